"""Fleet as a library: a job in, a finished run out.

    import coordinator as fleet

    job = fleet.load("examples/research.toml")      # a path, TOML text, a dict or a Job
    result = fleet.run(job, output_dir="runs", on_journal=print)
    result.status, result.exit_code, result.run.path, result.report_path
    result.outcomes["research-1"].result             # each member's validated result

:func:`run` takes the same steps as ``fleet run`` - validate the job, check that its
models can be made and its images exist (building missing ones), create the run
directory, then plan, fan out and write the report - with three differences a
program wants: it prints nothing unless asked (``echo``), it reports progress
through callbacks (every trace event, every journal entry), and it raises typed
errors instead of exiting:

- :class:`~coordinator.jobfile.JobError`: the job is invalid (which field, what was
  wrong, an example of right), before anything exists;
- :class:`RunNotStarted`: the job is valid but cannot run here (no API key for its
  model, no Docker engine, images that cannot be built, an output directory that
  cannot be made); no run directory exists;
- :class:`RunFailed`: the run started and its Docker engine (or model) went away;
  the run directory and every finished member's result are kept, and
  :func:`resume` runs what did not finish.

A member failing is never an exception: it is that member's outcome, and the run's
``status`` (``succeeded`` when the quorum was met, else ``failed``) says the rest.
:func:`run_async` is the same inside an event loop that is already running (it does
not install signal handlers; cancel its scope to stop the run, which then ends
``interrupted`` with its boxes removed).
"""

from __future__ import annotations

import io
import os
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import anyio
from pydantic import ValidationError

from sandbox.errors import SandboxError
from subagents.model import ModelError

from .driver import RunOptions, RunSummary, execute
from .errors import CommandFailed, UsageError
from .jobfile import JobError, describe_validation, load_job, parse_job, render_toml
from .prewarm import Prewarm
from .runs import RunDir, RunDirUnavailable, check_root, root_for
from .spec import Job

JobSource = Job | Mapping[str, Any] | str | os.PathLike[str]
EventCallback = Callable[[Any], None]
JournalCallback = Callable[[dict[str, Any]], None]


class RunNotStarted(Exception):
    """The job is valid but cannot run here; nothing was created. The message says
    what to do (e.g. set ANTHROPIC_API_KEY, run ``fleet setup``)."""


class RunFailed(Exception):
    """The run started and could not go on (its engine or model went away); its
    directory and finished members' results are kept: ``resume(run.path)``."""

    def __init__(self, message: str, run: RunDir) -> None:
        super().__init__(message)
        self.run = run


def load(source: JobSource) -> Job:
    """A validated :class:`Job` from a job file's path, TOML text, a dict or a Job;
    raises :class:`JobError` naming every bad field."""
    job, _ = _load(source)
    return job


def _load(source: JobSource) -> tuple[Job, str]:
    """The job and the TOML text its run keeps as ``job.toml``."""
    if isinstance(source, Job):
        job = source
    elif isinstance(source, Mapping):
        try:
            job = Job.model_validate(dict(source))
        except ValidationError as exc:
            raise JobError("<dict>", describe_validation(exc)) from None
    elif isinstance(source, str) and "\n" in source:
        return parse_job(source, source="<text>"), source
    else:
        return load_job(Path(source))
    return job, render_toml(job.model_dump(mode="json", exclude_defaults=True))


def run(
    job: JobSource,
    *,
    output_dir: str | os.PathLike[str] | None = None,
    on_event: EventCallback | None = None,
    on_journal: JournalCallback | None = None,
    echo: bool = False,
    options: RunOptions | None = None,
) -> RunSummary:
    """Validate, check and run ``job`` to the end; see the module docstring."""
    return anyio.run(
        lambda: run_async(
            job,
            output_dir=output_dir,
            on_event=on_event,
            on_journal=on_journal,
            echo=echo,
            options=options,
        )
    )


async def run_async(
    job: JobSource,
    *,
    output_dir: str | os.PathLike[str] | None = None,
    on_event: EventCallback | None = None,
    on_journal: JournalCallback | None = None,
    echo: bool = False,
    options: RunOptions | None = None,
) -> RunSummary:
    """:func:`run` inside a running event loop."""
    parsed, text = _load(job)
    opts = _options(options, on_event, on_journal, echo)
    root = root_for(parsed, output_dir)
    # The first wave's boxes start beside the preflight, as `fleet run` starts them
    # while it loads (coordinator/prewarm.py); what no run takes is removed below.
    warm = _prewarm(text, opts)
    try:
        try:
            check_root(root)  # at once, before images are built
            await _preflight(parsed, opts)
            created = RunDir.create(parsed, text, root=root, name=warm.run if warm else None)
        except RunDirUnavailable as exc:
            raise RunNotStarted(str(exc)) from None
        return await _execute(created, parsed, opts, resume=False)
    finally:
        if warm is not None:
            opts.prewarm = None
            with anyio.CancelScope(shield=True):
                await anyio.to_thread.run_sync(warm.close)


def _prewarm(text: str, opts: RunOptions) -> Prewarm | None:
    """Boxes for the job's first wave, started now in a thread - unless the caller chose
    its own backend, a cluster runs the members, or boxes were started already."""
    if opts.prewarm is not None or opts.backend is not None or opts.cluster:
        return None
    opts.prewarm = Prewarm.from_text(text)
    return opts.prewarm


def resume(
    run_ref: str | os.PathLike[str],
    *,
    output_dir: str | os.PathLike[str] | None = None,
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
    run's budget, as ``fleet resume --budget-usd/--budget-tokens`` do."""

    async def go() -> RunSummary:
        found = RunDir.open(str(run_ref), root=Path(output_dir) if output_dir else None)
        parsed = found.job()
        opts = _options(options, on_event, on_journal, echo)
        opts.retry_failed = retry_failed or opts.retry_failed
        if budget_usd is not None or budget_tokens is not None:
            from .preflight import refuse_budget_on_cluster
            from .run_budget import check_raise

            try:
                if opts.cluster:
                    refuse_budget_on_cluster()
                check_raise(found.journal.read(), usd=budget_usd, tokens=budget_tokens)
            except UsageError as exc:
                raise RunNotStarted(str(exc)) from None
            opts.budget_usd, opts.budget_tokens = budget_usd, budget_tokens
        await _preflight(parsed, opts)
        return await _execute(found, parsed, opts, resume=True)

    return anyio.run(go)


def _options(
    options: RunOptions | None,
    on_event: EventCallback | None,
    on_journal: JournalCallback | None,
    echo: bool,
) -> RunOptions:
    opts = options or RunOptions(handle_signals=False)
    opts.out = sys.stderr if echo else io.StringIO()
    opts.tty = False
    if on_event is not None:
        opts.on_event.append(on_event)
    if on_journal is not None:
        opts.on_journal.append(on_journal)
    return opts


async def _preflight(job: Job, opts: RunOptions) -> None:
    from .preflight import preflight  # its checks run their own event loop: a thread

    try:
        parallel = await anyio.to_thread.run_sync(
            lambda: preflight(
                job, out=opts.out, cluster=opts.cluster, insecure_cluster=opts.insecure_cluster
            )
        )
    except (UsageError, CommandFailed) as exc:
        raise RunNotStarted(str(exc)) from None
    opts.max_parallel = parallel.members
    print(f"fleet: {parallel.members} members at once: {parallel.why}", file=opts.out)


async def _execute(run_dir: RunDir, job: Job, opts: RunOptions, *, resume: bool) -> RunSummary:
    try:
        return await execute(run_dir, job, opts, resume=resume)
    except (SandboxError, ModelError, BaseExceptionGroup) as exc:
        leaves = _leaves(exc)
        if not all(isinstance(e, SandboxError | ModelError) for e in leaves):
            raise
        reason = "; ".join(dict.fromkeys(str(e) for e in leaves))
        run_dir.journal.append("run_finished", status="failed", error=reason)
        run_dir.clear_live()
        raise RunFailed(
            f"run {run_dir.id} failed: {reason} (its directory {run_dir.path} is kept; "
            "resume it once fixed)",
            run_dir,
        ) from None


def _leaves(exc: BaseException) -> list[BaseException]:
    """The errors inside (nested) exception groups, which task groups wrap them in."""
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for inner in exc.exceptions for leaf in _leaves(inner)]
    return [exc]
