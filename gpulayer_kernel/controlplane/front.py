"""One flat call surface over the control plane's services (ADR 0001): ``via``.

``ControlPlane.submit`` is ``JobCalls.submit``, ``ControlPlane.run_cell`` is
``SessionCalls.run_cell``: each call of the surface is declared once, in ``core.py``, as
``submit = via("job_calls", JobCalls.submit)``. Its signature is the service's (mypy sees it
through ``via``'s ``ParamSpec``), the HTTP client mirrors the same names (DESIGN rule 1: magics
never care which they hold), and the call runs on the service, which holds only the parts it
was given. The first use on an instance binds the service's method into the instance, so later
calls cost a plain attribute read.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Concatenate, Generic, ParamSpec, TypeVar, overload

P = ParamSpec("P")
R = TypeVar("R")


class via(Generic[P, R]):
    """A call of the front that is a service's method (see the module docstring)."""

    __slots__ = ("function", "method", "name", "service")

    def __init__(self, service: str, method: Callable[Concatenate[Any, P], R]) -> None:
        self.service = service
        self.function = method  # what the class shows (``inspect`` reads its signature)
        self.method = method.__name__
        self.name = self.method

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    @overload
    def __get__(self, obj: None, owner: type | None = None) -> Callable[Concatenate[Any, P], R]: ...

    @overload
    def __get__(self, obj: object, owner: type | None = None) -> Callable[P, R]: ...

    def __get__(self, obj: object | None, owner: type | None = None) -> Any:
        if obj is None:
            return self.function
        bound = getattr(getattr(obj, self.service), self.method)
        obj.__dict__[self.name] = bound  # a non-data descriptor: the instance's own wins now
        return bound
