"""launch.py and ports.py on their own: torchrun's argv, the port it reserves, rank tags, reasons.

Fast tests, no job processes; one runs ``torchrun --help`` to check every flag we pass exists.
"""

from __future__ import annotations

import asyncio
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from gpulayer_kernel.clock import SYSTEM_CLOCK, Clock
from gpulayer_kernel.contracts import (
    Job,
    JobAssignment,
    JobSpec,
    NodePlacement,
    Rendezvous,
)
from gpulayer_kernel.errors import GPUlayerError
from gpulayer_kernel.job import OUTPUT_ENV
from gpulayer_kernel.testing import FakeClock, NullTransport, until
from gpulayer_kernel.worker import launch, ports
from gpulayer_kernel.worker.config import ExecutorConfig
from gpulayer_kernel.worker.exits import describe_exit
from gpulayer_kernel.worker.ports import PortReservations
from gpulayer_kernel.worker.transport import Transport

from .conftest import needs_torch


class FakeTransport(NullTransport):
    """Records rendezvous calls; ``get_rendezvous`` answers ``record`` or times out."""

    def __init__(self, record: Rendezvous | None = None, clock: Clock = SYSTEM_CLOCK) -> None:
        super().__init__(clock)
        self.published: list[tuple[str, Rendezvous]] = []
        self.record = record
        self.waits: list[float] = []

    async def publish_rendezvous(self, job_id: str, rdzv: Rendezvous) -> None:
        self.published.append((job_id, rdzv))

    async def get_rendezvous(self, job_id: str, wait: float) -> Rendezvous:
        self.waits.append(wait)
        if self.record is not None:
            return self.record
        return await super().get_rendezvous(job_id, wait)


def assignment(
    *,
    gpus: int = 2,
    nodes: int = 1,
    node_rank: int = 0,
    simulated: bool = True,
    devices: list[int] | None = None,
    argv: list[str] | None = None,
) -> JobAssignment:
    spec = JobSpec.model_validate(
        {
            "workload": {"kind": "command", "argv": argv or ["python", "train.py", "--lr", "1"]},
            "resources": {"gpus": gpus, "nodes": nodes},
        }
    )
    job = Job(id="job123456789", seq=1, spec=spec, submitted_at=0.0)
    node = NodePlacement(
        worker_id=f"w{node_rank}",
        worker_name=f"worker{node_rank}",
        devices=devices if devices is not None else list(range(gpus)),
        simulated=simulated,
        node_rank=node_rank,
    )
    return JobAssignment(job=job, node=node, nnodes=nodes)


def make(
    a: JobAssignment,
    tmp_path: Path,
    transport: Transport | None = None,
    *,
    held: PortReservations | None = None,
    clock: Clock = SYSTEM_CLOCK,
    **config: Any,
) -> tuple[launch.Launch, dict[str, str], list[str]]:
    said: list[str] = []
    cfg = ExecutorConfig(work_root=tmp_path, **config)
    env = {OUTPUT_ENV: str(tmp_path / "job" / "output")}
    lx = launch.Launch(
        a,
        transport or FakeTransport(),
        cfg,
        said.append,
        ports=held if held is not None else PortReservations(),
        clock=clock,
    )
    return lx, env, said


def flag(argv: list[str], name: str) -> str:
    for item in argv:
        if item.startswith(f"--{name}="):
            return item.split("=", 1)[1]
    raise AssertionError(f"--{name} not in {argv}")


# -- devices ------------------------------------------------------------------------------------


def test_device_env_names_exactly_the_placed_devices() -> None:
    real = launch.device_env(assignment(gpus=2, devices=[2, 5], simulated=False))
    assert real["CUDA_VISIBLE_DEVICES"] == "2,5" and real["GPULAYER_DEVICES"] == "2,5"
    sim = launch.device_env(assignment(gpus=2))
    assert sim["CUDA_VISIBLE_DEVICES"] == "" and sim["GPULAYER_SIMULATED"] == "1"


# -- ports --------------------------------------------------------------------------------------


def test_parse_ports_reads_lists_and_ranges() -> None:
    assert ports.parse_ports("29500-29502, 29600,") == [29500, 29501, 29502, 29600]
    with pytest.raises(GPUlayerError, match="'x' is not a port"):
        ports.parse_ports("29500,x")
    with pytest.raises(GPUlayerError, match="not within 1-65535"):
        ports.parse_ports("70000")


def _listener() -> socket.socket:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen()
    return s


def test_a_taken_port_is_skipped_and_the_next_one_reserved() -> None:
    worker = PortReservations()
    with _listener() as taken:
        busy = taken.getsockname()[1]
        free = ports.free_port()
        held = worker.reserve("127.0.0.1", [busy, free])
        try:
            assert held.getsockname()[1] == free and free in worker
            # The same worker never hands one port to two jobs at once.
            with pytest.raises(GPUlayerError, match=f"tried {busy}") as err:
                worker.reserve("127.0.0.1", [busy, free])
            assert "GPULAYER_RENDEZVOUS_PORTS" in err.value.hint
        finally:
            worker.release(held)
    assert free not in worker


def test_a_reserved_port_is_free_for_torchruns_store_only() -> None:
    worker = PortReservations()
    held = worker.reserve("127.0.0.1", [0])
    port = held.getsockname()[1]
    try:
        plain = socket.socket()
        with pytest.raises(OSError):  # nobody else binds it while we hold it...
            plain.bind(("127.0.0.1", port))
        plain.close()
        # ...but a store that sets SO_REUSEADDR, as torchrun's TCPStore does, binds and listens.
        store = socket.socket()
        store.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        store.bind(("127.0.0.1", port))
        store.listen()
        store.close()
    finally:
        worker.release(held)


def test_configured_ports_all_taken_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    with _listener() as taken:
        busy = taken.getsockname()[1]
        monkeypatch.setenv(ports.PORTS_ENV, f"{busy}")
        with pytest.raises(GPUlayerError, match=f"no free port for the rendezvous.*{busy}"):
            PortReservations().reserve("127.0.0.1")


def test_interface_for_finds_loopback_and_nothing_for_a_foreign_address() -> None:
    assert ports.interface_for("127.0.0.1") == "lo"
    assert ports.interface_for("192.0.2.77") is None  # TEST-NET-1: on no interface here


# -- argv ---------------------------------------------------------------------------------------


async def test_single_host_gang_runs_torchrun_with_a_static_rendezvous(tmp_path: Path) -> None:
    held = PortReservations()
    lx, env, said = make(assignment(gpus=2), tmp_path, held=held)
    argv = await lx.wrap(["python", "train.py", "--lr", "1"], env)
    try:
        assert argv[:3] == [sys.executable, "-m", "torch.distributed.run"]
        assert flag(argv, "nnodes") == "1" and flag(argv, "nproc-per-node") == "2"
        assert flag(argv, "node-rank") == "0" and flag(argv, "master-addr") == "127.0.0.1"
        port = int(flag(argv, "master-port"))
        assert lx.master == ("127.0.0.1", port) and port in held
        assert flag(argv, "max-restarts") == "0" and flag(argv, "tee") == "3"
        assert flag(argv, "log-dir") == str(tmp_path / "job" / "torchrun")
        rank_argv = argv[argv.index("--no-python") + 1 :]
        assert rank_argv[:2] == ["/bin/sh", "-c"]
        assert rank_argv[-4:] == [sys.executable, "train.py", "--lr", "1"]  # our python
        if launch._SETPRIV:
            assert [launch._SETPRIV, "--pdeathsig", "SIGKILL", "--"] == rank_argv[4:8]
        assert env["GPULAYER_WORLD_SIZE"] == "2" and "GLOO_SOCKET_IFNAME" not in env
        assert said == [
            f"torchrun: ranks 0-1 of 2 here (node 0 of 1), rendezvous at 127.0.0.1:{port}"
        ]
    finally:
        lx.close()
    assert port not in held


async def test_non_gang_jobs_run_as_they_are(tmp_path: Path) -> None:
    lx, env, _ = make(assignment(gpus=1), tmp_path)
    assert await lx.wrap(["python", "x.py"], env) == ["python", "x.py"]
    assert (env["RANK"], env["WORLD_SIZE"]) == ("0", "1")
    assert lx.splitter("stdout") is None and lx.failure_reason(1) is None


async def test_rank0_node_publishes_its_advertised_address(tmp_path: Path) -> None:
    t = FakeTransport()
    lx, env, _ = make(assignment(gpus=1, nodes=2), tmp_path, t, advertise_addr="127.0.0.1")
    argv = await lx.wrap(["python", "x.py"], env)
    try:
        ((job_id, rdzv),) = t.published
        assert job_id == "job123456789" and rdzv.master_addr == "127.0.0.1"
        assert flag(argv, "master-port") == str(rdzv.master_port)
        assert flag(argv, "nnodes") == "2" and env["GLOO_SOCKET_IFNAME"] == "lo"
        assert env["GPULAYER_WORLD_SIZE"] == "2"
    finally:
        lx.close()


async def test_other_nodes_use_the_published_record(tmp_path: Path) -> None:
    t = FakeTransport(Rendezvous(master_addr="10.213.0.1", master_port=29555))
    a = assignment(gpus=2, nodes=2, node_rank=1)
    lx, env, said = make(a, tmp_path, t, rendezvous_timeout=7.0)
    argv = await lx.wrap(["python", "x.py"], env)
    assert t.waits and t.waits[0] == pytest.approx(7.0, abs=0.5) and not t.published
    assert (flag(argv, "master-addr"), flag(argv, "master-port")) == ("10.213.0.1", "29555")
    assert flag(argv, "node-rank") == "1"
    assert said[0].startswith("torchrun: ranks 2-3 of 4 here (node 1 of 2)")
    lx.close()


async def test_a_rendezvous_that_never_comes_fails_with_the_reason(tmp_path: Path) -> None:
    clock = FakeClock()
    a = assignment(gpus=1, nodes=2, node_rank=1)
    t = FakeTransport(clock=clock)
    lx, env, _ = make(a, tmp_path, t, clock=clock, rendezvous_timeout=30.0)
    wrapping = asyncio.create_task(lx.wrap(["python", "x.py"], env))
    await until(lambda: t.waits, what="the first long-poll")
    await clock.advance(29.0)
    assert not wrapping.done()  # still within the rendezvous timeout
    await clock.advance(1.0)
    with pytest.raises(GPUlayerError, match=r"rendezvous did not complete within 30s") as err:
        await wrapping
    assert clock.monotonic() == 30.0 and t.waits[0] == 30.0
    assert "--advertise-addr" in err.value.hint


# -- rank tags and failure reasons -------------------------------------------------------------

# What torch 2.13's torchrun wrote when local rank 1 of a node raised (abridged, real format).
TRANSCRIPT_ERR = """\
[default1]:[rank1]: Traceback (most recent call last):
[default1]:[rank1]:   File "/tmp/fail.py", line 6, in <module>
[default1]:[rank1]:     inner()
[default1]:[rank1]: ValueError: boom in rank 1
W1129 19:10:59.584000 7503 torch/distributed/elastic/multiprocessing/api.py:1028] Sending process 7508 closing signal SIGTERM
E1129 19:10:59.787000 7503 torch/distributed/elastic/multiprocessing/api.py:1002] failed (exitcode: 1) local_rank: 1 (pid: 7509) of binary: /bin/sh
Traceback (most recent call last):
  File "<frozen runpy>", line 198, in _run_module_as_main
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
fail.py FAILED
------------------------------------------------------------
Failures:
[1]:
  time      : 2026-11-29_19:10:59
  host      : localhost
  rank      : 0 (local_rank: 0)
  exitcode  : -15 (pid: 7508)  (SIGTERM)
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-11-29_19:10:59
  host      : localhost
  rank      : RANK (local_rank: 1)
  exitcode  : 1 (pid: 7509)
  error_file: <N/A>
  traceback : To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html
============================================================
"""  # noqa: E501


def feed(lx: launch.Launch, stdout: str, stderr: str) -> list[tuple[int | None, str]]:
    out, err = lx.splitter("stdout"), lx.splitter("stderr")
    assert out is not None and err is not None
    return [out(t) for t in stdout.splitlines()] + [err(t) for t in stderr.splitlines()]


def test_lines_are_tagged_with_global_ranks_and_failure_names_the_rank(tmp_path: Path) -> None:
    lx, _, _ = make(assignment(gpus=2), tmp_path)
    tagged = feed(
        lx,
        "[default0]:rank 0: sum = 3\n[default1]:rank 1 says hi\n",
        TRANSCRIPT_ERR.replace("RANK", "1"),
    )
    assert tagged[:2] == [(0, "rank 0: sum = 3"), (1, "rank 1 says hi")]
    assert tagged[2] == (1, "Traceback (most recent call last):")  # torch's own tag dropped
    assert tagged[6][0] is None  # torchrun's own lines belong to no rank
    reason = lx.failure_reason(1)
    assert reason is not None
    head, _, quoted = reason.partition("\n")
    assert head == "rank 1 on worker0 exited with code 1; last lines of rank 1:"
    assert quoted.splitlines() == [
        "  Traceback (most recent call last):",
        '    File "/tmp/fail.py", line 6, in <module>',
        "      inner()",
        "  ValueError: boom in rank 1",
    ]


def test_multi_node_ranks_are_offset_by_the_node_rank(tmp_path: Path) -> None:
    lx, _, _ = make(assignment(gpus=2, nodes=2, node_rank=1), tmp_path)
    transcript = TRANSCRIPT_ERR.replace("[default1]:[rank1]", "[default1]:[rank3]")
    feed(lx, "[default0]:hello\n", transcript.replace("RANK", "3"))
    reason = lx.failure_reason(1)
    assert reason is not None and reason.startswith("rank 3 exited with code 1; last lines")
    assert reason.endswith("ValueError: boom in rank 1")
    assert not lx.peer_failure()


def test_a_rank_that_only_lost_a_peer_is_not_the_root_cause(tmp_path: Path) -> None:
    lx, _, _ = make(assignment(gpus=1, nodes=2, node_rank=0), tmp_path)
    feed(
        lx,
        "",
        "[default0]:[rank0]: RuntimeError: [../gloo/transport/tcp/pair.cc:553] Connection closed "
        "by peer [127.0.0.1]:24968\n"
        + TRANSCRIPT_ERR.split("[default1]:[rank1]: ValueError: boom in rank 1\n", 1)[1].replace(
            "RANK", "0"
        ),
    )
    assert lx.peer_failure()
    assert (lx.failure_reason(1) or "").startswith(
        "rank 0 exited with code 1 after losing a peer (look at the other nodes); last lines"
    )


def test_a_signal_and_a_silent_rank_are_described(tmp_path: Path) -> None:
    lx, _, _ = make(assignment(gpus=2), tmp_path)
    feed(
        lx,
        "",
        TRANSCRIPT_ERR.split("W1129", 1)[1]
        .replace("RANK", "0")
        .replace("exitcode  : 1 (pid: 7509)", "exitcode  : -9 (pid: 7509)"),
    )
    assert lx.failure_reason(137) == "rank 0 on worker0 was killed by SIGKILL (it printed nothing)"


def test_exit_wording_is_one_rule_for_jobs_and_ranks() -> None:
    assert describe_exit(3) == "exited with code 3"
    assert describe_exit(-9) == "killed by SIGKILL"
    assert describe_exit(-9, subject="rank 2") == "rank 2 was killed by SIGKILL"
    assert describe_exit(1, subject="rank 2") == "rank 2 exited with code 1"
    assert describe_exit(-99) == "killed by signal 99"
    assert describe_exit(None) == "the process did not report an exit status"


def test_torchrun_failing_before_the_ranks_is_explained(tmp_path: Path) -> None:
    lx, env, _ = make(assignment(gpus=2), tmp_path)
    lx.master = ("127.0.0.1", 29655)
    feed(
        lx,
        "",
        (
            "Traceback (most recent call last):\n"
            '  File "static_tcp_rendezvous.py", line 67, in next_rendezvous\n'
            "torch.distributed.DistNetworkError: The server socket has failed to listen on any "
            "local network address. port: 29655, useIpv6: false, code: -98, name: EADDRINUSE, "
            "message: address already in use\n"
        ),
    )
    reason = lx.failure_reason(1)
    assert reason is not None
    assert reason.startswith(
        "torchrun could not listen on 127.0.0.1:29655 (address already in use) before any rank"
    )
    lx2, _, _ = make(assignment(gpus=2), tmp_path)
    feed(lx2, "", "[default1]:Traceback (most recent call last):\n[default1]:KeyError: 'x'\n")
    assert lx2.failure_reason(-9) == (
        "rank 1 failed; last lines of rank 1:\n"
        "  Traceback (most recent call last):\n  KeyError: 'x'"
    )


def test_artifacts_of_a_gang_are_named_by_rank(tmp_path: Path) -> None:
    lx, _, _ = make(assignment(gpus=2, nodes=2, node_rank=1), tmp_path)
    assert lx.artifact_name("rank3/model.pt") == ("rank3/model.pt", 3)
    assert lx.artifact_name("stray.txt") == ("node1/stray.txt", None)
    single, _, _ = make(assignment(gpus=1), tmp_path)
    assert single.artifact_name("model.pt") == ("model.pt", None)


@pytest.mark.slow  # ~2 s with two xdist workers on two cores
@needs_torch
@pytest.mark.torch
def test_torchrun_of_this_torch_accepts_every_flag_we_pass(tmp_path: Path) -> None:
    """Flag names drift between torch releases: ask the installed torchrun itself."""
    lx, env, _ = make(assignment(gpus=2), tmp_path)
    argv = asyncio.run(lx.wrap(["python", "x.py"], env))
    lx.close()
    help_text = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    ours = [a.split("=", 1)[0] for a in argv[3 : argv.index("--no-python") + 1]]
    assert ours and all(a.startswith("--") for a in ours)
    missing = [a for a in ours if a not in help_text]
    assert not missing, f"torchrun does not know {missing}"
