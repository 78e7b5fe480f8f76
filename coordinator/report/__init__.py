"""The run's report: what ``report.json`` holds and how ``report.md`` shows it
(``report``), and the analyst that builds it from the members' results alone, with every
citation checked by code (``synthesis``).

It imports no other room: a lead's report and the run's report step use it, and
``fleet trace`` reads its memory lines.
"""
