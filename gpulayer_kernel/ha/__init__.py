"""High availability (ADR 0009, 0020): leadership on PostgreSQL (``leadership.py``), the standby
server that answers until it leads (``standby.py``), and the clients' and workers' choice among a
control plane's URLs (``failover.py``)."""
