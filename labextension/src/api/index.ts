/**
 * The panel's side of the HTTP API: the contract types and values (`contracts.ts`), one
 * request function (`request.ts`) with its error (`errors.ts`) and clock (`clock.ts`), and
 * the calls (`calls.ts`). Nothing here renders or holds state.
 */
export { GPUlayerAPI } from './calls';
export { ServerClock } from './clock';
export * from './contracts';
export { APIError, errorFromAnswer } from './errors';
export { API_PATH, makeRequester } from './request';
export type { IRequestOptions, Requester } from './request';
