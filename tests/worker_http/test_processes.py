"""Real processes: ``gpulayer serve``, ``gpulayer worker`` and the CLI client, on 127.0.0.1."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpulayer_kernel.contracts import CommandWorkload, JobSpec, Resources
from gpulayer_kernel.testing import GL, ServeProcess, WorkerProcess, wait_until

pytestmark = pytest.mark.slow
PY = sys.executable


def gl(
    env: dict[str, str], *args: str, timeout: float = 60, stdin: str | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*GL, *args], capture_output=True, text=True, timeout=timeout, env=env, input=stdin
    )


@pytest.fixture
def client_env(tmp_path: Path) -> Iterator[dict[str, str]]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPULAYER_")}
    env["GPULAYER_HOME"] = str(tmp_path / "client-home")  # nothing local to find
    yield env


def wait_state(server: ServeProcess, job_id: str, states: set[str], timeout: float = 30) -> str:
    """The job's state once it is in one of ``states`` (or as it is at ``timeout``)."""
    with server.client() as c:
        with contextlib.suppress(TimeoutError):
            wait_until(lambda: c.get(job_id).state.value in states, timeout)
        return str(c.get(job_id).state.value)


def test_two_workers_cli_and_a_server_restart(tmp_path: Path, client_env: dict[str, str]) -> None:
    with ServeProcess(tmp_path / "home", heartbeat_timeout=15) as server:
        assert server.admin_token.startswith("glt_c_")
        join = server.create_token("join", ttl=600)
        env = {**client_env, **server.client_env()}
        with (
            WorkerProcess(server.url, join, name="w1", simulate_gpus=1, home=tmp_path / "w1"),
            WorkerProcess(server.url, join, name="w2", simulate_gpus=1, home=tmp_path / "w2"),
        ):
            workers = json.loads(gl(env, "workers", "--json").stdout)
            assert sorted(w["name"] for w in workers) == ["w1", "w2"]
            assert all(w["transport"] == "http" for w in workers)
            # `gpulayer run` streams the output and returns the exit code.
            r = gl(
                env,
                "run",
                "--worker",
                "w1",
                "--",
                PY,
                "-c",
                "import sys; print('hello from w1'); print('to stderr', file=sys.stderr)",
            )
            assert r.returncode == 0, r.stderr
            assert r.stdout == "hello from w1\n" and "to stderr" in r.stderr
            r = gl(env, "run", "--worker", "w2", "--", "sh", "-c", "echo w2 here; exit 3")
            assert r.returncode == 3 and r.stdout == "w2 here\n"
            # Both GPUs busy at once: each worker gets one job.
            with server.client() as c:
                spec = JobSpec(
                    workload=CommandWorkload(argv=["sleep", "1"]), resources=Resources(gpus=1)
                )
                slow = [c.submit(spec).id for _ in range(2)]
                for job_id in slow:
                    assert wait_state(server, job_id, {"succeeded"}) == "succeeded"
                placed = {c.get(j).placement.nodes[0].worker_name for j in slow}  # type: ignore[union-attr]
            assert placed == {"w1", "w2"}

            # A job runs across a control-plane crash and restart.
            job_id = gl(
                env,
                "run",
                "--detach",
                "--",
                PY,
                "-c",
                "import time; print('before', flush=True); time.sleep(2); "
                "print('after', flush=True)",
            ).stdout.strip()
            assert wait_state(server, job_id, {"running"}) == "running"
            server.restart(kill=True)
            follow = gl(env, "logs", "-f", job_id)
            assert follow.returncode == 0, follow.stderr
            assert follow.stdout == "before\nafter\n"
            jobs = json.loads(gl(env, "jobs", "--json").stdout)
            assert {j["id"]: j["state"] for j in jobs}[job_id] == "succeeded"
            # Both workers are back and take work.
            for name in ("w1", "w2"):
                r = gl(env, "run", "--worker", name, "--", "echo", f"{name} after restart")
                assert r.returncode == 0 and r.stdout == f"{name} after restart\n", r.stderr
            table = gl(env, "jobs").stdout
            assert "succeeded" in table and "failed" in table
            cancel_me = gl(env, "run", "--detach", "--", "sleep", "30").stdout.strip()
            assert wait_state(server, cancel_me, {"running"}) == "running"
            r = gl(env, "cancel", cancel_me)
            assert r.returncode == 0 and "cancelled" in r.stdout


def test_a_killed_worker_s_job_is_lost_after_the_heartbeat_timeout(
    tmp_path: Path, client_env: dict[str, str]
) -> None:
    with ServeProcess(tmp_path / "home", heartbeat_timeout=2) as server:
        join = server.create_token("join")
        env = {**client_env, **server.client_env()}
        worker = WorkerProcess(server.url, join, name="doomed", home=tmp_path / "w")
        with worker:
            job_id = gl(env, "run", "--detach", "--", "sleep", "60").stdout.strip()
            assert wait_state(server, job_id, {"running"}) == "running"
            t0 = time.monotonic()
            worker.kill(signal.SIGKILL)
            assert wait_state(server, job_id, {"lost"}, timeout=15) == "lost"
            assert time.monotonic() - t0 < 8
            with server.client() as c:
                job = c.get(job_id)
                assert job.reason is not None and "doomed" in job.reason
                assert [w.state.value for w in c.workers()] == ["lost"]


def test_secrets_and_tokens_never_reach_the_server_log(
    tmp_path: Path, client_env: dict[str, str]
) -> None:
    secret = "hf_TopSecretValue123"
    with ServeProcess(tmp_path / "home", args=("--max-wait", "30")) as server:
        env = {**client_env, **server.client_env(), "GPULAYER_LOG_LEVEL": "DEBUG"}
        join = server.create_token("join")
        r = gl(env, "secret", "set", "HF_TOKEN", stdin=secret + "\n")
        assert r.returncode == 0 and secret not in r.stdout + r.stderr
        assert gl(env, "secret", "list").stdout == "HF_TOKEN\n"
        with WorkerProcess(
            server.url,
            join,
            name="w",
            home=tmp_path / "w",
            env={**client_env, "GPULAYER_LOG_LEVEL": "DEBUG"},
        ) as worker:
            r = gl(
                env,
                "run",
                "--secret",
                "HF_TOKEN",
                "--",
                PY,
                "-c",
                "import os; s = os.environ['HF_TOKEN']; print('it is', s); "
                "print(s[:3], end='', flush=True); print(s[3:])",
            )
            assert r.returncode == 0, r.stderr
            assert r.stdout == "it is ***\n***\n"
            shown = gl(env, "show", "--", r.stderr.split("job ")[1].split()[0]).stdout
            assert secret not in shown
            # A token in the URL is refused, and the access log never has query strings.
            import httpx

            resp = httpx.get(server.url + "/api/v1/jobs", params={"t": server.admin_token})
            assert resp.status_code == 400
        # The admin token is printed once, on the line that says so; never logged.
        shown_once = [line for line in server.output().splitlines() if "shown once" in line]
        assert len(shown_once) == 1 and server.admin_token in shown_once[0]
        logs = "\n".join(
            line
            for line in (server.output() + worker.output()).splitlines()
            if "shown once" not in line
        )
        for text in (
            secret,
            server.admin_token,
            join,
            # The secret part: glt_<k>_<id>_<secret>, and the secret itself may hold "_".
            server.admin_token.split("_", 3)[3],
            join.split("_", 3)[3],
        ):
            assert text not in logs
        assert "GET /api/v1/jobs" in server.output() or "/api/v1" in server.output()


def test_the_tls_rule_from_the_command_line(tmp_path: Path, client_env: dict[str, str]) -> None:
    r = gl(client_env, "serve", "--home", str(tmp_path / "h"), "--host", "0.0.0.0", "--port", "0")
    assert r.returncode == 2
    assert "refusing to serve plain HTTP on 0.0.0.0" in r.stderr and "--tls-cert" in r.stderr
    env = {**client_env, "GPULAYER_JOIN_TOKEN": "glt_j_0123456789ab_x"}
    r = gl(env, "worker", "--server", "http://10.1.2.3:8470", "--simulate-gpus", "1")
    assert r.returncode == 2
    assert "refusing plain http:// to 10.1.2.3" in r.stderr and "https://10.1.2.3:8470" in r.stderr
    env = {**client_env, "GPULAYER_URL": "http://gpu-head.example:8470", "GPULAYER_TOKEN": "x"}
    r = gl(env, "jobs")
    assert r.returncode == 2 and "refusing plain http://" in r.stderr


def test_everything_works_over_https_with_a_private_ca(
    tmp_path: Path, client_env: dict[str, str]
) -> None:
    trustme = pytest.importorskip("trustme")
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1", "localhost")
    ca_file, cert_file, key_file = tmp_path / "ca.pem", tmp_path / "cert.pem", tmp_path / "key.pem"
    ca.cert_pem.write_to_path(str(ca_file))
    cert.cert_chain_pems[0].write_to_path(str(cert_file))
    for blob in cert.cert_chain_pems[1:]:
        with cert_file.open("ab") as f:
            f.write(blob.bytes())
    cert.private_key_pem.write_to_path(str(key_file))
    with ServeProcess(
        tmp_path / "home",
        args=("--tls-cert", str(cert_file), "--tls-key", str(key_file), "--ca-cert", str(ca_file)),
    ) as srv:
        assert srv.url.startswith("https://127.0.0.1:")
        with srv.client(ca_cert=str(ca_file)) as c:
            _, join = c.create_token("join")
        # Without the CA the client says how to fix it.
        env = {**client_env, **srv.client_env()}
        r = gl(env, "jobs")
        assert r.returncode == 2 and "GPULAYER_CA_CERT" in r.stderr
        env["GPULAYER_CA_CERT"] = str(ca_file)
        with WorkerProcess(
            srv.url, join, name="tls-w", home=tmp_path / "w", args=("--ca-cert", str(ca_file))
        ):
            r = gl(env, "run", "--", "echo", "over https")
            assert r.returncode == 0 and r.stdout == "over https\n", r.stderr
        # A local command finds the server and its CA through the lock file.
        local = {**client_env, "GPULAYER_HOME": str(tmp_path / "home")}
        r = gl(local, "jobs", "--json")
        assert r.returncode == 0, r.stderr
        assert json.loads(r.stdout)[0]["state"] == "succeeded"
