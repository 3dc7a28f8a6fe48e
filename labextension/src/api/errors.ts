/** The API's errors as the panel sees them: one class, built from the server's error answer. */

/** An answer from the API that was not a success; `status` 0 means "no answer at all". */
export class APIError extends Error {
  constructor(
    readonly status: number,
    readonly code: string,
    message: string,
    readonly hint: string = ''
  ) {
    super(message);
    this.name = 'APIError';
  }

  /** The server (or the control plane in it) could not be reached or is not serving. */
  get unreachable(): boolean {
    return this.status === 0 || this.status === 502 || this.status === 503;
  }
}

/** Turn an error answer (`{"code", "message", "hint"}` or anything else) into an APIError. */
export function errorFromAnswer(
  status: number,
  data: unknown,
  text: string
): APIError {
  if (data && typeof data === 'object') {
    const d = data as Record<string, unknown>;
    if (typeof d.message === 'string') {
      return new APIError(
        status,
        typeof d.code === 'string' ? d.code : `http_${status}`,
        d.message,
        typeof d.hint === 'string' ? d.hint : ''
      );
    }
  }
  if (status === 404) {
    return new APIError(
      status,
      'not_installed',
      'the GPUlayer server extension is not enabled in this Jupyter server',
      'run `jupyter server extension enable gpulayer_kernel.jupyter` and restart it'
    );
  }
  const snippet = text
    .replace(/<[^>]*>/g, ' ')
    .trim()
    .slice(0, 200);
  return new APIError(
    status,
    `http_${status}`,
    snippet || `HTTP ${status}`,
    ''
  );
}
