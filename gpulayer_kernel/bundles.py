"""Content-addressed source bundles: a deterministic tar whose sha256 is its identity.

The same files give the same digest on any machine and any day: entries are sorted, and mtimes,
owners and modes are fixed. Unpacking is defensive: it checks the digest first, then lets
``tarfile``'s ``data`` filter refuse absolute paths, ``..``, links that leave the target and device
files (Python 3.11's default filter is unsafe, so the filter is always passed explicitly).
"""

from __future__ import annotations

import hashlib
import io
import os
import shutil
import tarfile
import tempfile
from collections.abc import Iterable, Mapping
from pathlib import Path, PurePosixPath

from .display import human_bytes
from .errors import BundleError

MAX_BUNDLE_BYTES = 256 << 20
# Folders that tools leave beside the code and no job needs: bytecode and Jupyter's autosaves.
IGNORED_DIRS = frozenset({"__pycache__", ".ipynb_checkpoints"})
_FIXED_MTIME = 0


def digest_of(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _check_name(name: str) -> str:
    p = PurePosixPath(name)
    if not name or p.is_absolute() or ".." in p.parts or name.startswith("./"):
        raise BundleError(
            f"bundle entry {name!r} is not a relative path inside the bundle",
            hint="name bundle files with relative paths such as 'pkg/mod.py'",
            details={"entry": name},
        )
    return str(p)


def build(files: Mapping[str, bytes]) -> tuple[str, bytes]:
    """Pack ``{relative path: content}`` into a deterministic tar; returns (sha256, bytes)."""
    buf = io.BytesIO()
    # format=PAX with no pax headers for plain ASCII names; GNU/PAX both deterministic here.
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name in sorted(_check_name(n) for n in files):
            data = files[name]
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mtime = _FIXED_MTIME
            info.mode = 0o644
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            tar.addfile(info, io.BytesIO(data))
    raw = buf.getvalue()
    return digest_of(raw), raw


def build_from_paths(
    paths: Iterable[Path], base: Path, extra: Mapping[str, bytes] = {}
) -> tuple[str, bytes]:
    """Bundle files (and folders, recursively) named relative to ``base``, plus ``extra``."""
    files: dict[str, bytes] = dict(extra)
    for path in paths:
        full = path if path.is_absolute() else base / path
        if not full.exists():
            raise BundleError(
                f"file {str(path)!r} does not exist",
                hint=f"paths are relative to {base}",
                details={"path": str(path)},
            )
        members = sorted(full.rglob("*")) if full.is_dir() else [full]
        for member in members:
            if member.is_file() and not IGNORED_DIRS.intersection(member.parts):
                try:
                    rel = member.resolve().relative_to(base.resolve())
                except ValueError:
                    rel = (
                        Path(member.name) if not full.is_dir() else member.relative_to(full.parent)
                    )
                files[rel.as_posix()] = member.read_bytes()
    return build(files)


def verify(data: bytes, digest: str) -> None:
    actual = digest_of(data)
    if actual != digest:
        raise BundleError(
            f"bundle content has sha256 {actual[:12]}…, not the {digest[:12]}… it claims",
            hint="the upload was corrupted or altered; upload the bundle again",
            details={"expected": digest, "actual": actual},
        )


def check_archive(data: bytes, digest: str) -> None:
    """Refuse what is not a bundle at all (empty, compressed, not a tar, no files), by name."""
    if len(data) > MAX_BUNDLE_BYTES:
        raise BundleError(
            f"bundle {digest[:12]}… is {human_bytes(len(data))}; the limit is "
            f"{human_bytes(MAX_BUNDLE_BYTES)}",
            hint="ship large data as artifacts or on the worker's disk, not in the bundle",
            details={"digest": digest, "bytes": len(data)},
        )
    with _open_tar(data, digest) as tar:
        members = tar.getmembers()
        for member in members:
            _check_member(member, digest)
    if not any(m.isfile() for m in members):
        raise BundleError(
            f"bundle {digest[:12]}… holds no files",
            hint="a bundle is a tar of the files a job runs; build it with gpulayer_kernel.bundles",
            details={"digest": digest},
        )


def _open_tar(data: bytes, digest: str) -> tarfile.TarFile:
    """An uncompressed tar over ``data``, or a BundleError that says what the bytes are."""
    if not data:
        raise BundleError(
            f"bundle {digest[:12]}… is empty (0 bytes)",
            hint="a bundle is a tar of the files a job runs; build it with gpulayer_kernel.bundles",
            details={"digest": digest},
        )
    what = "gzip-compressed" if data[:2] == b"\x1f\x8b" else "not a tar archive"
    try:
        return tarfile.open(fileobj=io.BytesIO(data), mode="r:")
    except tarfile.TarError:
        raise BundleError(
            f"bundle {digest[:12]}… is {what}",
            hint="bundles are plain (uncompressed) tar archives; build them with "
            "gpulayer_kernel.bundles.build",
            details={"digest": digest},
        ) from None


def unpack(data: bytes, digest: str, target: Path) -> Path:
    """Verify ``data`` against ``digest`` and unpack it into ``target`` (atomically)."""
    verify(data, digest)
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    check_archive(data, digest)
    tmp = Path(tempfile.mkdtemp(prefix=".unpack-", dir=target.parent))
    try:
        with _open_tar(data, digest) as tar:
            try:
                tar.extractall(tmp, filter="data")
            except tarfile.FilterError as exc:
                raise BundleError(
                    f"bundle {digest[:12]}… has an unsafe entry: {exc}",
                    hint="bundles may hold only regular files with relative paths",
                    details={"digest": digest},
                ) from None
        try:
            os.rename(tmp, target)
        except OSError:
            if not target.exists():  # lost a race with another unpacker: theirs is identical
                raise
            shutil.rmtree(tmp, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return target


def _check_member(member: tarfile.TarInfo, digest: str) -> None:
    """Bundles are source code: regular files and folders with relative paths, nothing else.

    The ``data`` filter would silently strip a leading ``/`` and allow links that stay inside;
    refusing them outright makes a hand-crafted archive fail loudly instead.
    """
    path = PurePosixPath(member.name)
    problem = None
    if path.is_absolute():
        problem = "is an absolute path"
    elif ".." in path.parts:
        problem = "climbs out with '..'"
    elif member.issym() or member.islnk():
        problem = f"is a link to {member.linkname!r}"
    elif not (member.isfile() or member.isdir()):
        problem = "is not a regular file (device, fifo or other special file)"
    if problem:
        raise BundleError(
            f"bundle {digest[:12]}… entry {member.name!r} {problem}",
            hint="bundles may hold only regular files with relative paths",
            details={"digest": digest, "entry": member.name},
        )


def read_files(data: bytes) -> dict[str, bytes]:
    """Return the regular files of a bundle (for tests and inspection)."""
    out: dict[str, bytes] = {}
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as tar:
        for member in tar.getmembers():
            if member.isfile():
                f = tar.extractfile(member)
                assert f is not None
                out[member.name] = f.read()
    return out
