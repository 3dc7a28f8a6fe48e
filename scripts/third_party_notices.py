"""Write THIRD-PARTY-NOTICES.md from the panel's production build (what the wheel bundles).

    jlpm build:prod && python scripts/third_party_notices.py

A production build (``jupyter-builder build``) writes ``static/third-party-licenses.json``: every
npm package whose code is inside the bundle, with its licence text. tests/release checks that the
checked-in notice is what this script makes from a fresh build, so a new bundled dependency cannot
ship without its notice.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
REPORT = Path("gpulayer_kernel/labextension/static/third-party-licenses.json")
NOTICE = Path("THIRD-PARTY-NOTICES.md")

HEAD = """# Third-party notices

GPUlayer is licensed under the Apache License 2.0 (`LICENSE`, `NOTICE`). Its wheel bundles one
piece of other people's code: the JupyterLab panel, installed as
`share/jupyter/labextensions/@gpulayer/jupyterlab`, is built from GPUlayer's TypeScript together
with the npm packages below. JupyterLab, Lumino and React are not in the bundle (JupyterLab
provides them to extensions at run time), and Python dependencies are installed by pip as
packages of their own, each with its own licence.

The same list ships machine-readable in the panel as `static/third-party-licenses.json`. This file
is generated: `jlpm build:prod && python scripts/third_party_notices.py` (tests/release checks it).
"""


def render(report: dict[str, list[dict[str, str]]]) -> str:
    """The notice for a ``third-party-licenses.json`` report, packages sorted by name."""
    parts = [HEAD]
    for pkg in sorted(report["packages"], key=lambda p: p["name"]):
        text = pkg["extractedText"].strip() or "(the package ships no licence text)"
        parts.append(
            f"\n## {pkg['name']} {pkg['versionInfo']} ({pkg['licenseId'] or 'unknown licence'})\n"
            f"\n```text\n{text}\n```\n"
        )
    return "".join(parts)


def main(argv: list[str]) -> int:
    root = Path(argv[1]) if len(argv) > 1 else ROOT
    report = root / REPORT
    if not report.exists():
        print(f"{report} is missing: run `jlpm build:prod` first", file=sys.stderr)
        return 1
    (root / NOTICE).write_text(render(json.loads(report.read_text())))
    print(f"wrote {root / NOTICE}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
