"""Job-defined tools from a job file (``[[members.tools]]``), through the real CLI: the
model sees the tool with its schema, calls it, and the command runs in the member's
box with its arguments passed as arguments, never as shell text."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from scripted_calls import tool_results

from coordinator.cli import main
from coordinator.rundir.runs import RunDir
from subagents.fake_api import tool_use
from subagents.trace import read_trace

TOOLS_JOB = """
name = "tools"
output_dir = "{out}"
[model]
name = "claude-sonnet-5"
[[members]]
id = "coder"
kind = "coding"
task = "Count the words of notes.txt with count_words."
repo = "{repo}"
limits = {{ max_turns = 6, deadline_s = 120 }}
[[members.tools]]
name = "count_words"
description = "Count the words of a file in /workspace."
command = "wc -w {{path}}"
parameters = {{ path = {{ type = "string", description = "file to count" }} }}
"""


@pytest.mark.docker
def test_job_file_tool_runs_in_the_members_box_with_quoted_arguments(
    tmp_path, images, fake_api, cleanup, capsys
):
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "notes.txt").write_text("one two three four\n")

    def policy(body: dict[str, Any]) -> Any:
        step = len(tool_results(body))
        if step == 0:
            return tool_use("count_words", {"path": "notes.txt"})
        if step == 1:  # an argument that tries to add a command stays one argument
            return tool_use("count_words", {"path": "notes.txt; touch /workspace/pwned"})
        return tool_use("submit_result", {"summary": "counted", "tests_run": [], "notes": []})

    api = fake_api(policy)
    out = tmp_path / "runs"
    cleanup.append(out)
    job = tmp_path / "job.toml"
    job.write_text(TOOLS_JOB.format(out=out, repo=repo))
    code = main(["run", str(job), "--plain"])
    assert code == 0, capsys.readouterr().err
    (run,) = RunDir.list(out)
    assert run.outcome("coder").status == "ok"
    # The model was offered the tool with the schema the job file gave it.
    first = api.requests[0]
    (offered,) = [t for t in first["tools"] if t["name"] == "count_words"]
    assert offered["description"] == "Count the words of a file in /workspace."
    assert offered["input_schema"]["properties"]["path"]["type"] == "string"
    assert offered["input_schema"]["required"] == ["path"]
    results = {
        e.call_id: e
        for e in read_trace(run.member_dir("coder") / "trace.jsonl")
        if e.type == "tool_result"
    }
    outputs = [e.output for e in results.values() if "wc -w" in e.output]
    assert len(outputs) == 2
    assert "exit code 0" in outputs[0] and "4 notes.txt" in outputs[0]
    # The injected ';' reached wc as part of a file name, never the shell.
    assert "No such file" in outputs[1] and "'notes.txt; touch /workspace/pwned'" in outputs[1]
    patch = run.member_dir("coder") / "patch.diff"
    assert not patch.exists() or "pwned" not in patch.read_text()


@pytest.mark.parametrize(
    ("tool", "said"),
    [
        (  # a host callable runs outside every box: only when the job says so
            'name = "cwd"\ndescription = "the cwd"\ncallable = "os:getcwd"\n',
            ["members[0].tools[0]", "set host = true"],
        ),
        (
            'name = "shell"\ndescription = "mine"\ncommand = "true"\n',
            ["members[0].tools", "tool 'shell' has the name of a built-in tool"],
        ),
        (  # quotes around a placeholder would let an argument out of its quoting
            'name = "say"\ndescription = "d"\ncommand = "echo \\"{msg}\\" >> log"\n'
            'parameters = { msg = { type = "string" } }\n',
            [
                "members[0].tools[0]",
                "tool 'say': placeholder {msg} stands inside double quotes",
                "write it outside the quotes: 'echo {msg} >> log'",
            ],
        ),
    ],
)
def test_a_job_tool_that_cannot_be_used_stops_the_run_before_it_starts(
    tmp_path, capsys, tool, said
):
    job = tmp_path / "job.toml"
    job.write_text(
        'name = "t"\n[[members]]\nkind = "coding"\ntask = "x"\n[[members.tools]]\n' + tool
    )
    assert main(["run", str(job), "--output-dir", str(tmp_path / "runs")]) == 2
    err = capsys.readouterr().err
    assert all(s in err for s in said), err
    assert not (tmp_path / "runs").exists()


def test_examples_tools_job_names_its_tools(tmp_path):
    from coordinator.job.jobfile import load_job

    job, _ = load_job(Path(__file__).resolve().parent.parent / "examples" / "tools.toml")
    assert [t.name for t in job.members[0].tools] == ["run_tests", "count_lines"]
