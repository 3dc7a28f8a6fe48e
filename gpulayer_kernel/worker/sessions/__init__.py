"""A session on its worker (ADR 0019): the executor (``executor.py``) holding its attempt
(``attempt.py``, shared with a GPU kernel's executor, ``kernel.py``), its rank group (``ranks.py``,
each rank running ``host.py``) and its cells (``cells.py``), side by side; and the frames between
them (``wire.py``, ``channel.py``, ``output.py``)."""
