"""The client side of a control plane: the HTTP clients (``clients.py``), the calls they share
(``calls.py`` and one module per area), the HTTP base the worker's transport shares too
(``httpbase.py``), and finding which plane to talk to (``connect.py``).

``AsyncClient`` and ``Client`` are importable from here; they load on first use, so a worker or a
job that needs only ``httpbase`` does not import the clients.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..lazy import lazy_names

if TYPE_CHECKING:
    from .clients import AsyncClient, Client

__all__ = ["AsyncClient", "Client"]

__getattr__ = lazy_names(__name__, dict.fromkeys(__all__, "clients"), globals())
