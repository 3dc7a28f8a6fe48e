"""Without the ``jupyter`` extra the magics and ``gpulayer lab`` name the extra to install.

Each case runs in a fresh interpreter where the missing package is blocked (``sys.modules[name] =
None`` makes its import fail as if it were absent); the wheel test (tests/release) checks the
same in a venv that really has only the core dependencies.
"""

from __future__ import annotations

import subprocess
import sys

HINT = "pip install 'gpulayer[jupyter]'"


def python(code: str, *blocked: str) -> subprocess.CompletedProcess[str]:
    block = "".join(f"sys.modules[{name!r}] = None\n" for name in blocked)
    return subprocess.run(
        [sys.executable, "-c", f"import sys\n{block}{code}"],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_loading_the_magics_without_ipython_names_the_extra() -> None:
    r = python(
        "import gpulayer_kernel\n"
        "try:\n"
        "    gpulayer_kernel.load_ipython_extension(None)\n"
        "except ImportError as exc:\n"
        "    print(type(exc).__name__, exc.code, exc.details['module'])\n"
        "    print(exc)\n",
        "IPython",
    )
    assert r.returncode == 0, r.stderr
    first, message = r.stdout.splitlines()[:2]
    assert first == "MissingExtra missing_extra IPython"
    assert "the %%gpulayer magics: the 'jupyter' extra of gpulayer is not installed" in message
    assert HINT in message


def test_a_notebook_kernel_without_widgets_says_once_why_jobs_show_as_text() -> None:
    r = python(
        "import os\n"
        "from IPython.core.interactiveshell import InteractiveShell\n"
        "from IPython.core.error import UsageError\n"
        "shell = InteractiveShell.instance()\n"
        "shell.kernel = object()  # as in ipykernel: a frontend could show widgets\n"
        "os.environ['JPY_SESSION_NAME'] = 'analysis.ipynb'\n"
        "from gpulayer_kernel.jupyter import magics\n"
        "print(magics.display_mode(), magics.display_mode())\n"
        "shell.register_magics(magics.GPUlayerMagics)\n"
        "try:\n"
        "    shell.run_line_magic('gpulayer', 'display widget')\n"
        "except UsageError as exc:\n"
        "    print('UsageError:', exc)\n",
        "anywidget",
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[0] == "text text"
    assert r.stderr.count("gpulayer: showing jobs as text") == 1, r.stderr
    assert HINT in r.stderr
    assert "UsageError: %gpulayer display widget: the 'jupyter' extra" in r.stdout
    assert HINT in r.stdout


def test_gpulayer_lab_without_jupyterlab_names_the_extra() -> None:
    r = python("from gpulayer_kernel.cli import main\nsys.exit(main(['lab']))", "jupyterlab")
    assert r.returncode == 2
    assert "gpulayer: error: gpulayer lab: the 'jupyter' extra" in r.stderr
    assert f"gpulayer: hint: {HINT}" in r.stderr
    assert "Traceback" not in r.stderr
