"""Every client call written once, as a generator that yields requests and receives responses.

``AsyncClient`` and ``Client`` (``clients.py``) only differ in how they send them. Long waits
(``wait``, ``logs``, ``events``) are split here into server-sized long-polls.

Protocol 1.1 calls (``run``: submit and follow in one request, its bundle inline; ``follow``: the
job and its lines in one long-poll; ``submit_many``) fall back to the 1.0 requests against a
server that predates them: ``protocol`` is the server's, as its answers say it
(``GPUlayer-Protocol``; none: 1.0), unknown until the first answer.
"""

from __future__ import annotations

import base64
import builtins
import hashlib
import json
import time
import uuid
from collections.abc import Generator, Iterable
from dataclasses import dataclass, field
from typing import Any, TypeVar
from urllib.parse import quote

import httpx
from pydantic import BaseModel

from .. import versions
from ..contracts import (
    EventCursor,
    EventPage,
    Job,
    JobFollow,
    JobList,
    JobSpec,
    JobState,
    LogPage,
    SubmitAnswer,
    WorkerInfo,
)
from ..contracts.reports import MAX_INLINE_BUNDLE
from ..errors import GPUlayerError, from_json
from .httpbase import error_from

T = TypeVar("T")
M = TypeVar("M", bound=BaseModel)
# The longest single long-poll a client asks for; the server's own limit is higher (60 s).
POLL_CHUNK = 25.0
# How much longer than a long-poll the client waits for its answer before giving up on it.
POLL_SLACK = 15.0
ERRORS = tuple(range(400, 600))  # a request whose error is the call's to hand back, not raise
NEWER = (404, 405)  # how a server before 1.1 answers a 1.1 route


@dataclass
class Req:
    """One request of a call; ``ok`` lists error statuses handed back instead of raised."""

    method: str
    path: str
    params: list[tuple[str, str]] = field(default_factory=list)
    json: Any = None
    content: bytes | None = None
    timeout: float | None = None
    ok: tuple[int, ...] = ()
    # An Idempotency-Key (ADR 0003): a write sent again with it is done once. The client sends
    # the same Req, so the same key, on each of its retries (``failover.Servers``).
    key: str | None = None
    # Sending it twice does no harm (a heartbeat): it moves past a hung server as a GET does.
    repeatable: bool = False
    # Nobody reads the answer: ``Prefer: return=minimal`` (a 1.1 server answers 204).
    minimal: bool = False
    # Headers of the caller's own (the panel's proxy passes the browser's Content-Type on).
    headers: dict[str, str] = field(default_factory=dict)

    def send_kwargs(self) -> dict[str, Any]:
        kw: dict[str, Any] = {"params": self.params}
        headers: dict[str, str] = {}
        if self.json is not None:
            kw["content"] = (
                self.json.encode() if isinstance(self.json, str) else json.dumps(self.json).encode()
            )
            headers["Content-Type"] = "application/json"
        elif self.content is not None:
            kw["content"] = self.content
            headers["Content-Type"] = "application/octet-stream"
        if self.key is not None:
            headers[IDEMPOTENCY_KEY] = self.key
        headers.update(self.headers)
        if headers:
            kw["headers"] = headers
        if self.timeout is not None:
            kw["timeout"] = httpx.Timeout(self.timeout, connect=10.0)
        return kw


Call = Generator[Req, httpx.Response, T]
IDEMPOTENCY_KEY = "Idempotency-Key"
# A worker's enrolment nonce, the same on every try of one join with an instance token
# (``security.tokens.enrolled_worker_id``): a retry whose answer was lost is that worker again.
ENROLMENT = "GPUlayer-Enrolment"


def new_key(key: str | None = None) -> str:
    """The caller's idempotency key, or a fresh one (a UUID) for a new write."""
    return key if key is not None else str(uuid.uuid4())


def _model(cls: type[M], resp: httpx.Response) -> M:
    return cls.model_validate_json(resp.content)


def _body(model: BaseModel) -> str:
    return model.model_dump_json()


def _pid(value: str) -> str:
    return quote(value, safe="")


def _older(resp: httpx.Response) -> bool:
    """No such route (404), or not with this method (405: ``POST /jobs/run`` is ``/jobs/{id}``
    there), from a server without the protocol header: the route is newer than the server."""
    return resp.status_code in NEWER and versions.HEADER not in resp.headers


def _newer(model: type[M], resp: httpx.Response) -> M | None:
    """A 1.1 route's answer; None where the server is older than the route (speak 1.0)."""
    if _older(resp):
        return None
    if resp.status_code >= 400:
        raise error_from(resp)
    return _model(model, resp)


class Calls:
    """Every call as a generator of requests: written once for both clients."""

    def __init__(self) -> None:
        self.protocol: versions.Version | None = None  # the server's, once it answered

    def heard(self, resp: httpx.Response) -> None:
        """Note the protocol a server's answer says it speaks (another major is refused)."""
        said = resp.headers.get(versions.HEADER)
        if said is None and resp.status_code >= 500:
            return  # a proxy's answer, perhaps: it says nothing about the server
        self.protocol = versions.peer(said, peer_is="the control plane")

    @property
    def v11(self) -> bool:
        """Whether the server may speak 1.1 (unknown yet counts: a 404 then tells)."""
        return self.protocol is None or versions.at_least(self.protocol, 1)

    def submit(self, spec: JobSpec, key: str | None = None) -> Call[Job]:
        return _model(Job, (yield Req("POST", "/jobs", json=_body(spec), key=new_key(key))))

    def run(
        self,
        spec: JobSpec,
        bundle: bytes | None = None,
        wait: float = 0.0,
        linger: float = 0.05,
        limit: int = 1000,
        key: str | None = None,
    ) -> Call[JobFollow]:
        """Submit (its bundle inline when given and small) and follow, in one request."""
        key = new_key(key)
        digest = getattr(spec.workload, "bundle", None)
        chunk = min(max(0.0, wait), POLL_CHUNK)
        if self.v11 and (bundle is None or len(bundle) <= MAX_INLINE_BUNDLE):
            body: dict[str, Any] = {"spec": spec.model_dump(mode="json")}
            if bundle is not None:
                body["bundle"] = base64.b64encode(bundle).decode()
            params = [("wait", f"{chunk:.3f}"), ("linger", f"{linger:.3f}"), ("limit", str(limit))]
            resp = yield Req(
                "POST",
                "/jobs/run",
                params=params,
                json=json.dumps(body),
                timeout=max(chunk, linger) + POLL_SLACK,
                ok=NEWER,
                key=key,
            )
            if (followed := _newer(JobFollow, resp)) is not None:
                return followed
        # 1.0, or a bundle too large to ride inline: upload, submit, wait, read the logs.
        if bundle is not None and digest is not None and not (yield from self.has_bundle(digest)):
            yield from self.put_bundle(bundle, digest)
        job = yield from self.submit(spec, key)
        if chunk > 0:
            job = yield from self.wait(job.id, chunk)
        page = yield from self.logs(job.id, limit=limit)
        return JobFollow(
            job=job, records=page.records, next_since=page.next_since, cursor="", more=False
        )

    def follow(
        self,
        job_id: str,
        since: int = 0,
        cursor: str | None = None,
        wait: float = 0.0,
        linger: float = 0.05,
        limit: int = 1000,
    ) -> Call[JobFollow]:
        """The job and its records after ``since``, in one long-poll (1.0: logs, then the job)."""
        chunk = min(max(0.0, wait), POLL_CHUNK)
        if self.v11:
            params = [("since", str(since)), ("wait", f"{chunk:.3f}")]
            params += [("linger", f"{linger:.3f}"), ("limit", str(limit))]
            if cursor:
                params.append(("cursor", cursor))
            resp = yield Req(
                "GET",
                f"/jobs/{_pid(job_id)}/follow",
                params=params,
                timeout=max(chunk, linger) + POLL_SLACK,
                ok=NEWER,
            )
            if (followed := _newer(JobFollow, resp)) is not None:
                return followed
        page = yield from self.logs(job_id, since, chunk, limit)
        job = yield from self.get(job_id)
        return JobFollow(
            job=job, records=page.records, next_since=page.next_since, cursor="", more=False
        )

    def submit_many(
        self, specs: Iterable[JobSpec], key: str | None = None
    ) -> Call[builtins.list[Job | GPUlayerError]]:
        """Several jobs in one request; each entry's job or refusal, in order."""
        specs = builtins.list(specs)
        if self.v11:
            body = {"specs": [s.model_dump(mode="json") for s in specs]}
            resp = yield Req(
                "POST", "/jobs/batch", json=json.dumps(body), ok=NEWER, key=new_key(key)
            )
            if (answer := _newer(SubmitAnswer, resp)) is not None:
                out: builtins.list[Job | GPUlayerError | None] = [None] * len(specs)
                for r in answer.refused:
                    out[r.index] = from_json(r.status, {"code": r.code, "message": r.message})
                jobs = iter(answer.jobs)
                return [o if o is not None else next(jobs) for o in out]
        done: builtins.list[Job | GPUlayerError] = []
        for spec in specs:  # 1.0: one by one
            resp = yield Req("POST", "/jobs", json=_body(spec), ok=ERRORS, key=new_key())
            done.append(error_from(resp) if resp.status_code >= 400 else _model(Job, resp))
        return done

    def get(self, job_id: str) -> Call[Job]:
        return _model(Job, (yield Req("GET", f"/jobs/{_pid(job_id)}")))

    def list(
        self,
        states: Iterable[JobState] = (),
        *,
        name: str | None = None,
        label: tuple[str, str] | None = None,
        limit: int = 100,
    ) -> Call[builtins.list[Job]]:
        params = [("state", JobState(s).value) for s in states]
        if name is not None:
            params.append(("name", name))
        if label is not None:
            params.append(("label", f"{label[0]}={label[1]}"))
        params.append(("limit", str(limit)))
        return _model(JobList, (yield Req("GET", "/jobs", params=params))).jobs

    def cancel(
        self, job_id: str, reason: str = "cancelled by user", key: str | None = None
    ) -> Call[Job]:
        # The reason is the server's ("cancelled by user"); kept for parity with the ControlPlane.
        path = f"/jobs/{_pid(job_id)}/cancel"
        return _model(Job, (yield Req("POST", path, key=new_key(key))))

    def wait(self, job_id: str, timeout: float | None = None) -> Call[Job]:
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            left = POLL_CHUNK if deadline is None else max(0.0, deadline - time.monotonic())
            chunk = min(left, POLL_CHUNK)
            job = _model(
                Job,
                (
                    yield Req(
                        "GET",
                        f"/jobs/{_pid(job_id)}/wait",
                        params=[("timeout", f"{chunk:.3f}")],
                        timeout=chunk + POLL_SLACK,
                    )
                ),
            )
            if job.state.terminal or (deadline is not None and time.monotonic() >= deadline):
                return job
            job_id = job.id

    def logs(
        self, job_id: str, since: int = 0, wait: float = 0.0, limit: int = 1000
    ) -> Call[LogPage]:
        deadline = time.monotonic() + max(0.0, wait)
        while True:
            chunk = min(max(0.0, deadline - time.monotonic()), POLL_CHUNK)
            page = _model(
                LogPage,
                (
                    yield Req(
                        "GET",
                        f"/jobs/{_pid(job_id)}/logs",
                        params=[
                            ("since", str(since)),
                            ("wait", f"{chunk:.3f}"),
                            ("limit", str(limit)),
                        ],
                        timeout=chunk + POLL_SLACK,
                    )
                ),
            )
            if page.records or page.state.terminal or time.monotonic() >= deadline:
                return page

    def explain(self, job_id: str) -> Call[str]:
        resp = yield Req("GET", f"/jobs/{_pid(job_id)}/explain")
        return str(resp.json()["sentence"])

    def workers(self) -> Call[builtins.list[WorkerInfo]]:
        resp = yield Req("GET", "/workers")
        return [WorkerInfo.model_validate(w) for w in resp.json()["workers"]]

    def set_worker_state(self, worker_id: str, state: str) -> Call[WorkerInfo]:
        return _model(
            WorkerInfo,
            (yield Req("POST", f"/workers/{_pid(worker_id)}/state", json={"state": str(state)})),
        )

    def remove_worker(self, ref: str, *, force: bool = False) -> Call[WorkerInfo]:
        params = [("force", "1")] if force else []
        return _model(WorkerInfo, (yield Req("DELETE", f"/workers/{_pid(ref)}", params=params)))

    def events(
        self, since: int = 0, wait: float = 0.0, cursor: str | None = None
    ) -> Call[EventPage]:
        # A cursor (`<epoch>:<seq>`) wins over `since`, and says when the server restarted.
        after = [("cursor", cursor)] if cursor is not None else [("since", str(since))]
        deadline = time.monotonic() + max(0.0, wait)
        while True:
            chunk = min(max(0.0, deadline - time.monotonic()), POLL_CHUNK)
            page = _model(
                EventPage,
                (
                    yield Req(
                        "GET",
                        "/events",
                        params=[*after, ("wait", f"{chunk:.3f}")],
                        timeout=chunk + POLL_SLACK,
                    )
                ),
            )
            if page.events or page.reset or time.monotonic() >= deadline:
                return page

    def event_cursor(self) -> Call[str]:
        return _model(EventCursor, (yield Req("GET", "/events/cursor"))).cursor

    def put_bundle(self, data: bytes, digest: str | None = None) -> Call[str]:
        digest = digest or hashlib.sha256(data).hexdigest()
        resp = yield Req("PUT", f"/bundles/{_pid(digest)}", content=data, timeout=600.0)
        return str(resp.json()["digest"])

    def has_bundle(self, digest: str) -> Call[bool]:
        resp = yield Req("HEAD", f"/bundles/{_pid(digest)}", ok=(404,))
        return resp.status_code == 200

    def get_bundle(self, digest: str) -> Call[bytes]:
        return (yield Req("GET", f"/bundles/{_pid(digest)}", timeout=600.0)).content

    def get_blob(self, digest: str) -> Call[bytes]:
        return (yield Req("GET", f"/artifacts/{_pid(digest)}", timeout=600.0)).content

    def artifact(self, job_id: str, name: str) -> Call[bytes]:
        path = f"/jobs/{_pid(job_id)}/artifacts/{quote(name, safe='/')}"
        return (yield Req("GET", path, timeout=600.0)).content

    def status(self) -> Call[dict[str, Any]]:
        data = (yield Req("GET", "/status")).json()
        assert isinstance(data, dict)
        return data
