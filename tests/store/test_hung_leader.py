"""Clients get past a hung leader, and past a standby that answers a HEAD (issue 32, items 4, 5).

An active and a standby ``gpulayer serve`` on one real PostgreSQL database. The leader is
SIGSTOPped: its port still accepts connections (the kernel completes the handshake) and nothing
answers, the case a 30 s request timeout spent whole on one URL. With the hung leader first in
the URLs:

- ``gpulayer jobs`` answers once the standby leads (it failed after 31 s with ``ReadTimeout``);
- a client moves to the next URL within ~2 s of the hang (the log says when);
- a worker given both URLs stays in service on the new leader (its heartbeats move on) and runs
  the next job there;
- ``HttpLink`` (a Jupyter host's kernel link) takes several URLs and fails over the same way.

And with the standby first: ``gpulayer run --files`` works (``HEAD /bundles/{sha}`` got a
body-less 503 the client could not read as ``not_leader``); every answer names its role in the
``GPUlayer-Role`` header, HEAD included.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from gpulayer_kernel.client.clients import Client
from gpulayer_kernel.contracts import CommandWorkload, JobSpec, JobState
from gpulayer_kernel.errors import NotFound
from gpulayer_kernel.ha.failover import LEADER_HEADER, ROLE_HEADER
from gpulayer_kernel.kernels.link import HttpLink
from gpulayer_kernel.testing import GL, ServeProcess, WorkerProcess
from gpulayer_kernel.testing.postgres import PostgresServer

pytestmark = pytest.mark.slow

MOVED_WITHIN = 3.0  # seconds from a request's start to its move off the hung leader (~2 s)
ANSWERED_WITHIN = 15.0  # the standby leads ~5 s after the hang; then a round or two


@contextlib.contextmanager
def pair(pg: PostgresServer, tmp_path: Path) -> Iterator[tuple[ServeProcess, ServeProcess]]:
    db = pg.create_database()
    args = ("--db", db, "--artifacts", str(tmp_path / "blobs"))
    args += ("--secrets-key", str(tmp_path / "secrets.key"))
    a = ServeProcess(tmp_path / "a", heartbeat_timeout=8, args=args, standby=True)
    b = ServeProcess(tmp_path / "b", heartbeat_timeout=8, args=args, standby=True)
    try:
        a.start().wait_leading()
        b.start()
        yield a, b
    finally:
        for s in (a, b):
            if s.alive():
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(s.pid, signal.SIGCONT)  # a stopped process ignores SIGTERM
            s.stop()


def gl(
    *argv: str, env: dict[str, str], cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*GL, *argv], env=env, cwd=cwd, capture_output=True, text=True, timeout=120
    )


def client_env(urls: str, token: str, tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPULAYER_")}
    env.update(GPULAYER_URL=urls, GPULAYER_TOKEN=token, GPULAYER_HOME=str(tmp_path / "cli"))
    return env


def test_a_sigstopped_leader_is_passed_by_cli_client_worker_and_kernel_link(
    gl_postgres: PostgresServer, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with pair(gl_postgres, tmp_path) as (a, b):
        urls = f"{a.url},{b.url}"
        join = a.create_token("join")
        with WorkerProcess(urls, join, name="w1", home=tmp_path / "w1") as worker:
            os.killpg(a.pid, signal.SIGSTOP)  # hung: connections accepted, nothing answered
            hung = time.monotonic()

            # A client: its first move off the hung leader comes within ~2 s.
            caplog.set_level(logging.INFO, logger="gpulayer.failover")
            with Client(urls, a.admin_token) as c:
                started = time.time()  # a log record's time is the wall clock's
                c.workers()
                answered = time.monotonic() - hung
                moves = [r for r in caplog.records if "moving from" in r.getMessage()]
                assert moves and a.url in moves[0].getMessage(), caplog.text
                first_move = moves[0].created - started
                assert first_move <= MOVED_WITHIN, f"first move after {first_move:.2f}s"
                assert answered <= ANSWERED_WITHIN, f"answered {answered:.2f}s after the hang"
                assert b.url in c.servers.url

                # The command line, the hung server still first.
                took = time.monotonic()
                jobs = gl("jobs", env=client_env(urls, a.admin_token, tmp_path))
                took = time.monotonic() - took
                assert jobs.returncode == 0, jobs.stderr
                assert took <= ANSWERED_WITHIN, f"gpulayer jobs took {took:.2f}s"

                # The worker followed: in service on b well past b's heartbeat timeout after it
                # took over (its heartbeats moved on; they used to hang on a and it was lost),
                # and it runs b's next job (its work long-poll moves after its own timeout).
                time.sleep(max(0.0, hung + 20.0 - time.monotonic()))
                (w,) = [x for x in c.workers() if x.id == worker.worker_id]
                assert w.live, w
                job = c.submit(JobSpec(workload=CommandWorkload(argv=["true"])))
                done = c.wait(job.id, timeout=90)
                assert done.state == JobState.SUCCEEDED, done
            print(f"hung leader: first move {first_move:.2f}s, answered {answered:.2f}s, "
                  f"gpulayer jobs {took:.2f}s")  # fmt: skip

            # The kernel link takes both URLs and gets past the hung one too.
            async def explain() -> float:
                link = HttpLink(urls, a.admin_token)
                try:
                    t = time.monotonic()
                    with pytest.raises(NotFound):
                        await link.explain("0123456789ab")  # answered by b: no such job
                    return time.monotonic() - t
                finally:
                    await link.close()

            linked = asyncio.run(explain())
            assert linked <= ANSWERED_WITHIN, f"the kernel link took {linked:.2f}s"


def test_gpulayer_run_files_works_with_the_standby_first(
    gl_postgres: PostgresServer, tmp_path: Path
) -> None:
    with pair(gl_postgres, tmp_path) as (a, b):
        # Every answer says its role, HEAD included (no body to say it with).
        digest = "0" * 64
        head_b = httpx.head(f"{b.url}/api/v1/bundles/{digest}")
        assert head_b.status_code == 503 and head_b.content == b""
        assert head_b.headers[ROLE_HEADER] == "standby"
        assert head_b.headers[LEADER_HEADER].rstrip("/").endswith(str(a.port))
        head_a = httpx.head(
            f"{a.url}/api/v1/bundles/{digest}",
            headers={"Authorization": f"Bearer {a.admin_token}"},
        )
        assert head_a.status_code == 404 and head_a.headers[ROLE_HEADER] == "leader"
        assert httpx.get(f"{b.url}/api/v1/health").headers[ROLE_HEADER] == "standby"

        urls = f"{b.url},{a.url}"  # the standby first
        join = a.create_token("join")
        with WorkerProcess(urls, join, name="w1", home=tmp_path / "w1"):
            work = tmp_path / "here"
            work.mkdir()
            (work / "numbers.txt").write_text("1 2 3\n")
            env = client_env(urls, a.admin_token, tmp_path)
            run = gl("run", "--files", "numbers.txt", "--", "cat", "numbers.txt", env=env, cwd=work)
        assert run.returncode == 0, run.stdout + run.stderr
        assert run.stdout == "1 2 3\n"


@pytest.mark.parametrize("several", [False, True])
def test_a_client_timeout_is_short_per_url_only_where_it_can_move(several: bool) -> None:
    """The rule itself: a short connect and first-byte timeout per URL, doubled each round;
    one URL, a long-poll's own timeout, or a write that must not be sent twice: the full one."""
    from gpulayer_kernel.ha.failover import Servers

    s = Servers("http://a:1,http://b:2" if several else "http://a:1")
    get = s.timeout("GET", 0, default=30.0, own=None)
    post = s.timeout("POST", 0, default=30.0, own=None)
    keyed = s.timeout("POST", 0, default=30.0, own=None, keyed=True)
    poll = s.timeout("GET", 0, default=30.0, own=55.0)
    later = s.timeout("GET", 2, default=30.0, own=None)
    if several:
        assert (get.connect, get.read) == (2.0, 2.0)
        assert (keyed.connect, keyed.read) == (2.0, 2.0)
        assert (post.connect, post.read) == (2.0, 30.0)
        assert (poll.connect, poll.read) == (2.0, 55.0)
        assert (later.connect, later.read) == (4.0, 4.0)  # the second round waits longer
    else:
        for t in (get, post, keyed, later):
            assert (t.connect, t.read) == (10.0, 30.0)
        assert (poll.connect, poll.read) == (10.0, 55.0)
