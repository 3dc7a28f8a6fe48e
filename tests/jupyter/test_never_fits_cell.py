"""A cell whose job can never run, in a terminal IPython (issue 23, item 6): its reason shows
once, and no hint points at a traceback that is not there."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from .conftest import CLEAR_ENV

SCRIPT = """\
%load_ext gpulayer_kernel
get_ipython().run_cell_magic("gpulayer", "--gpus 64", "print('hi')\\n")
"""


def test_a_never_fits_cell_says_why_once_with_a_true_hint(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in CLEAR_ENV}
    env |= {"GPULAYER_HOME": str(tmp_path / "home"), "IPYTHONDIR": str(tmp_path / "ipython")}
    script = tmp_path / "cell.ipy"
    script.write_text(SCRIPT)
    ran = subprocess.run(
        [sys.executable, "-m", "IPython", "--no-banner", "--colors=NoColor", str(script)],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd=tmp_path,
    )
    shown = re.sub(r"\x1b\[[0-9;]*m", "", ran.stdout + ran.stderr)
    assert shown.count("can never run on the workers here") == 1, shown
    assert "Submit it with --wait" in shown  # the reason carries its own advice
    assert "JobFailed" in shown and "(why: above)" in shown, shown
    assert "traceback" not in shown.lower(), shown  # there is none: the job never started
    assert "`" not in shown, shown
