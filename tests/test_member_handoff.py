"""One hand-off per member: a job member's work settings reach the unit a worker runs
in one piece."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

from coordinator.job.jobfile import parse_job
from coordinator.job.work import MemberWork
from coordinator.rundir.runs import RunDir
from coordinator.runner.driver import _units

SCHEMA = {
    "type": "object",
    "properties": {
        "risk": {"type": "string", "enum": ["low", "high"], "description": "How risky."},
        "tests_run": {"type": "array", "minItems": 1},
    },
    "required": ["risk"],
}
"""A job's result schema (a job's own field and a constraint on the coding kind's own one)."""

JOB = """
name = "handoff"
[[members]]
id = "coder"
kind = "coding"
task = "t"
repo = "."
files = { "check.py" = "print(1)" }
setup = "pip install -e ."
attempts = 3
[members.result_schema]
type = "object"
required = ["risk"]
properties.risk = { type = "string", enum = ["low", "high"], description = "How risky." }
properties.tests_run = { type = "array", minItems = 1 }
"""


def test_every_work_setting_of_a_job_member_reaches_its_unit(tmp_path: Path) -> None:
    job = parse_job(JOB)
    [member] = job.members
    # Every setting is given a value other than its default, so none arrives by default.
    for name, info in MemberWork.model_fields.items():
        assert getattr(member, name) != info.get_default(call_default_factory=True), name
    run = RunDir.create(job, JOB, root=tmp_path)
    [unit] = _units(run, job, job.members)
    assert unit.work() == member.work()
    # A unit crosses to a cluster node pickled, and comes back the same.
    assert pickle.loads(pickle.dumps(unit)) == unit


def test_a_run_directorys_members_from_before_still_make_the_same_units(tmp_path: Path) -> None:
    """``members.json`` as runs wrote it when the work settings were MemberJob's own
    fields (keys flat, in that order): a resume reads it to the same units."""
    job = parse_job(JOB)
    run = RunDir.create(job, JOB, root=tmp_path)
    before = {
        "id": "coder",
        "kind": "coding",
        "task": "t",
        "result_schema": SCHEMA,
        "repo": ".",
        "files": {"check.py": "print(1)"},
        "setup": {"run": "pip install -e ."},
        "attempts": 3,
    }
    (run.path / "members.json").write_text(json.dumps([before]))
    planned = run.planned_members()
    assert planned is not None
    [unit] = _units(run, job, planned)
    assert unit.work() == job.members[0].work()
