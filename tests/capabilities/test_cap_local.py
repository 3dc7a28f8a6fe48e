"""A local worker's capabilities: the per-machine cache, the first answer, the background check.

The background check is real here: a probe process that imports this machine's torch, writes the
cache and ends itself, while the process that started it never imports torch.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpulayer_kernel.capabilities import local
from gpulayer_kernel.capabilities.build import TorchBuild
from gpulayer_kernel.capabilities.driver import DriverFacts, ProcGpu
from gpulayer_kernel.capabilities.local import BUILD_SOURCE, BackgroundCheck, local_capabilities
from gpulayer_kernel.capabilities.machine import FORMAT, MachineCache, cache_dir, machine_key
from gpulayer_kernel.contracts import Device, WorkerCapabilities
from gpulayer_kernel.errors import InvalidInput

GIB = 1 << 30
H100 = DriverFacts(
    nvidia_version="550.54.15",
    nvidia_gpus=(ProcGpu("0000:18:00.0", "NVIDIA H100 80GB HBM3", "GPU-1", 0),),
    nvidia_present=True,
)
BUILD = TorchBuild(version="2.13.0+cpu", cuda=None, hip=None, stamp="/x/torch/version.py:1:2")


# -- the key and the cache -----------------------------------------------------------------------


def test_the_key_follows_what_the_answer_depends_on() -> None:
    key = machine_key(H100, BUILD, {})
    assert machine_key(H100, BUILD, {}) == key
    others = [
        machine_key(DriverFacts(nvidia_version="550.54.15", nvidia_present=True), BUILD, {}),
        machine_key(H100, None, {}, torch_stamp="none"),
        machine_key(H100, TorchBuild("2.13.0+cpu", None, None, "/x/torch/version.py:1:3"), {}),
        machine_key(H100, BUILD, {"CUDA_VISIBLE_DEVICES": "1"}),
        machine_key(H100, BUILD, {"HIP_VISIBLE_DEVICES": "0"}),
    ]
    assert len({key, *others}) == 1 + len(others)
    # The home folder is not part of it: a fresh $GPULAYER_HOME finds the machine's answer.
    assert machine_key(H100, BUILD, {"GPULAYER_HOME": "/elsewhere"}) == key


def test_the_cache_keeps_fresh_answers_only(tmp_path: Path) -> None:
    store = MachineCache(tmp_path / "cache", ttl=100.0)
    caps = WorkerCapabilities(probe_sources=["torch"]).model_dump(mode="json")
    assert store.read("k" * 64) is None
    assert store.write("k" * 64, caps, now=1000.0)
    assert store.read("k" * 64, now=1050.0) == caps
    assert store.read("k" * 64, now=1101.0) is None  # expired: probe again
    assert store.read("j" * 64, now=1050.0) is None  # another key
    assert oct(os.stat(tmp_path / "cache").st_mode & 0o777) == "0o700"


@pytest.mark.parametrize(
    "content",
    ["", "{", "[]", '{"key": "kkk", "format": 1}', json.dumps({"format": FORMAT, "key": "x"})],
)
def test_a_damaged_or_foreign_entry_is_no_entry(tmp_path: Path, content: str) -> None:
    store = MachineCache(tmp_path)
    store.path("k" * 64).write_text(content)
    assert store.read("k" * 64) is None


def test_an_unwritable_cache_is_no_cache(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    store = MachineCache(blocker / "cache")
    assert store.write("k" * 64, {}) is False
    assert store.read("k" * 64) is None


def test_old_entries_of_other_keys_are_pruned(tmp_path: Path) -> None:
    store = MachineCache(tmp_path)
    store.write("a" * 64, {})
    old = store.path("a" * 64)
    os.utime(old, (time.time() - 40 * 86400,) * 2)
    store.write("b" * 64, {})
    assert not old.exists() and store.path("b" * 64).exists()


def test_where_the_cache_lives() -> None:
    assert cache_dir({"GPULAYER_CACHE_DIR": "/c"}) == Path("/c")
    assert cache_dir({"XDG_CACHE_HOME": "/x"}) == Path("/x/gpulayer")
    assert cache_dir({}) == Path.home() / ".cache" / "gpulayer"


# -- local_capabilities ---------------------------------------------------------------------------


async def test_simulated_gpus_need_no_probe(tmp_path: Path) -> None:
    probed = await local_capabilities(env={"GPULAYER_SIMULATE_GPUS": "2"}, cache=tmp_path)
    assert probed.capabilities.simulated and len(probed.capabilities.devices) == 2
    assert probed.check is None and not list(tmp_path.iterdir())
    with pytest.raises(InvalidInput, match="GPULAYER_SIMULATE_GPUS='two' is not a number") as e:
        await local_capabilities(env={"GPULAYER_SIMULATE_GPUS": "two"}, cache=tmp_path)
    assert e.value.details == {"field": "GPULAYER_SIMULATE_GPUS"} and e.value.hint


class NoCheck(BackgroundCheck):
    """A background check that never starts a probe (and answers nothing)."""

    started = 0

    def start(self) -> None:
        NoCheck.started += 1
        self._finish(None)


async def test_a_cached_answer_is_used_with_fresh_host_facts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(local, "BackgroundCheck", NoCheck)
    env = {"GPULAYER_CACHE_DIR": str(tmp_path)}
    key = machine_key(local.read_drivers(), local.read_torch_build(), env)
    seen = Device(index=0, vendor="nvidia", name="NVIDIA H100", kind="h100", memory_bytes=GIB)
    cached = WorkerCapabilities(devices=[seen], probe_sources=["torch"], runtime="cuda")
    MachineCache(tmp_path).write(key, cached.model_dump(mode="json"))
    probed = await local_capabilities(env=env)
    assert probed.from_cache and probed.check is None
    assert probed.capabilities.devices == [seen]
    assert probed.capabilities.host.cpus >= 1 and probed.capabilities.host.hostname
    # Another key (here: other visible devices) is another machine state: not this entry.
    other = await local_capabilities(env={**env, "CUDA_VISIBLE_DEVICES": "3"})
    assert not other.from_cache and other.capabilities.devices == []
    assert await other.checked() is None


async def test_without_a_driver_nothing_runs_and_nothing_is_guessed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def no_probe(**kw: object) -> WorkerCapabilities:
        raise AssertionError("no process should probe a machine without a driver")

    monkeypatch.setattr(local, "run_probe", no_probe)
    caps = await local.first_answer(DriverFacts(), BUILD, has_torch=True)
    assert caps.devices == [] and caps.runtime == "cpu"
    assert caps.frameworks.torch_version == "2.13.0+cpu" and caps.probe_sources == [BUILD_SOURCE]
    # What only a running torch can say stays unset until it has said it.
    assert not caps.frameworks.cuda_available and caps.frameworks.distributed_backends == []
    bare = await local.first_answer(DriverFacts(), None, has_torch=False)
    assert bare.probe_errors == ["torch: not installed"] and bare.probe_sources == []


async def test_with_a_driver_the_devices_come_from_the_no_torch_probe(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    asked: list[object] = []
    h100 = Device(index=0, vendor="nvidia", name="NVIDIA H100", kind="h100", memory_bytes=GIB)

    async def driver_probe(**kw: object) -> WorkerCapabilities:
        asked.append(kw)
        return WorkerCapabilities(devices=[h100], cuda_driver="550.54.15", probe_sources=["nvml"])

    monkeypatch.setattr(local, "run_probe", driver_probe)
    caps = await local.first_answer(H100, BUILD, has_torch=True)
    assert asked == [{"timeout": 30.0, "args": ["--no-torch"]}]
    assert caps.devices == [h100] and caps.runtime == "cuda" and caps.cuda_driver == "550.54.15"
    assert caps.probe_sources == ["nvml", BUILD_SOURCE]
    assert caps.dist_backend == "gloo"  # NCCL unconfirmed until torch has been imported


@pytest.mark.slow  # the background probe imports torch: ~2-4 s of CPU
async def test_the_background_check_answers_and_fills_the_cache(tmp_path: Path) -> None:
    env = {"GPULAYER_CACHE_DIR": str(tmp_path)}
    first, second = await asyncio.gather(local_capabilities(env=env), local_capabilities(env=env))
    if first.check is None:  # no torch here: the first answer was the whole one, and cached
        assert first.capabilities.probe_errors == ["torch: not installed"]
        assert (await local_capabilities(env=env)).from_cache
        return
    assert BUILD_SOURCE in first.capabilities.probe_sources
    assert second.check is not None
    # One probe process for both: the second waits for the first one's answer in the cache.
    assert [c.pid is not None for c in (first.check, second.check)].count(True) == 1
    full, other = await asyncio.gather(first.checked(), second.checked())
    assert full is not None and other is not None
    assert BUILD_SOURCE not in full.probe_sources
    assert full.frameworks.torch_version == first.capabilities.frameworks.torch_version
    assert "gloo" in full.frameworks.distributed_backends  # what only torch can say
    assert other.model_copy(update={"host": full.host}) == full
    again = await local_capabilities(env=env)
    assert again.from_cache and again.capabilities.model_copy(update={"host": full.host}) == full


def test_a_probe_past_its_deadline_stops_itself(tmp_path: Path) -> None:
    """A torch whose import hangs: the background probe ends at its deadline, caching nothing."""
    fake = tmp_path / "site"
    (fake / "torch").mkdir(parents=True)
    (fake / "torch" / "__init__.py").write_text("import time\ntime.sleep(60)\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(fake), *sys.path])}
    start = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "gpulayer_kernel.capabilities.probe", "--deadline", "1",
         "--cache-dir", str(tmp_path / "cache"), "--key", "k" * 64],
        env=env, capture_output=True, timeout=60,
    )  # fmt: skip
    assert done.returncode != 0 and time.monotonic() - start < 30
    assert not (tmp_path / "cache").exists()


async def test_a_failed_background_probe_is_no_answer(tmp_path: Path) -> None:
    check = BackgroundCheck(MachineCache(tmp_path), "k" * 64, python=str(tmp_path / "nope"))
    check.start()
    assert await check.result() is None
    crashing = tmp_path / "python"
    crashing.write_text('#!/bin/sh\necho \'{"probe_errors": ["probe: boom"]}\'\n')
    crashing.chmod(0o755)
    check = BackgroundCheck(MachineCache(tmp_path), "j" * 64, python=str(crashing))
    check.start()
    assert await check.result() is None
    assert MachineCache(tmp_path).read("j" * 64) is None


# -- the embedded default re-registers with the full answer ---------------------------------------


@pytest.mark.slow  # the background probe imports torch: ~2-4 s of CPU
async def test_the_local_worker_is_re_registered_with_the_full_answer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from gpulayer_kernel.embedded import Embedded

    monkeypatch.setenv("GPULAYER_CACHE_DIR", str(tmp_path / "cache"))  # a machine never probed
    async with Embedded(tmp_path / "home", local_worker=True) as emb:
        assert emb.probe is not None and emb.worker is not None
        if emb.probe.check is None:
            pytest.skip("no torch here: the first answer is the whole answer")
        [first] = await emb.cp.workers()
        assert BUILD_SOURCE in first.capabilities.probe_sources
        full = await emb.probe.checked()
        assert full is not None
        deadline = time.monotonic() + 30
        while True:
            [now] = await emb.cp.workers()
            if BUILD_SOURCE not in now.capabilities.probe_sources:
                break
            assert time.monotonic() < deadline, "the worker kept its first answer"
            await asyncio.sleep(0.05)
        assert now.id == first.id  # the same worker, not a second one
        assert now.capabilities.frameworks == full.frameworks
