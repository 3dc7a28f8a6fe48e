"""What a notebook's folder can hold that a workspace must refuse, skip or survive, on a real
file system: too many files, a huge (sparse) file, symlinks out, FIFOs, sockets, unreadable
files, odd names, a file rewritten while it is read, and names that try to leave the folder."""

from __future__ import annotations

import base64
import os
import shutil
import socket
import tempfile
import threading
import time
from pathlib import Path

import pytest

from gpulayer_kernel.contracts.workspace import FileEntry
from gpulayer_kernel.errors import InvalidInput
from gpulayer_kernel.workspace.index import Changing, read_stable
from gpulayer_kernel.workspace.names import (
    checked,
    name_of,
    read_inside,
    remove_inside,
    wire,
    write_inside,
)
from gpulayer_kernel.workspace.scan import IGNORE_FILE, Caps, Rules, WorkspaceTooBig, scan


@pytest.mark.slow
def test_a_folder_of_300k_files_is_refused_fast_naming_the_biggest_entry(tmp_path: Path) -> None:
    # On tmpfs where there is one: 300k files take ~2 s to make there, minutes on a busy disk.
    base = Path(tempfile.mkdtemp(dir="/dev/shm")) if os.path.isdir("/dev/shm") else tmp_path
    root = base / "home"
    cache = root / "cache"
    cache.mkdir(parents=True)
    (root / "notebook.ipynb").write_text("{}")
    (root / "data.csv").write_text("a\n1\n")
    try:
        for d in range(300):
            sub = cache / f"{d:03}"
            sub.mkdir()
            fd = os.open(sub, os.O_RDONLY)
            for i in range(1000):
                os.close(os.open(f"f{i}", os.O_CREAT | os.O_WRONLY, 0o644, dir_fd=fd))
            os.close(fd)
        t0 = time.monotonic()
        with pytest.raises(WorkspaceTooBig) as err:
            scan(root, Caps(files=50_000))
        took = time.monotonic() - t0
        assert took < 5.0  # it stops at the cap, not after 300k stats
        assert err.value.code == "workspace_too_big" and err.value.status == 413
        assert "over 50,000 files" in err.value.message
        assert "cache/" in err.value.message  # the entry that holds them
        assert str(root / IGNORE_FILE) in err.value.hint and "`cache/`" in err.value.hint
        # nothing was touched: every file is still there
        assert (root / "data.csv").read_text() == "a\n1\n"
        assert len(os.listdir(cache / "299")) == 1000
        # following the hint makes it a workspace
        (root / IGNORE_FILE).write_text("cache/\n")
        found, _ = scan(root, Caps(files=50_000))
        assert {f.rel for f in found} == {b"notebook.ipynb", b"data.csv", IGNORE_FILE.encode()}
    finally:
        shutil.rmtree(base if base != tmp_path else cache, ignore_errors=True)


def test_a_10_gib_file_is_refused_at_once_naming_it(tmp_path: Path) -> None:
    (tmp_path / "small.py").write_text("x = 1\n")
    with open(tmp_path / "weights.bin", "wb") as f:
        f.truncate(10 << 30)  # sparse: 10 GiB that takes no disk
    t0 = time.monotonic()
    with pytest.raises(WorkspaceTooBig) as err:
        scan(tmp_path, Caps())
    assert time.monotonic() - t0 < 1.0  # sizes come from stat: nothing was read
    assert "weights.bin (10 GiB)" in err.value.message
    assert "/weights.bin" in err.value.hint and IGNORE_FILE in err.value.hint
    (tmp_path / IGNORE_FILE).write_text("*.bin\n")
    found, _ = scan(tmp_path, Caps())
    assert {f.rel for f in found} == {b"small.py", IGNORE_FILE.encode()}


def test_defaults_leave_out_git_virtualenvs_and_caches(tmp_path: Path) -> None:
    for p in (".git/HEAD", "venv/bin/python", "__pycache__/h.pyc", "env2/x.py", "src/m.py"):
        (tmp_path / p).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / p).write_text("x")
    (tmp_path / "env2" / "pyvenv.cfg").write_text("home = /usr\n")  # a virtualenv by any name
    (tmp_path / IGNORE_FILE).write_text("!venv/\n")  # a default taken back
    found, _ = scan(tmp_path, Caps())
    assert {f.rel for f in found} == {b"src/m.py", b"venv/bin/python", IGNORE_FILE.encode()}


def test_symlinks_fifos_and_sockets_are_skipped_with_a_note(tmp_path: Path) -> None:
    root = tmp_path / "nb"
    root.mkdir()
    outside = tmp_path / "secret.txt"
    outside.write_text("not yours")
    (root / "ok.txt").write_text("ok")
    (root / "out").symlink_to(outside)
    (root / "in").symlink_to(root / "ok.txt")
    os.mkfifo(root / "pipe")
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(root / "sock"))
    try:
        found, notes = scan(root, Caps())
    finally:
        sock.close()
    assert [f.rel for f in found] == [b"ok.txt"]
    text = "\n".join(notes.all())
    assert f"out: a symlink to {outside} (out of the folder), not followed" in text
    assert "in: a symlink to" in text and "(inside the folder)" in text
    assert "pipe: a FIFO, skipped" in text and "sock: a socket, skipped" in text


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to become another user")
def test_unreadable_files_are_skipped_with_a_note() -> None:
    base = Path(tempfile.mkdtemp())  # pytest's own folders are closed to other users
    os.chmod(base, 0o755)
    try:
        _unreadable(base)
    finally:
        shutil.rmtree(base, ignore_errors=True)


def _unreadable(tmp_path: Path) -> None:
    root = tmp_path / "nb"
    (root / "locked").mkdir(parents=True)
    (root / "ok.txt").write_text("ok")
    (root / "private.key").write_text("k")
    os.chmod(root / "private.key", 0)
    os.chmod(root / "locked", 0)
    for p in (tmp_path, root):
        os.chmod(p, 0o755)
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the scan runs as nobody, for whom those are unreadable
        os.close(r)
        try:
            os.setgid(65534)
            os.setuid(65534)
            found, notes = scan(root, Caps())
            os.write(w, ("|".join(f.rel.decode() for f in found) + "\n").encode())
            os.write(w, "\n".join(notes.all()).encode())
        finally:
            os._exit(0)
    os.close(w)
    with os.fdopen(r) as f:
        files, _, notes = f.read().partition("\n")
    os.waitpid(pid, 0)
    os.chmod(root / "locked", 0o755)
    assert files == "ok.txt"
    assert "private.key: not readable, skipped" in notes
    assert "locked/: not readable, skipped" in notes


def test_odd_names_travel_exactly(tmp_path: Path) -> None:
    names = [b"a\nb.txt", b"caf\xe9.csv", b"Data.csv", b"data.csv", "naïve.py".encode()]
    for n in names:
        path, raw = wire(n)
        entry = FileEntry(path=path, raw=raw, size=1, mode=0o644, digest="0" * 64)
        assert name_of(FileEntry.model_validate_json(entry.model_dump_json())) == n
        write_inside(tmp_path, n, n, 0o644)
    assert sorted(os.listdir(os.fsencode(tmp_path))) == sorted(names)
    assert wire(b"caf\xe9.csv") == ("caf\\xe9.csv", base64.b64encode(b"caf\xe9.csv").decode())
    found, _ = scan(tmp_path, Caps())
    assert sorted(f.rel for f in found) == sorted(names)


@pytest.mark.parametrize(
    "name",
    [b"../../.bashrc", b"/etc/passwd", b"a/../../b", b"", b"a//b", b"./x", b"x\x00y"],
    ids=["dotdot", "absolute", "climb", "empty", "empty-part", "dot", "nul"],
)
def test_names_that_leave_the_folder_are_refused(tmp_path: Path, name: bytes) -> None:
    with pytest.raises(InvalidInput) as err:
        checked(name)
    assert err.value.code == "workspace_unsafe_name"
    raw = base64.b64encode(name).decode()
    with pytest.raises(InvalidInput):
        name_of(FileEntry(path="x", raw=raw, size=0, mode=0o644, digest="0" * 64))


def test_a_symlink_on_the_way_is_never_written_through(tmp_path: Path) -> None:
    root, elsewhere = tmp_path / "nb", tmp_path / "elsewhere"
    root.mkdir()
    elsewhere.mkdir()
    (root / "out").symlink_to(elsewhere)
    (root / "link.txt").symlink_to(elsewhere / "target.txt")
    for name in (b"out/x.txt", b"link.txt"):
        with pytest.raises(InvalidInput) as err:
            write_inside(root, name, b"evil", 0o644)
        assert err.value.code == "workspace_unsafe_name"
    assert os.listdir(elsewhere) == []
    assert read_inside(root, b"out/x.txt") is None
    assert not remove_inside(root, b"out/x.txt")


def test_a_write_is_the_old_content_or_the_new_never_a_mix(tmp_path: Path) -> None:
    write_inside(tmp_path, b"d/f.bin", b"old" * 1000, 0o600)
    write_inside(tmp_path, b"d/f.bin", b"new" * 2000, 0o755)
    assert (tmp_path / "d" / "f.bin").read_bytes() == b"new" * 2000
    assert (tmp_path / "d" / "f.bin").stat().st_mode & 0o777 == 0o755
    assert os.listdir(tmp_path / "d") == ["f.bin"]  # no temporary left


def test_a_file_rewritten_while_read_is_read_whole_or_not_at_all(tmp_path: Path) -> None:
    path = tmp_path / "growing.csv"
    a, b = b"A" * (4 << 20), b"B" * (3 << 20)
    path.write_bytes(a)
    stop = threading.Event()

    def writer() -> None:  # rewrites in place, in pieces, as an editor without rename would
        flip = False
        while not stop.is_set():
            body = b if flip else a
            with open(path, "r+b") as f:
                f.truncate(0)
                for i in range(0, len(body), 1 << 20):
                    f.write(body[i : i + (1 << 20)])
                    f.flush()
            flip = not flip

    t = threading.Thread(target=writer)
    t.start()
    seen = {"whole": 0, "changing": 0}
    try:
        for _ in range(30):
            try:
                data, _ = read_stable(os.fsencode(path))
            except Changing as exc:
                assert "changed while being read" in str(exc)
                seen["changing"] += 1
                continue
            # A state the file was in: the old, the new, or the writer's own step (it
            # truncates, then writes 1 MiB at a time) — never A's bytes beside B's.
            assert set(data) <= {65} or set(data) <= {66}, "a mix of old and new"
            assert len(data) % (1 << 20) == 0
            seen["whole"] += 1
    finally:
        stop.set()
        t.join()
    assert sum(seen.values()) == 30


def test_rules_match_folders_and_files(tmp_path: Path) -> None:
    (tmp_path / IGNORE_FILE).write_text("data/raw/\n*.ckpt\n")
    rules = Rules(tmp_path)
    assert rules.ignored(b"data/raw", True)
    assert not rules.ignored(b"data", True)
    assert rules.ignored(b"models/last.ckpt", False)
    assert rules.ignored(b".git", True)
