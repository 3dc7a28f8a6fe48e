"""A session on its worker (ADR 0019): the executor (``executor.py``), its ranks' processes
(``ranks.py``, each running ``host.py``), their cells (``cells.py``), and the frames between them
(``wire.py``, ``channel.py``, ``output.py``)."""
