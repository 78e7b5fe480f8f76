"""The coding member: works on files in its own box and returns a patch.

The model reports what it did (summary, tests it ran, notes); the harness supplies
what must not be taken on the model's word:

* ``patch`` and ``files_changed`` come from a git diff of ``/workspace`` against a
  snapshot taken before the first turn, made by Fleet's own program in the box
  (:mod:`.workspace_git`), never in ``/workspace``'s own ``.git`` (a repository there
  is never touched). Everything in the box is the member's to write, so that program
  runs no file of the member's (``python3 -I -S``), gives git a git directory made
  fresh for each call and a configuration of Fleet's alone (no hook, fsmonitor,
  filter, diff driver or textconv can run), and takes the baseline only from objects
  that hash down from the commit id the host kept: an object the member changed is
  refused.
* the patch is of the files' bytes as they are, and nothing can hide a change from
  it: ``info/attributes`` (which beats the repository's ``.gitattributes``) turns off
  filters, end-of-line and encoding conversion and leaves binary detection to git (so
  ``*.md binary`` cannot turn a text change into "Binary files differ"); binary files
  travel as git binary patches. New files are judged by the ignore rules as they were
  at the snapshot, so a ``.gitignore`` the member wrote hides nothing; a directory it
  made into a repository still has its files in the patch. The patch is read back
  from the box as bytes (a file that is not UTF-8 stays intact), which is what
  ``fleet code --apply`` applies byte for byte.
* a collection that fails - the baseline gone or changed, a changed path git will
  not hold in a patch (``.Git/config``), a patch over ``PATCH_BYTES`` - ends the
  member ``failed`` with the reason (``collection_error``), never ``ok`` with a
  shorter patch; the changed files are kept in ``edits.tar`` in its run directory.
* when the job gave a check command (:class:`CodingSettings` ``test``) it is run once
  more after the model submits, and ``verified`` records its real exit code. A test
  that fails there makes the member ``failed`` ("test failed after edit: ..."),
  whatever the model reported: the job's test is the job's definition of done. Its
  result - patch, summary, the test's output - is kept, because a person wants to
  read a change that almost worked, but nothing downstream takes it as a success.

The model is told the check command in words, with what Fleet does with it
(:func:`check_brief`), so it can run the same check before it submits.

The full patch is also written to ``patch.diff`` in the member's run directory; the
result keeps up to ``PATCH_CHARS`` of it (with a marker when cut), so one huge diff
cannot swamp the coordinator's report.
"""

from __future__ import annotations

import hashlib
import json
import os
import uuid
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

from sandbox.base import ExecResult, Sandbox
from sandbox.errors import OutputLimitExceeded
from sandbox.inbox import stamps

from ..tools.base import ToolContext
from ..tools.coding import coding_tools
from ..tools.names import show
from ..tools.registry import render_exec
from . import Kind, builtin_traits, register_kind, workspace_git
from .results import CodingReport, CodingResult, VerifiedTests

PATCH_CHARS = 200_000
PATCH_BYTES = 64 * 1024 * 1024
"""Largest patch collected; a larger one fails the collection (edits kept in edits.tar)."""
RESULT_BYTES = 16 * 1024 * 1024
_SAME = '{"ok": true, "same": true'
"""How the in-box program's answer for a checkpoint equal to the last one begins."""


def read_patch(path: Path, limit: int = PATCH_BYTES) -> bytes:
    """A patch file's bytes from a run directory (at most ``limit``), never through a
    symbolic link: its files came from a box's collection or a node's reply."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return b""
    with os.fdopen(fd, "rb") as fh:
        return fh.read(limit)


def _print_or_none(value: object) -> str | None:
    """The box's stamps print, if it looks like one (a SHA-256 in hex)."""
    return value if stamps.is_print(value) and isinstance(value, str) else None


"""Largest ``result.json`` of the in-box program read back (it lists changed paths)."""
ARCHIVE_READ_BYTES = 2 * workspace_git.ARCHIVE_BYTES
EMPTY_PRINT = hashlib.sha256(b"").hexdigest()
"""The box's stamps print of an empty /workspace (:func:`stamps.stamps_print` hashes no entry)."""
"""``edits.tar`` read back: its file content is capped in the box, headers come on top."""
_PROGRAM = f"""import sys
s = type(sys)("stamps")
exec(compile({Path(stamps.__file__).read_text()!r}, "stamps.py", "exec"), s.__dict__)
sys.modules["stamps"] = s
exec(compile({Path(workspace_git.__file__).read_text()!r}, "workspace_git.py", "exec"), {{"__name__": "__main__"}})
"""
"""The in-box program, run with ``python3 -I -S -c`` (see its module): the stamps print
the box agent shares made a module first, so both compute it from one source."""

SYSTEM_PROMPT = """\
You are a careful software engineer working alone in a Linux sandbox. The code is \
in /workspace; you may change anything there. Tools: shell (run commands: build, \
test, git), read_file, write_file, edit_file (exact replacement of a unique piece \
of text), glob and grep.

Work like this: look before you change (glob, grep, read_file); make the smallest \
change that does the task; run the tests or a quick check after changing code; \
read error output closely and fix the cause. Do not invent APIs: read the code. A \
file name that is not UTF-8 is shown with \\xNN for each such byte (and \\\\ for a \
backslash in it): pass it to the tools as shown; in a shell command write it as $'...'.

When done, call submit_result with a short summary, the test commands you ran and \
whether they passed. The patch (a diff of /workspace) is collected for you: do not \
paste code or diffs into the result."""


CHECK_BRIEF = (
    "The job's check command - Fleet runs it again in the box after you submit, and "
    "the task counts as done only if it passes there:\n"
)
FINDING_BRIEF = (
    "The job's check command - Fleet runs it again in the box after you submit and "
    "reports its exit code as the finding (whether the documented behaviour held); it "
    "need not pass, and you must not change what it checks to make it pass:\n"
)
"""Opens the brief; the command follows it verbatim (the offline coding policy,
subagents/model/offline_coding.py, reads it back by this opening)."""


class CodingSettings(BaseModel):
    """A coding member's settings (its ``MemberSpec.settings``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    test: str | None = None
    """The job's check command, run again in the box after the member submits; when
    it fails there the member ends ``failed``. None: no check."""
    test_gate: bool = True
    """False: the check's exit code is the member's finding (a lead's check of a
    documented behaviour), and a failing check does not fail the member."""


def check_brief(settings: CodingSettings) -> str | None:
    """The first message's words about the check command, when there is one."""
    if settings.test is None or not settings.test.strip():
        return None
    return (CHECK_BRIEF if settings.test_gate else FINDING_BRIEF) + settings.test


async def _in_box_git(
    box: Sandbox, action: str, args: list[str], request: dict[str, Any]
) -> tuple[dict[str, Any], str]:
    """Run the in-box program (:mod:`.workspace_git`); its result and output directory."""
    out = f"/tmp/fleet-out-{uuid.uuid4().hex}"
    argv = ["python3", "-I", "-S", "-c", _PROGRAM, action, out, *args]
    res = await box.exec(argv, cwd="/", timeout=600, stdin=json.dumps(request))
    same = _said_same(res) if len(args) == 4 else None
    if same is not None:
        return same, out  # the program removed ``out`` itself
    try:
        data = json.loads(await box.read_file(f"{out}/result.json", limit=RESULT_BYTES))
    except (FileNotFoundError, OutputLimitExceeded, ValueError):
        tail = (res.stderr or res.stdout).strip()[-500:]
        return {
            "ok": False,
            "error": f"Fleet's in-box git stopped (exit {res.exit_code}): {tail}",
        }, out
    if not isinstance(data, dict):
        return {"ok": False, "error": "Fleet's in-box git wrote no result"}, out
    if "stamps_print" in data:
        data["stamps_print"] = _print_or_none(data["stamps_print"])
    return data, out


def _said_same(res: ExecResult) -> dict[str, Any] | None:
    """The in-box program's answer that the workspace is as at the last checkpoint."""
    if res.exit_code != 0 or not res.stdout.startswith(_SAME):
        return None
    try:
        said = json.loads(res.stdout[:1024])
    except ValueError:
        return None
    if not isinstance(said, dict) or said.get("same") is not True:
        return None
    return {"ok": True, "same": True, "stamps_print": _print_or_none(said.get("stamps_print"))}


async def snapshot_workspace(ctx: ToolContext) -> None:
    """Record /workspace as the baseline the patch is computed against.

    A box whose workspace is known to be empty (:meth:`Sandbox.untouched_workspace`: a
    fresh box of Fleet's image with no repository or files put in it) gets the baseline
    an empty snapshot makes without a call: the snapshot would start Python and five
    git processes in the box for it (55-60 ms of the box's CPU; sixteen members starting
    at once spent about a second of two cores on it), and the collection writes that
    baseline's objects itself (:data:`workspace_git.NO_SNAPSHOT`)."""
    if ctx.sandbox is None:
        return
    if ctx.sandbox.untouched_workspace():
        commit, _ = workspace_git.empty_baseline()
        ctx.state["baseline"] = {
            "objects": workspace_git.NO_SNAPSHOT,
            "commit": commit,
            "stamps": "",
            "refused": {},
        }
        _checkpoint().from_baseline(ctx, EMPTY_PRINT)
        ctx.sandbox.watch_workspace()
        return
    data, _ = await _in_box_git(ctx.sandbox, "snapshot", [], {})
    if data.get("ok") and isinstance(data.get("commit"), str):
        # The commit id is the baseline's fingerprint: kept here, out of the member's
        # reach, so an object of the snapshot it changed is refused at collection.
        ctx.state["baseline"] = {
            "objects": str(data.get("objects")),
            "commit": data["commit"],
            "stamps": str(data.get("stamps")),
            "refused": data.get("refused") or {},
        }
        if data.get("stamps_print"):
            _checkpoint().from_baseline(ctx, data["stamps_print"])
        ctx.sandbox.watch_workspace()
    else:
        ctx.state["baseline_error"] = str(data.get("error", "no result"))[-500:]


async def collect_patch(data: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
    """Add patch, files_changed and the verified test run to the submitted report; a
    collection that fails sets ``collection_error`` and keeps the edits in edits.tar."""
    result = dict(data)
    if ctx.sandbox is None:
        result.setdefault("notes", []).append("patch unavailable: no sandbox")
        return result
    box = ctx.sandbox
    # A workspace still as its baseline (its stamps say so) has the empty patch: the
    # box answers "same" without a collection.
    found, out = await _diff_now(ctx, _checkpoint().baseline_state(ctx))
    # Names travel as os.fsdecode strings: one that is not UTF-8 arrives intact and is
    # shown as the tools show it.
    result["files_changed"] = [show(str(n)) for n in found.get("changed") or []]
    raw = b""
    if found.get("ok") and not found.get("same"):
        try:
            raw = await box.read_file(f"{out}/patch.diff", limit=PATCH_BYTES)
        except (FileNotFoundError, OutputLimitExceeded) as exc:
            found = {**found, "ok": False, "error": f"the patch could not be read back: {exc}"}
    if found.get("ok"):
        (ctx.run_dir / "patch.diff").write_bytes(raw)
        patch = raw.decode("utf-8", "replace")
        result["patch_truncated"] = len(patch) > PATCH_CHARS
        result["patch"] = (
            patch
            if len(patch) <= PATCH_CHARS
            else (patch[:PATCH_CHARS] + "\n[... patch cut; the full diff is in patch.diff ...]\n")
        )
    else:
        why = ctx.state.get("baseline_error")
        error = str(found.get("error", "no result"))
        result["collection_error"] = f"the baseline snapshot failed ({why})" if why else error
        await _keep_edits(box, out, found, result, ctx)
    await _verify(box, ctx, result)
    return result


async def _keep_edits(
    box: Sandbox, out: str, found: dict[str, Any], result: dict[str, Any], ctx: ToolContext
) -> None:
    """Copy the failed collection's edits.tar to the run directory and say what it holds."""
    try:
        tar = await box.read_file(f"{out}/edits.tar", limit=ARCHIVE_READ_BYTES)
    except (FileNotFoundError, OutputLimitExceeded):
        tar = b""
    notes = result.setdefault("notes", [])
    if tar:
        (ctx.run_dir / "edits.tar").write_bytes(tar)
        result["edits_archive"] = "edits.tar"
    for key, what in (("deleted", "deleted"), ("left_out", "not in edits.tar (too large)")):
        names = [show(str(n)) for n in found.get(key) or []]
        if names:
            shown = ", ".join(names[:20]) + (
                f" and {len(names) - 20} more" if len(names) > 20 else ""
            )
            notes.append(f"{what}: {shown}")


async def _verify(box: Sandbox, ctx: ToolContext, result: dict[str, Any]) -> None:
    """Run the job's check command again, after the collection (it runs the member's code)."""
    settings = ctx.settings
    test = settings.test if isinstance(settings, CodingSettings) else None
    if test is not None and test.strip():
        res = await box.exec(test, timeout=600)
        tail = render_exec(res.stdout[-3_000:], res.stderr[-2_000:], res.exit_code, res.timed_out)
        result["verified"] = VerifiedTests(
            command=test,
            exit_code=res.exit_code,
            passed=res.ok,
            output_tail=tail,
            gate=settings.test_gate if isinstance(settings, CodingSettings) else True,
        ).model_dump()


def judge_result(result: dict[str, Any]) -> str | None:
    """The member's failure reason: its patch could not be collected, or the job's test,
    re-run by Fleet, fails."""
    error = result.get("collection_error")
    if error:
        kept = result.get("edits_archive")
        where = (
            f"the changed files are kept in {kept} in the member's run directory"
            if kept
            else "no edits could be kept"
        )
        return f"patch collection failed: {error} ({where})"
    return failed_test(result)


def failed_test(result: dict[str, Any]) -> str | None:
    """The member's failure reason when the job's test, re-run by Fleet, fails."""
    verified = result.get("verified")
    if not isinstance(verified, dict) or verified.get("passed", True):
        return None
    if not verified.get("gate", True):
        return None  # the exit code is the finding, not the member's success
    return (
        f"test failed after edit: {verified.get('command')!r} exit {verified.get('exit_code')} "
        "(patch kept in patch.diff)"
    )


def _checkpoint() -> Any:
    # Imported on use: only a member that may resume pays for it.
    from . import coding_checkpoint

    return coding_checkpoint


async def _diff_now(
    ctx: ToolContext, last: dict[str, str | None] | None = None
) -> tuple[dict[str, Any], str]:
    """The in-box collection against the kept baseline. For a checkpoint, ``last`` is
    the newest one kept (``sha256`` of its patch, the box's ``stamps_print`` then):
    the answer is ``{"same": True}`` when the workspace has not changed since."""
    assert ctx.sandbox is not None
    baseline = ctx.state.get("baseline") or {"objects": "/nonexistent", "commit": "none"}
    request = {
        "stamps": baseline.get("stamps"),
        "refused": baseline.get("refused", {}),
        "patch_bytes": PATCH_BYTES,
    }
    args = [baseline["objects"], baseline["commit"]]
    if last is not None:
        args += [str(last["sha256"]), last.get("stamps_print") or "-"]
    return await _in_box_git(ctx.sandbox, "collect", args, request)


CODING = register_kind(
    Kind(
        name="coding",
        **builtin_traits("coding"),
        system_prompt=SYSTEM_PROMPT,
        tools=lambda settings: coding_tools(),
        result_model=CodingResult,
        submit_model=CodingReport,
        submit_description=(
            "Finish: report what you changed (summary), the test commands you ran and "
            "whether they passed. The patch is collected automatically. Call once, when done."
        ),
        setup=snapshot_workspace,
        checkpoint=lambda ctx, tools: _checkpoint().checkpoint_workspace(ctx, tools, _diff_now),
        restore=lambda ctx, data: _checkpoint().restore_workspace(ctx, data),
        finalize=collect_patch,
        judge=judge_result,
        settings=CodingSettings,
        brief=check_brief,
    )
)
