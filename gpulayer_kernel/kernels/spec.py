"""GPU kernel specs: the launcher's "Python 3 (GPUlayer · 1 GPU)" entries, made and listed.

A spec is an ordinary Jupyter kernel spec whose metadata names the ``gpulayer-provisioner`` and
its config; ``argv`` is what runs on the worker (informational: the provisioner starts it there).
"""

from __future__ import annotations

import json
import re
import sys
import tempfile
from pathlib import Path
from typing import Any

from ..errors import InvalidInput, NotFound

PROVISIONER = "gpulayer-provisioner"
NAME_RE = re.compile(r"^[a-z0-9][a-z0-9._-]{0,62}$")


def display_name(gpus: int, gpu_kind: list[str]) -> str:
    """``Python 3 (GPUlayer · 2 A100 GPUs)``: the kind before "GPU", where a launcher card,
    which cuts a long name, still shows it."""
    if gpus == 0:
        return "Python 3 (GPUlayer · CPU)"
    kind = f"{'/'.join(k.upper() for k in gpu_kind)} " if gpu_kind else ""
    return f"Python 3 (GPUlayer · {gpus} {kind}GPU{'' if gpus == 1 else 's'})"


def default_name(gpus: int, gpu_kind: list[str]) -> str:
    kind = f"-{'-'.join(gpu_kind)}" if gpu_kind else ""
    return f"gpulayer-{gpus}gpu{kind}".lower()


def kernel_json(
    gpus: int, gpu_kind: list[str], wait: float, idle_timeout: float | None
) -> dict[str, Any]:
    config: dict[str, Any] = {"gpus": gpus, "gpu_kind": gpu_kind, "max_wait": wait}
    if idle_timeout is not None:
        config["idle_timeout"] = idle_timeout
    return {
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": display_name(gpus, gpu_kind),
        "language": "python",
        "interrupt_mode": "signal",
        "metadata": {
            "debugger": False,
            "gpulayer": {"gpus": gpus, "gpu_kind": gpu_kind},
            "kernel_provisioner": {"provisioner_name": PROVISIONER, "config": config},
        },
    }


def install(
    *,
    gpus: int,
    gpu_kind: list[str],
    name: str | None = None,
    user: bool = False,
    prefix: str | None = None,
    wait: float = 300.0,
    idle_timeout: float | None = None,
) -> tuple[str, str]:
    """Install a GPU kernel spec; returns (name, the folder it went to)."""
    from jupyter_client.kernelspec import KernelSpecManager

    if gpus < 0 or gpus > 64:
        raise InvalidInput(f"--gpus {gpus}: give 0 to 64", code="bad_gpus")
    if wait < 0:
        raise InvalidInput(f"--wait {wait:g}: give seconds, 0 or more", code="bad_wait")
    name = name or default_name(gpus, gpu_kind)
    if not NAME_RE.match(name):
        raise InvalidInput(
            f"--name {name!r} is not a kernel spec name",
            hint="lower-case letters, digits, '.', '_' and '-', starting with a letter or digit",
            code="bad_kernel_name",
        )
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / name
        folder.mkdir()
        spec = kernel_json(gpus, gpu_kind, wait, idle_timeout)
        (folder / "kernel.json").write_text(json.dumps(spec, indent=1) + "\n")
        dest = KernelSpecManager().install_kernel_spec(str(folder), name, user=user, prefix=prefix)
    return name, dest


def listed() -> dict[str, dict[str, Any]]:
    """The installed GPU kernel specs: name -> {display_name, gpus, gpu_kind, resource_dir}."""
    from jupyter_client.kernelspec import KernelSpecManager

    out: dict[str, dict[str, Any]] = {}
    for name, entry in KernelSpecManager().get_all_specs().items():
        meta = entry["spec"].get("metadata", {})
        prov = meta.get("kernel_provisioner", {})
        if prov.get("provisioner_name") != PROVISIONER:
            continue
        config = prov.get("config", {})
        out[name] = {
            "display_name": entry["spec"].get("display_name", name),
            "gpus": config.get("gpus", 1),
            "gpu_kind": config.get("gpu_kind", []),
            "wait": config.get("max_wait"),
            "resource_dir": entry["resource_dir"],
        }
    return out


def remove(name: str) -> str:
    """Remove a GPU kernel spec (never another kind of spec); returns its folder."""
    from jupyter_client.kernelspec import KernelSpecManager

    ours = listed()
    if name not in ours:
        raise NotFound(
            f"no GPUlayer kernel spec {name!r}"
            + (f" (installed: {', '.join(sorted(ours))})" if ours else " (none installed)"),
            hint="list them with `gpulayer kernelspec list`",
            code="kernelspec_not_found",
        )
    return str(KernelSpecManager().remove_kernel_spec(name))
