"""The steps of ``benchmarks/gpu_check.sh``, one per call: ``python benchmarks/gpu_check.py STEP``.

Each step prints what it saw and exits 0 when every check held, 1 with the reason otherwise (the
shell script runs them with a time limit and writes the report). They run against the embedded
control plane on the ``$GPULAYER_HOME`` and ``$GPULAYER_CACHE_DIR`` the script made, on the real
GPUs: no simulated device anywhere here. Steps: probe, placement, cell, session, nccl, trainer,
fsdp; and deps, which the script runs first, on any machine (what imports, torch's version).
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import socket
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent


class CheckFailed(Exception):
    """A check did not hold; the message says which and what was seen."""


def check(ok: object, what: str) -> None:
    if not ok:
        raise CheckFailed(what)
    print(f"ok: {what}")


def full_probe() -> Any:
    from gpulayer_kernel.capabilities import run_probe

    return asyncio.run(run_probe(timeout=180.0))


# -- steps -----------------------------------------------------------------------------------------


def probe() -> None:
    """The full probe (torch imported), the first answer (no torch) and the drivers' files agree."""
    from gpulayer_kernel.capabilities.build import read_torch_build
    from gpulayer_kernel.capabilities.driver import read_drivers
    from gpulayer_kernel.capabilities.local import first_answer

    smi = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=60)
    print(f"nvidia-smi -L (exit {smi.returncode}):\n{smi.stdout}{smi.stderr}")
    full = full_probe()
    print("full probe:", full.model_dump_json(indent=2))
    drivers = read_drivers()
    quick = asyncio.run(first_answer(drivers, read_torch_build(), has_torch=True))
    print("first answer (no torch):", quick.model_dump_json(indent=2))
    print(f"drivers' files: {drivers}")
    check(smi.returncode == 0, "nvidia-smi answers")
    check(not [e for e in full.probe_errors if e.startswith("probe:")], "the probe ran to its end")
    check(full.devices, f"the full probe sees GPUs: {[d.name for d in full.devices]}")
    check({d.vendor for d in full.devices} == {"nvidia"}, "they are NVIDIA GPUs, none simulated")
    check(full.runtime == "cuda" and not full.simulated, f"runtime cuda, got {full.runtime}")
    check(full.frameworks.cuda_available, "torch.cuda.is_available()")
    check("nccl" in full.frameworks.distributed_backends, "torch has NCCL")
    check(full.dist_backend == "nccl", f"gangs use nccl, got {full.dist_backend}")
    check(full.cuda_driver, f"the driver version is known: {full.cuda_driver}")
    same = [(d.uuid, d.name, d.memory_bytes) for d in full.devices]
    seen = [(d.uuid, d.name, d.memory_bytes) for d in quick.devices]
    check(seen == same, f"the first answer (driver only) lists the same GPUs: {seen} vs {same}")
    check(
        set(quick.probe_sources) & {"nvml", "nvidia-smi"},
        f"the first answer's devices came from the driver: {quick.probe_sources}",
    )
    check(drivers.nvidia_version == full.cuda_driver, "/proc/driver/nvidia says the same driver")
    if "CUDA_VISIBLE_DEVICES" not in os.environ:
        check(len(drivers.nvidia_gpus) == len(full.devices), "/proc lists every GPU")


async def _run_job(spec_data: dict[str, Any], files: dict[str, bytes] | None = None) -> Any:
    """Submit one job to the embedded control plane; return (job, stdout lines)."""
    from gpulayer_kernel import bundles
    from gpulayer_kernel.client.connect import open_session
    from gpulayer_kernel.contracts import JobSpec, parse

    async with open_session(local_worker=True) as s:
        if files is not None:
            digest, data = bundles.build(files)
            await s.put_bundle(data, digest)
            spec_data["workload"]["bundle"] = digest
        job = await s.submit(parse(JobSpec, spec_data))
        done = await s.wait(job.id, timeout=600)
        while not done.state.terminal:
            done = await s.wait(job.id, timeout=600)
        page = await s.logs(job.id, since=0, wait=0)
        out = [r.text for r in page.records if r.stream == "stdout"]
        err = [r.text for r in page.records if r.stream != "stdout"]
        print(f"job {done.id}: {done.state.value}; {done.placement and done.placement.explanation}")
        print("stdout:", *out, sep="\n  ")
        if err:
            print("other output:", *err, sep="\n  ")
        return done, out


def _command(code: str, gpus: int = 1) -> dict[str, Any]:
    return {
        "name": "gpu-check",
        "workload": {"kind": "command", "argv": [sys.executable, "-c", code]},
        "resources": {"gpus": gpus},
        "workdir": os.getcwd(),
        "timeout": 300,
    }


def placement() -> None:
    """A one-GPU job sees its device, and only it, through CUDA_VISIBLE_DEVICES."""
    code = (
        "import os, torch\n"
        "print('visible', os.environ.get('CUDA_VISIBLE_DEVICES'))\n"
        "print('count', torch.cuda.device_count())\n"
        "print('name', torch.cuda.get_device_name(0))\n"
    )
    job, out = asyncio.run(_run_job(_command(code)))
    check(job.state.value == "succeeded", f"the job succeeded: {job.state.value} {job.reason}")
    [node] = job.placement.nodes
    check(len(node.devices) == 1 and not node.simulated, f"placed on one real GPU: {node}")
    lines = dict(line.split(" ", 1) for line in out if " " in line)
    check(
        lines.get("visible") == str(node.devices[0]), f"CUDA_VISIBLE_DEVICES={lines.get('visible')}"
    )
    check(lines.get("count") == "1", f"torch in the job sees one GPU: {lines.get('count')}")
    names = {d.name for d in full_probe().devices}
    check(lines.get("name") in names, f"and it is one of {names}: {lines.get('name')}")


CELL = """\
import torch
x = torch.randn(2048, 2048, device="cuda", dtype=torch.bfloat16)
y = (x @ x).float()
torch.cuda.synchronize()
finite = bool(torch.isfinite(y).all())
{"device": torch.cuda.get_device_name(0), "finite": finite, "shape": list(y.shape)}
"""


def cell() -> None:
    """A one-shot torch cell on CUDA (what ``%%gpulayer --gpus 1 --out r`` submits): its value."""
    spec = {
        "name": "gpu-check-cell",
        "workload": {"kind": "python", "bundle": "0" * 64, "entrypoint": "cell:cell.py"},
        "resources": {"gpus": 1},
        "timeout": 300,
    }
    job, _out = asyncio.run(_run_job(spec, {"cell.py": CELL.encode()}))
    print("result:", json.dumps(job.result))
    check(job.state.value == "succeeded", f"the cell ran: {job.state.value} {job.reason}")
    result = job.result or {}
    check(result.get("finite") is True, "a bf16 matmul on the GPU gave finite numbers")
    check(result.get("shape") == [2048, 2048], "and the expected shape")
    check("device" in result, f"on {result.get('device')}")


def session() -> None:
    """A session on one GPU keeps a CUDA tensor between cells."""
    from gpulayer_kernel.sessions import start_session

    with start_session("gpu-check", gpus=1, wait=300) as s:
        print("session:", s.id)
        first = s.run("import torch\nt = torch.arange(4.0, device='cuda')\nstr(t.device)")
        print("cell 1:", first.text)
        second = s.run("float(t.sum().item()), torch.cuda.get_device_name(0)")
        print("cell 2:", second.text)
    check(first.text.strip("'\"") == "cuda:0", f"the tensor is on the GPU: {first.text}")
    check(second.text.startswith("(6.0,"), f"the next cell still has it: {second.text}")


NCCL = """\
import os, torch, torch.distributed as dist
dist.init_process_group("nccl", init_method="tcp://127.0.0.1:{port}", rank=0, world_size=1)
t = torch.ones(4, device="cuda")
dist.all_reduce(t)
torch.cuda.synchronize()
print("backend", dist.get_backend(), "sum", float(t.sum()))
dist.destroy_process_group()
"""


def nccl() -> None:
    """torch.distributed with NCCL on one device, inside a gpulayer job (its environment)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    job, out = asyncio.run(_run_job(_command(NCCL.replace("{port}", str(port)))))
    check(job.state.value == "succeeded", f"the job succeeded: {job.state.value} {job.reason}")
    check("backend nccl sum 4.0" in out, f"NCCL initialised and reduced: {out}")


def trainer() -> None:
    """bench_trainer.py --gpu: bf16 GPT, raw loop vs Trainer, with MFU (not skipped)."""
    quick = ["--quick"] if "--quick" in sys.argv else []
    done = subprocess.run(
        [sys.executable, str(HERE / "bench_trainer.py"), "--gpu", *quick],
        capture_output=True,
        text=True,
        timeout=900,
    )
    print(done.stdout, done.stderr, sep="\n")
    check(done.returncode == 0, f"bench_trainer.py --gpu exited {done.returncode}")
    check("skipped" not in done.stdout, "it ran on the GPU (not skipped)")
    mfu = re.findall(r"(raw|trainer) MFU (\d+\.\d)%", done.stdout)
    check(len(mfu) == 2, f"MFU for the raw loop and the Trainer: {mfu}")
    check(re.search(r"trainer/raw \(gpt\): \d", done.stdout), "the Trainer/raw ratio")


def deps() -> None:
    """Every package a step imports (named when missing), and torch's version or its absence."""
    import importlib

    missing = []
    for name in (
        "pydantic",
        "httpx",
        "tornado",
        "cryptography",
        "prometheus_client",
        "jupyter_client",
        "zmq",
        "ipykernel",
        "IPython",
        "numpy",
        "gpulayer_kernel",
    ):
        try:
            module = importlib.import_module(name)
            print(f"# {name} {getattr(module, '__version__', '')}".rstrip())
        except ImportError as exc:
            missing.append(f"{name} ({exc})")
    try:
        import torch

        print(f"# torch {torch.__version__}")
    except ImportError:
        print("# torch: not installed (every step needs it where there is a GPU)")
    if missing:
        print("missing: " + ", ".join(missing))
        raise CheckFailed("missing: " + ", ".join(missing))


def fsdp() -> None:
    """bench_fsdp.py on NCCL: the Trainer's FSDP against a hand-written fully_shard loop."""
    import torch

    gpus = torch.cuda.device_count()
    check(gpus >= 1, f"torch sees {gpus} GPU(s)")
    quick = ["--quick"] if "--quick" in sys.argv else []
    launch = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={min(gpus, 2)}"]
    done = subprocess.run(
        [*launch, str(HERE / "bench_fsdp.py"), "--gpu", *quick],
        capture_output=True,
        text=True,
        timeout=900,
    )
    print(done.stdout, done.stderr[-4000:], sep="\n")
    check(done.returncode == 0, f"bench_fsdp.py --gpu exited {done.returncode}")
    check("skipped" not in done.stdout, "it ran on the GPU (not skipped)")
    check("same parameters as the hand-written loop: yes" in done.stdout, "the same parameters")
    check(re.search(r"trainer/hand \d", done.stdout), "the Trainer/hand ratio")


STEPS: dict[str, Callable[[], None]] = {
    "deps": deps,
    "probe": probe,
    "placement": placement,
    "cell": cell,
    "session": session,
    "nccl": nccl,
    "trainer": trainer,
    "fsdp": fsdp,
}


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in STEPS:
        print(f"usage: gpu_check.py {{{','.join(STEPS)}}} [--quick]", file=sys.stderr)
        return 2
    try:
        STEPS[argv[0]]()
    except CheckFailed as exc:
        print(f"FAILED: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
