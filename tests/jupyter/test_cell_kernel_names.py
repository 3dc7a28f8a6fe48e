"""A one-shot ``%%gpulayer`` cell that reads names defined only in the kernel is refused before
anything is submitted (issue 36: the accelerate habit of calling a kernel function failed late,
with NameError on every rank). The check itself, then through the magic on a real shell."""

from __future__ import annotations

import types
from typing import Any

import pytest
from IPython.core.interactiveshell import InteractiveShell

from gpulayer_kernel.jupyter.cellspec import check_kernel_names
from gpulayer_kernel.jupyter.handle import CellError

from .test_magics import cell, ip, job_count  # noqa: F401  (ip: the shared shell fixture)


def training_function() -> None:
    """Stands for a function the user defined in an earlier cell."""


KERNEL: dict[str, Any] = {
    "training_function": training_function,
    "torch": types.ModuleType("torch"),
    "lr": 0.1,
    "In": [],
}


def test_a_kernel_function_called_in_the_cell_is_named_with_the_remedies() -> None:
    with pytest.raises(CellError) as caught:
        check_kernel_names("import os\n\ntraining_function()\n", KERNEL, [])
    error = caught.value
    assert error.code == "cell_name_undefined"
    assert "line 3 of the cell uses 'training_function' (function)" in error.message
    assert error.hint.startswith("defined in the kernel: define it in the cell, or send its")
    assert "--files" in error.hint and "--in" not in error.hint
    assert error.details == {"names": ["training_function"]}


def test_a_kernel_value_may_travel_with_in_and_modules_must_be_imported() -> None:
    with pytest.raises(CellError, match="'lr' \\(float\\)") as value:
        check_kernel_names("print(lr)", KERNEL, [])
    assert "--in lr" in value.value.hint
    check_kernel_names("print(lr)", KERNEL, ["lr"])  # sent with --in: the cell has it
    with pytest.raises(CellError, match="'torch' \\(module\\)"):
        check_kernel_names("x = torch.ones(2)", KERNEL, [])


@pytest.mark.parametrize(
    "source",
    [
        "import torch\ntorch.ones(1)",
        "def training_function():\n    return lr\nlr = 1\ntraining_function()",
        "for lr in range(3):\n    print(lr)",
        "[lr for lr in range(3)]",
        "def f(lr):\n    return lr\n",
        "try:\n    pass\nexcept Exception as lr:\n    print(lr)",
        "from torch import *\ntraining_function()",  # a star import: the check is off
        "print(len(In))",  # IPython's own names are left alone
        "print(undefined_anywhere)",  # not the kernel's: the worker's NameError says it
    ],
)
def test_names_the_cell_binds_itself_pass(source: str) -> None:
    check_kernel_names(source, KERNEL, [])


def test_the_magic_refuses_before_submitting(ip: InteractiveShell) -> None:  # noqa: F811
    ip.run_cell("def training_function():\n    return 42\n")
    before = job_count()
    with pytest.raises(CellError, match="'training_function' \\(function\\), which is defined"):
        cell(ip, "--gpus 0", "training_function()")
    assert job_count() == before, "nothing was submitted"
