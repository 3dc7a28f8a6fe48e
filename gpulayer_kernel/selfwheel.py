"""The wheel of the GPUlayer this process runs, for workers to install (ADR 0017, issue 24).

A control plane serves it (``GET /api/v1/dist/…``, ``api/dist.py``) so that workers run the
version it runs and need no published package. Where it comes from, first match wins:

1. ``$GPULAYER_DIST``: a wheel file, or a folder holding ``gpulayer-<this version>-*.whl``
   (a release's own artifact, or ``pip wheel --no-deps -w DIR .`` in a checkout);
2. the installed distribution, packed back into a wheel once per version and cached under the
   per-user cache (``$GPULAYER_CACHE_DIR/dist``): what pip installed is exactly what a wheel
   holds, so the files listed in its ``RECORD`` (less pip's own additions) are the wheel.

An editable install (a checkout, ``pip install -e .``) has no files to pack: it must set
``$GPULAYER_DIST``, and is told so.
"""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import json
import os
import tempfile
import zipfile
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import IO

from ._version import __version__
from .errors import NotFound

DIST_ENV = "GPULAYER_DIST"
PROJECT = "gpulayer"
# What pip writes into an installed .dist-info that no wheel carries.
_INSTALLER_FILES = {"INSTALLER", "REQUESTED", "direct_url.json", "RECORD"}


@dataclass(frozen=True)
class Wheel:
    """One wheel file, ready to serve."""

    path: Path
    sha256: str
    size: int

    @property
    def name(self) -> str:
        return self.path.name


def _unavailable(why: str) -> NotFound:
    return NotFound(
        f"this control plane cannot serve its wheel: {why}",
        hint=f"build it (pip wheel --no-deps -w DIR . in the checkout) and start `gpulayer serve` "
        f"with {DIST_ENV}=DIR; or install workers with install-worker.sh --package SPEC",
        details={"version": __version__},
        code="dist_unavailable",
    )


def served_wheel(env: dict[str, str] | None = None) -> Wheel:
    """The wheel to serve: ``$GPULAYER_DIST``'s, else the installed distribution packed."""
    env = dict(os.environ) if env is None else env
    configured = env.get(DIST_ENV)
    if configured:
        return _describe(_configured(Path(configured)))
    from .capabilities.machine import cache_dir

    return _describe(pack_installed(cache_dir(env) / "dist"))


def _configured(path: Path) -> Path:
    if path.is_file():
        if not path.name.startswith(f"{PROJECT}-{__version__}-") or path.suffix != ".whl":
            raise _unavailable(f"{DIST_ENV}={path} is not a gpulayer {__version__} wheel")
        return path
    found = sorted(path.glob(f"{PROJECT}-{__version__}-*.whl")) if path.is_dir() else []
    if not found:
        raise _unavailable(f"{DIST_ENV}={path} holds no {PROJECT}-{__version__}-*.whl")
    return found[-1]


def _describe(path: Path) -> Wheel:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return Wheel(path, digest.hexdigest(), path.stat().st_size)


def pack_installed(cache: Path, dist: metadata.Distribution | None = None) -> Path:
    """The installed distribution as a wheel under ``cache`` (made once per version)."""
    dist = dist or metadata.distribution(PROJECT)
    direct = json.loads(dist.read_text("direct_url.json") or "{}")
    if direct.get("dir_info", {}).get("editable"):
        raise _unavailable("it runs from an editable install (a checkout)")
    wheel_meta = dist.read_text("WHEEL") or ""
    tags = [ln.split(":", 1)[1].strip() for ln in wheel_meta.splitlines() if ln.startswith("Tag:")]
    tag = tags[0] if tags else "py3-none-any"
    target = cache / f"{PROJECT}-{dist.version}-{tag}.whl"
    if target.is_file():
        return target
    files = [f for f in dist.files or () if _packed(f)]
    if not files:
        raise _unavailable("the installed distribution lists no files (no RECORD)")
    cache.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".wheel-", dir=cache)
    try:
        with os.fdopen(fd, "wb") as out:
            _write_wheel(out, dist, files)
        os.replace(tmp, target)  # atomic: two servers packing at once each leave a whole file
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return target


def _packed(f: metadata.PackagePath) -> bool:
    parts = f.parts
    if ".." in parts or "__pycache__" in parts or f.suffix == ".pyc":
        return False  # scripts pip wrote into bin/, and bytecode it compiled
    return not (parts[0].endswith(".dist-info") and parts[-1] in _INSTALLER_FILES)


def _write_wheel(
    out: IO[bytes], dist: metadata.Distribution, files: list[metadata.PackagePath]
) -> None:
    info = next(p.parts[0] for p in files if p.parts[0].endswith(".dist-info"))
    record = io.StringIO()
    rows = csv.writer(record, lineterminator="\n")
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as zf:
        for f in sorted(files, key=str):
            data = Path(str(dist.locate_file(f))).read_bytes()
            zf.writestr(str(f), data)
            sha = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            rows.writerow([str(f), f"sha256={sha}", len(data)])
        rows.writerow([f"{info}/RECORD", "", ""])
        zf.writestr(f"{info}/RECORD", record.getvalue())
