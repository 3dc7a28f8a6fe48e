"""A Trainer fit inside a real 2-rank session shows its progress while it runs (issue 36)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from gpulayer_kernel.contracts import CellState
from gpulayer_kernel.controlplane import ControlPlane

from ..conftest import WorkerFactory
from ..sessions.conftest import run, spec, up

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.slow, pytest.mark.torch]

FIT = """\
from gpulayer_kernel.torch import Trainer, distributed_loader
from gpulayer_kernel.torch.testing import TinyRegressor, regression_data
torch.manual_seed(0)
result = Trainer(max_steps=6, log_every=2, loggers=[], checkpoint_at_end=False).fit(
    TinyRegressor(), distributed_loader(regression_data(64), batch_size=4)
)
result.step
"""


@pytest.fixture(autouse=True)
def _torch_in_session_zygote(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("GPULAYER_SESSION_PRELOAD", "torch")
    yield


async def test_a_fit_in_a_two_rank_session_prints_its_progress_lines(
    gl_cp: ControlPlane, gl_worker: WorkerFactory
) -> None:
    await gl_worker(gpus=2)
    await gl_cp.start_session(spec(gpus=2))
    await up(gl_cp, "s1", timeout=120)
    page = await run(gl_cp, "s1", "import torch\n" + FIT)
    assert page.cell.state == CellState.OK, page
    lines = [r.text for r in page.records if r.stream == "stdout" and r.text.startswith("step")]
    assert [line.split()[1] for line in lines] == ["2/6", "4/6", "6/6"], lines
    assert {r.rank for r in page.records if r.text.startswith("step")} == {0}, "rank zero only"
    assert "samples/s" in lines[0]
