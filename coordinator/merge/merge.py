"""``[merge]``: the ok coding members' patches applied together, and tested.

After the members end, Fleet starts one fresh box of the members' image, copies their
repository into it as they had it (the same selection, :func:`staged_copy`), and runs
Fleet's own program there (:data:`PROGRAM`, ``python3 -I -S``) over the patches in the
job's order:

- the baseline is committed into a git directory of Fleet's own, outside
  ``/workspace`` (the repository's own ``.git`` is never used: its hooks, filters and
  configuration cannot run), with a configuration of Fleet's alone;
- each patch is tried with ``git apply --index``; one that does not apply as it is
  gets a three-way apply (``--3way``: the patch's preimage blobs are the baseline's,
  since every member started from the same tree, so git can merge a change whose
  context moved). A patch that still conflicts is left out **whole** - the work tree
  and index are put back to the last commit, so nothing of it stays half applied -
  and named with its member and the files it conflicted on; the others stay merged.
  Each applied patch is a commit, so a later conflict never undoes an earlier patch;
- the merged tree is tested with the merge's test in the same box, and
  ``merge/merged.diff`` is the diff from the baseline to the merged tree (binary
  included), read back bounded.

Written to the run directory: ``merge/merge.json`` (:class:`MergeRecord`: the members
in order, which were applied, each conflict, members skipped because they did not end
``ok`` with a patch, the test's verdict) and ``merge/merged.diff``; the journal gets a
``merge`` entry. ``fleet apply RUN`` applies ``merged.diff`` to the repository only
when the merged test passed. The patches came from boxes and are hostile: they are
only ever applied inside a box, and what comes back (the program's result, the diff)
is bounded and parsed, never run.

The merge box runs on the coordinator's engine (a cluster run needs one there too),
with no network; a repository setup is not applied to it.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

import anyio
from pydantic import BaseModel, Field

from sandbox.base import SandboxBackend
from sandbox.errors import OutputLimitExceeded, SandboxError
from sandbox.spec import NetworkPolicy
from subagents.kinds import trait
from subagents.kinds.coding import PATCH_BYTES, read_patch
from subagents.tools.registry import render_exec

from ..job.spec import Job
from ..journal.entries import MergeEntry
from ..nodes.repo_copy import RepoRefused, RepoTooLarge, copy_room, staged_copy
from ..rundir.runs import RunDir

MERGE_DIR = "merge"
OUT = "/tmp/fleet-merge"
RESULT_BYTES = 1024 * 1024
TEST_TIMEOUT_S = 600.0

Verdict = Literal["passed", "failed", "untested", "nothing", "error"]


class Conflict(BaseModel):
    member: str
    files: list[str] = Field(default_factory=list)
    """The files it conflicted on (as git named them; bounded)."""
    detail: str = ""
    """The end of git's own words."""


class Skipped(BaseModel):
    member: str
    reason: str


class MergeTest(BaseModel):
    command: str
    exit_code: int
    passed: bool
    output_tail: str = ""


class MergeRecord(BaseModel):
    """``merge/merge.json``."""

    members: list[str]
    """The merged members, in the order their patches were tried."""
    applied: list[str] = Field(default_factory=list)
    conflicts: list[Conflict] = Field(default_factory=list)
    skipped: list[Skipped] = Field(default_factory=list)
    test: MergeTest | None = None
    verdict: Verdict = "untested"
    """``passed``/``failed``: the merged test's; ``untested``: no test; ``nothing``: no
    patch to merge; ``error``: the merge itself could not run (``error`` says why)."""
    error: str = ""
    repo: str = ""
    """The repository the patches are of (what ``fleet apply`` applies to)."""
    merged_diff: str = ""
    """The merged patch, relative to the run directory ("" when there is none)."""
    duration_s: float = 0.0


PROGRAM = r"""
import json, os, re, subprocess, sys
out, order = sys.argv[1], json.load(sys.stdin)
git_dir = out + "/git"
env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": out + "/home",
       "GIT_DIR": git_dir, "GIT_WORK_TREE": "/workspace", "GIT_CONFIG_NOSYSTEM": "1",
       "GIT_CONFIG_GLOBAL": "/dev/null", "GIT_TERMINAL_PROMPT": "0", "LC_ALL": "C"}
os.makedirs(env["HOME"], exist_ok=True)
CFG = ["-c", "core.hooksPath=/dev/null", "-c", "core.fsmonitor=false", "-c", "user.name=fleet",
       "-c", "user.email=fleet@localhost", "-c", "commit.gpgsign=false", "-c", "core.autocrlf=false"]
def git(*args, check=True):
    p = subprocess.run(["git", *CFG, *args], env=env, cwd="/workspace", capture_output=True)
    if check and p.returncode != 0:
        raise SystemExit("git %s: %s" % (args[0], p.stderr.decode("utf-8", "replace")[-800:]))
    return p
git("init", "-q")
with open(git_dir + "/info/attributes", "w") as fh:
    fh.write("* -text -filter -eol -working-tree-encoding -ident\n")
git("add", "-A")
git("commit", "-q", "--allow-empty", "--no-verify", "-m", "baseline")
base = git("rev-parse", "HEAD").stdout.decode().strip()
applied, conflicts = [], []
for member, patch in order:
    p = git("apply", "--index", "--whitespace=nowarn", patch, check=False)
    if p.returncode != 0:
        p = git("apply", "--3way", "--whitespace=nowarn", patch, check=False)
    if p.returncode == 0:
        git("commit", "-q", "--allow-empty", "--no-verify", "-m", member)
        applied.append(member)
        continue
    words = (p.stderr + p.stdout).decode("utf-8", "replace")
    files = set(git("diff", "--name-only", "--diff-filter=U", "-z", check=False).stdout.decode(
        "utf-8", "surrogateescape").split("\0"))
    files |= set(re.findall(r"^error: patch failed: (.+):\d+$", words, re.M))
    files |= set(re.findall(r"^error: (.+?): (?:patch does not apply|does not exist in index|"
                            r"already exists in (?:index|working directory))$", words, re.M))
    files |= set(re.findall(r"^U (.+)$", words, re.M))
    files |= set(re.findall(r"^error: (?:invalid path|affected file) '(.+?)'", words, re.M))
    git("reset", "-q", "--hard", "HEAD")
    git("clean", "-fdq")
    conflicts.append({"member": member, "files": sorted(f for f in files if f)[:50],
                      "detail": words[-600:]})
with open(out + "/merged.diff", "wb") as fh:
    fh.write(git("diff", "--binary", "--no-color", "--no-ext-diff", base, "HEAD").stdout)
with open(out + "/result.json", "w") as fh:
    json.dump({"applied": applied, "conflicts": conflicts}, fh)
"""
"""Fleet's in-box merge (see the module docstring); argv: the output directory; stdin:
``[[member, patch path], ...]`` in order."""


async def run_merge(run: RunDir, job: Job, backend: Callable[[], SandboxBackend]) -> MergeRecord:
    """Merge the ok members' patches (see the module docstring); writes ``merge/`` and
    a journal entry, and returns the record. ``backend`` makes the engine's backend (the
    coordinator's). Never raises for the merge's own failure (an engine that is gone,
    a repository that may not go into a box: ``error``)."""
    assert job.merge is not None
    started = time.monotonic()
    members = job.merged_members()
    repo = Path(str(members[0].repo))
    record = MergeRecord(members=[m.id or "" for m in members], repo=str(repo))
    patches: list[tuple[str, bytes]] = []
    for m in members:
        mid = m.id or ""
        outcome = run.outcome(mid)
        if outcome is None or outcome.status != "ok":
            why = "it has no outcome" if outcome is None else f"it ended {outcome.status}"
            record.skipped.append(Skipped(member=mid, reason=why))
            continue
        patch = read_patch(run.path / "members" / mid / "patch.diff")
        if not patch.strip():
            record.skipped.append(Skipped(member=mid, reason="it changed nothing"))
            continue
        patches.append((mid, patch))
    test = job.merge_test()
    if not patches:
        record.verdict = "nothing"
    else:
        try:
            await _in_box(record, patches, test, members[0], job, run, backend())
        except (SandboxError, RepoTooLarge, RepoRefused, OSError) as exc:
            record.verdict, record.error = "error", f"{type(exc).__name__}: {exc}"[:2000]
    record.duration_s = round(time.monotonic() - started, 3)
    _write(run, record)
    run.journal.append(
        MergeEntry(
            verdict=record.verdict,
            applied=record.applied,
            conflicts=[c.member for c in record.conflicts],
            error=record.error or None,
        )
    )
    return record


async def _in_box(
    record: MergeRecord,
    patches: list[tuple[str, bytes]],
    test: str | None,
    first: Any,
    job: Job,
    run: RunDir,
    backend: SandboxBackend,
) -> None:
    spec = first.sandbox.box(
        trait(first.kind, "box_kind"), network=NetworkPolicy(), runtime=job.sandbox.runtime
    )
    repo = Path(str(first.repo))
    staging = await anyio.to_thread.run_sync(lambda: staged_copy(repo, room=copy_room(spec)))
    box = None
    try:
        box = await backend.create(spec, run=run.id, member="merge")
        await box.upload(Path(staging.name), "/workspace")
        for name, text in first.files.items():
            await box.write_file(f"/workspace/{name}", text)
        order = []
        for i, (mid, patch) in enumerate(patches):
            path = f"{OUT}/patches/{i:02d}.diff"
            await box.write_file(path, patch)
            order.append([mid, path])
        res = await box.exec(
            ["python3", "-I", "-S", "-c", PROGRAM, OUT],
            cwd="/",
            timeout=TEST_TIMEOUT_S,
            stdin=json.dumps(order),
        )
        try:
            said = json.loads(await box.read_file(f"{OUT}/result.json", limit=RESULT_BYTES))
        except (FileNotFoundError, OutputLimitExceeded, ValueError):
            tail = (res.stderr or res.stdout).strip()[-600:]
            record.verdict, record.error = "error", f"the merge program stopped: {tail}"
            return
        _take(record, said, {mid for mid, _ in patches})
        try:
            merged = await box.read_file(f"{OUT}/merged.diff", limit=PATCH_BYTES)
        except (FileNotFoundError, OutputLimitExceeded) as exc:
            record.verdict, record.error = "error", f"the merged diff could not be read: {exc}"
            return
        where = run.path / MERGE_DIR
        where.mkdir(parents=True, exist_ok=True)
        (where / "merged.diff").write_bytes(merged)
        record.merged_diff = f"{MERGE_DIR}/merged.diff" if merged.strip() else ""
        if test is None or not record.applied:
            record.verdict = "untested" if record.applied else "nothing"
            return
        ran = await box.exec(test, cwd="/workspace", timeout=TEST_TIMEOUT_S)
        tail = render_exec(ran.stdout[-3_000:], ran.stderr[-2_000:], ran.exit_code, ran.timed_out)
        record.test = MergeTest(
            command=test, exit_code=ran.exit_code, passed=ran.ok, output_tail=tail
        )
        record.verdict = "passed" if ran.ok else "failed"
    finally:
        with anyio.CancelScope(shield=True):
            if box is not None:
                await box.close()
            await anyio.to_thread.run_sync(staging.cleanup)


def _take(record: MergeRecord, said: Any, names: set[str]) -> None:
    """The in-box program's answer, checked: only members it was given, bounded text."""
    if not isinstance(said, dict):
        return
    record.applied = [m for m in said.get("applied") or [] if isinstance(m, str) and m in names]
    for c in said.get("conflicts") or []:
        if isinstance(c, dict) and c.get("member") in names:
            files = [str(f)[:300] for f in (c.get("files") or []) if isinstance(f, str)][:50]
            detail = str(c.get("detail") or "")[-600:]
            record.conflicts.append(Conflict(member=c["member"], files=files, detail=detail))


def _write(run: RunDir, record: MergeRecord) -> None:
    where = run.path / MERGE_DIR
    where.mkdir(parents=True, exist_ok=True)
    if not record.merged_diff:
        (where / "merged.diff").unlink(missing_ok=True)
    tmp = where / "merge.json.tmp"
    tmp.write_text(record.model_dump_json(indent=2), encoding="utf-8")
    os.replace(tmp, where / "merge.json")


def merge_line(record: MergeRecord) -> str:
    """The merge in one line: ``passed: a, b applied; c conflicts (greet.py) ->
    merge/merged.diff``."""
    if record.verdict == "error":
        return f"error: {record.error}"
    head = str(record.verdict)
    if record.test is not None:
        head += f" (`{record.test.command}` exit {record.test.exit_code})"
    said = f"{', '.join(record.applied) or 'nothing'} applied"
    for c in record.conflicts:
        said += f"; {c.member} left out, it conflicts" + (
            f" on {', '.join(c.files[:5])}" if c.files else ""
        )
    for k in record.skipped:
        said += f"; {k.member} not merged ({k.reason})"
    line = f"{head}: {said}"
    if record.merged_diff:
        line += f"; {record.merged_diff}"
    return line


def read_merge(run_dir: Path) -> MergeRecord | None:
    """A run's ``merge/merge.json`` (None: no merge, or not one)."""
    try:
        return MergeRecord.model_validate_json((run_dir / MERGE_DIR / "merge.json").read_bytes())
    except (OSError, ValueError):
        return None
