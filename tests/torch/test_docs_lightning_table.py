"""docs/trainer.md's "Coming from Lightning" table: every row names a test, and that test exists
(a row whose test is renamed or removed fails here, so no row stays unbacked)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def rows() -> list[tuple[str, str]]:
    text = (ROOT / "docs" / "trainer.md").read_text()
    section = text.split("## Coming from Lightning", 1)[1].split("\n## ", 1)[0]
    found = []
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 3 and cells[0] not in ("Lightning", "---"):
            found.append((cells[0], cells[2]))
    return found


def test_every_row_of_the_lightning_table_names_a_test_that_exists() -> None:
    table = rows()
    assert len(table) >= 12, table
    for lightning, tested_by in table:
        match = re.fullmatch(r"`(test_\w+\.py)::(test_\w+)`", tested_by)
        assert match, f"row {lightning!r} names no test: {tested_by!r}"
        path = ROOT / "tests" / "torch" / match.group(1)
        assert path.is_file(), f"row {lightning!r}: no {path}"
        names = {
            node.name
            for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
        }
        assert match.group(2) in names, f"row {lightning!r}: {tested_by} does not exist"
