"""Sessions on the control plane (ADR 0019): the session table (``table.py``), their cells
(``cells.py``), and the ControlPlane's session calls (``side.py``)."""
