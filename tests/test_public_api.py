"""The package root: one sorted public namespace, importable without Jupyter or torch."""

from __future__ import annotations

import subprocess
import sys

import gpulayer_kernel


def test_all_is_sorted_and_every_name_exists() -> None:
    names = gpulayer_kernel.__all__
    assert names == sorted(names)
    for name in names:
        assert hasattr(gpulayer_kernel, name), name


def test_importing_the_package_does_not_import_torch_or_jupyter() -> None:
    code = (
        "import sys, gpulayer_kernel\n"
        "heavy = [m for m in ('torch', 'IPython', 'jupyter_server', 'ipywidgets') "
        "if m in sys.modules]\n"
        "print(','.join(heavy))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""
