"""The docs site (issue 18, item 2): ``mkdocs build --strict`` of the real docs, and proof that
the strictness bites (a broken link fails; a page not yet in the nav does not)."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from gpulayer_kernel.api import operations

from .conftest import ROOT

# Builds and installs into fresh environments: past 120 s when xdist workers share the cores.
pytestmark = pytest.mark.timeout(600)

MKDOCS = Path(sys.executable).parent / "mkdocs"


def hooks() -> ModuleType:
    spec = importlib.util.spec_from_file_location("docs_site", ROOT / "scripts" / "docs_site.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def build(root: Path, site: Path) -> subprocess.CompletedProcess[str]:
    if not MKDOCS.exists():
        pytest.fail("mkdocs is missing: install.sh --dev installs the docs extra")
    return subprocess.run(
        [str(MKDOCS), "build", "--strict", "--site-dir", str(site)],
        cwd=root,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.mark.slow
def test_the_site_builds_strict_with_every_part(tmp_path: Path) -> None:
    site = tmp_path / "site"
    r = build(ROOT, site)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-5000:]
    assert "WARNING" not in r.stderr, r.stderr
    python = (site / "reference" / "python" / "index.html").read_text()
    assert "JobSpec" in python and "open_session" in python  # from the docstrings
    assert "Trainer" in (site / "reference" / "torch" / "index.html").read_text()
    assert "AsyncClient" in (site / "reference" / "client" / "index.html").read_text()
    http = (site / "reference" / "http-api" / "index.html").read_text()
    for template, method, _, _ in operations():
        path = template.replace(":path", "")
        assert f"{method.upper()} {path}" in http, (method, template)
    assert (site / "reference" / "openapi.json").exists()
    for adr in (ROOT / "adr").glob("0*.md"):
        assert (site / "adr" / adr.stem / "index.html").exists(), adr.name
    assert (site / "changelog" / "index.html").exists()
    assert (site / "releasing" / "index.html").exists()


def copy_of_the_docs(tmp: Path) -> Path:
    root = tmp / "repo"
    for name in ("docs", "adr"):
        shutil.copytree(ROOT / name, root / name)
    (root / "scripts").mkdir()
    shutil.copy2(ROOT / "scripts" / "docs_site.py", root / "scripts")
    for name in ("mkdocs.yml", "CHANGELOG.md", "RELEASING.md"):
        shutil.copy2(ROOT / name, root / name)
    return root


@pytest.mark.slow
def test_a_broken_link_fails_and_a_new_guide_joins_the_nav(tmp_path: Path) -> None:
    root = copy_of_the_docs(tmp_path)
    guide = root / "docs" / "brand-new.md"
    guide.write_text("# A brand-new guide\n\nSee [the quickstart](quickstart.md).\n")
    r = build(root, tmp_path / "ok")
    assert r.returncode == 0, r.stderr[-3000:]
    nav = (tmp_path / "ok" / "index.html").read_text()
    assert "More guides" in nav and "A brand-new guide" in nav
    guide.write_text("# A brand-new guide\n\nSee [nothing](no-such-page.md).\n")
    r = build(root, tmp_path / "broken")
    assert r.returncode != 0
    assert "contains a link 'no-such-page.md', but the target is not found" in r.stderr


def test_links_are_rewritten_from_the_repository_to_the_site() -> None:
    h = hooks()
    pages = h.repo_pages()
    assert pages["adr/README.md"] == "adr/index.md"
    text = (
        "[a](../adr/0007-distributed-launch-and-rendezvous.md#decision) [b](quickstart.md) "
        "[c](https://example.org/x.md) [d](images/panel-dark.png) [e](../adr/README.md) "
        "[f](../gpulayer_kernel/errors.py)"
    )
    out = h.rewrite_links(text, "docs/distributed.md", "distributed.md", pages)
    assert "[a](adr/0007-distributed-launch-and-rendezvous.md#decision)" in out
    assert "[b](quickstart.md)" in out and "[c](https://example.org/x.md)" in out
    assert "[d](images/panel-dark.png)" in out and "[e](adr/index.md)" in out
    assert "[f](../gpulayer_kernel/errors.py)" in out  # not a page: --strict reports it
    adr = h.rewrite_links(
        "[g](../docs/security.md) [h](0003-worker-protocol-and-authentication.md) "
        "[i](../CHANGELOG.md)",
        "adr/0009-security-and-workload-isolation.md",
        "adr/0009-security-and-workload-isolation.md",
        pages,
    )
    assert "[g](../security.md)" in adr and "[i](../changelog.md)" in adr
    assert "[h](0003-worker-protocol-and-authentication.md)" in adr


def test_the_front_pages_install_what_exists_today() -> None:
    """Issue 32, item 7: the README and docs/index.md told a new user to
    `pip install "gpulayer[jupyter,torch]"`, which fails while no release is published. They
    show what works today first (a checkout's install.sh, the wheel it builds, or a server's
    /api/v1/dist), and the published form only as what comes after a release."""
    for page in (ROOT / "README.md", ROOT / "docs" / "index.md"):
        text = page.read_text()
        assert "pip wheel --no-deps -w dist ." in text and "/api/v1/dist" in text, page
        published = 'pip install "gpulayer[jupyter,torch]"'
        for at in [i for i in range(len(text)) if text.startswith(published, i)]:
            before = text[max(0, at - 200) : at]
            assert "Once a release is" in before, f"{page.name}: {text[at - 200 : at + 40]!r}"
        assert "./install.sh" in text
