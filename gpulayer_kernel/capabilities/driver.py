"""What the GPU drivers say through the file system: read in microseconds, no process, no library.

The kernel driver publishes each NVIDIA GPU it has bound under ``/proc/driver/nvidia/gpus/<bus>/
information`` (model, UUID, minor number) and its version in ``/proc/driver/nvidia/version``;
``amdgpu`` publishes its GPUs as KFD topology nodes under ``/sys/class/kfd``. These files cannot
hang or crash anything, so they answer two questions on every start:

* **is there an NVIDIA driver at all?** Without one, the probe runs neither NVML nor nvidia-smi
  (most laptops, CPU boxes and every Mac pay nothing);
* **is this still the machine the cached probe saw?** ``identity()`` (driver versions and the
  GPUs' UUIDs) is part of the per-machine cache key (``machine.py``), so a new driver, a GPU added
  or removed, or one that fell off the bus, makes the next start probe again.

The files carry no memory size, so they are not a device source on their own: the devices come
from NVML, nvidia-smi or torch (``readers.py``), and from the cache while ``identity()`` matches.
Every reader takes the file system root, so tests feed it recorded files.
"""

from __future__ import annotations

import re
import shutil
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

_VERSION_RE = re.compile(r"Kernel Module(?: for \S+)?\s+(\d+(?:\.\d+)+)")


@dataclass(frozen=True, slots=True)
class ProcGpu:
    """One GPU as ``/proc/driver/nvidia/gpus/<bus>/information`` describes it."""

    bus: str
    model: str
    uuid: str | None
    minor: int | None


@dataclass(frozen=True, slots=True)
class DriverFacts:
    """The GPU drivers' own files, read once per start."""

    nvidia_version: str | None = None  # "550.54.15" from /proc/driver/nvidia/version
    nvidia_gpus: tuple[ProcGpu, ...] = ()
    nvidia_present: bool = False  # a driver is loaded, or its tools are installed
    amd: str = ""  # amdgpu's version and KFD GPU ids, for the cache key

    def identity(self) -> str:
        """What the cached probe depends on here: driver versions and which GPUs are bound."""
        gpus = ",".join(sorted(f"{g.bus}={g.uuid or g.model}" for g in self.nvidia_gpus))
        return (
            f"nvidia={self.nvidia_version or '-'}[{gpus}] present={self.nvidia_present} {self.amd}"
        )


def parse_version(text: str) -> str | None:
    """The driver version in ``/proc/driver/nvidia/version`` (proprietary or open module)."""
    match = _VERSION_RE.search(text)
    return match.group(1) if match else None


def parse_information(bus: str, text: str) -> ProcGpu:
    """One ``gpus/<bus>/information`` file (``Key: <tabs> value`` lines)."""
    fields: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep:
            fields[key.strip().lower()] = value.strip()
    minor = fields.get("device minor", "")
    uuid = fields.get("gpu uuid") or None
    return ProcGpu(
        bus=bus,
        model=fields.get("model", ""),
        uuid=uuid if uuid and uuid.startswith(("GPU-", "MIG-")) else None,
        minor=int(minor) if minor.isdigit() else None,
    )


def _read(path: Path) -> str | None:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return None


def read_drivers(
    root: Path = Path("/"),
    platform: str = sys.platform,
    which: Callable[[str], str | None] = shutil.which,
) -> DriverFacts:
    """The drivers' files under ``root``; whatever is missing is left empty."""
    proc = root / "proc" / "driver" / "nvidia"
    version_text = _read(proc / "version")
    gpus: list[ProcGpu] = []
    try:
        buses = sorted(p for p in (proc / "gpus").iterdir() if p.is_dir())
    except OSError:
        buses = []
    for bus in buses:
        text = _read(bus / "information")
        if text is not None:
            gpus.append(parse_information(bus.name, text))
    present = version_text is not None or bool(gpus)
    if not present and platform != "darwin":
        # Off Linux's /proc (WSL, Windows) the tools are the sign: NVML's library ships with
        # nvidia-smi. /dev/nvidiactl: a driver loaded in a container without its /proc.
        present = (root / "dev" / "nvidiactl").exists() or which("nvidia-smi") is not None
    return DriverFacts(
        nvidia_version=parse_version(version_text) if version_text else None,
        nvidia_gpus=tuple(gpus),
        nvidia_present=present,
        amd=_amd_identity(root),
    )


def _amd_identity(root: Path) -> str:
    """amdgpu's version and the KFD GPU ids (nodes with a non-zero ``gpu_id``), as one string."""
    version = (_read(root / "sys" / "module" / "amdgpu" / "version") or "").strip()
    ids: list[str] = []
    try:
        nodes = sorted((root / "sys" / "class" / "kfd" / "kfd" / "topology" / "nodes").iterdir())
    except OSError:
        nodes = []
    for node in nodes:
        gpu_id = (_read(node / "gpu_id") or "").strip()
        if gpu_id and gpu_id != "0":
            ids.append(gpu_id)
    return f"amd={version or '-'}[{','.join(ids)}]" if version or ids else ""
