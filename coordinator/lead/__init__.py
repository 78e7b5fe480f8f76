"""A lead run: the lead member and its retries (``lead``), its waves of spawned members on
the run's one fan-out (``waves``), and the report made from its ``finish`` (``lead_report``).
"""
