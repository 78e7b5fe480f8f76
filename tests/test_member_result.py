"""A member's result is its kind's type: read back from any run directory, refused when
it arrives from someone not trusted in a shape that is not one.

``MemberOutcome.result`` was a plain dict; now a coding member's is a
``CodingMemberResult``, a browser member's ``BrowserMemberResult`` (or, for a partial
result whose quotes were never checked, ``UncheckedFindings``), the lead's a
``LeadMemberResult``. These tests read result.json files as older Fleets wrote them,
files damaged on disk, and outcomes a node could send.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, ClassVar

import pytest

import coordinator as fleet
from coordinator.cli import main
from coordinator.job.jobfile import parse_job
from coordinator.journal.entries import (
    MemberFinishedEntry,
    MemberStartedEntry,
    RunFinishedEntry,
    RunStartedEntry,
)
from coordinator.nodes.worker import MemberUnit, received_outcome
from coordinator.rundir.runs import RunDir
from subagents.kinds.results import RESULT_CHARS
from subagents.results.outcome import MemberOutcome
from subagents.spec import MemberSpec

OLD_CODING = {
    "input_tokens": 0,
    "output_tokens": 346,
    "cache_read_tokens": 54434,
    "cache_write_tokens": 832,
    "member": "coder",
    "kind": "coding",
    "status": "ok",
    "reason": "",
    # As a Fleet before ``collection_error`` wrote it, with a job's own field.
    "result": {
        "summary": "appended 50 lines",
        "tests_run": [],
        "tests_passed": None,
        "notes": [],
        "patch": "diff --git a/log.txt b/log.txt\n+line 0\n",
        "patch_truncated": False,
        "files_changed": ["log.txt"],
        "verified": {
            "command": "python3 t.py",
            "exit_code": 0,
            "passed": True,
            "output_tail": "OK",
            "gate": True,
        },
        "risk": "low",
    },
    "partial_result": None,
    "limit": None,
    "progress": None,
    "result_truncated": False,
    "retryable": False,
    "resumed_from": 39,
    "turns": 52,
    "cost_usd": 0.016427,
    "duration_s": 7.748,
    "offline": False,
    "not_copied": [],
}
FINDINGS = {
    "summary": "Tasks are cancelled with Task.cancel().",
    "claims": [
        {
            "text": "cancel() requests cancellation",
            "source_url": "http://corpus:8080/library/asyncio-task.html",
            "quote": "Request the Task to be cancelled.",
        }
    ],
    "open_questions": ["what of shield()?"],
    "confidence": "medium",
}
CHECKED = {
    **FINDINGS,
    "claims": [{**FINDINGS["claims"][0], "verified": True, "note": ""}],
    "unverified": [],
    "pages_fetched": 2,
}
JOB = (
    'name = "typed"\n'
    + "".join(f'[[members]]\nid = "{m}"\nkind = "coding"\ntask = "t"\n' for m in "abcd")
    + '[[members]]\nid = "r"\nkind = "browser"\ntask = "t"\n'
)


def _outcome(kind: str, result: Any = None, **fields: Any) -> dict[str, Any]:
    return {"member": "m", "kind": kind, "status": "ok", "result": result, **fields}


def test_an_older_fleets_result_json_reads_as_its_kinds_type_and_writes_back_the_same():
    outcome = MemberOutcome.model_validate_json(json.dumps(OLD_CODING))
    result = outcome.result
    assert isinstance(result, fleet.CodingMemberResult)
    assert result.files_changed == ["log.txt"] and result.verified is not None
    assert result.verified.passed and result.collection_error is None
    assert result.job_fields == {"risk": "low"}  # the job's field survives, typed
    written = json.loads(outcome.model_dump_json())["result"]
    assert {k: v for k, v in written.items() if v is not None} == {
        k: v for k, v in OLD_CODING["result"].items() if v is not None
    }
    browser = MemberOutcome.model_validate(_outcome("browser", CHECKED))
    assert isinstance(browser.result, fleet.BrowserMemberResult)
    assert browser.result.claims[0].verified and browser.result.pages_fetched == 2
    lead = MemberOutcome.model_validate(_outcome("lead", {"summary": "s", "claims": []}))
    assert isinstance(lead.result, fleet.LeadMemberResult) and lead.result.summary == "s"


def test_partial_results_have_their_kinds_type_an_unchecked_one_says_so():
    """A limit's (or the run's budget's) closing submission: a browser member's whose
    quote check did not run is ``UncheckedFindings``, never taken for checked ones."""
    stopped = {"status": "incomplete", "limit": "budget", "result": None}
    browser = MemberOutcome.model_validate(_outcome("browser", partial_result=FINDINGS, **stopped))
    assert isinstance(browser.partial_result, fleet.UncheckedFindings)
    assert not isinstance(browser.partial_result, fleet.BrowserMemberResult)
    checked = MemberOutcome.model_validate(_outcome("browser", partial_result=CHECKED, **stopped))
    assert isinstance(checked.partial_result, fleet.BrowserMemberResult)
    coding = MemberOutcome.model_validate(
        _outcome("coding", partial_result={"summary": "half done"}, **stopped)
    )
    assert isinstance(coding.partial_result, fleet.CodingMemberResult)
    assert coding.partial_result.summary == "half done" and coding.partial_result.patch == ""
    # Unchecked findings are not a finished browser result.
    finished = MemberOutcome.model_validate(_outcome("browser", FINDINGS))
    assert isinstance(finished.result, fleet.UnknownResult)


@pytest.mark.parametrize(
    ("kind", "result", "problem"),
    [
        ("coding", FINDINGS, "claims"),  # another kind's shape
        ("browser", {"summary": "s", "patch": "x"}, "confidence"),
        ("coding", ["not", "an", "object"], "JSON object"),
        ("coding", {"summary": ""}, "summary"),
        ("coding", {"summary": "s", "vote": {"nested": 1}}, "vote"),  # no job value
    ],
    ids=["findings-as-coding", "patch-as-browser", "a-list", "empty-summary", "nested-extra"],
)
def test_a_result_that_is_not_its_kinds_reads_as_unknown_and_is_kept_as_it_was(
    kind, result, problem
):
    outcome = MemberOutcome.model_validate(_outcome(kind, result))
    assert isinstance(outcome.result, fleet.UnknownResult)
    assert problem in outcome.result.problem and outcome.result.kind == kind
    assert json.loads(outcome.model_dump_json())["result"] == result  # nothing lost


def test_a_kind_fleet_does_not_type_keeps_its_fields():
    outcome = MemberOutcome.model_validate(_outcome("probe", {"answer": "3", "sources": []}))
    assert isinstance(outcome.result, fleet.OtherResult)
    assert outcome.result.data == {"answer": "3", "sources": []}
    assert outcome.model_dump()["result"] == {"answer": "3", "sources": []}


def _unit(tmp_path: Path, schema: dict[str, Any] | None = None) -> MemberUnit:
    spec = MemberSpec(id="m", kind="coding", task="t", model="offline", result_schema=schema)
    return MemberUnit(
        run_id="r",
        member_dir=str(tmp_path),
        spec=spec.model_copy(update={"stated_deadline_s": 60}),
        retry={},
    )


class _NotAnOutcome:
    """What a hostile node could pickle into its reply instead of an outcome."""

    status = "ok"
    result: ClassVar[dict[str, str]] = {"summary": "s"}


@pytest.mark.parametrize(
    ("sent", "said"),
    [
        (_outcome("coding", FINDINGS), "is not one: claims"),
        (_outcome("coding", {"summary": "s", "vote": "yes"}), "vote neither the kind nor"),
        (_outcome("coding", {"summary": "s", "notes": ["x" * RESULT_CHARS]}), "over the"),
        (_outcome("coding", "a string"), "JSON object"),
        (_outcome("probe", {"answer": "3"}), "not for coding member 'm'"),
        ({**_outcome("coding", {"summary": "s"}), "member": "other"}, "member 'other'"),
        ({**_outcome("coding", {"summary": "s"}), "status": "won"}, "status"),
        ({**_outcome("coding", None), "partial_result": FINDINGS}, "partial result"),
        (_NotAnOutcome(), "MemberOutcome"),
    ],
    ids=[
        "another-kinds-shape",
        "undeclared-field",
        "oversize",
        "not-an-object",
        "another-kind",
        "another-member",
        "unknown-status",
        "bad-partial",
        "not-an-outcome",
    ],
)
def test_an_outcome_from_a_node_that_is_not_one_is_refused_with_what_is_wrong(tmp_path, sent, said):
    with pytest.raises(ValueError, match=None) as caught:
        received_outcome(_unit(tmp_path), sent)
    assert said in str(caught.value), caught.value
    assert "\n" not in str(caught.value)  # one line, for the member's reason


def test_an_outcome_from_a_node_keeps_the_jobs_declared_fields(tmp_path):
    schema = {"type": "object", "properties": {"vote": {"type": "string"}}}
    sent = MemberOutcome.model_validate(_outcome("coding", {"summary": "s", "vote": "yes"}))
    got = received_outcome(_unit(tmp_path, schema), sent)
    assert isinstance(got.result, fleet.CodingMemberResult)
    assert got.result.job_fields == {"vote": "yes"}


def _finished_run(tmp_path: Path) -> RunDir:
    """A finished run whose members' result.json are an older Fleet's, another kind's,
    huge, and not JSON at all."""
    job = parse_job(JOB)
    run = RunDir.create(job, JOB, root=tmp_path)
    run.save_members(job.members)
    members = {
        "a": OLD_CODING,
        "b": _outcome("coding", FINDINGS),
        "c": _outcome("coding", {"summary": "s", "notes": ["x" * RESULT_CHARS]}),
        "r": _outcome("browser", CHECKED),
    }
    run.journal.append(RunStartedEntry(pid=None))
    for m, data in members.items():
        run.journal.append(MemberStartedEntry(member=m))
        run.write_result(m, {**data, "member": m})
        run.journal.append(MemberFinishedEntry(member=m, status="ok"))
    run.journal.append(MemberStartedEntry(member="d"))
    (run.member_dir("d") / "result.json").write_text('{"member": "d", "status": ')
    run.journal.append(MemberFinishedEntry(member="d", status="ok"))
    run.journal.append(RunFinishedEntry(status="succeeded", ok=5, members=5))
    return run


def test_a_run_directory_with_odd_results_still_lists_traces_and_resumes(tmp_path, capsys):
    run = _finished_run(tmp_path)
    outcomes = run.outcomes()
    assert isinstance(outcomes["a"].result, fleet.CodingMemberResult)
    assert isinstance(outcomes["r"].result, fleet.BrowserMemberResult)
    assert isinstance(outcomes["b"].result, fleet.UnknownResult)
    big = outcomes["c"].result
    assert isinstance(big, fleet.UnknownResult) and "over the" in big.problem
    assert big.model_dump()["notes"] == ["x" * RESULT_CHARS]  # kept whole, not cut
    assert "d" not in outcomes and run.outcome("d") is None  # torn: no outcome at all
    for args in (["runs"], ["runs", "--json"], ["trace", run.id]):
        assert main([*args, "--output-dir", str(tmp_path)]) == 0, capsys.readouterr().err
    # ``fleet resume`` goes through fleet.resume (the CLI adds only its start-up).
    summary = fleet.resume(run.id, output_dir=tmp_path)
    assert summary.status == "succeeded"
    assert isinstance(summary.outcomes["a"].result, fleet.CodingMemberResult)
