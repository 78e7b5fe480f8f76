"""What a job says: its models (``spec``), reading its TOML (``jobfile``) and the words for
what is wrong with it (``job_problems``), what a member works on beside its spec
(``work``), the planner that splits a research question into members, and a run's name
(``run_names``).

The lowest room: it imports no other room of the coordinator.
"""
