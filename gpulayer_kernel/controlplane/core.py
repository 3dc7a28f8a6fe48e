"""The one ControlPlane (ADR 0001): the public calls, a thin front over services that do the work.

The same object runs in-process (``gpulayer run``, plain IPython, tests), inside the Jupyter server
extension, and behind ``gpulayer serve``. All state changes happen on one asyncio loop and are
written through to the MetadataStore (group-committed) before a call returns, so a crash leaves
every acknowledged change on disk.

Three floors:

- **the parts** (``wiring.py``, the one base): ``jobs`` (JobTable: the one commit path of every job
  change), ``registry`` (workers), ``event_log`` (the ring UIs follow), ``tails`` (job logs),
  ``dispatch`` (inboxes, cancels, rendezvous), ``scheduling`` (passes, reservations),
  ``outcomes`` (finishes, cancels, retries, lost workers), ``reaper``, ``sessions`` (ADR 0019),
  ``kernels`` (ADR 0021), ``provisioning`` (the ledger, budgets, instances, the autoscaler: ADR
  0010, 0011); ``wiring.py`` builds them and says what one part's change does to the others;
- **the services**, each given in its constructor only the parts it works with: ``job_calls``,
  ``blob_calls``, ``view_calls`` (``client_side.py``), ``worker_calls`` (``worker_side.py``),
  ``session_calls`` (``sessions/side.py``), ``admin_calls`` (``admin_side.py``);
- **the front**: this class's flat surface, one ``via`` line a call (``front.py``), which the
  HTTP client mirrors name for name.

Every wait and timeout runs on ``clock``: tests hand in a FakeClock. Identity
(``security.roles``): calls that read or act on someone's work take ``who`` (an ``Identity``: user
and role) and check it; ``who=None`` is the embedded single user, who is admin.
"""

from __future__ import annotations

from .admin_side import AdminCalls
from .client_side import BlobCalls, JobCalls, ViewCalls
from .front import via
from .sessions.side import SessionCalls
from .wiring import Wiring
from .worker_side import WorkerCalls


class ControlPlane(Wiring):
    """Knows every job and worker; places jobs with the pure scheduler; never polls.

    ``Wiring`` builds the parts and the services over them (its constructor takes the settings);
    the services' calls are this object's (the ``via`` lines below).
    """

    # Settings live in the part that uses them; tests and hosts read (and tune) them here.
    @property
    def heartbeat_timeout(self) -> float:
        return self.registry.heartbeat_timeout

    @property
    def reserve_after(self) -> float:
        return self.scheduling.reserve_after

    @reserve_after.setter
    def reserve_after(self, seconds: float) -> None:
        self.scheduling.reserve_after = seconds

    @property
    def rendezvous_timeout(self) -> float:
        return self.outcomes.rendezvous_timeout

    # -- the calls ---------------------------------------------------------------------------------

    # JobCalls (client_side.py)
    submit = via("job_calls", JobCalls.submit)
    enqueue = via("job_calls", JobCalls.enqueue)
    resolve = via("job_calls", JobCalls.resolve)
    get = via("job_calls", JobCalls.get)
    list = via("job_calls", JobCalls.list)
    cancel = via("job_calls", JobCalls.cancel)
    wait = via("job_calls", JobCalls.wait)
    logs = via("job_calls", JobCalls.logs)
    follow = via("job_calls", JobCalls.follow)
    run = via("job_calls", JobCalls.run)
    submit_many = via("job_calls", JobCalls.submit_many)
    explain = via("job_calls", JobCalls.explain)
    snapshot = via("job_calls", JobCalls.snapshot)
    job_counts = via("job_calls", JobCalls.job_counts)
    artifact_for = via("job_calls", JobCalls.artifact_for)
    # BlobCalls (client_side.py)
    put_blob = via("blob_calls", BlobCalls.put_blob)
    claim_blob = via("blob_calls", BlobCalls.claim_blob)
    has_blob = via("blob_calls", BlobCalls.has_blob)
    get_blob = via("blob_calls", BlobCalls.get_blob)
    put_bundle = via("blob_calls", BlobCalls.put_bundle)
    has_bundle = via("blob_calls", BlobCalls.has_bundle)
    get_bundle = via("blob_calls", BlobCalls.get_bundle)
    # ViewCalls (client_side.py)
    workers = via("view_calls", ViewCalls.workers)
    events = via("view_calls", ViewCalls.events)
    event_cursor = via("view_calls", ViewCalls.event_cursor)
    # WorkerCalls (worker_side.py)
    register = via("worker_calls", WorkerCalls.register)
    heartbeat = via("worker_calls", WorkerCalls.heartbeat)
    set_worker_state = via("worker_calls", WorkerCalls.set_worker_state)
    next_work = via("worker_calls", WorkerCalls.next_work)
    worker_disconnected = via("worker_calls", WorkerCalls.worker_disconnected)
    was_given = via("worker_calls", WorkerCalls.was_given)
    report_started = via("worker_calls", WorkerCalls.report_started)
    append_logs = via("worker_calls", WorkerCalls.append_logs)
    report_progress = via("worker_calls", WorkerCalls.report_progress)
    report_finished = via("worker_calls", WorkerCalls.report_finished)
    report = via("worker_calls", WorkerCalls.report)
    report_cell = via("worker_calls", WorkerCalls.report_cell)
    report_session = via("worker_calls", WorkerCalls.report_session)
    publish_rendezvous = via("worker_calls", WorkerCalls.publish_rendezvous)
    get_rendezvous = via("worker_calls", WorkerCalls.get_rendezvous)
    remove_worker = via("worker_calls", WorkerCalls.remove_worker)
    deregister = via("worker_calls", WorkerCalls.deregister)
    return_work = via("worker_calls", WorkerCalls.return_work)
    # SessionCalls (sessions.side.py)
    start_session = via("session_calls", SessionCalls.start_session)
    list_sessions = via("session_calls", SessionCalls.list_sessions)
    get_session = via("session_calls", SessionCalls.get_session)
    run_cell = via("session_calls", SessionCalls.run_cell)
    follow_cell = via("session_calls", SessionCalls.follow_cell)
    session_cells = via("session_calls", SessionCalls.session_cells)
    interrupt_session = via("session_calls", SessionCalls.interrupt_session)
    restart_session = via("session_calls", SessionCalls.restart_session)
    stop_session = via("session_calls", SessionCalls.stop_session)
    attach_session = via("session_calls", SessionCalls.attach_session)
    # AdminCalls (admin_side.py)
    set_secret = via("admin_calls", AdminCalls.set_secret)
    secret_names = via("admin_calls", AdminCalls.secret_names)
    delete_secret = via("admin_calls", AdminCalls.delete_secret)
    add_user = via("admin_calls", AdminCalls.add_user)
    update_user = via("admin_calls", AdminCalls.update_user)
    providers = via("admin_calls", AdminCalls.providers)
    instances = via("admin_calls", AdminCalls.instances)
    costs = via("admin_calls", AdminCalls.costs)
    budgets = via("admin_calls", AdminCalls.budgets)
    set_budget = via("admin_calls", AdminCalls.set_budget)
    delete_budget = via("admin_calls", AdminCalls.delete_budget)
