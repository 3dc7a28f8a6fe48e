"""The probe's readers: what this machine has and what the worker will run (ADR 0005, 0015).

``probe()`` runs them in order and folds every failure into ``probe_errors``, never a crash, because
a broken driver or a torch that raises on import must not take the worker down with it. The worker
calls it through ``python -m gpulayer_kernel.capabilities.probe`` in a subprocess (``run_probe``),
never in its own process.

Sources, in order:

1. **torch** when it imports: framework facts (version, CUDA/HIP build, ``cuda.is_available``,
   ``mps.is_available``, distributed backends) and, when it sees them, the CUDA/ROCm/MPS devices.
2. **NVML** (``pynvml`` from nvidia-ml-py if installed, else the driver's library through ctypes:
   ``nvml.py``) and then **nvidia-smi** when torch is absent,
   broken or sees no device: GPUs are usable when their driver is, so a box with a driver and no
   torch still offers its GPUs to command workloads. They also supply the driver version.

Each reader takes its input injected (a module object, a command runner, the text nvidia-smi
printed) so the tests feed it recorded outputs instead of needing the hardware.
"""

from __future__ import annotations

import csv
import importlib
import io
import os
import shutil
import subprocess
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..contracts import Device, Frameworks, HostFacts, WorkerCapabilities
from .host import read_host
from .kinds import normalize_kind
from .support import with_runtime

MIB = 1 << 20
SMI_QUERY = (
    "nvidia-smi",
    "--query-gpu=index,name,memory.total,uuid,driver_version,compute_cap",
    "--format=csv,noheader,nounits",
)
SMI_TIMEOUT = 10.0
_MISSING = {"", "[n/a]", "n/a", "[not supported]", "[unknown error]", "[insufficient permissions]"}


@dataclass
class SmiResult:
    """What running nvidia-smi gave: its exit status and output, or why it could not run."""

    returncode: int = 0
    stdout: str = ""
    stderr: str = ""
    error: str | None = None  # "not found on PATH", "timed out after 10 s", ...


SmiRunner = Callable[[Sequence[str], float], SmiResult]


@dataclass
class Found:
    """Devices and facts one reader found, with the reasons it found nothing."""

    devices: list[Device] = field(default_factory=list)
    driver: str | None = None
    errors: list[str] = field(default_factory=list)


def _one_line(text: object, limit: int = 240) -> str:
    line = " ".join(str(text).split())
    return line if len(line) <= limit else line[: limit - 3] + "..."


def _err(step: str, exc: BaseException) -> str:
    return f"{step}: {type(exc).__name__}: {_one_line(exc)}"


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


# --------------------------------------------------------------------------------------------------
# torch


def import_optional(name: str) -> tuple[Any | None, str | None]:
    """Import ``name``; ``(module, None)``, or ``(None, why)`` without raising."""
    try:
        return importlib.import_module(name), None
    except ModuleNotFoundError as exc:
        if exc.name == name:
            return None, "not installed"
        return None, f"import failed: ModuleNotFoundError: {_one_line(exc)}"
    except Exception as exc:  # a broken install raises anything (OSError for a missing .so, ...)
        return None, f"import failed: {type(exc).__name__}: {_one_line(exc)}"


def read_torch(
    torch: Any, *, host_memory: int = 0, apple_chip: str | None = None
) -> tuple[Frameworks, Found]:
    """Framework facts and the devices torch sees. ``torch`` is the module (or a fake of it)."""
    found = Found()
    version = str(getattr(torch, "__version__", "unknown"))
    tversion = getattr(torch, "version", None)
    built_cuda = getattr(tversion, "cuda", None)
    built_hip = getattr(tversion, "hip", None)
    cuda_available = False
    count = 0
    try:
        cuda_available = bool(torch.cuda.is_available())
        count = int(torch.cuda.device_count()) if cuda_available else 0
    except Exception as exc:  # CUDA init can raise on a half-installed driver
        found.errors.append(_err("torch.cuda", exc))
    vendor = "amd" if built_hip else "nvidia"
    for index in range(count):
        try:
            props = torch.cuda.get_device_properties(index)
            name = str(props.name)
            if vendor == "amd":
                cc = getattr(props, "gcnArchName", None)
            else:
                cc = f"{props.major}.{props.minor}"
            uuid = getattr(props, "uuid", None)
            found.devices.append(
                Device(
                    index=index,
                    vendor=vendor,
                    name=name,
                    kind=normalize_kind(name, vendor),
                    memory_bytes=int(props.total_memory),
                    compute_capability=str(cc) if cc else None,
                    uuid=_uuid(uuid, vendor),
                )
            )
        except Exception as exc:
            found.errors.append(_err(f"torch.cuda device {index}", exc))
    mps_available = False
    try:
        mps = getattr(getattr(torch, "backends", None), "mps", None)
        mps_available = bool(mps is not None and mps.is_available())
    except Exception as exc:
        found.errors.append(_err("torch.backends.mps", exc))
    if mps_available and not found.devices:
        chip = apple_chip or "Apple silicon"
        found.devices.append(
            Device(
                index=0,
                vendor="apple",
                name=chip,
                kind=normalize_kind(chip, "apple"),
                memory_bytes=host_memory,  # unified memory: the GPU shares the host's RAM
                unified_memory=True,
            )
        )
    backends: list[str] = []
    try:
        dist = getattr(torch, "distributed", None)
        if dist is not None and dist.is_available():
            for backend in ("gloo", "nccl", "mpi"):
                check = getattr(dist, f"is_{backend}_available", None)
                if check is not None and check():
                    backends.append(backend)
    except Exception as exc:
        found.errors.append(_err("torch.distributed", exc))
    frameworks = Frameworks(
        torch_version=version,
        torch_cuda=str(built_cuda) if built_cuda else None,
        torch_hip=str(built_hip) if built_hip else None,
        cuda_available=cuda_available,
        mps_available=mps_available,
        device_count=len(found.devices),
        distributed_backends=backends,
    )
    return frameworks, found


def _uuid(value: Any, vendor: str) -> str | None:
    if value is None:
        return None
    text = str(value)
    if vendor == "nvidia" and text and not text.startswith(("GPU-", "MIG-")):
        text = "GPU-" + text  # torch prints the bare UUID; NVML and nvidia-smi prefix it
    return text or None


# --------------------------------------------------------------------------------------------------
# NVML


def read_nvml(nvml: Any) -> Found:
    """NVIDIA devices and driver version through NVML (``pynvml``); ``nvml`` is the module."""
    found = Found()
    try:
        nvml.nvmlInit()
    except Exception as exc:
        found.errors.append(_err("nvml", exc))
        return found
    try:
        try:
            found.driver = _text(nvml.nvmlSystemGetDriverVersion())
        except Exception as exc:
            found.errors.append(_err("nvml driver version", exc))
        for index in range(int(nvml.nvmlDeviceGetCount())):
            try:
                handle = nvml.nvmlDeviceGetHandleByIndex(index)
                name = _text(nvml.nvmlDeviceGetName(handle))
                cc: str | None = None
                try:
                    major, minor = nvml.nvmlDeviceGetCudaComputeCapability(handle)
                    cc = f"{major}.{minor}"
                except Exception:
                    cc = None  # older drivers lack the call; the capability is optional
                found.devices.append(
                    Device(
                        index=index,
                        vendor="nvidia",
                        name=name,
                        kind=normalize_kind(name, "nvidia"),
                        memory_bytes=int(nvml.nvmlDeviceGetMemoryInfo(handle).total),
                        compute_capability=cc,
                        uuid=_text(nvml.nvmlDeviceGetUUID(handle)),
                    )
                )
            except Exception as exc:
                found.errors.append(_err(f"nvml device {index}", exc))
    except Exception as exc:
        found.errors.append(_err("nvml", exc))
    finally:
        try:
            nvml.nvmlShutdown()
        except Exception:
            pass  # nothing to report: the facts are already read
    return found


# --------------------------------------------------------------------------------------------------
# nvidia-smi


def parse_nvidia_smi(stdout: str) -> Found:
    """Parse ``nvidia-smi --query-gpu=index,name,memory.total,uuid,driver_version,compute_cap
    --format=csv,noheader,nounits`` output (memory in MiB)."""
    found = Found()
    text = stdout.strip()
    if not text:
        found.errors.append("nvidia-smi: printed nothing")
        return found
    lowered = text.lower()
    if "has failed" in lowered or "couldn't communicate" in lowered:
        found.errors.append(f"nvidia-smi: {_one_line(text.splitlines()[0])}")
        return found
    if lowered.startswith("no devices were found"):
        return found  # a driver with no GPUs: nothing found, nothing wrong
    for lineno, row in enumerate(csv.reader(io.StringIO(text), skipinitialspace=True), 1):
        if not row or not "".join(row).strip():
            continue
        if len(row) < 3:
            found.errors.append(f"nvidia-smi: line {lineno} not understood: {_one_line(row)}")
            continue
        cells = [c.strip() for c in row] + [""] * (6 - len(row))
        index_s, name, memory_s, uuid, driver, cc = cells[:6]
        try:
            index = int(index_s)
            memory = 0 if memory_s.lower() in _MISSING else int(float(memory_s) * MIB)
        except ValueError:
            found.errors.append(f"nvidia-smi: line {lineno} not understood: {_one_line(row)}")
            continue
        if driver.lower() not in _MISSING:
            found.driver = driver
        found.devices.append(
            Device(
                index=index,
                vendor="nvidia",
                name=name,
                kind=normalize_kind(name, "nvidia"),
                memory_bytes=memory,
                compute_capability=None if cc.lower() in _MISSING else cc,
                uuid=None if uuid.lower() in _MISSING else uuid,
            )
        )
    return found


def run_command(argv: Sequence[str], timeout: float) -> SmiResult:
    """Run ``argv`` (no shell) and capture its output; failures become ``SmiResult.error``."""
    if shutil.which(argv[0]) is None:
        return SmiResult(error="not found on PATH")
    try:
        done = subprocess.run(
            list(argv), capture_output=True, text=True, timeout=timeout, check=False
        )
    except subprocess.TimeoutExpired:
        return SmiResult(error=f"timed out after {timeout:g} s")
    except OSError as exc:
        return SmiResult(error=f"{type(exc).__name__}: {_one_line(exc)}")
    return SmiResult(done.returncode, done.stdout, done.stderr)


def read_nvidia_smi(runner: SmiRunner = run_command, timeout: float = SMI_TIMEOUT) -> Found:
    """Run the nvidia-smi query through ``runner`` and parse what it printed."""
    result = runner(SMI_QUERY, timeout)
    if result.error is not None:
        return Found(errors=[f"nvidia-smi: {result.error}"])
    if result.returncode == 0:
        return parse_nvidia_smi(result.stdout)
    text = (result.stdout + "\n" + result.stderr).strip()
    failed = parse_nvidia_smi(text)  # "NVIDIA-SMI has failed ..." speaks for itself
    if failed.errors and not failed.devices and "has failed" in failed.errors[0]:
        return failed
    first = _one_line(text.splitlines()[0]) if text else "no output"
    return Found(errors=[f"nvidia-smi: exit status {result.returncode}: {first}"])


# --------------------------------------------------------------------------------------------------
# putting it together


def visible_devices(devices: list[Device], env_value: str | None) -> list[Device]:
    """Apply ``CUDA_VISIBLE_DEVICES`` to a driver-level device list, renumbering like CUDA does.

    NVML and nvidia-smi list every GPU in the machine; torch (and the job) see only the visible
    ones, numbered from 0 in the order listed. Tokens are indices or UUID prefixes; CUDA stops at
    the first token it does not understand, and so does this.
    """
    if env_value is None:
        return devices
    chosen: list[Device] = []
    for token in (t.strip() for t in env_value.split(",")):
        match: Device | None = None
        if token.isdigit():
            match = next((d for d in devices if d.index == int(token)), None)
        elif token.startswith(("GPU-", "MIG-")):
            match = next((d for d in devices if d.uuid and d.uuid.startswith(token)), None)
        if match is None or match in chosen:
            break
        chosen.append(match)
    return [d.model_copy(update={"index": i}) for i, d in enumerate(chosen)]


IMPORT = object()  # sentinel: import the real module


def probe(
    *,
    torch: Any = IMPORT,
    nvml: Any = IMPORT,
    smi: SmiRunner = run_command,
    env: Mapping[str, str] | None = None,
    host: HostFacts | None = None,
    apple_chip: str | None = None,
) -> WorkerCapabilities:
    """Probe this machine. Pass ``torch=None``/``nvml=None`` for "absent", or a fake module."""
    env = os.environ if env is None else env
    errors: list[str] = []
    sources: list[str] = []
    try:
        host = host or read_host()
    except Exception as exc:
        errors.append(_err("host", exc))
        host = HostFacts()
    frameworks = Frameworks()
    devices: list[Device] = []
    driver: str | None = None

    if torch is IMPORT:
        torch, why = import_optional("torch")
        if why:
            errors.append(f"torch: {why}")
    if torch is not None:
        try:
            frameworks, found = read_torch(
                torch, host_memory=host.memory_bytes, apple_chip=apple_chip or _apple_chip(host)
            )
            errors.extend(found.errors)
            devices = found.devices
            if devices:
                sources.append("torch")
        except Exception as exc:
            errors.append(_err("torch", exc))

    if not devices or any(d.vendor == "nvidia" for d in devices):
        # No device from torch: ask the driver, which is what makes a GPU usable. With NVIDIA
        # devices from torch, ask it too, for the driver version (torch does not report it).
        driver_found, source = _driver_devices(nvml, smi, errors)
        driver = driver_found.driver
        if driver_found.devices:
            if not devices:
                devices = visible_devices(driver_found.devices, env.get("CUDA_VISIBLE_DEVICES"))
            sources.append(source)
    caps = WorkerCapabilities(
        host=host,
        devices=devices,
        cuda_driver=driver,
        frameworks=frameworks,
        probe_errors=errors,
        probe_sources=sources,
    )
    return with_runtime(caps)


def _driver_devices(nvml: Any, smi: SmiRunner, errors: list[str]) -> tuple[Found, str]:
    if nvml is IMPORT:
        nvml, why = import_optional("pynvml")
        if why:  # no pynvml: the driver's own library through ctypes (nvml.py)
            from . import nvml as nvml_ctypes

            try:
                nvml = nvml_ctypes.load()
            except OSError as exc:
                errors.append(f"nvml: pynvml {why}, and {_one_line(exc)}")
    if nvml is not None:
        found = read_nvml(nvml)
        if not found.errors or found.devices:
            errors.extend(found.errors)
            return found, "nvml"
        errors.extend(found.errors)
    found = read_nvidia_smi(smi)
    errors.extend(found.errors)
    return found, "nvidia-smi"


def _apple_chip(host: HostFacts) -> str | None:
    if host.os != "darwin":
        return None
    result = run_command(("sysctl", "-n", "machdep.cpu.brand_string"), 5.0)
    if result.error is not None or result.returncode != 0:
        return None
    return result.stdout.strip() or None
