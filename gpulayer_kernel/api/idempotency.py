"""``Idempotency-Key`` (ADR 0003): a keyed write is done once; every retry gets its answer.

An operation declared ``@op(..., idempotent=...)`` and sent with the header (IETF draft "The
Idempotency-Key HTTP Header Field") runs through ``run_keyed``, the one place that does this:

1. The key is checked (1-255 visible ASCII characters, else 400 ``idempotency_key_invalid``) and
   the request fingerprinted: sha256 of method, path and canonical body (JSON re-dumped with
   sorted keys; the query, which says how long to wait, is left out). Keys are per user: another
   user's same key is another record, and sees nothing of this one.
2. The same key in flight here: with the same fingerprint, wait for it, then answer as below;
   with another, 409 ``idempotency_key_reused``.
3. A stored record younger than the window (``ApiLimits.idempotency_window``, 24 h; the control
   plane's clock): another fingerprint gets 409 ``idempotency_key_reused``; an answer is
   replayed as sent (status and body) with ``Idempotency-Replayed: true``. ``follow`` routes
   (``/jobs/run``) run again instead, bound to the job they made, so a retry follows that job
   as it is now. A record without an answer was cut off by a restart: ``replay`` and ``follow``
   routes run again, bound to the jobs the record notes (``controlplane/idempotency.py``: each
   noted in the commit that stored it), so nothing is made twice; a cell (a ``follow`` route)
   follows the cell its first try numbered (noted ``cell:SESSION:N`` in the commit of the cell's
   row); ``once`` routes (a session start: what it makes is not all noted here) answer 409
   ``idempotency_key_unresolved``.
   An older record is forgotten: the key is new.
4. Otherwise the handler runs under a ``Claim``; ``once`` routes store the record first.
5. Its answer (2xx or 4xx) is stored before it is sent; a ``follow`` route's 2xx as it is
   sent (its record already names the job or cell it made, which is all a retry reads). A 5xx
   (unavailable, shutting down) is not an answer to keep: a record without jobs is forgotten
   (the retry runs anew), except on ``once`` routes, whose work may be done. A keyed long-poll
   outlives its client (a retry waits for its answer instead of leaving its outcome unknown).

Records are purged at most every ``PURGE_EVERY`` seconds, by the keyed requests themselves.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import json
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Literal

from ..controlplane.idempotency import Claim, split_refs
from ..errors import Conflict, InvalidInput
from ..store import IdempotencyRecord, MetadataStore
from .errors import error_answer

log = logging.getLogger("gpulayer.api")

HEADER = "Idempotency-Key"
REPLAYED = "Idempotency-Replayed"
WINDOW = 24 * 3600.0
PURGE_EVERY = 600.0
MAX_KEY = 255

Mode = Literal["replay", "follow", "once"]


@dataclass(frozen=True)
class Answer:
    """What a keyed request answered: its status, body and content type."""

    status: int
    body: bytes
    content_type: str = "application/json"
    replayed: bool = False


@dataclass
class _Running:
    fingerprint: str
    done: asyncio.Event = field(default_factory=asyncio.Event)


@dataclass
class Keys:
    """The keyed requests in flight in this process (one per mount's ``ApiContext``)."""

    running: dict[tuple[str, str], _Running] = field(default_factory=dict)
    purged_at: float = float("-inf")
    # A follow route's 2xx status, written as its answer goes (5. in the module docstring).
    writing: set[asyncio.Task[None]] = field(default_factory=set)


def check_key(raw: str) -> str:
    """The key, or 400 naming the header: 1 to 255 visible ASCII characters."""
    if not raw or len(raw) > MAX_KEY or not all("!" <= c <= "~" for c in raw):
        raise InvalidInput(
            f"the {HEADER} header must be 1 to {MAX_KEY} visible ASCII characters",
            hint="send a fresh random key (a UUID) with each new write, and the same one with "
            "its retries",
            details={"header": HEADER, "length": len(raw)},
            code="idempotency_key_invalid",
        )
    return raw


def fingerprint(method: str, path: str, body: bytes) -> str:
    """sha256 of method, path and canonical body (the same JSON however it was spaced)."""
    try:
        canonical = json.dumps(json.loads(body), sort_keys=True, separators=(",", ":")).encode()
    except ValueError:  # not JSON (or none): its bytes as they are
        canonical = body
    h = hashlib.sha256()
    for part in (method.upper().encode(), path.encode(), canonical):
        h.update(len(part).to_bytes(8, "big") + part)
    return h.hexdigest()


def _reused(key: str) -> Conflict:
    return Conflict(
        f"the {HEADER} {key!r} was already used for another request",
        hint="send a fresh key with each new write; reuse a key only to retry the same request",
        details={"header": HEADER},
        code="idempotency_key_reused",
    )


def _unresolved(key: str) -> Conflict:
    return Conflict(
        f"the request with {HEADER} {key!r} was cut off (the control plane restarted or "
        "stopped) before it was answered; whether it took effect is not known here",
        hint="look it up (gpulayer session cells, gpulayer session list) before sending it "
        "again with a new key",
        details={"header": HEADER},
        code="idempotency_key_unresolved",
    )


async def run_keyed(
    keys: Keys,
    store: MetadataStore,
    *,
    mode: Mode,
    raw_key: str,
    owner: str,
    fp: str,
    now: Callable[[], float],
    window: float,
    call: Callable[[Claim], Awaitable[Answer]],
) -> Answer:
    """Run one keyed request as the module docstring says; its answer, or a replay of it."""
    key = check_key(raw_key)
    if now() - keys.purged_at >= PURGE_EVERY:
        keys.purged_at = now()
        await store.purge_idempotency(now() - window)
    slot = (owner, key)
    while (running := keys.running.get(slot)) is not None:
        if running.fingerprint != fp:
            raise _reused(key)
        # The first try's answer is stored by then (a follow route's record names its job or
        # cell, which is what this one then follows).
        await running.done.wait()
    mine = keys.running[slot] = _Running(fp)  # before any await: the next one waits for us
    try:
        return await _run(keys, store, mode, key, owner, fp, now(), window, call)
    finally:
        del keys.running[slot]
        mine.done.set()


async def _run(
    keys: Keys,
    store: MetadataStore,
    mode: Mode,
    key: str,
    owner: str,
    fp: str,
    now: float,
    window: float,
    call: Callable[[Claim], Awaitable[Answer]],
) -> Answer:
    rec = await store.get_idempotency(owner, key)
    if rec is not None and rec.created_at + window <= now:
        rec = None  # its window is over: the key is new
    if rec is not None and rec.fingerprint != fp:
        raise _reused(key)
    bound = []
    cells: list[tuple[str, int]] = []
    if rec is not None:
        answered = rec.status is not None
        if answered and (mode != "follow" or (rec.status or 0) >= 300):
            assert rec.status is not None
            return Answer(rec.status, (rec.answer or "").encode(), replayed=True)
        if not answered and mode == "once":
            raise _unresolved(key)
        job_ids, cells = split_refs(rec.jobs)
        bound = [j for j in [await store.get_job(i) for i in job_ids] if j is not None]
    claim = Claim(store, rec or IdempotencyRecord(owner, key, fp, now), bound, cells)
    if rec is None and mode == "once":
        await store.save_idempotency(claim.record)  # a crash from here on is "unresolved"
    try:
        answer = await call(claim)
    except Exception as exc:
        status, body = error_answer(exc, 500)
        if status < 500:
            await _keep(store, claim, status, json.dumps(body).encode())
        elif mode != "once" and not claim.record.jobs:
            # No answer to keep (unavailable, stopping), and no job made: the retry runs anew.
            # A "once" route may have done its work (a session started, then the server stopped
            # during its long-poll): its record stays, and a retry is told so, never run twice.
            await store.delete_idempotency(owner, key)
        raise
    answer = dataclasses.replace(answer, replayed=rec is not None)  # an earlier try made it
    if mode == "follow" and answer.status < 300 and claim.record.jobs:
        # A follow route's answer is never replayed: a retry follows the job or cell its record
        # names (stored in that job's or cell's own commit) as it is now, whether or not this
        # status is stored yet. So it is written as the answer goes, not before it (a
        # commit off every served cell's and `run`'s path), and without its body (a cell's page
        # can be megabytes of output).
        task = asyncio.ensure_future(_keep(store, claim, answer.status, b""))
        keys.writing.add(task)
        task.add_done_callback(_kept(keys))
        return answer
    await _keep(store, claim, answer.status, answer.body)
    return answer


async def _keep(store: MetadataStore, claim: Claim, status: int, body: bytes) -> None:
    record = dataclasses.replace(claim.record, status=status, answer=body.decode())
    await store.save_idempotency(record)


def _kept(keys: Keys) -> Callable[[asyncio.Task[None]], None]:
    def done(task: asyncio.Task[None]) -> None:
        keys.writing.discard(task)
        if not task.cancelled() and task.exception() is not None:
            # Lost, the record still names its job or cell: a retry does what it would have.
            log.info("a follow route's status was not stored: %s", task.exception())

    return done
