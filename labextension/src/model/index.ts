/**
 * What the panel knows and how it says it, with no DOM: the live model (`livemodel.ts`) and
 * a job's log follower (`logfollower.ts`) over the API, the pure state they fold
 * (`state.ts`, `logbuffer.ts`), their retry rule (`retry.ts`), and the words and figures the
 * views show (`format.ts`, `costs.ts`).
 */
export * from './costs';
export * from './format';
export * from './livemodel';
export * from './logbuffer';
export * from './logfollower';
export * from './retry';
export * from './state';
