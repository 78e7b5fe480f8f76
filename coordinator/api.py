"""Fleet as a library: a job in, a finished run out.

    import coordinator as fleet

    job = fleet.load("examples/research.toml")      # a path, TOML text, a dict or a Job
    result = fleet.run(job, output_dir="runs", on_journal=print)
    result.status, result.exit_code, result.run.path, result.report_path
    result.outcomes["research-1"].result             # each member's validated result

There is one flow: ``fleet run``, ``research``, ``code`` and ``resume`` call
:func:`run_job` and :func:`resume_run` here and add only the terminal (the live
table, the keys that answer asks, Ctrl-C as a signal, exit codes). A run takes the
same steps either way - validate the job (its repositories too), check that its
models can be made and its images exist (building missing ones), create the run
directory, then plan, fan out and write the report - and a resume refuses a run
that another process still runs. A program gets three differences: nothing is
printed unless asked (``echo``), progress comes through callbacks (every trace event,
every journal entry as its typed model) or :func:`stream`, and errors are raised:

- :class:`~coordinator.job.jobfile.JobError`: the job is invalid (which field, what was
  wrong, an example of right), before anything exists;
- :class:`RunNotStarted`: the job is valid but cannot run here (no API key for its
  model, no Docker engine, images that cannot be built, an output directory that
  cannot be made); no run directory exists;
- :class:`RunInProgress` (a :class:`RunNotStarted`): a resume of a run that another
  live process is running - resuming it would remove that run's boxes under it;
- :class:`~coordinator.rundir.run_lookup.RunNotFound`: no run matches what resume was given;
- :class:`RunFailed`: the run started and its Docker engine (or model) went away;
  the run directory and every finished member's result are kept, and
  :func:`resume` runs what did not finish.

A member failing is never an exception: it is that member's outcome, and the run's
``status`` (``succeeded`` when the quorum was met, else ``failed``) says the rest.
A run that is cancelled - a cancelled scope around :func:`run_async`, or Ctrl-C in a
script's :func:`run` (which then raises ``KeyboardInterrupt``) - removes its boxes
and is journalled ``interrupted``, so ``fleet runs`` says so and it can be resumed
at once.

Why sync functions beside async ones: a script calls :func:`run`, a program with an
event loop awaits :func:`run_async`. Both are the same checks (:func:`check_new`,
which runs in a thread from async code because the preflight runs its own event
loop) followed by the same coroutine (:meth:`Ready.go`).

Why the API, too, starts the ``anthropic`` SDK's import early: a program calling
:func:`run` for the first time has not imported the SDK (``coordinator`` does not
load it), and the preflight no longer does either. So :func:`check_new` and
:func:`check_resume` start it on a thread (:mod:`subagents.model.sdk_import`) as
soon as they hold a job that calls the Messages API, just before the preflight: it
then runs beside the preflight (the repositories, the images, the engine's host),
whose last check joins it (:func:`coordinator.runner.preflight.check_sdk` says why
there), instead of in series before it. The thread is a daemon and imports only what
the first model call would import a moment later; a program that already imported
the SDK, or a later run in the same process, starts nothing. A run on offline models
never starts it. Unlike the command line, the API leaves the caller's garbage
collector alone (:mod:`coordinator.cli.early`): it is the caller's process.
"""

from __future__ import annotations

import io
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
from pydantic import ValidationError

from sandbox.errors import SandboxError
from sandbox.warm import WarmBoxes
from subagents.beside import leaves
from subagents.model import ModelError, sdk_import

from .errors import CommandFailed, UsageError
from .job.jobfile import (
    JobError,
    describe_validation,
    load_job,
    parse_job,
    render_toml,
    resolve_paths,
)
from .job.spec import Job
from .journal.entries import JournalEntryModel, RunFinishedEntry, UnknownEntry
from .rundir.runs import RunDir, RunDirUnavailable, check_root, root_for
from .runner.driver import EXIT_FAILED, EXIT_INTERRUPTED, EXIT_OK, RunOptions, RunSummary, execute

JobSource = Job | Mapping[str, Any] | str | os.PathLike[str]
EventCallback = Callable[[Any], None]
JournalCallback = Callable[[JournalEntryModel], None]
"""Hears every journal entry as it is written, as its model (``RunCreatedEntry``,
``MemberStartedEntry``, ``MemberFinishedEntry``, ...: :mod:`coordinator.journal.entries`)."""
OutputDir = str | os.PathLike[str] | None


class RunNotStarted(Exception):
    """The job is valid but cannot run here; nothing was created. The message says
    what to do (e.g. set ANTHROPIC_API_KEY, run ``fleet setup``). ``usage``: what was
    given is at fault (the command line exits 2), not this machine (exit 1)."""

    def __init__(self, message: str, *, usage: bool = True) -> None:
        super().__init__(message)
        self.usage = usage


class RunInProgress(RunNotStarted):
    """The run is still running in another process (``pid``); resume it once that
    process has ended. Resuming now would reap the live run's boxes."""

    def __init__(self, run: RunDir, pid: int) -> None:
        super().__init__(
            f"run {run.id} is still running (pid {pid}); resume it once it ends "
            "or after that process is gone"
        )
        self.run, self.pid = run, pid


class RunFailed(Exception):
    """The run started and could not go on (its engine or model went away); its
    directory and finished members' results are kept: ``resume(run.path)``."""

    def __init__(self, message: str, run: RunDir) -> None:
        super().__init__(message)
        self.run = run


def load(source: JobSource) -> Job:
    """A validated :class:`Job` from a job file's path, TOML text, a dict or a Job;
    raises :class:`JobError` naming every bad field (a missing repository too)."""
    job, _ = load_with_text(source)
    return job


def load_with_text(source: JobSource) -> tuple[Job, str]:
    """The job and the TOML text its run keeps as ``job.toml``. Paths in a job that
    is not a file are relative to the current directory, and checked as a file's are."""
    if isinstance(source, str) and "\n" in source:
        job = parse_job(source, source="<text>")
        resolve_paths(job, Path.cwd(), source="<text>", relative_to="the current directory")
        return job, source
    if isinstance(source, Job):
        job, where = source.model_copy(deep=True), "<Job>"
    elif isinstance(source, Mapping):
        try:
            job, where = Job.model_validate(dict(source)), "<dict>"
        except ValidationError as exc:
            raise JobError("<dict>", describe_validation(exc)) from None
    else:
        return load_job(Path(source))
    resolve_paths(job, Path.cwd(), source=where, relative_to="the current directory")
    return job, render_toml(job.model_dump(mode="json", exclude_defaults=True))


class _Discard(io.StringIO):
    """Where a quiet run's progress goes: nowhere (a StringIO would keep it all)."""

    def write(self, s: str) -> int:
        return len(s)


def make_options(
    options: RunOptions | None = None,
    *,
    on_event: EventCallback | None = None,
    on_journal: JournalCallback | None = None,
    echo: bool = False,
    warm: WarmBoxes | None = None,
) -> RunOptions:
    """The run options of an API call: no signal handlers (the caller's loop owns
    them), no live table; nothing printed unless ``echo`` (then to ``options.out``,
    by default standard error). ``warm``: boxes the caller keeps ready across its runs
    (:class:`sandbox.warm.WarmBoxes`, opened in the caller's loop)."""
    opts = options or RunOptions(handle_signals=False, tty=False)
    if warm is not None:
        opts.warm = warm
    if not echo:
        opts.out, opts.tty = _Discard(), False
    if on_event is not None:
        opts.on_event.append(on_event)
    if on_journal is not None:
        opts.on_journal.append(on_journal)
    return opts


@dataclass
class Ready:
    """A job checked to run here (or a run checked to resume); :meth:`go` runs it."""

    job: Job
    opts: RunOptions
    run: RunDir | None = None
    """The run, once it exists; None: a new run, made by :meth:`open`."""
    resume: bool = False
    text: str = ""
    root: Path | None = None
    at_once: str = ""

    def open(self) -> RunDir:
        """The run's directory: the resumed one, or a new one made now."""
        if self.run is not None:
            if self.resume:
                where = f"{self.run.id} ({self.at_once}) in {self.run.path}"
                print(f"fleet: resuming {where}", file=self.opts.out)
            return self.run
        # Boxes started while the job was read carry the run's id, chosen then.
        prewarm = self.opts.prewarm
        try:
            self.run = RunDir.create(
                self.job, self.text, root=self.root, name=prewarm.run if prewarm else None
            )
        except RunDirUnavailable as exc:
            raise RunNotStarted(str(exc)) from None
        n = self.job.member_count
        count = f"{n} member{'' if n == 1 else 's'}"
        where = f"{self.run.id} ({count}, {self.at_once}) in {self.run.path}"
        print(f"fleet: run {where}", file=self.opts.out)
        for entry in self.run.journal.read():  # run_created, written before any listener
            for listener in self.opts.on_journal:
                if not isinstance(entry, UnknownEntry):
                    listener(entry)
        return self.run

    async def go(self) -> RunSummary:
        """Open the run, then run it to its end; :class:`RunFailed` when its engine or
        model went away."""
        run = self.open()
        try:
            return await execute(run, self.job, self.opts, resume=self.resume)
        except (SandboxError, ModelError, BaseExceptionGroup) as exc:
            # An engine that dies after the preflight surfaces from the run's task group,
            # wrapped in an exception group: its message, not a traceback.
            found = leaves(exc)
            if not all(isinstance(e, SandboxError | ModelError) for e in found):
                raise
            reason = "; ".join(dict.fromkeys(str(e) for e in found))
            run.journal.append(RunFinishedEntry(status="failed", error=reason))
            run.clear_live()
            raise RunFailed(
                f"run {run.id} failed: {reason}\nrun directory: {run.path} (once fixed, "
                f"'{run.resume_command()}' runs the members that did not finish)",
                run,
            ) from None


def check_new(
    job: Job,
    text: str,
    opts: RunOptions,
    *,
    output_dir: OutputDir = None,
    flags: dict[str, str] | None = None,
) -> Ready:
    """Where the run goes and the preflight, before anything exists; ``flags`` names
    the command-line flag behind a field in the preflight's messages."""
    root = root_for(job, output_dir)
    try:
        check_root(root)  # at once, before images are built
    except RunDirUnavailable as exc:
        raise RunNotStarted(str(exc)) from None
    return Ready(job, opts, text=text, root=root, at_once=_preflight(job, opts, flags))


def check_resume(
    run_ref: str | os.PathLike[str],
    opts: RunOptions,
    *,
    output_dir: OutputDir = None,
    budget_usd: float | None = None,
    budget_tokens: int | None = None,
) -> Ready | RunSummary:
    """A run to resume, checked; or, when it has nothing left to run, its summary."""
    run = RunDir.open(str(run_ref), root=Path(output_dir) if output_dir else None)
    owner = run.owner_pid()
    if owner is not None:
        raise RunInProgress(run, owner)
    job = run.job()
    if budget_usd is not None or budget_tokens is not None:
        from .runner.run_budget import check_raise

        try:
            check_raise(run.journal.read(), usd=budget_usd, tokens=budget_tokens)
        except UsageError as exc:
            raise RunNotStarted(str(exc)) from None
        opts.budget_usd, opts.budget_tokens = budget_usd, budget_tokens
    done = _nothing_left(run, job, opts)
    if done is not None:
        return done
    return Ready(job, opts, run=run, resume=True, at_once=_preflight(job, opts, None))


def _nothing_left(run: RunDir, job: Job, opts: RunOptions) -> RunSummary | None:
    """The run as it ended, when a resume would run nothing: nothing is recorded."""
    from .lead.lead import lead_finished

    members = run.planned_members()
    if members is None:
        return None  # never planned: the resume plans it
    pending = run.pending_members(members, retry_failed=opts.retry_failed)
    lead_open = job.lead is not None and not lead_finished(run, retry_failed=opts.retry_failed)
    if pending or lead_open:
        return None
    state = run.state()
    print(
        f"fleet: run {run.id} has nothing left to run ({state.status}); "
        "use --retry-failed to run its failed members again",
        file=opts.out,
    )
    code = EXIT_OK if state.status == "succeeded" else EXIT_FAILED
    return summary_of(run, state.status, code)


def summary_of(run: RunDir, status: str, exit_code: int) -> RunSummary:
    """A summary read back from the run directory (its members' ``result.json``)."""
    outcomes = run.outcomes()
    report = run.path / "report.md"
    return RunSummary(run, status, exit_code, outcomes, report if report.exists() else None)


def interrupted(run: RunDir) -> RunSummary:
    """The summary of a run that was cancelled (the driver journalled it)."""
    return summary_of(run, "interrupted", EXIT_INTERRUPTED)


def run(
    job: JobSource,
    *,
    output_dir: OutputDir = None,
    on_event: EventCallback | None = None,
    on_journal: JournalCallback | None = None,
    echo: bool = False,
    options: RunOptions | None = None,
) -> RunSummary:
    """Validate, check and run ``job`` to the end; see the module docstring."""
    parsed, text = load_with_text(job)
    opts = make_options(options, on_event=on_event, on_journal=on_journal, echo=echo)
    return run_job(parsed, text, opts, output_dir=output_dir)


def run_job(
    job: Job,
    text: str,
    opts: RunOptions,
    *,
    output_dir: OutputDir = None,
    flags: dict[str, str] | None = None,
) -> RunSummary:
    """:func:`run` for a job already read, with its options made: what ``fleet run``,
    ``research`` and ``code`` call."""
    ready = check_new(job, text, opts, output_dir=output_dir, flags=flags)
    return anyio.run(ready.go)


async def run_async(
    job: JobSource,
    *,
    output_dir: OutputDir = None,
    on_event: EventCallback | None = None,
    on_journal: JournalCallback | None = None,
    echo: bool = False,
    options: RunOptions | None = None,
    warm: WarmBoxes | None = None,
) -> RunSummary:
    """:func:`run` inside a running event loop. ``warm``: boxes the caller keeps ready
    across its runs (:class:`sandbox.warm.WarmBoxes`, opened in this loop); the run's
    members whose box spec is the pool's take those before any is made."""
    parsed, text = load_with_text(job)
    opts = make_options(options, on_event=on_event, on_journal=on_journal, echo=echo, warm=warm)
    ready = await anyio.to_thread.run_sync(
        lambda: check_new(parsed, text, opts, output_dir=output_dir)
    )
    return await ready.go()


def resume(
    run_ref: str | os.PathLike[str],
    *,
    output_dir: OutputDir = None,
    on_event: EventCallback | None = None,
    on_journal: JournalCallback | None = None,
    echo: bool = False,
    retry_failed: bool = False,
    budget_usd: float | None = None,
    budget_tokens: int | None = None,
    options: RunOptions | None = None,
) -> RunSummary:
    """Run the members of an earlier run that have no final outcome (also the failed
    ones with ``retry_failed``, and those its budget stopped); ``run_ref`` is a run
    directory, id or id prefix. ``budget_usd`` / ``budget_tokens`` raise (or set) the
    run's budget, as ``fleet resume --budget-usd/--budget-tokens`` do. A run with
    nothing left to run is returned as it ended; one that another process still runs
    is :class:`RunInProgress`."""
    opts = make_options(options, on_event=on_event, on_journal=on_journal, echo=echo)
    opts.retry_failed = retry_failed or opts.retry_failed
    return resume_run(
        run_ref, opts, output_dir=output_dir, budget_usd=budget_usd, budget_tokens=budget_tokens
    )


def resume_run(
    run_ref: str | os.PathLike[str],
    opts: RunOptions,
    *,
    output_dir: OutputDir = None,
    budget_usd: float | None = None,
    budget_tokens: int | None = None,
) -> RunSummary:
    """:func:`resume` with its options made: what ``fleet resume`` calls."""
    ready = check_resume(
        run_ref, opts, output_dir=output_dir, budget_usd=budget_usd, budget_tokens=budget_tokens
    )
    return ready if isinstance(ready, RunSummary) else anyio.run(ready.go)


async def resume_async(
    run_ref: str | os.PathLike[str],
    *,
    output_dir: OutputDir = None,
    on_event: EventCallback | None = None,
    on_journal: JournalCallback | None = None,
    echo: bool = False,
    retry_failed: bool = False,
    budget_usd: float | None = None,
    budget_tokens: int | None = None,
    options: RunOptions | None = None,
    warm: WarmBoxes | None = None,
) -> RunSummary:
    """:func:`resume` inside a running event loop (``warm`` as for :func:`run_async`)."""
    opts = make_options(options, on_event=on_event, on_journal=on_journal, echo=echo, warm=warm)
    opts.retry_failed = retry_failed or opts.retry_failed
    ready = await anyio.to_thread.run_sync(
        lambda: check_resume(
            run_ref, opts, output_dir=output_dir, budget_usd=budget_usd, budget_tokens=budget_tokens
        )
    )
    return ready if isinstance(ready, RunSummary) else await ready.go()


def _preflight(job: Job, opts: RunOptions, flags: dict[str, str] | None) -> str:
    """The preflight (:mod:`coordinator.runner.preflight`); how many members run at once,
    and why. The SDK's import starts first, on its thread, when the job calls the
    Messages API (see the module's docstring)."""
    from .runner.preflight import model_names, preflight

    sdk_import.start_for(model_names(job))
    try:
        parallel = preflight(
            job, flags, out=opts.out, cluster=opts.cluster, insecure_cluster=opts.insecure_cluster
        )
    except UsageError as exc:
        raise RunNotStarted(str(exc)) from None
    except CommandFailed as exc:
        raise RunNotStarted(str(exc), usage=False) from None
    opts.max_parallel = parallel.members
    return f"{parallel.members} at once: {parallel.why}"
