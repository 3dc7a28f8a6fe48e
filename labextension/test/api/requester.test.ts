import { describe, expect, it } from 'vitest';

import { APIError } from '../../src/api/errors';
import { ITransport, joinUrl, requester } from '../../src/api/requester';

/** A transport that records each request and answers from `answer`. */
function fake(answer: (url: string, init: RequestInit) => Response): {
  transport: ITransport;
  sent: { url: string; init: RequestInit }[];
} {
  const sent: { url: string; init: RequestInit }[] = [];
  const transport: ITransport = {
    baseUrl: '/user/ada/',
    send: (url, init) => {
      sent.push({ url, init });
      return Promise.resolve(answer(url, init));
    }
  };
  return { transport, sent };
}

describe('the requester (the panel and the cell widget share it)', () => {
  it('joins the base URL, the API path and the call with single slashes', () => {
    expect(joinUrl('/user/ada/', '/gpulayer/api/v1')).toBe(
      '/user/ada/gpulayer/api/v1'
    );
    expect(joinUrl('/', 'jobs/abc/cancel')).toBe('/jobs/abc/cancel');
  });

  it('sends JSON to the API under the base URL and reads JSON back', async () => {
    const { transport, sent } = fake(
      () => new Response('{"id": "abc"}', { status: 200 })
    );
    const got = await requester(transport)<{ id: string }>('jobs/abc/cancel', {
      method: 'POST',
      body: { why: 'test' }
    });
    expect(got).toEqual({ id: 'abc' });
    expect(sent).toHaveLength(1);
    expect(sent[0]?.url).toBe('/user/ada/gpulayer/api/v1/jobs/abc/cancel');
    expect(sent[0]?.init.method).toBe('POST');
    expect(sent[0]?.init.body).toBe('{"why":"test"}');
  });

  it("turns the server's error answer into an APIError with its code", async () => {
    const { transport } = fake(
      () =>
        new Response(
          '{"code": "job_not_found", "message": "no job \'x\'", "hint": "list jobs"}',
          { status: 404 }
        )
    );
    const call = requester(transport)('jobs/x/cancel', { method: 'POST' });
    await expect(call).rejects.toMatchObject({
      status: 404,
      code: 'job_not_found',
      hint: 'list jobs'
    });
  });

  it('says the Jupyter server does not answer when the transport rejects', async () => {
    const transport: ITransport = {
      baseUrl: '/',
      send: () => Promise.reject(new TypeError('Failed to fetch'))
    };
    const error = await requester(transport)('jobs').catch((e: unknown) => e);
    expect(error).toBeInstanceOf(APIError);
    expect((error as APIError).unreachable).toBe(true);
  });
});
