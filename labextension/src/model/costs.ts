/**
 * The cost column of the jobs list (ADR 0011): what a job cost, or is expected to, and the
 * history of its attempts. Every figure comes from the server's `Job.history` (the ledger's
 * estimate and charge of each attempt); nothing is priced here.
 */
import type { IAttemptRecord, IJob } from '../api';

/** Dollars as the panel shows them: "$0.00", "$1.25", "$1,204". */
export function formatDollars(amount: number): string {
  if (amount >= 1000) {
    return `$${Math.round(amount).toLocaleString('en-US')}`;
  }
  return `$${amount.toFixed(2)}`;
}

/**
 * The job's cost: the charges of its ended attempts, plus the estimate of the one placed or
 * running now ("≈ $1.20"); empty before its first placement.
 */
export function formatCost(job: IJob): string {
  const history = job.history;
  if (history.length === 0) {
    return '';
  }
  const charged = history.reduce((sum, a) => sum + (a.charge ?? 0), 0);
  const open = history.find(a => a.charge === null);
  if (open) {
    const est = charged + open.estimate;
    return charged > 0
      ? `${formatDollars(charged)} + ≈ ${formatDollars(open.estimate)}`
      : `≈ ${formatDollars(est)}`;
  }
  return formatDollars(charged);
}

/** One attempt as a line: "attempt 1 · lost (preempted: …) · $0.12 of ≈ $0.50 · retried". */
export function formatAttempt(a: IAttemptRecord): string {
  const parts = [`attempt ${a.attempt}`];
  const where = a.workers.join(', ');
  if (where) {
    parts.push(`on ${where}${a.provider ? ` (${a.provider})` : ''}`);
  }
  parts.push(
    a.outcome
      ? `${a.outcome}${a.reason ? ` (${a.reason})` : ''}`
      : 'in progress'
  );
  parts.push(
    a.charge !== null
      ? `${formatDollars(a.charge)} of ≈ ${formatDollars(a.estimate)}`
      : `≈ ${formatDollars(a.estimate)}`
  );
  if (a.retried) {
    parts.push('retried');
  }
  return parts.join(' · ');
}

/** Every attempt, one per line (the cost column's tooltip). */
export function formatAttempts(job: IJob): string {
  return job.history.map(formatAttempt).join('\n');
}
