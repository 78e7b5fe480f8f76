"""The coordinator's commands: ``fleet run | research | code | resume | runs``.

Exit codes, the same for every command: 0 the run met its quorum (failed members are
still listed), 1 the run failed, 2 bad input (a one-paragraph message naming what
was wrong, never a traceback), 130 interrupted (resumable with ``fleet resume``).
When Fleet's own re-run of ``fleet code --test CMD`` fails on the member's work, the
member is ``failed`` (so is the run: exit 1); its patch is kept in the run directory
and printed, but never applied.

``research`` and ``code`` are shorthands: they write the job file they stand for
into the run directory (``job.toml``), so every run - however it was started - can
be read, re-run and resumed the same way.

Before a run directory exists, :func:`coordinator.runner.preflight.preflight` checks that
every model the job names can be made and that the images its boxes need are built
(building them when they can be), so a job that cannot start leaves no run behind.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import anyio

from sandbox.cluster.auth import add_insecure_flag
from subagents.browser.corpus import CORPUS_ALLOW
from subagents.kinds.results import CodingMemberResult, MemberResult, UnknownResult
from subagents.results.outcome import MemberOutcome

from ..errors import CommandFailed, UsageError
from ..job.jobfile import JobError, load_job, parse_job, resolve_paths
from ..job.spec import Job
from ..nodes import host_git
from ..report.synthesis import WHO
from ..rundir.run_lookup import find_run, runs_root
from ..rundir.runs import RunDir, RunNotFound
from ..runner.run_budget import budget_use_line
from . import add_runs_dir, early

if TYPE_CHECKING:
    from ..runner.driver import RunOptions, RunSummary

T = TypeVar("T")

# What runs a job (the driver, the preflight, the lead) is imported by the command that
# runs one, after its job has been read: a job file with a mistake, and `fleet runs`,
# answer without loading the model client (about a second).


def _toml_str(s: str) -> str:
    return json.dumps(s, ensure_ascii=False)  # a JSON string is a valid TOML basic string


def _cluster(args: argparse.Namespace) -> str | None:
    """The Ray cluster members run on: ``--cluster``, else ``FLEET_CLUSTER``, else none."""
    return getattr(args, "cluster", None) or os.environ.get("FLEET_CLUSTER") or None


def _insecure_cluster(args: argparse.Namespace) -> bool:
    return bool(getattr(args, "insecure_cluster_without_auth", False))


def _options(args: argparse.Namespace) -> RunOptions:
    from ..runner.driver import RunOptions

    return RunOptions(
        tty=False if getattr(args, "plain", False) else None,
        approve_all=getattr(args, "approve_all", False),
        wait_approval=getattr(args, "wait_approval", False),
        cluster=_cluster(args),
        insecure_cluster=_insecure_cluster(args),
        exits_after=True,
    )


def _go(call: Callable[[], T]) -> T:
    """Run or resume through the API (:mod:`coordinator.api`), its errors as the
    command line says them: one paragraph and an exit code, never a traceback."""
    from ..api import RunFailed, RunNotStarted

    try:
        return call()
    except RunNotStarted as exc:
        raise (UsageError if exc.usage else CommandFailed)(str(exc)) from None
    except RunFailed as exc:
        print(f"fleet: {exc}", file=sys.stderr)
        raise SystemExit(1) from None
    except KeyboardInterrupt:
        # Ctrl-C before the run's signal watcher was up: the run already said it is
        # interrupted and how to resume it; a second Ctrl-C must not cut the exit short.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        raise SystemExit(130) from None


def _start(
    job: Job, text: str, args: argparse.Namespace, flags: dict[str, str] | None = None
) -> RunSummary:
    from ..api import check_new

    opts = _options(args)
    opts.prewarm = getattr(args, "prewarm", None)  # boxes started while the job was read
    # The checks run before the event loop, so Ctrl-C during an image build ends the
    # command at once (no run exists yet).
    ready = _go(lambda: check_new(job, text, opts, output_dir=args.output_dir, flags=flags))
    early.resume_gc()  # loaded, the SDK included: the run collects as usual
    return _go(lambda: anyio.run(ready.go))


def cmd_run(args: argparse.Namespace) -> int:
    try:
        job, text = load_job(args.job)
    except JobError as exc:
        raise UsageError(str(exc)) from None
    return _start(job, text, args).exit_code


def research_toml(
    question: str,
    members: int,
    allow: list[str],
    model: str | None,
    search_url: str | None,
    lead: dict[str, int] | None = None,
) -> str:
    """The job file ``fleet research`` stands for; ``lead``: the ``[lead]`` table's
    limits (``max_members``, ``max_waves``) when ``--lead`` was given."""
    hosts = [CORPUS_ALLOW, *[d for d in allow if d != CORPUS_ALLOW]]
    lines = [f"name = {_toml_str('research')}"]
    if model:
        lines += ["", "[model]", f"name = {_toml_str(model)}"]
    table = "lead" if lead is not None else "research"
    lines += ["", f"[{table}]", f"question = {_toml_str(question)}", f"members = {members}"]
    lines += [f"{k} = {v}" for k, v in (lead or {}).items()]
    lines += ["", "[egress]", f"allow = [{', '.join(_toml_str(h) for h in hosts)}]"]
    if search_url:
        lines.append(f"search_url = {_toml_str(search_url)}")
    return "\n".join(lines) + "\n"


def _parse_flags(text: str, flags: dict[str, str]) -> Job:
    """Validate a generated job; errors name the command-line flag, not the TOML field."""
    try:
        return parse_job(text, source="(command line)")
    except JobError as exc:
        msg = str(exc)
        for field, flag in flags.items():
            msg = msg.replace(f"  {field}", f"  {flag} ({field})")
        raise UsageError(msg) from None


def cmd_research(args: argparse.Namespace) -> int:
    if not args.question.strip():
        raise UsageError(
            'the question is empty; e.g. fleet research "How does asyncio cancel tasks?"'
        )
    limits = {"max_members": args.max_members, "max_waves": args.max_waves}
    if not args.lead and any(v is not None for v in limits.values()):
        flag = "--max-members" if args.max_members is not None else "--max-waves"
        raise UsageError(
            f"{flag} is for a lead's waves; add --lead, e.g. "
            f'fleet research "QUESTION" --lead {flag} 3'
        )
    lead = {k: v for k, v in limits.items() if v is not None} if args.lead else None
    text = research_toml(
        args.question, args.members, args.allow_domain or [], args.model, args.search_url, lead
    )
    job = _parse_flags(
        text,
        {
            "lead.members": "--members",
            "lead.max_members": "--max-members",
            "lead.max_waves": "--max-waves",
            "research.members": "--members",
            "egress.allow": "--allow-domain",
            "egress.search_url": "--search-url",
            "model.name": "--model",
        },
    )
    return _start(job, text, args, {"model.name": "--model"}).exit_code


def cmd_code(args: argparse.Namespace) -> int:
    repo = Path(args.repo).resolve()
    if not repo.is_dir():
        raise UsageError(
            f"REPO {args.repo!r} is not a directory; give the path of the code to "
            'work on, e.g. fleet code ./myproject "Add a --verbose flag"'
        )
    lines = [f"name = {_toml_str('code-' + (repo.name or 'repo'))}"]
    if args.model:
        lines += ["", "[model]", f"name = {_toml_str(args.model)}"]
    lines += [
        "",
        "[[members]]",
        'id = "coder"',
        'kind = "coding"',
        f"task = {_toml_str(args.task)}",
        f"repo = {_toml_str(str(repo))}",
    ]
    if args.test:
        lines.append(f"test = {_toml_str(args.test)}")
    if args.attempts is not None:
        lines.append(f"attempts = {args.attempts}")
    setup = _setup_table(args)
    if setup:
        lines.append(f"setup = {setup}")
    text = "\n".join(lines) + "\n"
    flags = {
        "members[0].task": "TASK",
        "members[0].test": "--test",
        "model.name": "--model",
        "members[0].setup.run": "--setup",
        "members[0].setup.allow": "--setup-allow",
        "members[0].setup.wheels": "--wheels",
        "members[0].attempts": "--attempts",
    }
    job = _parse_flags(text, flags)
    try:
        resolve_paths(job, Path.cwd(), source="(command line)", relative_to="the current directory")
    except JobError as exc:
        msg = str(exc)
        for field, flag in flags.items():
            msg = msg.replace(f"  {field}", f"  {flag} ({field})")
        raise UsageError(msg) from None
    summary = _start(job, text, args, {"model.name": "--model", "members[0].repo": "REPO"})
    from ..runner.driver import EXIT_FAILED

    outcome = summary.outcomes.get("coder")
    patch = summary.run.path / "members" / "coder" / "patch.diff"
    if args.setup is not None:
        _say_setup(patch.parent)
    if outcome is not None and outcome.attempts:
        print("\n" + attempts_table(outcome))
    if outcome is None or outcome.result is None:
        return summary.exit_code  # no result at all: the run's summary said why
    result = outcome.result
    if not isinstance(result, CodingMemberResult):
        # The member's result.json was changed or damaged after it ran: nothing to apply.
        print(f"fleet: the coder's result is not a coding result ({_why(result)})", file=sys.stderr)
        return EXIT_FAILED
    # A member whose test fails after its edit ends failed with its result kept:
    # shown here like a passing one, then refused below.
    print(f"\nsummary: {result.summary}")
    files = result.files_changed
    print(f"files changed: {', '.join(files) if files else 'none'}")
    if outcome.not_copied:
        print("not copied into the box (as the member's result.json says):")
        print("\n".join(f"  {line}" for line in outcome.not_copied))
    verified = result.verified
    failed_test = verified is not None and not verified.passed
    if verified is not None:
        verdict = "FAILED" if failed_test else "passed"
        print(
            f"test: {verified.command} -> exit {verified.exit_code} ({verdict}, "
            "re-run by Fleet after the member finished)"
        )
    if result.collection_error:
        # No patch stands for the member's work: say so, and where its files are.
        kept = result.edits_archive
        where = patch.with_name(kept) if kept else "nothing could be kept"
        print(f"the patch could not be collected: {result.collection_error}")
        print(f"changed files: {where}; {repo} is untouched (nothing to apply)")
        return EXIT_FAILED
    if not patch.exists() or not patch.read_bytes().strip():
        print("no changes were made; nothing to apply")
        return EXIT_FAILED if failed_test else summary.exit_code
    print(f"patch: {patch}")
    if failed_test:
        # --test is the user's gate: a patch that fails it is kept for reading, never
        # applied, and the command fails so a script can tell.
        print(f"the test fails with this patch; {repo} is untouched (not applied)")
        return EXIT_FAILED
    if args.apply:
        return _apply(repo, patch)
    print(f"your repository is untouched; apply with: git -C {repo} apply {patch.resolve()}")
    return summary.exit_code


def attempts_table(outcome: MemberOutcome) -> str:
    """A member's parallel attempts, one row each, and which one was chosen and why."""
    rows = [("attempt", "status", "test", "files", "lines", "tokens", "cost", "")]
    chosen = outcome.choice.attempt if outcome.choice else None
    for a in outcome.attempts:
        test = "-" if a.verified is None else "passed" if a.verified else "FAILED"
        tokens = a.input_tokens + a.output_tokens + a.cache_read_tokens + a.cache_write_tokens
        same = f"same as {a.same_as}" if a.same_as else ""
        mark = "chosen" if a.attempt == chosen else same
        rows.append(
            (
                str(a.attempt),
                a.status,
                test,
                str(len(a.files_changed)),
                str(a.lines),
                f"{tokens:,}",
                f"${a.cost_usd:.4f}",
                mark,
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    if outcome.choice is not None:
        c = outcome.choice
        if c.attempt is None:
            lines.append(f"chosen: none ({c.reason})")
        else:
            lines.append(f"chosen: attempt {c.attempt}, by {WHO.get(c.by, c.by)}: {c.reason}")
    return "\n".join(lines)


def _say_setup(member_dir: Path) -> None:
    """What the member's setup did, from its trace: made (and its log), reused, failed."""
    from subagents.trace import SandboxEvent

    from ..traceview.detail import setup_text

    try:
        lines = (member_dir / "trace.jsonl").read_text().splitlines()
    except OSError:
        return
    for line in lines:
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if event.get("type") == "sandbox" and event.get("action") == "setup":
            text = setup_text(SandboxEvent.model_validate(event)).removeprefix("SETUP ")
            log = member_dir / "setup.log"
            print(f"\nsetup: {text}" + (f" (its output: {log})" if log.exists() else ""))
            return


def _setup_table(args: argparse.Namespace) -> str | None:
    """``--setup`` and its companions as the member's ``setup`` inline table."""
    if args.setup is None:
        used = "--setup-allow" if args.setup_allow else "--wheels" if args.wheels else None
        if used:
            raise UsageError(f"{used} is for a setup; add --setup CMD (or --setup auto)")
        return None
    pairs = [f"run = {_toml_str(args.setup)}"]
    if args.setup_allow:
        pairs.append(f"allow = [{', '.join(_toml_str(h) for h in args.setup_allow)}]")
    if args.wheels:
        pairs.append(f"wheels = {_toml_str(str(Path(args.wheels).resolve()))}")
    return "{ " + ", ".join(pairs) + " }"


def _why(result: MemberResult) -> str:
    return result.problem if isinstance(result, UnknownResult) else f"a {result.kind} result"


def _apply(repo: Path, patch: Path) -> int:
    for check in (True, False):
        done = host_git.apply(repo, patch, check=check)
        if done.returncode != 0:
            print(
                f"fleet: the patch does not apply to {repo} (changed since the run?):\n"
                f"{done.stderr.decode('utf-8', 'replace').strip()}",
                file=sys.stderr,
            )
            return 1
    print(f"applied to {repo}")
    return 0


def cmd_apply(args: argparse.Namespace) -> int:
    """``fleet apply RUN``: ``fleet code --apply`` for a merged run - the merged patch,
    onto the members' repository, only when the merge test passed there."""
    from ..merge.merge import MERGE_DIR, merge_line, read_merge

    try:
        run = RunDir(find_run(args.run, args.output_dir))
    except RunNotFound as exc:
        raise UsageError(str(exc)) from None
    record = read_merge(run.path)
    if record is None:
        raise UsageError(
            f"run {run.id} has no merge (merge/merge.json); a job asks for one with [merge]"
        )
    if record.verdict != "passed":
        why = "the merged patches were not tested" if record.verdict == "untested" else ""
        print(
            f"fleet: not applied: the merge {record.verdict}"
            + (f" ({why})" if why else "")
            + f"\nmerge: {merge_line(record)}",
            file=sys.stderr,
        )
        return 1
    repo = Path(args.repo or record.repo).resolve()
    if not repo.is_dir():
        raise UsageError(f"{repo} is not a directory; give the repository with --repo DIR")
    patch = run.path / MERGE_DIR / "merged.diff"
    if not patch.is_file() or patch.is_symlink():
        print(f"fleet: run {run.id} has no merged patch to apply", file=sys.stderr)
        return 1
    print(f"merge: {merge_line(record)}")
    return _apply(repo, patch)


def cmd_resume(args: argparse.Namespace) -> int:
    from ..api import resume_run

    opts = _options(args)
    opts.retry_failed = args.retry_failed
    try:
        return _go(
            lambda: resume_run(
                args.run,
                opts,
                output_dir=args.output_dir,
                budget_usd=args.budget_usd,
                budget_tokens=args.budget_tokens,
            )
        ).exit_code
    except RunNotFound as exc:
        raise UsageError(str(exc)) from None


def _budget_use(run: RunDir) -> dict[str, Any] | None:
    """How the run used its ``[budget]`` (None: it has none)."""
    from ..runner.run_budget import budget_use

    entries = run.journal.read()
    if not any(e.event == "budget" for e in entries):
        return None
    return budget_use(entries, run.outcomes().values())


def _age(ts: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(ts)) if ts else "-"


def cmd_runs(args: argparse.Namespace) -> int:
    rows: list[dict[str, Any]] = []
    root = runs_root(args.output_dir)
    for run in RunDir.list(root):
        st = run.state()
        try:
            name = run.job().name
        except (OSError, ValueError):
            name = "?"
        ok = sum(1 for s in st.members.values() if s == "ok")
        rows.append(
            {
                "id": run.id,
                "name": name,
                "status": st.status,
                "ok": ok,
                "members": len(st.members),
                "started": st.started or run.created,
                "path": str(run.path),
                "merge": st.merge,
                "budget": _budget_use(run),
            }
        )
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    if not rows:
        print(f"no runs under {root}/")
        return 0
    width = max(len(r["id"]) for r in rows)
    print(f"{'run':<{width}}  {'status':<11} {'ok':>5}  {'started':<16}  name")
    for r in rows:
        print(
            f"{r['id']:<{width}}  {r['status']:<11} {r['ok']:>2}/{r['members']:<2}  "
            f"{_age(r['started']):<16}  {r['name']}"
            + (f"  (merge: {r['merge']})" if r["merge"] else "")
            + (f"  (budget: {budget_use_line(r['budget'])})" if r["budget"] else "")
        )
    return 0


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--output-dir",
        default=None,
        metavar="DIR",
        help="where run directories go (default: the job's output_dir, else "
        "$FLEET_RUNS_DIR, else runs)",
    )
    p.add_argument("--plain", action="store_true", help="plain progress lines even on a terminal")
    _approval_flags(p)
    _cluster_flag(p)


def _approval_flags(p: argparse.ArgumentParser) -> None:
    """How asks of the job's tool policies are answered (see coordinator/oversight/approvals.py)."""
    g = p.add_mutually_exclusive_group()
    g.add_argument(
        "--approve-all",
        action="store_true",
        help="say yes to every call the job's policy would ask a person about",
    )
    g.add_argument(
        "--wait-approval",
        action="store_true",
        help="without a terminal, wait for 'fleet approve RUN' to answer asks "
        "(default there: the job's ask_default at once)",
    )


def _cluster_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--cluster",
        metavar="ADDRESS",
        help="run the members on the nodes of the Ray cluster at ADDRESS (HEAD:PORT; "
        "default: $FLEET_CLUSTER, else this machine); needs the 'cluster' extra",
    )
    add_insecure_flag(p)


def _count(top: int) -> Callable[[str], int]:
    """An argparse type: a whole number from 1 to ``top``."""

    def parse(text: str) -> int:
        try:
            n = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number, e.g. 3") from None
        if not 1 <= n <= top:
            raise argparse.ArgumentTypeError(f"{n} is out of range; give 1 to {top}")
        return n

    return parse


_positive = _count(32)


def register(subparsers: Any) -> None:
    """Add the coordinator's commands to the ``fleet`` parser."""
    p = subparsers.add_parser("run", help="run a job file (members, or a research question)")
    p.add_argument("job", help="path of the job's TOML file")
    _common(p)
    p.set_defaults(func=cmd_run)

    p = subparsers.add_parser(
        "research", help="split a question across browser members and write a cited report"
    )
    p.add_argument("question", help="the research question, in quotes")
    p.add_argument(
        "--members",
        type=_positive,
        default=3,
        metavar="N",
        help="sub-questions, one browser member each (default 3)",
    )
    p.add_argument(
        "--lead",
        action="store_true",
        help="a lead plans, spawns members in waves, follows up what is open, checks "
        "documented code by running it, and writes the report",
    )
    p.add_argument(
        "--max-members",
        type=_count(256),
        metavar="N",
        help="with --lead: members over all waves, at most (default 12)",
    )
    p.add_argument(
        "--max-waves",
        type=_count(20),
        metavar="N",
        help="with --lead: waves, at most (default 3)",
    )
    p.add_argument(
        "--allow-domain",
        action="append",
        metavar="D",
        help="add a host browser members may reach (repeatable; the offline "
        "corpus is always allowed)",
    )
    p.add_argument(
        "--search-url",
        metavar="URL",
        help="search page with {query}, on an allowed host (default: the corpus)",
    )
    p.add_argument(
        "--model",
        metavar="M",
        help="model (default: Claude when ANTHROPIC_API_KEY is set, else offline)",
    )
    _common(p)
    p.set_defaults(func=cmd_research)

    p = subparsers.add_parser(
        "code", help="a coding member works on a copy of REPO and returns a patch"
    )
    p.add_argument("repo", help="directory of the code to work on (copied into the box)")
    p.add_argument("task", help="what the coding member should do, in quotes")
    p.add_argument(
        "--test",
        metavar="CMD",
        help="command that checks the work, run in the box; if it fails after the "
        "member's changes, exit 1 and nothing is applied",
    )
    p.add_argument(
        "--apply",
        action="store_true",
        help="apply the patch to REPO afterwards (default: REPO is untouched)",
    )
    p.add_argument(
        "--attempts",
        type=int,
        metavar="N",
        help="N independent attempts at once (1-8), each in its own box; the patch "
        "chosen among those whose test passed is the one kept",
    )
    p.add_argument(
        "--setup",
        metavar="CMD",
        help="prepare the box once with CMD (or 'auto': a venv and the project's "
        "dependencies), cached on the engine for later runs; the member runs offline",
    )
    p.add_argument(
        "--setup-allow",
        action="append",
        metavar="HOST",
        help="a host the setup may reach (repeat; e.g. pypi.org files.pythonhosted.org)",
    )
    p.add_argument(
        "--wheels",
        metavar="DIR",
        help="a wheelhouse for the setup, read-only at /wheels (PIP_FIND_LINKS)",
    )
    p.add_argument(
        "--model",
        metavar="M",
        help="model (default: Claude when ANTHROPIC_API_KEY is set, else offline)",
    )
    _common(p)
    p.set_defaults(func=cmd_code)

    p = subparsers.add_parser("resume", help="finish an interrupted or killed run")
    p.add_argument("run", help="run id (or the start of one) or run directory")
    p.add_argument(
        "--retry-failed",
        action="store_true",
        help="also run members that ended failed, timed out or crashed",
    )
    p.add_argument(
        "--budget-usd",
        type=float,
        metavar="X",
        help="raise (or set) the run's hard line to X US dollars; members the budget "
        "stopped run again",
    )
    p.add_argument(
        "--budget-tokens",
        type=int,
        metavar="N",
        help="raise (or set) the run's hard line to N tokens",
    )
    add_runs_dir(p)
    p.add_argument("--plain", action="store_true", help="plain progress lines even on a terminal")
    _approval_flags(p)
    _cluster_flag(p)
    p.set_defaults(func=cmd_resume)

    p = subparsers.add_parser(
        "apply",
        help="apply a run's merged patch ([merge]) to its repository, only if the merge test passed",
    )
    p.add_argument("run", help="run id (or the start of one) or run directory")
    p.add_argument(
        "--repo",
        metavar="DIR",
        help="apply to DIR instead of the repository the members worked on",
    )
    add_runs_dir(p)
    p.set_defaults(func=cmd_apply)

    p = subparsers.add_parser("runs", help="list runs and their status")
    add_runs_dir(p)
    p.add_argument("--json", action="store_true", help="print the list as JSON")
    p.set_defaults(func=cmd_runs)
