/** The server's clock as the page sees it, fed by each answer's `Date` header. */

/**
 * The server's clock as seen from the page, from each answer's `Date` header. Ages and
 * elapsed times compare server timestamps, so a browser whose clock is off (a remote
 * JupyterHub) would show nonsense without it. `Date` has 1 s resolution: smaller
 * differences are ignored.
 */
export class ServerClock {
  /** Seconds to add to the browser's clock to get the server's. */
  offset = 0;

  observe(dateHeader: string | null, localMs: number = Date.now()): void {
    if (!dateHeader) {
      return;
    }
    const serverMs = Date.parse(dateHeader);
    if (Number.isNaN(serverMs)) {
      return;
    }
    const offset = (serverMs - localMs) / 1000;
    this.offset = Math.abs(offset) > 1.5 ? offset : 0;
  }

  /** Now, in server seconds since the epoch (what every `*_at` field uses). */
  now(localMs: number = Date.now()): number {
    return localMs / 1000 + this.offset;
  }
}
