"""``%load_ext gpulayer_kernel`` needs the package root to expose the IPython entry points."""

from __future__ import annotations

import subprocess
import sys


def test_package_root_exposes_the_ipython_extension() -> None:
    import gpulayer_kernel

    assert callable(getattr(gpulayer_kernel, "load_ipython_extension", None)), (
        "gpulayer_kernel/__init__.py must define load_ipython_extension (see ADR 0018)"
    )
    assert callable(getattr(gpulayer_kernel, "unload_ipython_extension", None))


def test_importing_the_package_loads_no_ipython() -> None:
    # Jobs import gpulayer_kernel.job.runner on every start, and the Jupyter server imports
    # gpulayer_kernel.jupyter.extension: neither may pay for IPython or widgets.
    code = (
        "import sys, gpulayer_kernel, gpulayer_kernel.jupyter, gpulayer_kernel.job.runner; "
        "print(sorted(m for m in ('IPython', 'ipywidgets', 'anywidget') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_a_job_process_does_not_import_pydantic() -> None:
    code = (
        "import sys, gpulayer_kernel.job.runner, gpulayer_kernel.job; "
        "print(sorted(m for m in ('pydantic', 'aiosqlite', 'httpx') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
