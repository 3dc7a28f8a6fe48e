"""Sessions on a real control plane with in-process workers (``gl_cp``, ``gl_worker``).

Session ranks are real processes forked from the worker's session zygote. Most tests need only
IPython in them (``GPULAYER_SESSION_PRELOAD`` empty: the zygote starts in ~0.2 s); those that
use torch preload it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterator

import pytest

from gpulayer_kernel.contracts import (
    CellPage,
    CellRequest,
    Resources,
    SessionHolder,
    SessionInfo,
    SessionSpec,
    SessionStatus,
)
from gpulayer_kernel.controlplane import ControlPlane
from gpulayer_kernel.testing import until

HOLDER = SessionHolder(client="kernel-a", notebook="train.ipynb", kernel="k-a")


@pytest.fixture(autouse=True)
def _no_torch_in_session_zygote(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("GPULAYER_SESSION_PRELOAD", "")
    yield


def spec(name: str = "s1", **resources: object) -> SessionSpec:
    return SessionSpec(name=name, holder=HOLDER, resources=Resources(**resources))  # type: ignore[arg-type]


async def up(cp: ControlPlane, name: str, timeout: float = 60.0) -> SessionInfo:
    """The session once it is idle (its ranks said ready)."""

    async def ready() -> bool:
        return (await cp.get_session(name)).status in (SessionStatus.IDLE, SessionStatus.ENDED)

    await until(ready, timeout, what=f"session {name} to come up")
    info = await cp.get_session(name)
    assert info.status == SessionStatus.IDLE, info
    return info


async def run(cp: ControlPlane, name: str, code: str, **fields: object) -> CellPage:
    """One cell to its end (following it when it outlives the first answer)."""
    fields.setdefault("client", HOLDER.client)
    page = await cp.run_cell(name, CellRequest(code=code, **fields), wait=30)  # type: ignore[arg-type]
    records = list(page.records)
    while not page.finished:
        page = await cp.follow_cell(name, page.cell.number, page.next_since, wait=30)
        records += page.records
    return page.model_copy(update={"records": records})


Run = Callable[..., Awaitable[CellPage]]
