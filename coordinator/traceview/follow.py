"""``fleet trace RUN --follow``: tail a run live from its files.

Polling (every ``interval`` seconds) rather than inotify: it works the same on any
filesystem, including a run directory on a network mount or inside a bind-mounted
volume, and costs one ``stat``-sized read per member per poll. Only complete lines
are consumed, so an event being written is picked up whole on the next poll. The
follower exits once the run's end is recorded and nothing new arrived in the last
poll; Ctrl-C stops it earlier (the CLI turns that into exit code 130).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import TextIO

from coordinator.oversight.visible import on_terminal
from coordinator.traceview.load import (
    load_run,
    read_journal,
    read_json,
    read_new_events,
    refresh_members,
)
from coordinator.traceview.rollup import rollup_run
from coordinator.traceview.text import format_event, format_run


def follow(
    name: str | Path,
    out: TextIO,
    *,
    member: str | None = None,
    interval: float = 0.5,
    sleep: Callable[[float], None] = time.sleep,
) -> int:
    """Print the run table, then every new event as it is written; return 0 at the run's end."""
    run = load_run(name)
    out.write(
        on_terminal(format_run(rollup_run(run)))
        + "\n\nfollowing "
        + on_terminal(str(run.dir))
        + " (Ctrl-C to stop)\n"
    )
    out.flush()
    while True:
        was_finished = run.finished
        refresh_members(run)
        printed = 0
        for m in run.members:
            if member is not None and m.id != member:
                continue
            for ev in read_new_events(m):
                line = format_event(m.id, ev)
                if line is not None:
                    out.write(on_terminal(line) + "\n")
                    printed += 1
        out.flush()
        # Exit only after one full poll that started with the run already over, so
        # the members' last lines written just before the run's end are not lost.
        if was_finished and printed == 0:
            break
        run.journal = read_journal(run.dir)
        sleep(interval)
    for m in run.members:
        m.result = read_json(m.dir / "result.json")
    out.write("\n" + on_terminal(format_run(rollup_run(run))) + "\n")
    out.flush()
    return 0
