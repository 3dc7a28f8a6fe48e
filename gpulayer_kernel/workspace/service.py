"""The control plane's part of workspaces: the decision, each user's objects, and the call lane.

- **The decision**: for a session that named its notebook's folder, :func:`plan.decide` over the
  worker it was placed on (what that worker declared when it joined). The session's
  ``SessionInfo.workspace`` shows it, and each sync's version and size.
- **Objects**: the store's content-addressed blobs, each claimed for the user who uploaded it
  (or whose session's worker sent it back). ``missing`` answers per user: a digest another user
  holds is missing for you until you upload its bytes — a hash alone never grants content.
- **The lane** (in memory, per session): the Jupyter host's calls wait here until the session's
  worker, long-polling, takes and answers them. A call is named by its caller, so a call sent
  again after a restart or a lost answer is the same call.

It holds nothing durable but the objects: a restarted control plane starts with empty lanes,
the host sends its call again and the worker, which kept its answer, answers it again. A
session's lane and plan are dropped when it ends (``forget``, from the wiring's job change).

Only the worker of the session's first node holds the synced copy, so only it may take the
lane's calls and answer them (``check_node``): the worker of a multi-node session's other node
is refused (403 ``workspace_not_this_node``).
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ..contracts import Job, JobState
from ..contracts.workspace import (
    WorkspaceAnswer,
    WorkspaceCall,
    WorkspaceCalls,
    WorkspacePlan,
    WorkspaceSource,
    WorkspaceView,
)
from ..errors import Forbidden, InvalidInput, NotFound, Unavailable
from ..security.roles import Identity, check_act, resolved
from . import pack as packs
from .plan import decide

if TYPE_CHECKING:
    from ..controlplane.jobs import JobTable
    from ..controlplane.sessions.table import SessionTable
    from ..controlplane.workers import WorkerRegistry
    from ..store import ArtifactStore, MetadataStore

# Per lane: calls waiting for the worker, and answers remembered (a call sent again is
# answered from here).
KEPT = 256
OWNED_KEPT = 200_000  # digests remembered as a user's (a cache of the store's answer)
MAX_PACK = 256 << 20  # content one pack may unpack to


@dataclass
class Lane:
    calls: OrderedDict[str, WorkspaceCall] = field(default_factory=OrderedDict)
    answers: OrderedDict[str, WorkspaceAnswer] = field(default_factory=OrderedDict)
    news: asyncio.Event = field(default_factory=asyncio.Event)  # for the worker
    answered: asyncio.Event = field(default_factory=asyncio.Event)  # for the hosts


class WorkspacePlane:
    """Every session's workspace lane and view; a part of the control plane (built in
    ``controlplane/wiring.py`` as ``cp.workspace``)."""

    def __init__(
        self,
        jobs: JobTable,
        sessions: SessionTable,
        registry: WorkerRegistry,
        artifacts: ArtifactStore,
        store: MetadataStore,
    ) -> None:
        self.jobs = jobs
        self.sessions = sessions
        self.registry = registry
        self.artifacts = artifacts
        self.store = store
        self._lanes: dict[str, Lane] = {}
        self._owned: dict[str, set[str]] = {}  # user -> digests known to be theirs
        self._plans: dict[str, WorkspacePlan] = {}

    # -- the decision ------------------------------------------------------------------------------

    async def plan(self, job: Job, worker_id: str | None = None) -> WorkspacePlan | None:
        """The plan on the session's first node, or on the node of ``worker_id`` (a multi-node
        session: only its first node holds a synced copy; another node runs in the notebook's
        folder where it sees it, else in its own folder, and says so)."""
        source = getattr(job.spec.workload, "workspace", None)
        if source is None:
            return None
        if job.state not in (JobState.PLACED, JobState.RUNNING) or job.placement is None:
            return self._plans.get(job.id)
        nodes = job.placement.nodes
        first = nodes[0]
        node = next((n for n in nodes if n.worker_id == worker_id), first)
        if node is not first:
            plan = self._decide(source, node.worker_id, node.worker_name)
            if plan.mode != "synced":
                return plan
            return WorkspacePlan(
                mode="none",
                reason=f"worker {node.worker_name} does not see {source.folder}, and a "
                f"multi-node session's synced copy is on its first node ({first.worker_name}) "
                "only: the code runs in a scratch folder on this node",
            )
        known = self._plans.get(job.id)
        if known is not None:
            return known
        plan = self._decide(source, first.worker_id, first.worker_name)
        self._plans[job.id] = plan
        self._show(job, plan)
        return plan

    def _decide(self, source: WorkspaceSource, worker_id: str, name: str) -> WorkspacePlan:
        worker = self.registry.get(worker_id)
        shares = worker.shares if worker is not None else None
        in_process = worker is not None and worker.transport == "inprocess"
        return decide(source, shares, worker=name, in_process=in_process)

    def _show(self, job: Job, plan: WorkspacePlan, **more: int) -> None:
        source = getattr(job.spec.workload, "workspace", None)
        view = WorkspaceView(
            mode=plan.mode,
            folder=source.folder if source else None,
            path=plan.path,
            reason=plan.reason,
            **more,
        )
        self.sessions.set_workspace(job.id, view)

    async def view(self, ref: str, who: Identity | None) -> WorkspaceView | None:
        """The session's workspace as the host sees it (its plan decided once it runs)."""
        job = await self._job(ref, who)
        plan = await self.plan(job)
        if plan is None:
            return None
        source = getattr(job.spec.workload, "workspace", None)
        return WorkspaceView(
            mode=plan.mode,
            folder=source.folder if source else None,
            path=plan.path,
            reason=plan.reason,
        )

    async def _job(self, ref: str, who: Identity | None) -> Job:
        s, job = await self.sessions.find(ref, who)
        check_act(who, job.owner, f"session {s.name}")
        return job

    # -- objects ---------------------------------------------------------------------------------

    async def missing(self, digests: list[str], who: Identity | None) -> list[str]:
        user = resolved(who).user
        return await self._missing(digests, user)

    async def _missing(self, digests: list[str], user: str) -> list[str]:
        out = []
        for d in dict.fromkeys(digests):
            if d in self._known(user):
                continue
            if self.artifacts.has(d) and await self.store.blob_owned(d, user):
                self._known(user).add(d)
                continue
            out.append(d)
        return out

    def _known(self, user: str) -> set[str]:
        """The digests known to be ``user``'s; a cache, started afresh past ``OWNED_KEPT`` (the
        store answers again) so a user with millions of files does not grow the server."""
        owned = self._owned.setdefault(user, set())
        if len(owned) > OWNED_KEPT:
            owned.clear()
        return owned

    async def put_pack(self, blob: bytes, user: str) -> int:
        """Store a pack's objects (each verified) for ``user``; how many."""
        objs = await asyncio.to_thread(lambda: list(packs.unpack(blob, MAX_PACK)))
        await asyncio.to_thread(self.artifacts.put_many, objs)
        await self.store.add_blob_owners([(d, user) for d, _ in objs])
        self._known(user).update(d for d, _ in objs)
        return len(objs)

    async def read_pack(self, digests: list[str], user: str) -> bytes:
        """The pack of those of ``digests`` that are ``user``'s (others: left out, as absent)."""
        mine = set(digests) - set(await self._missing(digests, user))
        objs = await asyncio.to_thread(
            lambda: [(d, self.artifacts.get(d)) for d in digests if d in mine]
        )
        return await asyncio.to_thread(packs.pack, objs)

    async def owner_of(self, job_id: str) -> str:
        """Whose objects a worker of ``job_id`` reads and writes (every node of a one-shot job
        syncs its own copy; that the job was given to the worker is the worker routes' check)."""
        return (await self.jobs.get(job_id)).owner

    async def check_node(self, job_id: str, worker_id: str) -> None:
        """``worker_id`` may take the session's lane: it runs the first node of the session's
        current placement, the one with the synced copy. Another node's worker is refused, and
        so is a worker of an earlier placement (the session back in the queue)."""
        job = await self.jobs.get(job_id)
        first = job.placement.nodes[0] if job.placement is not None else None
        if first is None or first.worker_id != worker_id:
            where = f"its first node ({first.worker_name})" if first else "no worker now"
            raise Forbidden(
                f"session {job_id}'s workspace is on {where}, not on this worker",
                hint="a multi-node session's other nodes run without a synced copy",
                code="workspace_not_this_node",
            )

    # -- the lane ----------------------------------------------------------------------------------

    def _lane(self, job_id: str) -> Lane:
        lane = self._lanes.get(job_id)
        if lane is None:
            lane = self._lanes[job_id] = Lane()
        return lane

    async def call(
        self, ref: str, call: WorkspaceCall, wait: float, who: Identity | None
    ) -> WorkspaceAnswer:
        """Hand ``call`` to the session's worker; its answer, or ``workspace_timeout`` after
        ``wait`` seconds (send the same call again)."""
        job = await self._job(ref, who)
        plan = await self.plan(job)
        if plan is None or plan.mode != "synced":
            raise InvalidInput(
                f"session {ref} has no synced workspace"
                + (f" ({plan.mode}: {plan.reason})" if plan else ""),
                hint="in place, the code already runs in the notebook's folder",
                code="workspace_not_synced",
            )
        lane = self._lane(job.id)
        if call.id not in lane.answers and call.id not in lane.calls:
            lane.calls[call.id] = call
            while len(lane.calls) > KEPT:  # a worker that takes none: the oldest waits longest
                lane.calls.popitem(last=False)  # its host sends it again after its wait
            lane.news.set()
        deadline = asyncio.get_running_loop().time() + max(0.0, wait)
        while call.id not in lane.answers:
            left = deadline - asyncio.get_running_loop().time()
            current = await self.jobs.get(job.id)
            if current.state.terminal:
                raise NotFound(
                    f"session {ref} has ended; its workspace with it",
                    code="session_ended",
                )
            if left <= 0:
                raise Unavailable(
                    f"the worker of session {ref} has not answered workspace call {call.id} "
                    f"within {wait:g}s",
                    hint="it is sent again",
                    code="workspace_timeout",
                )
            lane.answered.clear()
            try:
                await asyncio.wait_for(lane.answered.wait(), min(left, 1.0))
            except TimeoutError:
                pass
        answer = lane.answers[call.id]
        if answer.ok and call.op == "sync" and call.delta is not None:
            self._show(
                job,
                plan,
                version=answer.version,
                files=len(call.delta.put) if call.delta.base is None else 0,
            )
        return answer

    async def next_calls(self, job_id: str, worker_id: str, wait: float) -> WorkspaceCalls:
        """(The worker.) Calls not answered yet; long-polls ``wait`` seconds for one."""
        await self.check_node(job_id, worker_id)
        lane = self._lane(job_id)
        if not lane.calls:
            lane.news.clear()
            try:
                await asyncio.wait_for(lane.news.wait(), max(0.0, wait))
            except TimeoutError:
                pass
        return WorkspaceCalls(calls=list(lane.calls.values()))

    async def answer(self, job_id: str, worker_id: str, answer: WorkspaceAnswer) -> None:
        await self.check_node(job_id, worker_id)
        lane = self._lane(job_id)
        lane.calls.pop(answer.id, None)
        lane.answers[answer.id] = answer
        while len(lane.answers) > KEPT:
            lane.answers.popitem(last=False)
        lane.answered.set()

    def forget(self, job_id: str) -> None:
        self._lanes.pop(job_id, None)
        self._plans.pop(job_id, None)
