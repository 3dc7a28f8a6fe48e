"""What the drivers' files and torch's version file say, read from recorded files (no GPU here)."""

from __future__ import annotations

import shutil
from importlib.machinery import ModuleSpec
from pathlib import Path

import pytest

from gpulayer_kernel.capabilities.build import (
    install_stamp,
    parse_version_file,
    read_torch_build,
    torch_dir,
)
from gpulayer_kernel.capabilities.driver import (
    DriverFacts,
    parse_information,
    parse_version,
    read_drivers,
)

DATA = Path(__file__).parent / "data"


def no_smi(name: str) -> str | None:
    return None


# -- /proc/driver/nvidia -------------------------------------------------------------------------


def test_two_h100_bound_to_driver_550() -> None:
    facts = read_drivers(DATA / "proc_h100x2", platform="linux", which=no_smi)
    assert facts.nvidia_present and facts.nvidia_version == "550.54.15"
    assert [(g.bus, g.model, g.uuid, g.minor) for g in facts.nvidia_gpus] == [
        ("0000:18:00.0", "NVIDIA H100 80GB HBM3", "GPU-5c2b5e0b-7e0c-3f5a-2c1d-8a4e3b9f6d01", 0),
        ("0000:2a:00.0", "NVIDIA H100 80GB HBM3", "GPU-5c2b5e0b-7e0c-3f5a-2c1d-8a4e3b9f6d02", 1),
    ]


def test_the_open_kernel_module_version_line() -> None:
    facts = read_drivers(DATA / "proc_open_module", platform="linux", which=no_smi)
    assert facts.nvidia_version == "560.35.03" and facts.nvidia_gpus == ()
    assert facts.nvidia_present  # a driver is loaded, even with no GPU bound


def test_no_driver_means_nothing_to_ask(tmp_path: Path) -> None:
    facts = read_drivers(tmp_path, platform="linux", which=no_smi)
    assert facts == DriverFacts()
    # Off /proc, the driver's tools or its control device are the sign.
    assert read_drivers(tmp_path, platform="linux", which=lambda n: "/usr/bin/" + n).nvidia_present
    (tmp_path / "dev").mkdir()
    (tmp_path / "dev" / "nvidiactl").touch()
    assert read_drivers(tmp_path, platform="linux", which=no_smi).nvidia_present
    assert not read_drivers(tmp_path, platform="darwin", which=no_smi).nvidia_present


def test_identity_changes_with_the_driver_and_the_gpus(tmp_path: Path) -> None:
    root = tmp_path / "root"
    shutil.copytree(DATA / "proc_h100x2", root)
    before = read_drivers(root, platform="linux", which=no_smi).identity()
    assert read_drivers(root, platform="linux", which=no_smi).identity() == before
    gpus = root / "proc" / "driver" / "nvidia" / "gpus"
    shutil.rmtree(gpus / "0000:2a:00.0")  # a GPU fell off the bus
    one = read_drivers(root, platform="linux", which=no_smi).identity()
    assert one != before
    version = root / "proc" / "driver" / "nvidia" / "version"
    version.write_text(version.read_text().replace("550.54.15", "550.90.07"))
    assert read_drivers(root, platform="linux", which=no_smi).identity() not in (before, one)


def test_amd_gpus_are_part_of_the_identity(tmp_path: Path) -> None:
    nodes = tmp_path / "sys" / "class" / "kfd" / "kfd" / "topology" / "nodes"
    for node, gpu_id in (("0", "0"), ("1", "53987"), ("2", "7718")):  # node 0: the CPU
        (nodes / node).mkdir(parents=True)
        (nodes / node / "gpu_id").write_text(gpu_id + "\n")
    (tmp_path / "sys" / "module" / "amdgpu").mkdir(parents=True)
    (tmp_path / "sys" / "module" / "amdgpu" / "version").write_text("6.8.5\n")
    facts = read_drivers(tmp_path, platform="linux", which=no_smi)
    assert facts.amd == "amd=6.8.5[53987,7718]" and not facts.nvidia_present
    assert facts.amd in facts.identity()


def test_odd_information_files_do_not_break_the_reader() -> None:
    gpu = parse_information("0000:01:00.0", "Model:\tNVIDIA L4\nGPU UUID:\t[N/A]\nrubbish\n")
    assert (gpu.model, gpu.uuid, gpu.minor) == ("NVIDIA L4", None, None)
    assert parse_version("nothing like a version") is None


# -- torch/version.py ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "version", "cuda", "hip"),
    [
        ("cpu", "2.13.0+cpu", None, None),
        ("cu124", "2.5.1+cu124", "12.4", None),
        ("rocm62", "2.5.1+rocm6.2", None, "6.2.41133-dd7f95766"),
    ],
)
def test_torch_builds_read_from_their_version_file(
    tmp_path: Path, name: str, version: str, cuda: str | None, hip: str | None
) -> None:
    package = tmp_path / "torch"
    package.mkdir()
    (package / "__init__.py").write_text("raise SystemExit('torch must not be imported')\n")
    (package / "version.py").write_text((DATA / "torch_version" / f"{name}.txt").read_text())

    def find_spec(module: str) -> ModuleSpec:
        return ModuleSpec(module, None, origin=str(package / "__init__.py"))

    build = read_torch_build(find_spec)
    assert build is not None
    assert (build.version, build.cuda, build.hip) == (version, cuda, hip)
    assert str(package / "version.py") in build.stamp == install_stamp(build)
    # A reinstall rewrites the file: a new stamp, so the per-machine cache probes again.
    (package / "version.py").write_text((DATA / "torch_version" / f"{name}.txt").read_text() + "\n")
    again = read_torch_build(find_spec)
    assert again is not None and again.stamp != build.stamp


def test_no_torch_or_an_unreadable_one(tmp_path: Path) -> None:
    assert read_torch_build(lambda name: None) is None
    assert install_stamp(None, lambda name: None) == "none"
    package = tmp_path / "torch"
    package.mkdir()
    (package / "__init__.py").touch()
    (package / "version.py").write_text("__version__ = (")  # truncated by a failed install

    def find_spec(module: str) -> ModuleSpec:
        return ModuleSpec(module, None, origin=str(package / "__init__.py"))

    assert torch_dir(find_spec) == package
    assert read_torch_build(find_spec) is None
    assert install_stamp(None, find_spec) == f"unreadable:{package}"


def test_the_version_file_is_read_not_run() -> None:
    facts = parse_version_file("import os\nos.system('false')\n__version__ = '9.9'\ncuda = None\n")
    assert facts == {"__version__": "9.9", "cuda": None}


def test_the_installed_torch_is_found_without_importing_it() -> None:
    import subprocess
    import sys

    code = (
        "import sys\n"
        "from gpulayer_kernel.capabilities.build import read_torch_build\n"
        "b = read_torch_build()\n"
        "print(b.version if b else None, 'torch' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    version, imported = out.stdout.split()
    assert imported == "False"
    if version != "None":
        import importlib.metadata

        assert version == importlib.metadata.version("torch")
