"""One run from its checks to its report: the checks before a run exists (``preflight``),
the run's life - plan, fan out or lead, report, journal - and its resume (``driver``), its
budget lines (``run_budget``) and its report step (``analyst``: the lead's report, or the
analyst's over the members' results).

The highest room: only the API (:mod:`coordinator.api`) and the CLI stand above it.
Named ``runner`` and not ``run`` because ``coordinator.run`` is the API's function.
"""
