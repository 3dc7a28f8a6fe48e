"""``gpulayer quota set`` for a user who does not exist: refused, saying so (issue 23, item 6)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from gpulayer_kernel.testing import GL


@pytest.mark.slow  # ~6 s with two xdist workers on two cores
def test_the_cli_refuses_a_quota_for_a_user_who_does_not_exist(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPULAYER_")}
    env["GPULAYER_HOME"] = str(tmp_path / "home")  # the state directory, opened by the CLI

    def gl(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*GL, *args], capture_output=True, text=True, timeout=60, env=env)

    refused = gl("quota", "set", "--user", "nobody", "--max-gpus", "2")
    assert refused.returncode == 2, refused.stderr
    assert "gpulayer: error: no user 'nobody'" in refused.stderr
    assert "gpulayer: hint: " in refused.stderr and "gpulayer user add nobody" in refused.stderr
    assert "`" not in refused.stderr  # plain text: no code marks
    assert "nobody" not in gl("quota", "list").stdout
    assert gl("user", "add", "nobody").returncode == 0
    done = gl("quota", "set", "--user", "nobody", "--max-gpus", "2")
    assert done.returncode == 0 and "quota of user:nobody: max GPUs 2" in done.stdout, done.stderr
