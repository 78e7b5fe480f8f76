"""A lone surrogate from the model (JSON may carry one as a ``\\ud800`` escape) or from
a box (a file's bytes that are not UTF-8) ends no member and breaks no record: the
trace, the journal and the result are written, and ``fleet trace`` reads them. Before,
the model's escape ended its member "internal error: UnicodeEncodeError"."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from coordinator.cli import main
from coordinator.rundir.runs import RunDir
from subagents.fake_api import tool_use
from subagents.trace import read_trace

pytestmark = pytest.mark.docker
ODD = "a\ud800b"


def _policy(body: dict[str, Any]) -> Any:
    turns = sum(1 for m in body["messages"] if m["role"] == "assistant")
    if turns == 0:
        return tool_use("shell", {"command": f"printf 'x\\377y' > odd.txt; echo {ODD}"})
    if turns == 1:
        return tool_use("read_file", {"path": "odd.txt"})
    return tool_use("submit_result", {"summary": f"done {ODD}", "tests_run": [], "notes": [ODD]})


def test_a_lone_surrogate_from_the_model_or_a_file_ends_no_member(
    tmp_path: Path, images, docker_client, fake_api, cleanup, capsys
) -> None:
    fake_api(_policy)
    cleanup.append(tmp_path / "runs")
    job = tmp_path / "job.toml"
    job.write_text(
        f'name = "t"\noutput_dir = "{tmp_path / "runs"}"\n[model]\nname = "claude-sonnet-5"\n'
        '[[members]]\nid = "odd"\nkind = "coding"\ntask = "Write an odd file."\n'
    )
    code = main(["run", str(job), "--plain"])
    err = capsys.readouterr().err
    assert code == 0, err
    (run,) = RunDir.list(tmp_path / "runs")
    result = run.outcome("odd")
    assert result.status == "ok", result.reason
    assert "internal error" not in err
    events = list(read_trace(run.path / "members" / "odd" / "trace.jsonl"))
    calls = [e for e in events if e.type == "tool_call"]
    # What UTF-8 cannot hold is shown as U+FFFD in every record, the rest as written.
    assert calls and calls[0].input["command"].endswith("a\ufffdb")
    read = [e for e in events if e.type == "tool_result" and e.tool == "read_file"]
    assert read and "x\ufffdy" in read[0].output
    assert main(["trace", str(run.path), "odd"]) == 0
    assert "done" in capsys.readouterr().out
    json.loads((run.path / "report.json").read_text())
