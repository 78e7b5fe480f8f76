"""One hand-off per member: a job member's work settings reach the unit a worker runs
in one piece, and the job's ``result_schema`` travels once, whole, in the member's
spec - its member's part derived for ``submit_result``, the whole checked after the end.
"""

from __future__ import annotations

import json
import pickle
import shutil
import tomllib
from pathlib import Path
from typing import Any

import pytest
from fleet_policies import tool_results
from pydantic import ValidationError

import coordinator as fleet
from coordinator.job.jobfile import JobError, parse_job
from coordinator.job.work import MemberWork
from coordinator.nodes.worker import MemberUnit, job_fields
from coordinator.rundir.runs import RunDir
from coordinator.runner.driver import _units
from subagents.fake_api import tool_use
from subagents.results.schema_check import MAX_DEPTH, problems
from subagents.spec import MemberSpec

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"

SCHEMA = {
    "type": "object",
    "properties": {
        "risk": {"type": "string", "enum": ["low", "high"], "description": "How risky."},
        "tests_run": {"type": "array", "minItems": 1},
    },
    "required": ["risk"],
}
"""A job's own field (``risk``) and a constraint on the coding kind's own field."""

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
    # The job's schema exists once: whole, in the spec; the unit has no copy of it.
    assert unit.spec.result_schema == SCHEMA and "result_schema" not in MemberUnit.model_fields
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
    assert unit.spec.result_schema == SCHEMA


def test_the_member_fills_in_the_jobs_own_fields_and_the_rest_is_checked_after(
    tmp_path: Path,
) -> None:
    schema = {
        "type": "object",
        "properties": {
            "claims": {"type": "array", "minItems": 1},
            "verdict": {"type": "string", "enum": ["yes", "no"]},
        },
        "required": ["verdict", "claims"],
    }
    spec = MemberSpec(id="r", kind="browser", task="t", result_schema=schema)
    part = spec.member_result_schema()
    assert part is not None and list(part.properties) == ["verdict"]
    assert part.required == ["verdict"]
    unit = MemberUnit(run_id="r", member_dir=str(tmp_path), spec=spec, retry={})
    assert job_fields(unit) == {"claims", "verdict"}


@pytest.mark.parametrize(
    ("schema", "said"),
    [
        (
            '{ type = "object", properties = { summary = { type = "integer" } } }',
            "'summary' has type integer, but the CodingReport result already has 'summary'",
        ),
        ('{ type = "object", required = ["nope"] }', "result_schema requires ['nope']"),
        ('{ type = "object", properties = [1] }', "properties: Input should be a valid dict"),
        ('{ type = "object", required = "risk" }', "required: Input should be a valid list"),
        (
            '{ type = "object", properties = { x = { type = "object" } } }',
            "properties.x.type: Input should be",
        ),
        (
            '{ type = "object", properties = { tests_run = { type = "array", minItems = "1" } } }',
            "properties.tests_run.minItems: should be a whole number, 0 or more (got '1')",
        ),
        (
            '{ type = "object", properties = { notes = { items = { enum = "ab" } } } }',
            "properties.notes.items.enum: should be a list of the allowed values",
        ),
    ],
    ids=[
        "kind-field-of-another-type",
        "required-nowhere",
        "properties-a-list",
        "required-a-string",
        "nested",
        "count-a-string",
        "enum-a-string",
    ],
)
def test_a_result_schema_no_member_could_satisfy_is_refused_when_read(
    schema: str, said: str
) -> None:
    text = f'name = "x"\n[[members]]\nkind = "coding"\ntask = "t"\nresult_schema = {schema}\n'
    with pytest.raises(JobError) as err:
        parse_job(text)
    assert "members[0].result_schema: " in str(err.value) and said in str(err.value)
    # The harness's own spec refuses it alike, as given by a caller of the harness.
    given = tomllib.loads(f"v = {schema}")["v"]
    with pytest.raises(ValidationError) as refused:
        MemberSpec(id="m", kind="coding", task="t", inputs={"result_schema": given})
    assert said in str(refused.value)


def test_a_schema_nested_past_what_the_check_after_the_end_reads_is_refused() -> None:
    """The check after the end recurses once a level: a schema nested deeper than
    :data:`MAX_DEPTH` is refused when read, one as deep as it is taken and checked."""

    def nested(levels: int) -> dict[str, Any]:
        inner: dict[str, Any] = {"type": "string", "minLength": 2}
        for _ in range(levels):
            inner = {"type": "array", "items": inner}
        return {"type": "object", "properties": {"notes": inner}}

    with pytest.raises(ValidationError, match=f"nested more than {MAX_DEPTH} levels deep"):
        MemberSpec(id="m", kind="coding", task="t", result_schema=nested(5_000))
    deepest = MemberSpec(id="m", kind="coding", task="t", result_schema=nested(MAX_DEPTH - 1))
    schema = deepest.job_schema()
    assert schema is not None
    value: Any = "x"
    for _ in range(MAX_DEPTH - 1):
        value = [value]
    [wrong] = problems({"notes": value}, schema)
    assert wrong.startswith("result.notes[0]") and wrong.endswith("at least 2 characters")


def _submitting(body: dict[str, Any]) -> Any:
    """A model that first leaves out the job's required ``risk`` (refused by
    submit_result), then submits it; ``[tested]`` members name a test they ran."""
    tested = "[tested]" in json.dumps(body["messages"][0])
    answer: dict[str, Any] = {"summary": "looked", "tests_run": ["python3 test_greet.py"] * tested}
    if tool_results(body):
        answer["risk"] = "low"
    return tool_use("submit_result", answer)


@pytest.mark.docker
def test_the_jobs_schema_reaches_the_model_and_fails_a_result_after_the_end(
    tmp_path, images, docker_client, cleanup, fake_api
):
    """Through a real run: the model sees the job's new field in submit_result's input
    schema (the request body the fake API recorded) and must fill it in; a constraint
    on the kind's own field (``tests_run`` with ``minItems``) is not the model's schema
    but still fails the member whose result breaks it, with the job's reason."""
    cleanup.append(tmp_path / "runs")
    api = fake_api(_submitting)
    repo = tmp_path / "repo"
    shutil.copytree(EXAMPLES / "sample-repo", repo)
    member = {"kind": "coding", "repo": str(repo), "result_schema": SCHEMA}
    job = {
        "name": "handoff",
        "output_dir": str(tmp_path / "runs"),
        "model": {"name": "claude-sonnet-5"},
        "fanout": {"min_success": 1, "max_parallel": 2},
        "synthesis": {"enabled": False},  # every model call is a member's
        "members": [
            {**member, "id": "bare", "task": "Look at greet.py."},
            {**member, "id": "tested", "task": "[tested] Look at greet.py."},
        ],
    }
    result = fleet.run(job)
    tested, bare = result.outcomes["tested"], result.outcomes["bare"]
    assert tested.status == "ok", tested.reason
    assert tested.result.job_fields == {"risk": "low"}
    assert tested.result.tests_run == ["python3 test_greet.py"]
    assert bare.status == "failed"
    assert bare.reason == (
        "result does not satisfy the job's result_schema: result.tests_run should have at "
        "least 1 items"
    )
    assert len(api.requests) == 4  # each member: refused without risk, then accepted
    for body in api.requests:
        submit = next(t for t in body["tools"] if t["name"] == "submit_result")["input_schema"]
        assert submit["properties"]["risk"]["enum"] == ["low", "high"]
        assert submit["properties"]["risk"]["description"] == "How risky."
        assert "risk" in submit["required"]
        assert "minItems" not in json.dumps(submit["properties"]["tests_run"])
    refused = [text for body in api.requests for text, error in tool_results(body) if error]
    assert refused and all("risk" in text for text in refused)


def test_a_members_known_fields_start_with_its_own_and_name_every_one() -> None:
    """An unknown key in a member's table lists what it may hold: its own fields first
    (id, kind, task), the work settings it shares with the unit after."""
    from coordinator.job.jobfile import known_fields
    from coordinator.job.spec import MemberJob

    listed = known_fields(("members", 0, "colour")).split(", ")
    assert listed[:3] == ["id", "kind", "task"]
    assert sorted(listed) == sorted(MemberJob.model_fields)
