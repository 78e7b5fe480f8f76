"""The run directory: its fsync'd journal, ``members.json`` and results (``runs``), and
finding runs by path, id or prefix (``run_lookup``).

Everything above writes or reads it, so it imports only :mod:`coordinator.job`.
"""
