"""A run's id, which is also its directory's name: ``<job slug>-<date>-<time>-<4 hex>``.

Kept apart (standard library only) so that the run's boxes can be started, labelled
with its id, before the job model and the harness are imported
(:mod:`coordinator.nodes.prewarm`).
"""

from __future__ import annotations

import re
import secrets
import time


def slug(name: str) -> str:
    """A job's name as the start of its runs' names."""
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")[:30] or "job"


def run_name(job_name: str) -> str:
    """A new run's id and directory name."""
    return f"{slug(job_name)}-{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(2)}"
