"""Jupyter integration: the ``%%gpulayer`` magics, the job widget, the kernel's bridge, and the
Jupyter server extension with the JupyterLab panel.

``%load_ext gpulayer_kernel`` (or ``%load_ext gpulayer_kernel.jupyter``) loads the magics. Names
here are imported lazily: the Jupyter server extension lives in this package too, and must not
pull IPython or widgets into the server process (nor jupyter_server into a kernel).

Jupyter finds the server extension through ``_jupyter_server_extension_points`` on this module
(``jupyter-config/server-config/gpulayer.json`` enables ``gpulayer_kernel.jupyter``), and the
prebuilt Lab extension through ``_jupyter_labextension_paths``.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .handle import JobHandle
    from .magics import last_job, load_ipython_extension, unload_ipython_extension

__all__ = ["JobHandle", "last_job", "load_ipython_extension", "unload_ipython_extension"]

#: The npm name of the Lab extension (package.json), also its folder under share/jupyter.
LABEXTENSION_NAME = "@gpulayer/jupyterlab"


def _jupyter_server_extension_points() -> list[dict[str, Any]]:
    """The server extension: the ``GPUlayer`` ExtensionApp (see ``extension.py``)."""
    from .extension import GPUlayer

    return [{"module": "gpulayer_kernel.jupyter", "app": GPUlayer}]


def _load_jupyter_server_extension(serverapp: Any) -> Any:
    """Load the server extension into ``serverapp`` (for hosts that call the module directly)."""
    from .extension import GPUlayer

    return GPUlayer._load_jupyter_server_extension(serverapp)  # type: ignore[no-untyped-call]


def _jupyter_labextension_paths() -> list[dict[str, str]]:
    """Where the built Lab extension is (``jupyter-builder develop`` links it from here).

    The path is absolute, so it is right whether Jupyter asks this module or the package root.
    """
    built = Path(__file__).resolve().parent.parent / "labextension"
    return [{"src": str(built), "dest": LABEXTENSION_NAME}]


def __getattr__(name: str) -> Any:
    if name == "__version__":  # shown by `jupyter server extension list`
        from .. import __version__

        return __version__
    if name == "JobHandle":
        from .handle import JobHandle

        return JobHandle
    if name in ("last_job", "load_ipython_extension", "unload_ipython_extension"):
        from . import magics

        return getattr(magics, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
