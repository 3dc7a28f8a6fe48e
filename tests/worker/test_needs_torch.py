"""Which Python jobs start from the torch-loaded zygote (worker/needs_torch.py): the judgement
from a job's source, which must route every torch import there and never raise."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpulayer_kernel.worker.needs_torch import (
    MAX_FILES,
    MAX_SOURCE,
    entry_needs_torch,
    imports_of,
    needs_torch,
)

TORCH = [
    "import torch",
    "import torch.nn as nn",
    "from torch import nn",
    "from torch.utils.data import DataLoader",
    "import numpy, torchvision",
    "import lightning as L",
    "from transformers import AutoModel",
    "def f():\n    import torch\n    return torch",  # inside a function: still imported by it
    "try:\n    import torch\nexcept ImportError:\n    torch = None",
    "if False:\n    import torch",  # never runs, but it is no judgement of control flow
    "import importlib\nimportlib.import_module('torch')",
    "__import__('torchaudio')",
    "name = 'x'\n__import__(name)",  # a computed name: cannot be judged
    "from gpulayer_kernel import torch as gt",
    "from gpulayer_kernel.torch import Trainer",
    "import gpulayer_kernel.torch.trainer",
    "from gpulayer_kernel.job.ranks import rank",
    "from gpulayer_kernel.job import ranks",
    "x = (",  # does not parse here; the job's interpreter might be newer
    "type X = int\nimport torch",
]

LIGHT = [
    "",
    "1 + 1",
    "print(1)\n1 + 1\n",
    "import numpy as np\nnp.ones(3).sum()",
    "import os, sys, json",
    "from gpulayer_kernel import job\njob.set_result(1)",
    "import torchish",  # a name that only starts like torch
    "s = 'import torch'",  # in a string, not an import
    "# import torch",
    "x = torch_like = 1",
    "from . import helper",
    "import re\nre.compile('\\d+')",  # an invalid escape: a warning when parsed, still light
]


@pytest.mark.parametrize("source", TORCH)
def test_torch_imports_are_routed_to_the_torch_zygote(source: str) -> None:
    assert needs_torch(source)


@pytest.mark.parametrize("source", LIGHT)
def test_light_code_is_routed_to_the_light_zygote(source: str) -> None:
    assert not needs_torch(source)


@settings(max_examples=300, deadline=None)
@given(st.text())
def test_never_raises_on_any_text(source: str) -> None:
    assert isinstance(needs_torch(source), bool)


IDENT = st.from_regex(r"[a-z_][a-z0-9_]{0,8}", fullmatch=True)
LIGHT_LINE = st.one_of(
    st.builds(lambda n: f"import {n}x", IDENT),  # never a torch user: all end in "x"
    st.builds(lambda a, b: f"{a}x = {b!r}", IDENT, st.integers()),
    st.builds(lambda a: f"print({a!r})", st.text(max_size=20)),
    st.just("def f():\n    return 1"),
)
TORCH_LINE = st.sampled_from(TORCH[:13])


@settings(max_examples=200, deadline=None)
@given(st.lists(LIGHT_LINE, max_size=8), TORCH_LINE, st.integers(min_value=0, max_value=8))
def test_a_torch_import_anywhere_among_light_lines_is_found(
    lines: list[str], torch_line: str, where: int
) -> None:
    assert not needs_torch("\n".join(lines))
    lines.insert(min(where, len(lines)), torch_line)
    assert needs_torch("\n".join(lines))


def test_imports_of_names_relative_and_submodule_imports() -> None:
    names = imports_of("from .pkg import a\nfrom os import path\nimport x.y")
    assert names is not None
    assert {".pkg", ".pkg.a", "os", "os.path", "x.y"} <= names
    assert imports_of("def (") is None


# -- entry points: the cell, the script, the module and the job's own modules -------------------


def test_a_cell_in_memory_is_judged_from_its_text(tmp_path: Path) -> None:
    assert not entry_needs_torch("cell:cell.py", tmp_path, {"cell.py": "1 + 1"})
    assert entry_needs_torch("cell:cell.py", tmp_path, {"cell.py": "import torch"})


def test_a_script_is_followed_into_the_jobs_own_modules(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text("import model\nmodel.fit()\n")
    (tmp_path / "model.py").write_text("from .nets import mlp\n")
    (tmp_path / "nets").mkdir()
    (tmp_path / "nets" / "__init__.py").write_text("")
    (tmp_path / "nets" / "mlp.py").write_text("import torch.nn\n")
    (tmp_path / "light.py").write_text("import json\nimport model2\n")
    (tmp_path / "model2.py").write_text("import light  # a cycle\n")
    assert entry_needs_torch("train.py", tmp_path)
    assert entry_needs_torch("nets.mlp:f", tmp_path)
    assert not entry_needs_torch("light.py", tmp_path)


def test_a_package_init_that_imports_torch_counts_for_its_submodules(tmp_path: Path) -> None:
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("import torch\n")
    (tmp_path / "pkg" / "calc.py").write_text("def add(a, b):\n    return a + b\n")
    assert entry_needs_torch("pkg.calc:add", tmp_path)


def test_entry_modules_outside_the_bundle(tmp_path: Path) -> None:
    assert not entry_needs_torch("json:dumps", tmp_path)  # the standard library: light
    assert entry_needs_torch("gpulayer_kernel.torch.run:main", tmp_path)
    # installed somewhere, code unseen: the bounded mistake (~10 ms), not a torch import
    assert entry_needs_torch("someone.train:main", tmp_path)


def test_what_cannot_be_judged_goes_to_the_torch_zygote(tmp_path: Path) -> None:
    assert entry_needs_torch("missing.py", tmp_path)  # unreadable: never raises
    big = "x = 1\n" * (MAX_SOURCE // 6 + 1)
    assert entry_needs_torch("cell:c.py", tmp_path, {"c.py": big})
    (tmp_path / "gpulayer-inputs.safetensors").write_bytes(b"")  # --in tensors to decode
    (tmp_path / "c.py").write_text("1 + 1")
    assert entry_needs_torch("cell:c.py", tmp_path)


def test_a_long_chain_of_own_modules_stops_at_the_file_limit(tmp_path: Path) -> None:
    for i in range(MAX_FILES + 5):
        (tmp_path / f"m{i}.py").write_text(f"import m{i + 1}\n")
    assert entry_needs_torch("m0.py", tmp_path)  # not followed to its end: unsure
    (tmp_path / "short.py").write_text("import m0x\n")
    assert not entry_needs_torch("short.py", tmp_path)
