"""The panel's contract types and values agree with the Python contracts.

``labextension/src/api/contracts.generated.ts`` is generated from
``gpulayer_kernel/contracts/schema.json`` (itself checked against the models by test_contracts)
and checked in, so a contract change that skips the TypeScript side fails here, not in a
browser. The generator's ``--check`` mode does the comparing; one test feeds it a changed schema
to show that the check can fail. The few values the panel writes by hand (a sentinel id, a label
key, which job states are final) are read from ``labextension/src/api/contracts.ts`` and
compared with their Python constants.

Without Node.js/jlpm the generator tests skip on a developer machine and fail in CI (``CI``
set), where install.sh provides both.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from gpulayer_kernel.contracts import TERMINAL_STATES, JobState
from gpulayer_kernel.contracts.workers import HIDDEN_JOB
from gpulayer_kernel.jupyter.cellspec import NOTEBOOK_LABEL

ROOT = Path(__file__).resolve().parents[1]
SCHEMA = ROOT / "gpulayer_kernel" / "contracts" / "schema.json"
GENERATED = ROOT / "labextension" / "src" / "api" / "contracts.generated.ts"
HAND_WRITTEN = ROOT / "labextension" / "src" / "api" / "contracts.ts"
FIX = "python -m gpulayer_kernel.contracts.schema && jlpm build:contracts"
VENV_BIN = str(Path(sys.executable).parent)


def _check_contracts(*args: str) -> subprocess.CompletedProcess[str]:
    """``jlpm check:contracts ARGS``: the generator in check mode, as CI and developers run it."""
    path = os.pathsep.join([VENV_BIN, os.environ.get("PATH", "")])
    jlpm = shutil.which("jlpm", path=path)
    if jlpm is None or shutil.which("node") is None or not (ROOT / "node_modules").is_dir():
        message = "jlpm/node or node_modules not available (./install.sh --dev installs them)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    return subprocess.run(
        [jlpm, "check:contracts", *args],
        cwd=ROOT,
        env={**os.environ, "PATH": path},
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_checked_in_contract_types_match_schema_json() -> None:
    r = _check_contracts()
    # The generator's own message names the file, the first differing line and the command.
    assert r.returncode == 0, r.stderr[-3000:] + r.stdout[-1000:]
    assert "matches" in r.stdout


def _with_property(node: Any, title: str, name: str) -> int:
    """Add a string property ``name`` to every schema of ``title`` in ``node``; how many."""
    count = 0
    if isinstance(node, dict):
        if node.get("title") == title and "properties" in node:
            node["properties"][name] = {"type": "string"}
            count += 1
        for child in node.values():
            count += _with_property(child, title, name)
    elif isinstance(node, list):
        for child in node:
            count += _with_property(child, title, name)
    return count


def test_the_check_fails_on_a_changed_schema_and_names_the_fix(tmp_path: Path) -> None:
    # A contract grew a field (the everyday change) but the TypeScript was not regenerated.
    schema = json.loads(SCHEMA.read_text())
    # WorkerInfo is also inlined as a `$defs` entry of the contracts that carry one; the
    # generator refuses two different definitions under one name, so change every copy.
    assert _with_property(schema, "WorkerInfo", "probe_field") >= 1
    changed = tmp_path / "schema.json"
    changed.write_text(json.dumps(schema))

    r = _check_contracts("--schema", str(changed))

    assert r.returncode == 1, r.stdout + r.stderr
    assert "labextension/src/api/contracts.generated.ts is stale" in r.stderr
    assert "probe_field: string;" in r.stderr  # the first line that differs
    assert FIX in r.stderr
    assert GENERATED.read_text().count("probe_field") == 0  # --check writes nothing


def _ts_string(name: str) -> str:
    found = re.search(rf"export const {name} = '([^']*)';", HAND_WRITTEN.read_text())
    assert found, f"{HAND_WRITTEN.relative_to(ROOT)} has no `export const {name} = '…';`"
    return found.group(1)


def test_the_panels_sentinel_and_label_are_the_python_ones() -> None:
    assert _ts_string("HIDDEN_JOB") == HIDDEN_JOB
    assert _ts_string("NOTEBOOK_LABEL") == NOTEBOOK_LABEL


def test_the_panels_final_job_states_are_the_python_ones() -> None:
    # contracts.ts says per state whether it is final (a Record, so tsc rejects a new state
    # left out); this holds its answers to the Python rule.
    text = HAND_WRITTEN.read_text()
    record = re.search(r"const FINAL[^=]*= \{(?P<body>[^}]*)\}", text)
    assert record, f"{HAND_WRITTEN.relative_to(ROOT)} has no `const FINAL = {{…}}` record"
    final = {
        m.group(1): m.group(2) == "true"
        for m in re.finditer(r"(\w+): (true|false)", record.group("body"))
    }
    assert final == {state.value: state in TERMINAL_STATES for state in JobState}
