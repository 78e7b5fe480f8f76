"""Where a member's attempts run: the :class:`~coordinator.nodes.worker.Nodes` seam and one
member's retries and record (``worker``), this host (``node``), a Ray cluster
(``cluster``, its node actor ``node_service`` and what travels to and from it:
``shipping``, the stream's typed messages in ``stream``, ``node_asks``, ``node_budget``,
``node_durable``, ``run_governor``), the
boxes started early and how many run at once (``prewarm``, ``capacity``), and what of a
user's repository goes into a box (``repo_copy``, ``repo_list``, ``repo_tree``, with
every host git command in ``host_git``).
"""
