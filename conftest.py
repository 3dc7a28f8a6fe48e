"""What applies to every pytest run of this repository, whatever path it is given.

``pytest --nbval-lax notebooks`` (docs/quickstart.md) never loads ``tests/conftest.py``; this file
is loaded for any path under the repository, so what must hold everywhere lives here (issue 32,
item 12):

- the scheduling of xdist workers: a notebook's cells run on one worker, in order (they share
  one kernel: split across workers, 30 cells failed with ``NameError``), and so do the tests
  that share a costly or stateful fixture;
- one probe cache per run, out of the home folder;
- Python jobs' zygote preloads nothing unless a test asks;
- every process a fixture starts ends with the suite, whatever ends it
  (``gpulayer_kernel/testing/reaper.py``).

The shared fixtures (``gl_home``, ``gl_clock``, ``gl_cp``, ``gl_worker``, ...) ship in
``gpulayer_kernel/pytest_plugin.py``, loaded here, so that extension authors can load them too;
the fixtures of one folder of tests stay in its ``conftest.py``.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

import pytest

# Every process a test starts ends with the run, whatever ends it (a mark, a watchdog per pytest
# process, SIGTERM taken as Ctrl-C, a reaper of earlier runs' leftovers at session start); the
# ``gl_*`` fixtures. Not a pytest11 entry point: this repository's tests should not depend on how
# the package was installed.
pytest_plugins = ("gpulayer_kernel.testing.reaper", "gpulayer_kernel.pytest_plugin")

# Python jobs' zygote imports torch by default where it is installed (~2 s of a core per worker
# started): the suite starts hundreds of workers, so it preloads nothing unless a test asks.
os.environ.setdefault("GPULAYER_ZYGOTE_PRELOAD", "")

# PYTHONDONTWRITEBYTECODE (set in some shells) costs the suite minutes of CPU: every xdist worker
# then rewrites the asserts of all ~500 test modules again (~7 s of a core each), and every
# server, worker, kernel and CLI process it starts compiles gpulayer_kernel from source again
# (~0.3 s each, hundreds of them). The suite writes its bytecode (``__pycache__`` is git-ignored);
# jobs never see the variable either way (worker/env.py passes no PYTHON* variable on).
if os.environ.pop("PYTHONDONTWRITEBYTECODE", None) is not None:
    import sys

    sys.dont_write_bytecode = False


# Session fixtures too costly to start on every xdist worker: the tests that use one run on one
# worker (``--dist loadgroup``), named after it. The wheel build takes ~60 s of a core; Slurm's
# five daemons ~5 s to start and ~10 s to stop. PostgreSQL (1 s) and sshd (0.1 s) start per worker.
SHARED_ENGINES = {"gl_dist": "release", "gl_slurm": "slurm"}
_ENGINE_GROUPS = frozenset(SHARED_ENGINES.values())


# pytest 9.2 builds a test's id from ``item._id``; xdist 3.8's loadgroup still appends "@group" to
# ``item._nodeid``, which nothing reads any more, so its groups silently split. The workers write
# the groups to this file instead and ``GroupScheduling`` (below) reads them in the controller.
_GROUPS_FILE = "GPULAYER_TEST_GROUPS"


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Keep together on one xdist worker what shares a costly or stateful fixture.

    - a notebook's cells (nbval): they share one kernel, in order;
    - a module's tests that use a module- or class-scoped fixture (a Jupyter server, a kernel, a
      served control plane): it starts once, not once per worker;
    - the tests of a session engine in ``SHARED_ENGINES``.

    A test's own ``@pytest.mark.xdist_group("name")`` wins. Notebook cells and engine tests are
    also marked ``slow``.
    """
    groups: dict[str, str] = {}
    slow: list[str] = []
    for item in items:
        own = item.get_closest_marker("xdist_group")
        group = str(own.args[0]) if own and own.args else _group_of(item)
        # A notebook starts a kernel and runs real jobs; an engine's tests wait on its daemons:
        # all are left out of the `-m "not slow"` lane without marking each one by hand.
        if group is not None and (item.path.suffix == ".ipynb" or group in _ENGINE_GROUPS):
            item.add_marker(pytest.mark.slow)
        if group is not None:
            groups[item.nodeid] = group
        if item.get_closest_marker("slow"):
            slow.append(item.nodeid)
    path = os.environ.get(_GROUPS_FILE)
    if path and os.environ.get("PYTEST_XDIST_WORKER"):
        part = f"{path}.{os.environ['PYTEST_XDIST_WORKER']}"
        Path(part).write_text(json.dumps({"groups": groups, "slow": slow}))
        os.replace(part, path)  # every worker collects the same tests: any one file will do


# How much longer than a test of the fast lane a ``slow`` test takes, roughly (the weight that
# orders the work: see ``GroupScheduling``).
_SLOW_WEIGHT = 10


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """Tests of one group go to one worker, in order; every other test to whichever is free.

    The longest work goes out first (longest-processing-time-first): a session engine's group
    (the release build and its installs, Slurm), then groups and tests by weight, a ``slow``
    test counting ``_SLOW_WEIGHT`` fast ones. A long group handed out last would run on one
    worker alone while the others have finished: the run's tail.
    """
    from xdist.scheduler import LoadScopeScheduling

    class GroupScheduling(LoadScopeScheduling):  # type: ignore[misc]
        _groups: dict[str, str] | None = None
        _slow: frozenset[str] = frozenset()
        _ordered = False

        def _split_scope(self, nodeid: str) -> str:
            if self._groups is None:  # asked only once every worker has collected
                path = os.environ.get(_GROUPS_FILE, "")
                found = Path(path) if path else None
                read = json.loads(found.read_text()) if found and found.exists() else {}
                self._groups = read.get("groups", {})
                self._slow = frozenset(read.get("slow", ()))
            return "@" + self._groups[nodeid] if nodeid in self._groups else nodeid

        def _weight(self, scope: str, nodeids: dict[str, bool]) -> int:
            if scope.removeprefix("@") in _ENGINE_GROUPS:
                return 1 << 30
            return sum(_SLOW_WEIGHT if n in self._slow else 1 for n in nodeids)

        def _assign_work_unit(self, node: Any) -> None:
            if not self._ordered:  # the queue is whole by the first assignment
                self._ordered = True
                units = sorted(self.workqueue.items(), key=lambda u: -self._weight(*u))
                self.workqueue.clear()
                self.workqueue.update(units)
            super()._assign_work_unit(node)

    return GroupScheduling(config, log)


def _group_of(item: pytest.Item) -> str | None:
    module = item.nodeid.split("::", 1)[0]
    if item.path.suffix == ".ipynb":
        return module
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return None
    for name in info.names_closure:
        if name in SHARED_ENGINES:
            return SHARED_ENGINES[name]
    for defs in info.name2fixturedefs.values():
        if defs and defs[-1].scope in ("module", "class", "package"):  # [-1]: the one in force
            return module
    return None


_CACHE_MADE: list[str] = []
_GROUPS_MADE: list[str] = []


def pytest_configure(config: pytest.Config) -> None:
    """One per-machine probe cache for the whole run, out of the home folder (capabilities/
    machine.py): the first local worker's background probe fills it, later ones read it."""
    if getattr(config.option, "numprocesses", None) and not os.environ.get(_GROUPS_FILE):
        # Set before xdist starts its workers (they inherit it); removed in pytest_unconfigure.
        fd, path = tempfile.mkstemp(prefix="gpulayer-test-groups-", suffix=".json")
        os.close(fd)
        os.unlink(path)  # a worker makes it; none existing means no groups
        os.environ[_GROUPS_FILE] = path
        _GROUPS_MADE.append(path)
    if not os.environ.get("GPULAYER_CACHE_DIR"):
        os.environ["GPULAYER_CACHE_DIR"] = tempfile.mkdtemp(prefix="gpulayer-test-cache-")
        _CACHE_MADE.append(os.environ["GPULAYER_CACHE_DIR"])


def pytest_unconfigure(config: pytest.Config) -> None:
    """Remove that cache, unless a background probe still writes into it (it ends by itself)."""
    import fcntl
    import shutil

    for path in _GROUPS_MADE:
        for made in Path(path).parent.glob(Path(path).name + "*"):
            made.unlink(missing_ok=True)
    for folder in _CACHE_MADE:
        for lock in Path(folder).glob("probe-*.lock"):
            fd = os.open(lock, os.O_RDWR)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return  # held by a probe process: leave the folder to it
            finally:
                os.close(fd)
        shutil.rmtree(folder, ignore_errors=True)
