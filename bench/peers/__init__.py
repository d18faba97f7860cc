"""The systems `make bench` compares: their definitions (``systems.py``) and their agents.

An agent is a small script that runs inside a peer's own virtual environment (under
``.bench/venvs/``) and speaks only that peer's public API: ``setup`` (install its schema),
``seed count=N`` (pre-enqueue N no-op jobs the fastest way the peer offers), ``produce ...`` (one
call of the peer's normal enqueue API per job, see ``bench.probe.produce``), and the module the
peer's own worker command loads (the no-op handler, which calls ``bench.probe.started``).
"""
