"""A whole coding member: fake Messages API -> real anthropic client -> loop -> real box."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import pytest
from loop_support import coding_box, events, scripted, writer

from subagents.fake_api import reply, tool_use
from subagents.kinds.coding import CHECK_BRIEF, CodingSettings
from subagents.member import run_member
from subagents.spec import Limits, MemberSpec

pytestmark = [pytest.mark.docker, pytest.mark.anyio]

CHECK = "python3 -B -c 'import calc; assert calc.add(2, 3) == 5; print(\"ok\")'"


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
async def box(docker_client, images, run_id: str) -> AsyncIterator:
    files = {"calc.py": "def add(a, b):\n    return a - b\n", "README.md": "calc\n"}
    async with coding_box(docker_client, images, run_id, files) as sandbox:
        init = await sandbox.exec(
            "git init -q && git add -A && git -c user.name=u -c user.email=u@x commit -qm init"
        )
        assert init.ok, init.stderr
        yield sandbox


async def test_coding_member_fixes_a_bug_and_returns_the_patch(box, tmp_path: Path) -> None:
    script = [
        reply(tool_use("read_file", {"path": "calc.py"}), tool_use("grep", {"pattern": "def add"})),
        tool_use(
            "edit_file",
            {"path": "calc.py", "old_string": "return a - b", "new_string": "return a + b"},
        ),
        # Importing first leaves a __pycache__ behind, which must not be in the patch.
        tool_use("shell", {"command": f"python3 -c 'import calc' && {CHECK}"}),
        tool_use(
            "submit_result",
            {
                "summary": "add() subtracted; now it adds.",
                "tests_run": [CHECK],
                "tests_passed": True,
            },
        ),
    ]
    spec = MemberSpec(
        id="coder", kind="coding", task="Fix add() in calc.py.", settings=CodingSettings(test=CHECK)
    )
    outcome, api = await scripted(box, tmp_path, spec, script)
    assert outcome.status == "ok", outcome.reason
    result = outcome.result
    assert result.files_changed == ["calc.py"]  # no __pycache__, no .git
    assert "-    return a - b\n+    return a + b" in result.patch
    assert result.verified.passed is True and result.verified.exit_code == 0
    assert result.tests_passed is True and not result.patch_truncated
    assert (tmp_path / "patch.diff").read_text() == result.patch
    # The model was told the check command in words, not handed settings as data.
    first = [b["text"] for b in api.requests[0]["messages"][0]["content"]]
    assert first == ["Fix add() in calc.py.", CHECK_BRIEF + CHECK]
    # The model saw the coding tools and a submit_result without a patch field.
    tools = {t["name"]: t for t in api.requests[0]["tools"]}
    assert {"shell", "read_file", "write_file", "edit_file", "glob", "grep"} <= set(tools)
    assert "write_todos" in tools  # todos default on for coding
    assert "patch" not in tools["submit_result"]["input_schema"]["properties"]
    # The workspace's own repository was not touched by the baseline snapshot.
    log = await box.exec("git log --oneline | wc -l; git status --porcelain")
    assert log.stdout.split("\n")[:2] == ["1", " M calc.py"]
    shell = [e for e in events(tmp_path / "trace.jsonl", "tool_result") if e.tool == "shell"]
    assert shell and "ok" in shell[0].output and not shell[0].is_error


async def test_offline_coding_policy_applies_stated_edit_and_verifies(box, tmp_path: Path) -> None:
    from subagents.model.factory import make_model

    spec = MemberSpec(
        id="coder",
        kind="coding",
        task="Fix add(): replace `return a - b` with `return a + b` in `calc.py`.",
        settings=CodingSettings(test=CHECK),
    )
    model = make_model("offline", kind="coding")
    outcome = await run_member(
        spec, sandbox=box, model=model, run_dir=tmp_path, trace=writer(tmp_path, "coder")
    )
    assert outcome.status == "ok", outcome.reason
    assert outcome.offline
    result = outcome.result
    assert result.files_changed == ["calc.py"]
    assert result.tests_passed is True and result.verified.passed is True
    assert "Test exit codes: 1 -> 0." in result.summary
    assert any("offline" in note for note in result.notes)
    starts = events(tmp_path / "trace.jsonl", "member_start")
    assert starts[0].offline


async def test_turn_limit_partial_result_carries_the_patch_of_the_work_done(
    box, tmp_path: Path
) -> None:
    edit = {"path": "calc.py", "old_string": "return a - b", "new_string": "return a + b"}
    script = [
        tool_use("edit_file", edit),
        tool_use("submit_result", {"summary": "add() fixed; tests not run yet."}),
    ]
    spec = MemberSpec(
        id="coder", kind="coding", task="Fix add() in calc.py.", limits=Limits(max_turns=1)
    )
    outcome, api = await scripted(box, tmp_path, spec, script)
    assert outcome.status == "incomplete" and outcome.limit == "turns"
    assert api.requests[1]["tool_choice"] == {"type": "tool", "name": "submit_result"}
    partial = outcome.partial_result
    assert partial is not None and outcome.result is None
    assert partial.summary == "add() fixed; tests not run yet."
    assert partial.files_changed == ["calc.py"]
    assert "+    return a + b" in partial.patch


async def test_a_file_name_that_is_not_utf8_goes_through_tools_and_into_the_patch(
    box, tmp_path: Path
) -> None:
    made = await box.exec("printf 'old\\n' > $'caf\\xe9.txt'")
    assert made.ok, made.stderr
    script = [
        tool_use("glob", {"pattern": "*.txt"}),
        tool_use("edit_file", {"path": "caf\\xe9.txt", "old_string": "old", "new_string": "new"}),
        tool_use("submit_result", {"summary": "renamed nothing, changed a word."}),
    ]
    spec = MemberSpec(id="coder", kind="coding", task="Change the word in the odd file.")
    outcome, api = await scripted(box, tmp_path, spec, script)
    assert outcome.status == "ok", outcome.reason
    # The model was shown the name in a form it used back, and the result says the same.
    glob_result = api.requests[1]["messages"][-1]["content"][0]["content"][0]["text"]
    assert glob_result == "/workspace/caf\\xe9.txt"
    assert outcome.result.files_changed == ["caf\\xe9.txt"]
    # The patch names the real bytes and applies to a copy of the original.
    host = tmp_path / "host"
    host.mkdir()
    (host / os.fsdecode(b"caf\xe9.txt")).write_bytes(b"old\n")
    await anyio.run_process(["git", "apply", str(tmp_path / "patch.diff")], cwd=host)
    assert (host / os.fsdecode(b"caf\xe9.txt")).read_bytes() == b"new\n"
