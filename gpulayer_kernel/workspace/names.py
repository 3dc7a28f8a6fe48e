"""File names in a workspace: how they travel, which are refused, and writing inside a folder only.

A name is the file's path relative to the workspace, as bytes (Linux names need not be UTF-8):
it travels as UTF-8 text in ``FileEntry.path``, with the raw bytes beside it (``raw``, base64)
when they are not UTF-8. A name from the other side is checked before use (:func:`checked`):
relative, no ``..``, no empty or ``.`` part, no NUL. Writing goes through :func:`write_inside`,
which opens every directory on the way with ``O_NOFOLLOW`` relative to the one before: a symlink
planted anywhere on the path (``out -> /home/alice``) makes the write fail rather than land outside
the folder, whatever a name says. Files are written to a temporary name beside the target and
renamed over it, so a reader (or a crash) sees the old content or the new, never a mix.
"""

from __future__ import annotations

import base64
import contextlib
import errno
import os
import secrets
from collections.abc import Iterator

from ..contracts.workspace import MAX_PATH, FileEntry
from ..errors import GPUlayerError, InvalidInput

TMP_PREFIX = ".gpulayer-tmp-"  # temporary files of a write; left ones are removed at start


class DiskFull(GPUlayerError):
    """The disk under a workspace filled while writing (nothing half-written is left)."""

    code = "workspace_disk_full"
    status = 507


def wire(rel: bytes) -> tuple[str, str | None]:
    """``rel`` as ``FileEntry.path`` and ``raw``: UTF-8 text, plus the bytes when not UTF-8."""
    try:
        return rel.decode("utf-8"), None
    except UnicodeDecodeError:
        return rel.decode("utf-8", "backslashreplace"), base64.b64encode(rel).decode()


def name_of(entry: FileEntry) -> bytes:
    """The bytes an entry names (checked: see :func:`checked`)."""
    raw = base64.b64decode(entry.raw) if entry.raw is not None else entry.path.encode()
    return checked(raw)


def shown(rel: bytes) -> str:
    """A name as a sentence shows it (non-UTF-8 bytes escaped, newlines visible)."""
    return repr(rel.decode("utf-8", "backslashreplace"))[1:-1]


def checked(rel: bytes, field: str = "path") -> bytes:
    """``rel`` if it is a relative path that stays inside its folder, else InvalidInput."""
    parts = rel.split(b"/")
    bad = (
        not rel
        or len(rel) > MAX_PATH
        or rel.startswith(b"/")
        or b"\x00" in rel
        or any(p in (b"", b".", b"..") for p in parts)
    )
    if bad:
        raise InvalidInput(
            f"workspace file name {shown(rel)!r} is not a relative path inside the folder",
            hint="names are relative ('data/x.csv'): no '..', no leading '/', no empty part",
            details={"field": field, "name": shown(rel)},
            code="workspace_unsafe_name",
        )
    return rel


@contextlib.contextmanager
def _dir_fd(root: str | os.PathLike[str], parts: list[bytes], create: bool) -> Iterator[int]:
    """The fd of ``root/parts...``, each part opened without following a symlink."""
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for part in parts:
            try:
                nxt = os.open(
                    part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd
                )
            except FileNotFoundError:
                if not create:
                    raise
                os.mkdir(part, 0o755, dir_fd=fd)
                nxt = os.open(
                    part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd
                )
            except OSError as exc:
                if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                    raise _escapes(parts, part) from None
                raise
            os.close(fd)
            fd = nxt
        yield fd
    finally:
        os.close(fd)


def _escapes(parts: list[bytes], part: bytes) -> InvalidInput:
    name = b"/".join(parts)
    return InvalidInput(
        f"workspace path {shown(name)!r} goes through {shown(part)!r}, which is a symlink or "
        "not a folder: not written (it could lead out of the notebook's folder)",
        hint="remove or rename that entry if the file should be written there",
        details={"name": shown(name)},
        code="workspace_unsafe_name",
    )


def write_inside(root: str | os.PathLike[str], rel: bytes, data: bytes, mode: int) -> None:
    """Write ``data`` at ``root/rel`` atomically, never outside ``root`` (see the module)."""
    checked(rel)
    *dirs, leaf = rel.split(b"/")
    with _dir_fd(root, dirs, create=True) as dfd:
        with contextlib.suppress(FileNotFoundError):
            st = os.stat(leaf, dir_fd=dfd, follow_symlinks=False)
            import stat as _stat

            if _stat.S_ISLNK(st.st_mode) or _stat.S_ISDIR(st.st_mode):
                raise _escapes(dirs + [leaf], leaf)
        tmp = (TMP_PREFIX + secrets.token_hex(6)).encode()
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        fd = os.open(tmp, flags, 0o600, dir_fd=dfd)
        try:
            try:
                view = memoryview(data)
                while view:
                    n = os.write(fd, view)
                    view = view[n:]
                os.fchmod(fd, mode & 0o777)
            finally:
                os.close(fd)
            os.rename(tmp, leaf, src_dir_fd=dfd, dst_dir_fd=dfd)
        except BaseException as exc:
            with contextlib.suppress(OSError):
                os.unlink(tmp, dir_fd=dfd)
            if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
                raise DiskFull(
                    f"the disk under {os.fsdecode(root)} is full: {shown(rel)!r} was not written "
                    "(the file there is unchanged)",
                    hint="free space there, or exclude large files in .gpulayerignore",
                    details={"name": shown(rel)},
                ) from None
            raise


def read_inside(root: str | os.PathLike[str], rel: bytes) -> bytes | None:
    """``root/rel``'s bytes (None if absent); no symlink is followed on the way."""
    checked(rel)
    *dirs, leaf = rel.split(b"/")
    try:
        with _dir_fd(root, dirs, create=False) as dfd:
            fd = os.open(leaf, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dfd)
            with os.fdopen(fd, "rb") as f:
                return f.read()
    except (FileNotFoundError, NotADirectoryError, InvalidInput):
        return None  # a symlink on the way counts as absent
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            return None
        raise


def remove_inside(root: str | os.PathLike[str], rel: bytes) -> bool:
    """Remove the file ``root/rel`` (not a symlink's target, not a folder); False if absent."""
    checked(rel)
    *dirs, leaf = rel.split(b"/")
    try:
        with _dir_fd(root, dirs, create=False) as dfd:
            os.unlink(leaf, dir_fd=dfd)
            return True
    except (FileNotFoundError, NotADirectoryError, IsADirectoryError, InvalidInput):
        return False


def move_aside(root: str | os.PathLike[str], rel: bytes, tag: str) -> bytes | None:
    """Rename ``root/rel`` to a conflict name beside it (``x.worker-1.csv``); the new name."""
    checked(rel)
    *dirs, leaf = rel.split(b"/")
    stem, dot, ext = leaf.rpartition(b".")
    if not stem:
        stem, dot, ext = leaf, b"", b""
    try:
        with _dir_fd(root, dirs, create=False) as dfd:
            for n in range(1, 1000):
                new = stem + f".{tag}-{n}".encode() + dot + ext
                try:
                    os.stat(new, dir_fd=dfd, follow_symlinks=False)
                except FileNotFoundError:
                    os.rename(leaf, new, src_dir_fd=dfd, dst_dir_fd=dfd)
                    return b"/".join([*dirs, new])
    except (FileNotFoundError, NotADirectoryError):
        return None
    return None


def clean_temporaries(root: str | os.PathLike[str]) -> int:
    """Remove the temporary files a killed write left under ``root``; how many."""
    n = 0
    for dirpath, _dirs, files in os.walk(os.fsencode(root)):
        for f in files:
            if f.startswith(TMP_PREFIX.encode()):
                with contextlib.suppress(OSError):
                    os.unlink(os.path.join(dirpath, f))
                    n += 1
    return n
