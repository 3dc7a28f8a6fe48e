"""The ControlPlane's front (issue 34): every public call of its services is one of its own,
resolving to the service's method, and the front adds nothing of its own beyond its settings."""

from __future__ import annotations

import inspect

from gpulayer_kernel.controlplane import ControlPlane
from gpulayer_kernel.controlplane.admin_side import AdminCalls
from gpulayer_kernel.controlplane.client_side import BlobCalls, JobCalls, ViewCalls
from gpulayer_kernel.controlplane.front import via
from gpulayer_kernel.controlplane.sessions.side import SessionCalls
from gpulayer_kernel.controlplane.worker_side import WorkerCalls

SERVICES = {
    "job_calls": JobCalls,
    "blob_calls": BlobCalls,
    "view_calls": ViewCalls,
    "worker_calls": WorkerCalls,
    "session_calls": SessionCalls,
    "admin_calls": AdminCalls,
}
WIRED_ONLY = {"session_holds", "upload"}  # service calls the wiring hands a part, not a client


def test_every_service_call_is_on_the_front_and_only_them() -> None:
    fronted = {n: v for n, v in vars(ControlPlane).items() if isinstance(v, via)}
    for attr, cls in SERVICES.items():
        for name, fn in inspect.getmembers(cls, inspect.isfunction):
            if name.startswith("_") or name in WIRED_ONLY:
                continue
            assert name in fronted, f"ControlPlane lacks {cls.__name__}.{name}: add a via line"
            assert fronted[name].service == attr, name
            assert getattr(ControlPlane, name) is fn, name  # the class shows the service's own
    assert ControlPlane.__bases__ == (ControlPlane.__mro__[1],)  # one base: the wiring


async def test_a_call_on_the_front_runs_on_its_service(gl_cp: ControlPlane) -> None:
    assert gl_cp.submit == gl_cp.job_calls.submit
    assert gl_cp.get_session == gl_cp.session_calls.get_session
    assert "submit" in vars(gl_cp)  # bound once: later calls read the instance's attribute
