"""What a run's journal holds: one pydantic model per kind of entry (``entries``),
written and read through them; the file itself is :mod:`coordinator.rundir.runs`'s."""
