"""A package's names imported on first use (PEP 562's module ``__getattr__``), written once.

Several packages keep their imports cheap this way: a job process imports ``gpulayer_kernel``,
pytest loads ``gpulayer_kernel.testing``, and neither should pay for pydantic and the control
plane (~300 ms) until a name that needs them is read.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def lazy_names(
    package: str, table: Mapping[str, str], namespace: dict[str, Any]
) -> Callable[[str], Any]:
    """The ``__getattr__`` of ``package``: each name of ``table`` (name -> its module, relative
    to the package) imported when first read, then kept in ``namespace`` (the package's
    globals) so the next read is a plain lookup."""

    def __getattr__(name: str) -> Any:
        module = table.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f".{module}", package), name)
        namespace[name] = value
        return value

    return __getattr__
