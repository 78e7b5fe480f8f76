"""Members that a limit stopped, through the real ``fleet`` CLI: what they had found
reaches the lead and the report (marked partial), and what they left open is never
dropped - for a lead run and for a plain fan-out's analyst alike. Members talk to the
fake Messages API on 127.0.0.1 through the real ``anthropic`` client, in real boxes.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from fleet_policies import tool_results, with_lead

from coordinator.cli import main
from coordinator.rundir.runs import RunDir
from subagents.fake_api import tool_use
from subagents.trace import read_trace

pytestmark = pytest.mark.docker

NOTE = "no passage on the pages read matched the task's key terms"
LEFT_OPEN = "How does shield() change the cancellation of A?"
PARTIAL = {
    "summary": "Read one page before the turn limit.",
    "claims": [
        {
            "text": "A is cancelled by calling cancel() on its task.",
            "source_url": "http://corpus:8080/library/asyncio-task.html",
            "quote": "Request cancellation of the Task.",
        }
    ],
    "open_questions": [LEFT_OPEN, NOTE],
    "confidence": "low",
}
FOUND = {
    "summary": "B returns a result.",
    "claims": [
        {
            "text": "B returns the coroutine's result.",
            "source_url": "http://corpus:8080/library/asyncio-task.html",
            "quote": "Return the result of the Task.",
        }
    ],
    "open_questions": [NOTE, "What does B return when it is cancelled?"],
    "confidence": "medium",
}


def members(body: dict[str, Any]) -> Any:
    """``[stuck]`` searches until its turn limit stops it, then answers the closing call
    (the one that forces ``submit_result``) with what it had; the others submit at once."""
    task = json.dumps((body.get("messages") or [{}])[0])
    forced = (body.get("tool_choice") or {}).get("name") == "submit_result"
    if "[stuck]" in task and not forced:
        return tool_use("search", {"query": "asyncio cancel"})
    return tool_use("submit_result", PARTIAL if "[stuck]" in task else FOUND)


def _fan_out(tmp_path: Path, cleanup: list[Path], synthesis: str) -> RunDir:
    """A plain fan-out of a ``[stuck]`` member and one that answers, run to its end."""
    cleanup.append(tmp_path / "runs")
    job = tmp_path / "job.toml"
    job.write_text(
        f'name = "partial-fanout"\noutput_dir = "{tmp_path / "runs"}"\n'
        '[model]\nname = "claude-sonnet-5"\n' + synthesis + "[[members]]\n"
        'id = "a"\nkind = "browser"\ntask = "What does A do? [stuck]"\n'
        "limits = { max_turns = 2 }\n"
        '[[members]]\nid = "b"\nkind = "browser"\ntask = "What does B do?"\n'
    )
    main(["run", str(job), "--plain"])  # exit 1 or 0: a member ended incomplete
    (run,) = RunDir.list(tmp_path / "runs")
    return run


def _report(run: RunDir) -> dict[str, Any]:
    return json.loads((run.path / "report.json").read_text())


def test_a_member_stopped_by_a_limit_reaches_the_lead_and_the_report_as_partial(
    tmp_path: Path, images: Any, docker_client: Any, fake_api: Any, cleanup: list[Path]
) -> None:
    def lead(body: dict[str, Any]) -> Any:
        seen = "\n".join(t for t, _ in tool_results(body))
        if "Wave 1 started" not in seen:
            spawn = [
                {"kind": "browser", "task": "What does A do? [stuck]"},
                {"kind": "browser", "task": "What does B do?"},
            ]
            return tool_use("spawn", {"members": spawn})
        if "member w1-1" not in seen or "member w1-2" not in seen:
            return tool_use("wait", {"until": "all"})
        # The lead passes over what w1-1 left open: the report must not.
        claims = [
            {"text": "A is cancelled with cancel().", "cites": [{"member": "w1-1", "claim": 0}]},
            {"text": "B returns its result.", "cites": [{"member": "w1-2", "claim": 0}]},
        ]
        return tool_use("finish", {"summary": "A and B.", "claims": claims})

    fake_api(with_lead(lead, members))
    cleanup.append(tmp_path / "runs")
    job = tmp_path / "job.toml"
    job.write_text(
        f'name = "partial"\noutput_dir = "{tmp_path / "runs"}"\n[model]\nname = "claude-sonnet-5"\n'
        '[lead]\nquestion = "What do A and B do?"\nmembers = 2\nkinds = ["browser"]\n'
        "member_limits = { max_turns = 2, max_tokens = 200000 }\n"
    )
    assert main(["run", str(job), "--plain"]) == 0
    (run,) = RunDir.list(tmp_path / "runs")
    stuck = run.outcome("w1-1")
    assert stuck.status == "incomplete" and stuck.partial_result.claims
    # The lead heard of it with its partial result, said to be partial, in the block.
    events = list(read_trace(run.path / "lead" / "trace.jsonl"))
    told = "\n".join(e.output for e in events if e.type == "tool_result" and e.tool == "wait")
    assert "member w1-1 (browser, wave 1) ended incomplete" in told
    assert "a limit stopped it" in told and '"partial_result"' in told
    assert "Request cancellation of the Task." in told.split('url="member:w1-1"')[1]
    report = _report(run)
    by_text = {c["text"]: c for c in report["claims"]}
    cited = by_text["A is cancelled with cancel()."]
    assert not cited["uncited"]
    assert [(c["member"], c["claim"], c["partial"]) for c in cited["citations"]] == [
        ("w1-1", 0, True)
    ]
    assert [c["partial"] for c in by_text["B returns its result."]["citations"]] == [False]
    # What it left open is listed although the lead's finish named nothing open; its
    # note about its own reading is not an open question.
    assert LEFT_OPEN in report["open_questions"]
    assert NOTE not in report["open_questions"]
    md = (run.path / "report.md").read_text()
    assert "w1-1#0 (partial)" in md


def test_the_analyst_of_a_plain_fan_out_uses_a_partial_result_and_keeps_its_questions(
    tmp_path: Path, images: Any, docker_client: Any, fake_api: Any, cleanup: list[Path]
) -> None:
    fake_api(members)
    run = _fan_out(tmp_path, cleanup, '[synthesis]\nmodel = "offline"\n')
    assert run.outcome("a").status == "incomplete"
    report = _report(run)
    cites = {(c["member"], c["partial"]) for cl in report["claims"] for c in cl["citations"]}
    assert cites == {("a", True), ("b", False)}
    assert "A is cancelled by calling cancel() on its task." in [
        c["text"] for c in report["claims"]
    ]
    assert report["open_questions"] == [LEFT_OPEN, "What does B return when it is cancelled?"]
    assert "partial results included" in report["summary"]
    assert "a#0 (partial)" in (run.path / "report.md").read_text()


def test_a_model_analyst_that_passes_over_a_partial_members_question_does_not_drop_it(
    tmp_path: Path, images: Any, docker_client: Any, fake_api: Any, cleanup: list[Path]
) -> None:
    seen: list[str] = []

    def policy(body: dict[str, Any]) -> Any:
        if "analyst of a research team" not in json.dumps(body.get("system")):
            return members(body)
        seen.append(json.dumps(body["messages"]))
        claims = [{"text": "A is cancelled.", "cites": [{"member": "a", "claim": 0}]}]
        return tool_use("submit_report", {"summary": "A.", "claims": claims})

    fake_api(policy)
    run = _fan_out(tmp_path, cleanup, "")
    (asked,) = seen
    # The analyst read the partial result, said to be partial, outside its block.
    assert "PARTIAL result" in asked and "Request cancellation of the Task." in asked
    report = _report(run)
    assert [(c["member"], c["partial"]) for c in report["claims"][0]["citations"]] == [("a", True)]
    assert report["open_questions"] == [LEFT_OPEN]
