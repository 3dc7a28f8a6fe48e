"""Every snippet of docs/migrating.md runs: read from the file, so docs and tests cannot drift.

GPUlayer snippets run in order in one namespace after the set-up block (as cells of a notebook
would); Lightning and accelerate snippets the same way, when those packages are installed. The
``ipython gpulayer`` snippet (the notebook_launcher replacement) runs cell by cell in a real
kernel, as a two-rank job on simulated GPUs.
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")

DOC = Path(__file__).resolve().parents[2] / "docs" / "migrating.md"
FENCE = re.compile(
    r"^```(python|ipython) (setup|gpulayer|lightning|accelerate)\n(.*?)^```$", re.M | re.S
)

pytestmark = pytest.mark.torch


def snippets(kind: str, language: str = "python") -> list[str]:
    return [
        code
        for lang, tag, code in FENCE.findall(DOC.read_text())
        if tag == kind and lang == language
    ]


def run_in_order(kind: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "GPULAYER_JOB_ID", "GPULAYER_CONTROL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("GPULAYER_OUTPUT", str(tmp_path / "output"))
    monkeypatch.chdir(tmp_path)  # the snippets' logs and checkpoints land here
    namespace: dict[str, Any] = {"__name__": "__migrating__"}
    [setup] = snippets("setup")
    exec(compile(setup, "migrating.md: setup", "exec"), namespace)
    found = snippets(kind)
    assert found, f"no {kind} snippets in {DOC}"
    for i, code in enumerate(found, 1):
        exec(compile(code, f"migrating.md: {kind} snippet {i}", "exec"), namespace)


def test_the_page_has_the_snippets_it_promises() -> None:
    assert len(snippets("gpulayer")) == 6 and len(snippets("lightning")) == 5
    assert len(snippets("accelerate")) == 2 and len(snippets("gpulayer", "ipython")) == 1


@pytest.mark.slow  # ~2-4 s with two xdist workers on two cores (it trains)
def test_gpulayer_snippets_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    run_in_order("gpulayer", tmp_path, monkeypatch)
    assert (tmp_path / "gpulayer-logs" / "metrics.csv").is_file()
    assert (tmp_path / "gpulayer-state" / "state.pt").is_file()


@pytest.mark.slow
@pytest.mark.skipif(
    importlib.util.find_spec("lightning") is None,
    reason="lightning is not installed (pip install -e '.[benchmark]' runs these snippets)",
)
def test_lightning_snippets_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Lightning's advice (workers, log intervals) is noise
        run_in_order("lightning", tmp_path, monkeypatch)


@pytest.mark.skipif(
    importlib.util.find_spec("accelerate") is None,
    reason="accelerate is not installed (pip install accelerate runs these snippets)",
)
def test_accelerate_snippets_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from accelerate.state import AcceleratorState, PartialState

    # accelerate keeps one process-wide state, and its notebook_launcher refuses to start once any
    # Accelerator exists ("Restart your notebook"): the page's two snippets are two notebooks, so
    # each starts as a fresh kernel would, and the state is left clean for the tests after.
    def fresh() -> None:
        AcceleratorState._reset_state(reset_partial_state=True)
        PartialState._reset_state()

    fresh()
    try:
        for i, code in enumerate(snippets("accelerate"), 1):
            namespace: dict[str, Any] = {"__name__": "__migrating__"}
            for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "GPULAYER_JOB_ID"):
                monkeypatch.delenv(name, raising=False)
            monkeypatch.chdir(tmp_path)
            [setup] = snippets("setup")
            exec(compile(setup, "migrating.md: setup", "exec"), namespace)
            exec(compile(code, f"migrating.md: accelerate snippet {i}", "exec"), namespace)
            fresh()
    finally:
        fresh()
    assert (tmp_path / "accelerate-state").is_dir()


@pytest.mark.slow
def test_the_notebook_cell_replacing_notebook_launcher_runs_in_a_kernel(tmp_path: Path) -> None:
    pytest.importorskip("ipykernel")
    from tests.jupyter.conftest import started_kernel

    [code] = snippets("gpulayer", "ipython")
    cells = [c.strip() for c in code.split("# %%") if c.strip()]
    with started_kernel(tmp_path) as kernel:
        for source in cells:
            run = kernel.run(source, timeout=110)
            assert run.ok, (source[:60], run.reply["content"], run.stream())
