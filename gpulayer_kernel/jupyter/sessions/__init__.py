"""Sessions in a notebook (ADR 0019): the kernel's current session and its line commands
(``current.py``), session cells (``cells.py``), and the link kept true (``link.py``)."""
