"""The coding member: works on files in its own box and returns a patch.

The model reports what it did (summary, tests it ran, notes); the harness supplies
what must not be taken on the model's word:

* ``patch`` and ``files_changed`` come from a git diff of ``/workspace`` against a
  snapshot taken before the first turn. The snapshot lives in a separate git
  directory under ``/tmp`` so a repository already in ``/workspace`` (its ``.git``,
  index and branches) is never touched, and its ``.gitignore`` is honoured.
* the patch is of the files' bytes as they are, and nothing can hide a change from
  it: the snapshot's own ``info/attributes`` (which beats the repository's
  ``.gitattributes``) turns off filters, end-of-line and encoding conversion, and
  leaves binary detection to git (so ``*.md binary`` cannot turn a text change into
  "Binary files differ"); binary files travel as git binary patches; no textconv or
  external diff runs, and no configuration outside the snapshot is read. The patch
  is read back from the box as bytes (a file that is not UTF-8 stays intact), which
  is what ``fleet code --apply`` applies byte for byte.
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

import shlex
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from sandbox.errors import OutputLimitExceeded

from ..tools.base import ToolContext
from ..tools.coding import coding_tools
from ..tools.names import show
from ..tools.registry import render_exec
from . import Kind, register_kind

WORKSPACE = "/workspace"
BASELINE_GIT = "/tmp/fleet-baseline.git"
PATCH_CHARS = 200_000
_GIT = (
    f"export GIT_DIR={BASELINE_GIT} GIT_WORK_TREE={WORKSPACE} GIT_CONFIG_NOSYSTEM=1 "
    "GIT_CONFIG_GLOBAL=/dev/null GIT_ATTR_NOSYSTEM=1; "
    "git -c user.name=fleet -c user.email=fleet@localhost -c core.autocrlf=false "
    "-c core.attributesFile=/dev/null"
)
_RAW_ATTRIBUTES = "* -text -filter -ident !eol !working-tree-encoding !diff\n"
_NAMES = "/tmp/fleet-changed-names"
_PATCH = "/tmp/fleet-patch.diff"
PATCH_BYTES = 64 * 1024 * 1024
"""Largest patch read back from the box."""
_EXCLUDES = ".git\n__pycache__/\n*.pyc\n.pytest_cache/\n"

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


class CodingReport(BaseModel):
    """What the coding model submits (the harness adds the patch)."""

    model_config = ConfigDict(extra="forbid")

    summary: str = Field(min_length=1)
    """What was changed and why, in a few sentences."""
    tests_run: list[str] = Field(default_factory=list)
    """Test or check commands that were run."""
    tests_passed: bool | None = None
    """Whether the last run of those tests passed (None: no tests were run)."""
    notes: list[str] = Field(default_factory=list)
    """Caveats, follow-ups, anything a reviewer should know."""


class VerifiedTests(BaseModel):
    """The job's test command, re-run by the harness after the model submitted."""

    model_config = ConfigDict(extra="forbid")

    command: str
    exit_code: int
    passed: bool
    output_tail: str = ""
    """Last part of the command's output."""
    gate: bool = True
    """Whether a failing run fails the member (False: the exit code is a finding)."""


class CodingResult(CodingReport):
    """A coding member's result: the report plus what the harness measured."""

    patch: str = ""
    """Unified diff of /workspace against its state before the first turn."""
    patch_truncated: bool = False
    """The patch was longer than the result keeps; the full one is in patch.diff."""
    files_changed: list[str] = Field(default_factory=list)
    """Paths (relative to /workspace) added, modified or deleted."""
    verified: VerifiedTests | None = None
    """The job's test command re-run after submission, when the job gave one."""


async def snapshot_workspace(ctx: ToolContext) -> None:
    """Record /workspace as the baseline the patch is computed against."""
    if ctx.sandbox is None:
        return
    info = f"{BASELINE_GIT}/info"
    script = (
        f"{_GIT} init -q && printf {shlex.quote(_EXCLUDES)} > {info}/exclude && "
        f"printf {shlex.quote(_RAW_ATTRIBUTES)} > {info}/attributes && "
        f"{_GIT} add -A && {_GIT} commit -q --allow-empty --no-verify -m baseline"
    )
    res = await ctx.sandbox.exec(["bash", "-c", script], timeout=300)
    ctx.state["baseline"] = res.ok
    if not res.ok:
        ctx.state["baseline_error"] = (res.stderr or res.stdout)[-500:]


async def collect_patch(data: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
    """Add patch, files_changed and the verified test run to the submitted report."""
    result = dict(data)
    if ctx.sandbox is None or not ctx.state.get("baseline"):
        why = ctx.state.get("baseline_error", "no sandbox")
        result.setdefault("notes", []).append(
            f"patch unavailable: baseline snapshot failed ({why})"
        )
        return result
    box = ctx.sandbox
    # Through files, as bytes: a name or a line that is not UTF-8 arrives intact (a
    # name is then shown as the tools show it, not in git's octal quoting).
    diff = f"{_GIT} diff --cached --no-renames"
    script = (
        f"{{ {_GIT} add -A && {diff} --name-only -z; }} > {_NAMES}; "
        f"{diff} --binary --no-color --no-ext-diff --no-textconv > {_PATCH}"
    )
    await box.exec(["bash", "-c", script], timeout=300)
    names = (await box.read_file(_NAMES)).split(b"\0")
    result["files_changed"] = [show(n.decode("utf-8", "surrogateescape")) for n in names if n]
    too_large = False
    try:
        raw = await box.read_file(_PATCH, limit=PATCH_BYTES)
    except OutputLimitExceeded as exc:
        raw, too_large = b"", True
        result.setdefault("notes", []).append(
            f"patch not collected: {exc.size} bytes, over the {PATCH_BYTES}-byte limit"
        )
    (ctx.run_dir / "patch.diff").write_bytes(raw)
    patch = raw.decode("utf-8", "replace")
    result["patch_truncated"] = len(patch) > PATCH_CHARS or too_large
    result["patch"] = (
        patch
        if len(patch) <= PATCH_CHARS
        else (patch[:PATCH_CHARS] + "\n[... patch cut; the full diff is in patch.diff ...]\n")
    )
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
    return result


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
    # Imported on use: the checkpoint module builds on this one's git settings.
    from . import coding_checkpoint

    return coding_checkpoint


CODING = register_kind(
    Kind(
        name="coding",
        system_prompt=SYSTEM_PROMPT,
        tools=lambda settings: coding_tools(),
        result_model=CodingResult,
        submit_model=CodingReport,
        submit_description=(
            "Finish: report what you changed (summary), the test commands you ran and "
            "whether they passed. The patch is collected automatically. Call once, when done."
        ),
        todos=True,
        box_kind="coding",
        file_tools=True,
        setup=snapshot_workspace,
        checkpoint=lambda ctx, tools: _checkpoint().checkpoint_workspace(ctx, tools),
        restore=lambda ctx, data: _checkpoint().restore_workspace(ctx, data),
        finalize=collect_patch,
        judge=failed_test,
        settings=CodingSettings,
        brief=check_brief,
    )
)
