"""``gpulayer providers``, ``costs`` and ``budgets`` on an embedded control plane: what they
print, and every bad input refused with the field named and the next step (exit 2)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from gpulayer_kernel.testing import GL

pytestmark = pytest.mark.slow


def gl(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPULAYER_")}
    env["GPULAYER_HOME"] = str(home)
    return subprocess.run([*GL, *args], env=env, capture_output=True, text=True, timeout=60)


def test_budgets_costs_and_providers_from_the_command_line(tmp_path: Path) -> None:
    home = tmp_path / "home"
    none = gl(home, "providers")
    assert none.returncode == 0 and "no providers configured" in none.stdout
    made = gl(home, "budgets", "set", "team", "--project", "vision", "--limit", "5")
    assert made.returncode == 0, made.stderr
    assert "project vision" in made.stdout and "$5.00" in made.stdout
    listed = gl(home, "budgets")
    assert "team" in listed.stdout and "month / warn" in listed.stdout
    assert gl(home, "budgets", "delete", "team").returncode == 0
    again = gl(home, "budgets", "delete", "team")
    assert again.returncode == 2 and "no budget 'team'" in again.stderr
    assert "gpulayer budgets" in again.stderr  # the hint
    costs = gl(home, "costs", "--since", "7d")
    assert costs.returncode == 0 and "no costs recorded since then" in costs.stdout
    bad = gl(home, "costs", "--since", "someday")
    assert bad.returncode == 2 and "--since 'someday' is neither a duration" in bad.stderr
    negative = gl(home, "budgets", "set", "x", "--user", "ada", "--limit", "-1")
    assert negative.returncode == 2 and "limit" in negative.stderr


def test_a_broken_providers_file_is_refused_naming_the_field(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    (home / "providers.toml").write_text(
        '[providers.fake]\nkind = "fake"\n[[providers.fake.offers]]\nname = "x"\ngpus = 1\n'
    )
    r = gl(home, "providers")
    assert r.returncode == 2
    assert "providers.fake.offers.0.price_per_hour: Field required" in r.stderr
    assert "give every offer a price" in r.stderr
