/**
 * The lines a log view holds, as pure functions: the newest records within a bound, the
 * cursor after them, and the ranks they came from.
 */
import type { ILogRecord } from '../api';

/** The lines a log view holds: the newest `max` records, in order, and the cursor after them. */
export interface ILogBuffer {
  records: readonly ILogRecord[];
  /** Records dropped off the front to stay within `max`. */
  dropped: number;
  next: number;
}

export function emptyLog(): ILogBuffer {
  return { records: [], dropped: 0, next: 0 };
}

/** Append a page's records (ignoring any already held) and keep the newest `max`. */
export function appendLog(
  buffer: ILogBuffer,
  records: readonly ILogRecord[],
  nextSince: number,
  max = 20000
): ILogBuffer {
  const fresh = records.filter(r => r.seq > buffer.next);
  if (!fresh.length) {
    return nextSince > buffer.next ? { ...buffer, next: nextSince } : buffer;
  }
  let all = [...buffer.records, ...fresh];
  let dropped = buffer.dropped;
  if (all.length > max) {
    dropped += all.length - max;
    all = all.slice(all.length - max);
  }
  const last = fresh[fresh.length - 1];
  return {
    records: all,
    dropped,
    next: Math.max(nextSince, last ? last.seq : 0)
  };
}

/** The ranks present in a log (for the rank filter); empty for single-process jobs. */
export function logRanks(buffer: ILogBuffer): number[] {
  const ranks = new Set<number>();
  for (const r of buffer.records) {
    if (r.rank !== null) {
      ranks.add(r.rank);
    }
  }
  return [...ranks].sort((a, b) => a - b);
}
