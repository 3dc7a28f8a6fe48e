"""Following one job in one long-poll: its state, progress, result and log lines together.

Protocol 1.1's answer to "events + get + logs" (three long-polls and reads for a notebook cell):
a :class:`~gpulayer_kernel.contracts.JobFollow` page is the job as it is now and its log records
after ``since``, answered the moment either moves on from what the follower has seen (its
``cursor``: ``<epoch>:<seq>``, the event number of the job's last change; a cursor from before a
restart of the control plane counts as a change), at its end, or at ``wait``.

A job younger than ``linger`` seconds (from its submission) is held until it ends or grows up:
a short job is one answer, start to result with its log tail, instead of one per change (queued,
placed, running, a line, the end). An older one is answered at every change, as it happens.
``run`` is a submit followed by the first such page, in one request.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from .. import bundles
from ..clock import SYSTEM_CLOCK, Clock
from ..contracts import Job, JobFollow, JobSpec
from ..contracts.reports import MAX_INLINE_BUNDLE
from ..display import human_bytes
from ..errors import InvalidInput, TooLarge
from .events import EventLog
from .jobs import JobTable
from .logs import MAX_LOG_PAGE, LogTails

LINGER = 0.05  # seconds a young job's first answer waits for its end (the clients' default)
MAX_LINGER = 5.0


class Follower:
    """Answers follow pages from the job table, the log tails and the event log's epoch."""

    def __init__(
        self, jobs: JobTable, tails: LogTails, events: EventLog, *, clock: Clock = SYSTEM_CLOCK
    ) -> None:
        self.jobs = jobs
        self.tails = tails
        self.events = events
        self.clock = clock

    async def page(
        self,
        job: Job,
        current: Callable[[], Awaitable[Job]],
        *,
        since: int = 0,
        cursor: str | None = None,
        wait: float = 0.0,
        linger: float = LINGER,
        limit: int = 1000,
    ) -> JobFollow:
        """The next page for a follower of ``job`` (``current()`` reads it again)."""
        limit = max(1, min(limit, MAX_LOG_PAGE))
        linger = max(0.0, min(linger, MAX_LINGER))
        epoch, seen = _cursor(cursor)
        deadline = self.clock.monotonic() + max(0.0, wait)
        grown = job.submitted_at + linger
        while True:
            records, more = await self.tails.read_more(job.id, since, limit)
            version = self.jobs.version(job.id)
            changed = epoch != self.events.epoch or version > seen
            left = deadline - self.clock.monotonic()
            young = self.clock.now() < grown
            if job.state.terminal or more or left <= 0 or ((changed or records) and not young):
                return JobFollow(
                    job=job,
                    records=records,
                    next_since=records[-1].seq if records else since,
                    cursor=f"{self.events.epoch}:{version}",
                    more=more,
                )
            if young:
                left = min(left, max(0.0, grown - self.clock.now()))
            await self.jobs.changed(job.id, left)
            job = await current()


def check_inline_bundle(spec: JobSpec, bundle: bytes) -> str:
    """The digest a bundle sent with its spec must have: the one its workload names."""
    digest = getattr(spec.workload, "bundle", None)
    if digest is None:
        raise InvalidInput(
            "a bundle came with a job whose workload names none",
            hint="send `bundle` only with a python workload (or a command with --files)",
            details={"field": "bundle"},
        )
    if len(bundle) > MAX_INLINE_BUNDLE:
        raise TooLarge(
            f"an inline bundle is {human_bytes(len(bundle))}; at most "
            f"{human_bytes(MAX_INLINE_BUNDLE)} ride with "
            "the job",
            hint="upload it first (PUT /bundles/{sha256}); the client does this on its own",
            details={"field": "bundle", "limit": MAX_INLINE_BUNDLE},
            code="body_too_large",
        )
    bundles.verify(bundle, digest)  # BundleError names both digests
    return str(digest)


def _cursor(cursor: str | None) -> tuple[str | None, int]:
    """(epoch, seq) of a follower's cursor; none yet: everything is news."""
    if not cursor:
        return None, -1
    epoch, sep, seq = cursor.partition(":")
    if not sep or not epoch or not seq.isdigit() or len(cursor) > 64:
        raise InvalidInput(
            f"follow cursor {cursor!r} is not <epoch>:<seq>",
            hint="pass the `cursor` of the last page, or none to start",
            details={"field": "cursor", "value": cursor},
            code="bad_parameter",
        )
    return epoch, int(seq)
