"""GPUlayer: run notebook cells, scripts and PyTorch training on the right GPU from Jupyter.

The public names are re-exported here. Importing the package is light: Jupyter, IPython and torch
are imported only by the pieces that need them (``%load_ext gpulayer_kernel`` loads the magics).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .lazy import lazy_names

if TYPE_CHECKING:
    from .client.connect import open_session
    from .contracts import CommandWorkload, Job, JobSpec, JobState, PythonWorkload, Resources
    from .controlplane import ControlPlane
    from .embedded import Embedded
    from .errors import (
        BundleError,
        Conflict,
        Forbidden,
        GPUlayerError,
        InvalidInput,
        NotFound,
        NotJSON,
        SchemaTooNew,
        TooLarge,
        Unauthorized,
        Unavailable,
        ValidationFailed,
    )

# Imported on first use: every job process imports this package (the runner, the in-job API), and
# pydantic + the control plane cost ~300 ms of start-up that a job never needs.
_LAZY = {
    **dict.fromkeys(
        ["CommandWorkload", "Job", "JobSpec", "JobState", "PythonWorkload", "Resources"],
        "contracts",
    ),
    "ControlPlane": "controlplane",
    "Embedded": "embedded",
    "open_session": "client.connect",
    **dict.fromkeys(
        [
            "BundleError",
            "Conflict",
            "Forbidden",
            "GPUlayerError",
            "InvalidInput",
            "NotFound",
            "NotJSON",
            "SchemaTooNew",
            "TooLarge",
            "Unauthorized",
            "Unavailable",
            "ValidationFailed",
        ],
        "errors",
    ),
}


__getattr__ = lazy_names(__name__, _LAZY, globals())


try:
    # Written by the build from package.json's "version", the one place a version is set
    # (RELEASING.md); `gpulayer --version`, /status, /health and the panel all report it.
    from ._version import __version__
except ImportError:  # pragma: no cover - a source tree that was never built nor installed
    __version__ = "0+unknown"

__all__ = [
    "BundleError",
    "CommandWorkload",
    "Conflict",
    "ControlPlane",
    "Embedded",
    "Forbidden",
    "GPUlayerError",
    "InvalidInput",
    "Job",
    "JobSpec",
    "JobState",
    "NotFound",
    "NotJSON",
    "PythonWorkload",
    "Resources",
    "SchemaTooNew",
    "TooLarge",
    "Unauthorized",
    "Unavailable",
    "ValidationFailed",
    "__version__",
    "load_ipython_extension",
    "open_session",
    "unload_ipython_extension",
]


def load_ipython_extension(ipython: Any) -> None:
    """``%load_ext gpulayer_kernel``: register ``%%gpulayer`` and ``%gpulayer``."""
    from .jupyter.magics import load_ipython_extension as load

    load(ipython)


def unload_ipython_extension(ipython: Any) -> None:
    from .jupyter.magics import unload_ipython_extension as unload

    unload(ipython)


def _jupyter_server_extension_points() -> list[dict[str, Any]]:
    from .jupyter import _jupyter_server_extension_points as points

    return points()


def _jupyter_labextension_paths() -> list[dict[str, str]]:
    from .jupyter import _jupyter_labextension_paths as paths

    return paths()
