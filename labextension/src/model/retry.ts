/** Waiting between retries: the backoff rule and a sleep that a view going away cuts short. */

/** Retry delay after `failures` consecutive failures: 0.5 s doubling to 10 s, with jitter. */
export function backoff(failures: number, random: number = 0.5): number {
  const base = Math.min(10, 0.5 * 2 ** Math.max(0, failures - 1));
  return base * (0.75 + 0.5 * random);
}

/** Sleep `ms`, or less when `signal` aborts (the default `sleep` of the model and followers). */
export function abortableSleep(ms: number, signal: AbortSignal): Promise<void> {
  return new Promise(resolve => {
    const timer = setTimeout(done, ms);
    function done(): void {
      clearTimeout(timer);
      signal.removeEventListener('abort', done);
      resolve();
    }
    signal.addEventListener('abort', done);
  });
}
