"""Many members at once: the fan-out's policy - quorum, fail-fast, cancelling - (``fanout``)
over the executor that decides when each member runs (``executor``)."""
