"""The one ControlPlane (ADR 0001): the public calls, wired over the parts that do the work.

The same object runs in-process (``gpulayer run``, plain IPython, tests), inside the Jupyter server
extension, and behind ``gpulayer serve``. All state changes happen on one asyncio loop and are
written through to the MetadataStore (group-committed) before a call returns, so a crash leaves
every acknowledged change on disk. Each part owns its state and changes only through its methods:
``jobs`` (JobTable: the one commit path of every job change), ``registry`` (workers), ``event_log``
(the ring UIs follow), ``tails`` (job logs), ``dispatch`` (inboxes, cancels, rendezvous),
``scheduling`` (passes, reservations), ``outcomes`` (finishes, cancels, retries, lost workers),
``reaper``, ``sessions`` (ADR 0019), and ``provisioning`` (the cost ledger, budgets, provider
instances and, where the control plane serves workers, the autoscaler: ADR 0010, 0011). Every
wait and timeout runs on ``clock``: tests hand in a FakeClock.

Identity (``security.roles``): calls that read or act on someone's work take ``who`` (an
``Identity``: user and role) and check it with ``check_read``/``check_act``; ``who=None`` is the
embedded single user, who is admin. Jobs carry their ``owner``. ``users`` (UserService) holds
users and quotas, ``secrets`` (SecretTable) each user's sealed secrets, ``usage`` recent GPU use.
"""

from __future__ import annotations

from .admin_side import AdminSide
from .client_side import ClientSide
from .sessions.side import SessionSide
from .wiring import Wiring
from .worker_side import WorkerSide


class ControlPlane(Wiring, ClientSide, WorkerSide, SessionSide, AdminSide):
    """Knows every job and worker; places jobs with the pure scheduler; never polls.

    The calls are grouped by who makes them, one base each: ``ClientSide`` (a user's jobs, logs,
    events, blobs), ``WorkerSide`` (the worker protocol), ``SessionSide`` (notebook sessions) and
    ``AdminSide`` (users, tokens, secrets, providers, audit). ``Wiring`` builds the parts they
    call and connects them; its constructor takes the settings below.
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
