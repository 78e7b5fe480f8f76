"""A documented example checked by running it, through the real ``fleet`` CLI: the
offline lead finds the session as doctest would and a coding member runs it in its
box; a page whose output goes on past a blank line is ``inconclusive``, not
``contradicted``. Members talk to the fake Messages API on 127.0.0.1 through the real
``anthropic`` client, in real boxes.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from fleet_policies import coding_policy, with_lead

from coordinator.cli import main
from coordinator.rundir.runs import RunDir
from subagents.fake_api import tool_use

pytestmark = pytest.mark.docker

# As a rendered page shows it: Sphinx hides doctest's <BLANKLINE>, so the printed
# blank line is just a blank line - correct documentation, not runnable as written.
BLANK_IN_OUTPUT = 'print() writes each line:\n>>> print("a\\n\\nb")\na\n\nb'
HOLDS = "sorted() returns a new list:\n>>> sorted([3, 1, 2])\n[1, 2, 3]"
FINDINGS = {
    "summary": "Two documented examples.",
    "claims": [
        {"text": "print() prints a blank line.", "source_url": "http://corpus:8080/p", "quote": q}
        for q in (BLANK_IN_OUTPUT, HOLDS)
    ],
    "open_questions": [],
    "confidence": "high",
}


def test_an_example_whose_output_holds_a_blank_line_is_inconclusive_not_contradicted(
    tmp_path: Path, images: Any, docker_client: Any, fake_api: Any, cleanup: list[Path]
) -> None:
    def lead(body: dict[str, Any]) -> Any:  # the lead is offline: never asked
        raise AssertionError("the offline lead made a model call")

    def members(body: dict[str, Any]) -> Any:
        if "careful web researcher" in json.dumps(body["system"]):
            return tool_use("submit_result", FINDINGS)
        return coding_policy(turns=0)(body)

    fake_api(with_lead(lead, members))
    cleanup.append(tmp_path / "runs")
    job = tmp_path / "job.toml"
    job.write_text(
        f'name = "checks"\noutput_dir = "{tmp_path / "runs"}"\n[model]\nname = "claude-sonnet-5"\n'
        '[lead]\nquestion = "What does print() print?"\nmembers = 1\nmodel = "offline"\n'
    )
    assert main(["run", str(job), "--plain"]) == 0
    (run,) = RunDir.list(tmp_path / "runs")
    # The session as doctest finds it on the page went into the box.
    files = [m.files.get("example.txt") for m in run.planned_members() or [] if m.files]
    assert files == ['>>> print("a\\n\\nb")\na\n', ">>> sorted([3, 1, 2])\n[1, 2, 3]\n"]
    report = json.loads((run.path / "report.json").read_text())
    checks = {c["claim"]: c for c in report["checks"]}
    assert checks[1]["verdict"] == "verified" and checks[1]["exit_code"] == 0
    assert checks[0]["exit_code"] == 1 and checks[0]["verdict"] == "inconclusive"
    assert "blank line" in checks[0]["detail"] and "<BLANKLINE>" in checks[0]["detail"]
    assert "contradicted" not in (run.path / "report.md").read_text()
