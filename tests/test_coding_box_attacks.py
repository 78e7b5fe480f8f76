"""Fleet's own code in a coding box runs nothing the member wrote, and the member cannot
blank or trim its own patch: a scripted model (fake Messages API -> real anthropic
client -> loop) attacks from inside a real box, and each test shows the attack's marker
never ran, or that a collection it broke ends the member ``failed`` with its edits kept.
"""

from __future__ import annotations

import os
import tarfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from loop_support import coding_box, events, scripted
from scripted_calls import tool_results

from coordinator.cli import main
from coordinator.nodes import host_git
from coordinator.rundir.runs import RunDir
from subagents.fake_api import text, tool_use
from subagents.kinds import coding
from subagents.rules.policy import ToolPolicy
from subagents.spec import MemberSpec

pytestmark = [pytest.mark.docker, pytest.mark.anyio]

FIX = {"path": "calc.py", "old_string": "return a - b", "new_string": "return a + b"}
DONE = tool_use("submit_result", {"summary": "add() adds now."})
MARKERS = "/tmp/ran"
"""Every attack's payload touches a file in here; it must stay empty."""
PAYLOAD = f"#!/bin/sh\nmkdir -p {MARKERS}; touch {MARKERS}/$$\n"


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
async def box(docker_client, images, run_id: str) -> AsyncIterator:
    files = {
        "calc.py": "def add(a, b):\n    return a - b\n",
        ".gitignore": "*.log\n",
        "build/.gitignore": "*\n",  # ignores itself too, as build directories often do
        "build/out.o": "object\n",
        "lib/util.py": "UTIL = 1\n",
    }
    async with coding_box(docker_client, images, run_id, files) as sandbox:
        await sandbox.write_file("/tmp/payload", PAYLOAD, mode=0o755)
        yield sandbox


def member(task: str, **extra: Any) -> MemberSpec:
    return MemberSpec(id="coder", kind="coding", task=task, **extra)


async def markers(box: Any) -> str:
    listing = await box.exec(f"ls -A {MARKERS} 2>/dev/null; true")
    return listing.stdout.strip()


def shell(command: str) -> Any:
    return tool_use("shell", {"command": command})


async def test_a_git_config_the_member_writes_under_tmp_runs_nothing_at_collection(
    box, tmp_path: Path
) -> None:
    # Every git config under /tmp gets an fsmonitor, a filter and a diff driver, and the
    # workspace's .gitattributes names them: Fleet's git must run none of them.
    poison = (
        "for c in $(find /tmp -name config -path '*git*' 2>/dev/null); do "
        "git config --file $c core.fsmonitor /tmp/payload; "
        "git config --file $c filter.x.clean /tmp/payload; "
        "git config --file $c filter.x.process /tmp/payload; "
        "git config --file $c diff.x.textconv /tmp/payload; "
        "git config --file $c diff.external /tmp/payload; "
        "git config --file $c core.hooksPath /tmp; "
        "echo poisoned $c; done"
    )
    script = [
        tool_use("edit_file", FIX),
        tool_use("write_file", {"path": ".gitattributes", "content": "* filter=x diff=x\n"}),
        shell(poison),
        DONE,
    ]
    outcome, _ = await scripted(box, tmp_path, member("Fix add()."), script)
    assert await markers(box) == ""
    assert outcome.status == "ok", outcome.reason
    assert outcome.result.files_changed == [".gitattributes", "calc.py"]
    assert "-    return a - b\n+    return a + b" in outcome.result.patch


async def test_a_path_git_will_not_take_fails_the_member_and_keeps_its_edits(
    box, tmp_path: Path
) -> None:
    script = [
        tool_use("edit_file", FIX),
        tool_use("write_file", {"path": ".Git/config", "content": "[core]\n\tbare = true\n"}),
        DONE,
    ]
    outcome, _ = await scripted(box, tmp_path, member("Fix add()."), script)
    assert outcome.status == "failed"
    assert "patch collection failed" in outcome.reason and ".Git/config" in outcome.reason
    assert "edits.tar" in outcome.reason
    result = outcome.result
    assert result.collection_error and result.edits_archive == "edits.tar"
    assert result.files_changed == [".Git/config", "calc.py"]
    with tarfile.open(tmp_path / "edits.tar") as tar:
        kept = {m.name: tar.extractfile(m).read() for m in tar.getmembers()}  # type: ignore[union-attr]
    assert kept["calc.py"] == b"def add(a, b):\n    return a + b\n"
    assert set(kept) == {"calc.py", ".Git/config"}


async def test_a_changed_baseline_is_refused_not_diffed_against(box, tmp_path: Path) -> None:
    # The member forges a commit in which calc.py is already fixed and writes it over
    # every object of Fleet's snapshot, so that a diff against it would hide the fix.
    forge = (
        "b=$(ls -d /tmp/fleet-baseline* | head -1); "
        "d=$(mktemp -d) && cp -r /workspace/. $d && rm -rf $d/.git && cd $d && "
        "git init -q && git add -A && git -c user.name=m -c user.email=m@x commit -qm forged && "
        "c=$(git rev-parse HEAD) && f=.git/objects/${c:0:2}/${c:2} && "
        "for o in $(find $b/objects -type f -path '*/objects/??/*'); do cp -f $f $o; done; "
        "echo forged $b"
    )
    script = [tool_use("edit_file", FIX), shell(forge), DONE]
    outcome, _ = await scripted(box, tmp_path, member("Fix add()."), script)
    assert outcome.status == "failed", outcome.result
    assert "baseline snapshot was changed in the box" in outcome.reason
    with tarfile.open(tmp_path / "edits.tar") as tar:
        assert "calc.py" in tar.getnames()


async def test_a_gitignore_or_a_nested_repository_the_member_makes_hides_nothing(
    box, tmp_path: Path
) -> None:
    script = [
        tool_use("edit_file", FIX),
        tool_use("write_file", {"path": "helper.py", "content": "HELP = 1\n"}),
        tool_use("write_file", {"path": "sub/inner.py", "content": "INNER = 1\n"}),
        # A name git would read as pathspec magic (":!" excludes) is still just a name.
        tool_use("write_file", {"path": ":!odd.py", "content": "ODD = 1\n"}),
        tool_use("write_file", {"path": "notes.log", "content": "ignored at baseline\n"}),
        tool_use("write_file", {"path": "build/new.o", "content": "ignored at baseline\n"}),
        # Ignore everything, then make sub/ a repository of its own.
        shell("printf '*\\n' >> .gitignore && git init -q sub && echo sub is a repo"),
        DONE,
    ]
    outcome, _ = await scripted(box, tmp_path, member("Fix add()."), script)
    assert outcome.status == "ok", outcome.reason
    result = outcome.result
    # notes.log and build/new.o stay out: the repository's rules had them ignored
    # before the member came.
    changed = [".gitignore", ":!odd.py", "calc.py", "helper.py", "sub/inner.py"]
    assert result.files_changed == changed
    assert "+HELP = 1" in result.patch and "+INNER = 1" in result.patch


async def test_a_directory_made_a_link_is_not_followed_and_a_file_made_a_directory_is_staged(
    box, tmp_path: Path
) -> None:
    # lib/ becomes a link to a directory outside /workspace that holds a util.py too.
    # And calc.py, a file, becomes a directory.
    relink = (
        "mkdir -p /tmp/outside && echo 'SECRET = 1' > /tmp/outside/util.py && "
        "rm -rf lib && ln -s /tmp/outside lib && "
        "rm calc.py && mkdir calc.py && echo 'X = 1' > calc.py/x.py && echo done"
    )
    outcome, _ = await scripted(box, tmp_path, member("Relink lib."), [shell(relink), DONE])
    assert outcome.status == "ok", outcome.reason
    assert outcome.result.files_changed == ["calc.py", "calc.py/x.py", "lib", "lib/util.py"]
    patch = outcome.result.patch
    assert "deleted file mode 100644" in patch and "new file mode 120000" in patch
    assert "SECRET" not in patch and "+/tmp/outside" in patch
    # The patch applies, as fleet code --apply applies it, to the tree as it was.
    host = tmp_path / "host"
    (host / "lib").mkdir(parents=True)
    (host / "calc.py").write_text("def add(a, b):\n    return a - b\n")
    (host / "lib" / "util.py").write_text("UTIL = 1\n")
    done = host_git.apply(host, tmp_path / "patch.diff")
    assert done.returncode == 0, done.stderr
    assert os.readlink(host / "lib") == "/tmp/outside"
    assert (host / "calc.py" / "x.py").read_text() == "X = 1\n"


async def test_a_patch_over_the_limit_fails_the_member_and_keeps_its_edits(
    box, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(coding, "PATCH_BYTES", 4_000)
    big = "".join(f"LINE_{i} = {i}\n" for i in range(500))
    script = [
        tool_use("edit_file", FIX),
        tool_use("write_file", {"path": "big.py", "content": big}),
        DONE,
    ]
    outcome, _ = await scripted(box, tmp_path, member("Fix add()."), script)
    assert outcome.status == "failed"
    assert "over the 4000-byte limit" in outcome.reason
    with tarfile.open(tmp_path / "edits.tar") as tar:
        assert tar.extractfile("big.py").read() == big.encode()  # type: ignore[union-attr]


async def test_deny_shell_and_fleets_tools_run_no_file_the_member_wrote(
    box, tmp_path: Path
) -> None:
    # Modules a plain `python3 -c` in /workspace would import instead of the standard ones.
    hijack = "import os\nos.system('/tmp/payload')\n"
    script = [
        tool_use("write_file", {"path": "glob.py", "content": hijack}),
        tool_use("write_file", {"path": "json.py", "content": hijack}),
        tool_use("glob", {"pattern": "*.py"}),
        tool_use("grep", {"pattern": "payload"}),
        tool_use("read_file", {"path": "calc.py"}),
        tool_use("edit_file", FIX),
        shell("/tmp/payload"),  # denied: never runs
        DONE,
    ]
    spec = member("Fix add().", policy=ToolPolicy(deny=["shell"]))
    outcome, _ = await scripted(box, tmp_path, spec, script)
    assert await markers(box) == ""
    assert outcome.status == "ok", outcome.reason
    found = {e.tool: e for e in events(tmp_path / "trace.jsonl", "tool_result")}
    assert not found["glob"].is_error and "/workspace/glob.py" in found["glob"].output
    assert "glob.py:2:os.system('/tmp/payload')" in found["grep"].output
    assert found["shell"].is_error and "not permitted" in found["shell"].output
    assert outcome.result.files_changed == ["calc.py", "glob.py", "json.py"]


def test_fleet_code_says_a_failed_collection_and_where_the_edits_are(
    tmp_path: Path, images, fake_api, cleanup, capsys: pytest.CaptureFixture[str]
) -> None:
    steps = [
        tool_use("write_file", {"path": "greet.txt", "content": "hello fleet\n"}),
        tool_use("write_file", {"path": ".Git/config", "content": "[core]\n"}),
        DONE,
    ]

    def policy(body: dict[str, Any]) -> Any:
        tools = {t["name"] for t in body.get("tools") or []}
        step = len(tool_results(body))
        return steps[min(step, len(steps) - 1)] if "write_file" in tools else text("done")

    fake_api(policy)
    repo, out = tmp_path / "repo", tmp_path / "runs"
    repo.mkdir()
    (repo / "greet.txt").write_text("hello world\n")
    cleanup.append(out)
    args = ["code", str(repo), "Greet fleet.", "--model", "claude-sonnet-5"]
    code = main([*args, "--output-dir", str(out), "--plain", "--apply"])
    shown = capsys.readouterr().out
    assert code == 1
    assert "the patch could not be collected" in shown and ".Git/config" in shown
    (run,) = RunDir.list(out)
    edits = run.member_dir("coder") / "edits.tar"
    assert f"changed files: {edits}" in shown
    assert (repo / "greet.txt").read_text() == "hello world\n"  # nothing applied
    with tarfile.open(edits) as tar:
        assert tar.extractfile("greet.txt").read() == b"hello fleet\n"  # type: ignore[union-attr]
    report = (run.path / "report.md").read_text()
    assert "Its patch could not be collected" in report and "edits.tar" in report
