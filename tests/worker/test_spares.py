"""Spares (worker/spares.py): job processes forked ahead of time. A spare that died while idle
is dropped and replaced, never handed a job; a job handed to a spare runs in that spare."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from gpulayer_kernel.testing import until
from gpulayer_kernel.worker.config import ExecutorConfig
from gpulayer_kernel.worker.warm import WarmRunner
from gpulayer_kernel.worker.zygote_client import ZygoteClient

POOL = 2


def _env() -> dict[str, str]:
    return {"PATH": os.environ["PATH"], "GPULAYER_JOB_ID": "spare-test"}


async def _run(runner: WarmRunner, cwd: Path) -> tuple[int, int, str]:
    """One Python job that prints its own pid: (the launched pid, exit code, its stdout)."""
    child = await runner.spawn("pid.py", cwd, _env())
    assert child is not None, "the warm runner fell back to the cold spawn"
    assert child.stdout is not None
    out = await child.stdout.read()
    code = await child.wait()
    child.close()
    return child.pid, code, out.decode()


async def _pool_full(runner: WarmRunner) -> None:
    await until(lambda: runner.spares() == POOL, 30, what=f"{POOL} idle spares")
    # Each leads its own process group from the moment its pid is known (the zygote answers
    # only once the child's setsid is done): a kill of its group is never lost (ESRCH).
    assert all(os.getpgid(p) == p for p in runner.spare_pids())


async def test_a_job_takes_an_idle_spare_and_the_pool_is_replenished(tmp_path: Path) -> None:
    (tmp_path / "pid.py").write_text("import os; print(os.getpid())\n")
    runner = WarmRunner(ExecutorConfig(work_root=tmp_path), preload=lambda: (), pool=POOL)
    try:
        await _run(runner, tmp_path)  # starts the zygote, which then forks the spares
        await _pool_full(runner)
        idle = set(runner.spare_pids())
        supervisor, code, _ = await _run(runner, tmp_path)
        assert code == 0
        assert supervisor in idle  # no fork on the job's path: it ran in a spare
        await _pool_full(runner)  # one asked for after the use
        assert supervisor not in runner.spare_pids()
    finally:
        runner.close()


async def test_a_spare_that_died_idle_is_never_handed_a_job_and_is_replaced(
    tmp_path: Path,
) -> None:
    (tmp_path / "pid.py").write_text("import os; print(os.getpid())\n")
    runner = WarmRunner(ExecutorConfig(work_root=tmp_path), preload=lambda: (), pool=POOL)
    try:
        await _run(runner, tmp_path)
        await _pool_full(runner)
        killed = runner.spare_pids()
        for pid in killed:  # killed while idle (the OOM killer, a stray kill -9)
            os.killpg(pid, signal.SIGKILL)
        # At once, before the zygote's exit reports can arrive: the dead spares must be told
        # apart from live ones at hand-off and the job forked on demand instead.
        supervisor, code, out = await _run(runner, tmp_path)
        assert (code, out.strip().isdigit()) == (0, True), out
        assert supervisor not in killed
        await _pool_full(runner)
        assert not set(runner.spare_pids()) & set(killed)
        # and the replacements serve
        again, code, _ = await _run(runner, tmp_path)
        assert code == 0 and again not in killed
    finally:
        runner.close()


async def test_without_a_pool_every_job_is_forked_when_it_comes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Spares come only when the client asks the zygote for them (at start, and when a job's end
    # is reported, before ``wait`` returns): record every ask rather than sleep and look for none.
    asked: list[int] = []
    ask = ZygoteClient._ask

    def recording(self: ZygoteClient, n: int) -> None:
        asked.append(n)
        ask(self, n)

    monkeypatch.setattr(ZygoteClient, "_ask", recording)
    (tmp_path / "pid.py").write_text("import os; print(os.getpid())\n")
    runner = WarmRunner(ExecutorConfig(work_root=tmp_path), preload=lambda: (), pool=0)
    try:
        for _ in range(2):
            _, code, out = await _run(runner, tmp_path)
            assert code == 0 and out.strip().isdigit()
        assert [n for n in asked if n > 0] == []
        assert runner.spares() == 0
    finally:
        runner.close()
