"""Provisioning and accounting on the control plane (ADR 0010, 0011): the part that wires them
(``part.py``), the cost ledger (``ledger.py``), budgets (``budgets.py``), provider instances
(``instances.py``), the autoscaler and its reconciler (``autoscaler.py``, ``reconciler.py``), and
the costs report (``costs.py``)."""
