/**
 * What the page keeps of one job: its log lines and chart points, and who draws them.
 * Keyed by the job id, not the model: anywidget hands `initialize()` and each `render()` a
 * different proxy of the same model.
 */

/** A log line as Python sends it: `[stream, rank | null, text]`. */
export type LogLine = [string, number | null, string];
/** A chart point: `[step, {metric: value}]`. */
export type Point = [number, Record<string, number>];

/** The part of anywidget's model the widget uses (a callback gets the event's arguments). */
export interface IWidgetModel {
  get(name: string): unknown;
  on(event: string, callback: (...args: never[]) => void): void;
  off(event: string, callback: (...args: never[]) => void): void;
  send(content: unknown): void;
}

export const MAX_LINES = 5000; // kept in the page per job; older lines leave the view
export const MAX_POINTS = 5000; // chart points kept in the page per job
// Jobs whose lines the page keeps once no view shows them (a long notebook's old cells): past
// this, the oldest unseen go (a view drawn again starts from its saved `log_tail`).
export const MAX_UNSEEN_JOBS = 100;

export interface IJobStore {
  lines: LogLine[];
  points: Point[];
  /** Called with new lines, or null when the whole list changed. */
  listeners: Set<(lines: LogLine[] | null) => void>;
  charts: Set<() => void>;
}

const stores = new Map<string, IJobStore>();

export function store(model: IWidgetModel): IJobStore {
  const key = String(model.get('job_id'));
  let s = stores.get(key);
  if (!s) {
    s = {
      lines: [...((model.get('log_tail') as LogLine[] | null) ?? [])],
      points: [...((model.get('chart') as Point[] | null) ?? [])],
      listeners: new Set(),
      charts: new Set()
    };
    stores.set(key, s);
    forgetUnseen();
  }
  return s;
}

/** Drops the oldest stores no view draws, past `MAX_UNSEEN_JOBS` of them. */
function forgetUnseen(): void {
  const unseen = [...stores].filter(
    ([, s]) => s.listeners.size === 0 && s.charts.size === 0
  );
  for (const [key] of unseen.slice(0, unseen.length - MAX_UNSEEN_JOBS)) {
    stores.delete(key);
  }
}

/** How many jobs the page keeps lines for (tests). */
export function storedJobs(): number {
  return stores.size;
}

/** Keeps the last `max` items of `items`, in place. */
export function keepLast<T>(items: T[], max: number): void {
  if (items.length > max) {
    items.splice(0, items.length - max);
  }
}
