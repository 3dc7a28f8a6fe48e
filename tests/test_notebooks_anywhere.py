"""``pytest --nbval-lax notebooks`` works from any path (issue 32, item 12).

The documented command (docs/quickstart.md) failed: with ``-n 4`` (the default addopts) xdist
split a notebook's cells across workers, and 30 cells failed with ``NameError``, because the
grouping lived in ``tests/conftest.py``, which a run given only ``notebooks`` never loads. It
lives in the root ``conftest.py`` now. Run here from another directory, on two workers, as a
user would: one notebook whose cells need each other's names.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_a_notebook_runs_whole_on_two_workers_from_another_directory(tmp_path: Path) -> None:
    notebook = ROOT / "notebooks" / "01-quickstart.ipynb"
    # The run's own settings only: nothing of this (outer) run's workers or groups file.
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("PYTEST_", "GPULAYER_TEST_", "GPULAYER_URL", "GPULAYER_TOKEN"))
    }
    env["GPULAYER_HOME"] = str(tmp_path / "home")
    r = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--nbval-lax",
         str(notebook), "-n", "2", "-q"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
    assert "NameError" not in r.stdout
    assert " passed" in r.stdout and "failed" not in r.stdout
