"""One run's life: plan, fan out, synthesize, journal - and the same for a resume.

:func:`execute` is what ``fleet run``, ``fleet research``, ``fleet code`` and
``fleet resume`` all call. A fresh run and a resumed one differ in two lines: a
resume first reaps the dead run's boxes, and it runs only the members the journal
shows without a final outcome (the plan is read back from ``members.json``, never
redone, so the members and their ids are the same).

Interruption: SIGINT/SIGTERM are received as events (not as ``KeyboardInterrupt``
at an arbitrary instruction), cancel the fan-out scope, let every member release its
box under a shield, then the run is journalled ``interrupted`` and can be resumed.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any, TextIO

import anyio
from anyio.abc import TaskStatus

from sandbox.base import SandboxBackend
from sandbox.docker import reaper
from sandbox.registry import get_backend
from sandbox.warm import WarmBoxes
from subagents.beside import leaves
from subagents.browser.corpus import CORPUS_MEMBER
from subagents.kinds import RESEARCH_KIND, kind_is
from subagents.model import Model, make_model, resolve_model
from subagents.results.outcome import MemberOutcome
from subagents.spend.budget import register

from ..fanout.executor import Executor
from ..fanout.fanout import Fanout, to_member_spec
from ..job.planner import plan
from ..job.spec import LEAD_ID, Job, MemberJob
from ..journal.entries import (
    BoxesKeptEntry,
    JournalEntryModel,
    LeadSpawnEntry,
    MemberFinishedEntry,
    MemberQueuedEntry,
    PlanEntry,
    ReapedEntry,
    RunFinishedEntry,
    RunInterruptedEntry,
    RunStartedEntry,
)
from ..lead.lead import lead_finished, run_lead, spawned_members
from ..merge.merge import MergeRecord, merge_line, read_merge, run_merge
from ..nodes.capacity import choose, job_boxes, widest
from ..nodes.node import CLEANUP_S, LocalNodes, NodeDeps
from ..nodes.prewarm import Prewarm
from ..nodes.worker import MemberUnit, Nodes, Recorder, Services
from ..oversight.approvals import ApprovalQueue, FileApprover, Mode, read_keys
from ..oversight.progress import Progress
from ..report.report import memory_lines, memory_problems
from ..rundir.runs import RunDir
from .analyst import write_report
from .run_budget import budget_lines, finished_costs, make_budget

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130


@dataclass
class RunOptions:
    """How to run: where members run and what the user sees."""

    backend: SandboxBackend | None = None
    """Default: the Docker backend."""
    make_model: Callable[..., Model] = make_model
    executor: Executor[MemberUnit, MemberOutcome] | None = None
    out: TextIO = field(default_factory=lambda: sys.stderr)
    tty: bool | None = None
    retry_failed: bool = False
    """Resume: also run members that ended failed (not only unfinished ones)."""
    handle_signals: bool = True
    """Receive Ctrl-C and SIGTERM as events that interrupt the run (main thread only);
    the process's handlers are put back when it ends."""
    exits_after: bool = False
    """The process ends when the run does (the command line): after an interrupt,
    SIGINT stays ignored instead of its handler being put back."""
    cluster: str | None = None
    """A Ray cluster's address: members run on its nodes (``fleet run --cluster``)."""
    insecure_cluster: bool = False
    """Run on the cluster even if it lets in a process without its token
    (``--insecure-cluster-without-auth``): whoever reaches it can run code on its nodes."""
    on_event: list[Callable[[Any], None]] = field(default_factory=list)
    """Called with every trace event of every member, as it happens."""
    on_journal: list[Callable[[JournalEntryModel], None]] = field(default_factory=list)
    """Called with every journal entry as it is written, as its model
    (:mod:`coordinator.journal.entries`: member queued, started, finished, ...)."""
    approve_all: bool = False
    """Say yes to every ask of the members' tool policies."""
    wait_approval: bool = False
    """Wait for a person's answer to an ask (``fleet approve``) even without a terminal;
    without either, an ask gets the member's ``ask_default`` at once."""
    keys: bool | None = None
    """Take y / n / a for asks from the terminal's keyboard; None: when stdin and the
    progress output are both terminals."""
    max_parallel: int | None = None
    """Members at once when the job leaves ``max_parallel`` out, as the preflight chose
    it from the engine's host (:mod:`coordinator.nodes.capacity`); None: at most 4."""
    prewarm: Prewarm | None = None
    """The first wave's boxes, started before the run existed (:mod:`coordinator.nodes.prewarm`)."""
    warm: WarmBoxes | None = None
    """Boxes kept ready across runs by the caller (:mod:`sandbox.warm`): the run's warm
    pools take from it first; local runs only."""
    budget_usd: float | None = None
    """Resume: the run's hard line in USD, raised (or set) instead of the job's."""
    budget_tokens: int | None = None
    """Resume: the run's hard line in tokens, raised (or set) instead of the job's."""
    on_fanout: list[Callable[[Fanout], None]] = field(default_factory=list)
    """Told of the run's fan-out once it exists (a caller cancels one member through
    :meth:`Fanout.cancel`)."""


@dataclass
class RunSummary:
    run: RunDir
    status: str
    """succeeded, failed or interrupted."""
    exit_code: int
    outcomes: dict[str, MemberOutcome]
    report_path: Path | None = None


def _nodes(opts: RunOptions, approver: FileApprover) -> Nodes:
    """Where the run's members run: a Ray cluster's nodes (``opts.cluster``; Ray is
    imported only then), else this host's engine, through ``opts.backend``."""
    if opts.cluster:
        from ..nodes.cluster import RayNodes

        return RayNodes(opts.cluster, approver=approver, insecure=opts.insecure_cluster)
    if opts.backend is None:
        opts.backend = get_backend()
    deps = NodeDeps(
        backend=opts.backend,
        make_model=opts.make_model,
        approver=approver,
        prewarm=opts.prewarm,
        warm=opts.warm,
    )
    return LocalNodes(deps)


def _approver(run: RunDir, opts: RunOptions) -> FileApprover:
    """Who answers the asks of this run's tool policies (see coordinator/oversight/approvals.py)."""
    tty = opts.tty if opts.tty is not None else bool(getattr(opts.out, "isatty", bool)())
    mode: Mode = "all" if opts.approve_all else "wait" if tty or opts.wait_approval else "default"
    return FileApprover(ApprovalQueue(run.path / "approvals"), mode)


async def plan_members(
    run: RunDir, job: Job, make_model: Callable[[str], Model]
) -> list[MemberJob]:
    """The run's members: explicit ones plus the research plan; saved once, reused after."""
    saved = run.planned_members()
    if saved is not None:
        return saved
    members = [m.model_copy(deep=True) for m in job.members]
    if job.research is not None:
        r = job.research
        model = make_model(resolve_model(job.model.name))
        try:
            subs, planner = await plan(
                r.question, r.members, model=None if model.offline else model
            )
        finally:
            await model.aclose()
        taken = {m.id for m in members}
        for i, q in enumerate(subs, 1):
            mid = f"research-{i}"
            while mid in taken:
                mid += "x"
            members.append(
                MemberJob(
                    id=mid,
                    kind=RESEARCH_KIND,
                    task=q,
                    limits=r.limits,
                    inputs={"question": r.question},
                )
            )
        run.journal.append(PlanEntry(planner=planner, sub_questions=subs))
    run.save_members(members)
    return members


def _wants_corpus(job: Job) -> bool:
    return any(h.split(":")[0] == CORPUS_MEMBER for h in job.egress.allow)


def _units(run: RunDir, job: Job, members: list[MemberJob]) -> list[MemberUnit]:
    out = []
    for m in members:
        spec = to_member_spec(
            m,
            model=resolve_model(m.model or job.model.name),
            max_tokens=job.model.max_tokens,
            egress=job.egress,
            memory_root=run.path.parent / "memory",
            policy=job.policy,
            runtime=job.sandbox.runtime,
            fallback=m.fallback or job.model.fallback,
        )
        out.append(
            MemberUnit(
                run_id=run.id,
                # Made when the member starts (run_unit), not here for all of them up front.
                member_dir=str(run.path / "members" / spec.id),
                spec=spec,
                retry=job.fanout.retry,
                **m.work(),
            )
        )
    return out


WATCHED = (signal.SIGINT, signal.SIGTERM)
"""The signals a run receives as events when it handles signals."""


@dataclass
class _Signals:
    """Ctrl-C and SIGTERM for the whole run. The first cancels ``scope`` (the work in
    progress); later ones only say that cleanup is under way. The receiver stays open
    until the run has ended: with it closed, a second Ctrl-C became a
    ``KeyboardInterrupt`` raised inside the shielded cleanup, which once left the
    process hung in a half-closed event loop.

    The process's handlers are the caller's: a signal it was started ignoring (a
    background job's SIGINT, as POSIX shells start them) stays ignored, as Python itself
    leaves it, and when the run ends every handler is put back as it was - so a library
    caller's next run, or a child it starts, sees the process as it was before. Only a
    process that ends with the run (``exits_after``: the command line) keeps SIGINT
    ignored after an interrupt, so that one more Ctrl-C cannot cut its exit short."""

    out: TextIO
    exits_after: bool = False
    scope: anyio.CancelScope | None = None
    got: list[int] = field(default_factory=list)

    async def watch(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        before = {signum: signal.getsignal(signum) for signum in WATCHED}
        watched = [signum for signum, handler in before.items() if handler is not signal.SIG_IGN]
        try:
            with anyio.open_signal_receiver(*watched) as signals:
                task_status.started()
                async for signum in signals:
                    self.got.append(signum)
                    if len(self.got) == 1 and self.scope is not None:
                        self.scope.cancel()
                    elif len(self.got) == 2:
                        print(
                            f"fleet: still cleaning up (at most {CLEANUP_S:g}s), then the "
                            "run ends interrupted; please wait",
                            file=self.out,
                            flush=True,
                        )
        finally:
            # Closing the receiver set Python's own handlers, not necessarily the ones
            # there were: put those back.
            for signum in watched:
                restore_handler(signum, before[signum])
            if self.got and self.exits_after:
                # One more Ctrl-C while the process exits would end it by
                # KeyboardInterrupt, not exit 130.
                signal.signal(signal.SIGINT, signal.SIG_IGN)


def restore_handler(
    signum: int, handler: Callable[[int, FrameType | None], Any] | int | signal.Handlers | None
) -> None:
    """Put ``handler`` back for ``signum``; None (a handler that was not installed from
    Python) cannot be, and is left as it is."""
    if handler is not None:
        signal.signal(signum, handler)


@asynccontextmanager
async def _cleanup(what: str, out: TextIO) -> AsyncIterator[None]:
    """Shielded (an interrupt must not leak boxes) and bounded (nor hang the process)."""
    with anyio.CancelScope(shield=True), anyio.move_on_after(CLEANUP_S) as bound:
        yield
    if bound.cancelled_caught:
        print(
            f"fleet: {what} did not finish within {CLEANUP_S:g}s; "
            "'fleet sandbox gc' removes whatever is left",
            file=out,
        )


@dataclass
class _Progressed:
    """How far a run got before it ended or was interrupted (planning may not finish)."""

    members: list[MemberJob] = field(default_factory=list)
    progress: Progress | None = None
    outcomes: dict[str, MemberOutcome] = field(default_factory=dict)
    live_otel: Any = None
    """The run's live OpenTelemetry export (None: off)."""
    merge: MergeRecord | None = None
    """``[merge]``'s record, once it ran."""


async def execute(run: RunDir, job: Job, opts: RunOptions, *, resume: bool = False) -> RunSummary:
    """Run (or resume) ``run``; never raises for a member's failure.

    Ctrl-C is watched from the first line, so an interrupt while a resume reaps boxes
    or while the planner runs leaves the run ``interrupted`` (resumable), not dead.
    """
    run.journal.listeners.extend(opts.on_journal)  # every entry, from here to the end
    # Live spans cover the whole run, the planner's and the analyst's calls included.
    got = _Progressed(live_otel=_live_otel(run.id, job.name))
    signals = _Signals(opts.out, exits_after=opts.exits_after)
    ended = "interrupted"  # unless the run comes to its end: the workflow span's status
    try:
        approver = _approver(run, opts)
        nodes = _nodes(opts, approver)
        summary = await _execute(run, job, opts, nodes, got, approver, signals, resume=resume)
        ended = summary.status
    except BaseException as exc:
        stopped = (anyio.get_cancelled_exc_class(), KeyboardInterrupt)
        if all(isinstance(e, stopped) for e in leaves(exc)):
            # Cancelled from outside (a caller's scope, asyncio's Ctrl-C) or Ctrl-C before
            # the signal watcher was up: the boxes are gone (removed under a shield), so
            # the run is interrupted and resumable - not left looking alive, then dead.
            _journal_interrupted(run, opts.out)
        raise
    finally:
        if got.live_otel is not None:
            async with _cleanup("sending the last spans", opts.out):
                await anyio.to_thread.run_sync(got.live_otel.close, time.time(), ended)
    return summary


def _journal_interrupted(run: RunDir, out: TextIO) -> None:
    run.journal.append(RunInterruptedEntry())
    run.clear_live()
    print(f"fleet: interrupted: resume with '{run.resume_command()}'", file=out, flush=True)


async def _execute(
    run: RunDir,
    job: Job,
    opts: RunOptions,
    nodes: Nodes,
    got: _Progressed,
    approver: FileApprover,
    signals: _Signals,
    *,
    resume: bool,
) -> RunSummary:
    async with anyio.create_task_group() as guard:
        if opts.handle_signals:
            await guard.start(signals.watch)  # receiving before the run does anything
        async with anyio.create_task_group() as tg:
            signals.scope = tg.cancel_scope
            if signals.got:  # Ctrl-C came before there was a scope to cancel
                tg.cancel_scope.cancel()
            try:
                await _run_members(run, job, opts, nodes, got, tg, approver, resume=resume)
            finally:
                async with _cleanup("removing the run's boxes", opts.out):
                    await _remove_boxes(nodes, run, opts)
            tg.cancel_scope.cancel()
        progress = got.progress or Progress(
            [m.id or "" for m in got.members], out=opts.out, tty=False
        )
        make_model = _traced(opts.make_model, got.live_otel, "coordinator.analyst")
        summary = await _finish(
            run, job, got.members, progress, opts, got.outcomes, signals, make_model
        )
        guard.cancel_scope.cancel()
    return summary


def _progress(
    run: RunDir,
    rows: list[str],
    members: list[MemberJob],
    pending: list[MemberJob],
    opts: RunOptions,
) -> Progress:
    """The progress table, members finished in an earlier life of the run shown as such."""
    progress = Progress(rows, out=opts.out, tty=opts.tty)
    done = run.state().members
    waiting = {m.id for m in pending}  # by id: comparing whole members is quadratic
    for m in members:
        if m.id not in waiting:
            mid = m.id or ""
            progress.restore(mid, done.get(mid, "ok"), run.outcome(mid))
    return progress


async def _remove_boxes(nodes: Nodes, run: RunDir, opts: RunOptions) -> None:
    """Remove whatever the run left on every node - except boxes a member asked to keep
    (``sandbox.keep``, for debugging), which stay until ``fleet sandbox rm NAME``
    (or their TTL passes and ``fleet sandbox gc`` takes them). Then the run is no longer
    this process's: its liveness marker goes, whoever holds its boxes (the nodes of a
    cluster mark their own share, and leave this host's marker to this process)."""
    try:
        kept = await nodes.remove_boxes(run.id)
    finally:
        reaper.mark_done(run.id)
    if not kept:
        return
    run.journal.append(BoxesKeptEntry(boxes=kept))
    print(
        f"fleet: kept for debugging: {', '.join(kept)}; remove with "
        f"'fleet sandbox rm {' '.join(kept)}'",
        file=opts.out,
    )


async def _run_members(
    run: RunDir,
    job: Job,
    opts: RunOptions,
    nodes: Nodes,
    got: _Progressed,
    tg: Any,
    approver: FileApprover,
    *,
    resume: bool,
) -> None:
    """Plan, then fan out; fills ``got`` as it goes (an interrupt may stop it anywhere)."""
    await _begin_life(run, nodes, approver, resume=resume)
    members = got.members = await _members(run, job, opts, got)
    pending = _pending(run, job, members, opts, resume=resume)
    rows = ([LEAD_ID] if job.lead is not None else []) + [m.id or "" for m in members]
    progress = got.progress = _progress(run, rows, members, pending, opts)
    run.journal.listeners.insert(0, progress.on_journal)
    _start_budget(run, job, opts, resume=resume)
    _route_asks(run, approver, progress)
    # One write and one fsync for the whole queue: one each per member made a
    # 10,000-member run wait most of a minute before its first member started.
    run.journal.append_many([MemberQueuedEntry(member=m.id or "") for m in pending])
    deps = Recorder(
        listeners=[progress.on_event, *opts.on_event],
        journal=run.journal.append,
        recorded=lambda member: _last_status(run, member),
    )
    if got.live_otel is not None:
        _attach_otel(got.live_otel, deps)
    units = _units(run, job, pending)
    if progress.tty:
        _watch_terminal(tg, progress, approver, opts)
    parallel = (
        job.fanout.max_parallel
        or opts.max_parallel
        or choose(job_boxes(job), None, widest(job)).members
    )
    fan = Fanout(
        deps,
        max_parallel=parallel,
        min_success=job.fanout.min_success,
        fail_fast=job.fanout.fail_fast,
        executor=opts.executor,
        nodes=nodes,
        already_ok=_already_ok(run, members, pending),
        make_model=opts.make_model,
    )
    for told in opts.on_fanout:
        told(fan)
    try:
        if job.lead is not None:
            got.outcomes = await _lead_run(run, job, opts, nodes, got, deps, fan, parallel, pending)
            return
        services = Services(
            max_parallel=boxes_at_once(units, parallel),
            warm_pool=job.fanout.warm_pool,
            corpus=any(kind_is(u.spec.kind, "reads_web") for u in units) and _wants_corpus(job),
        )
        async with nodes.serve(run.id, units, services):
            fanned = await fan.run(units)
            got.outcomes = fanned.outcomes
        if job.merge is not None and job.merge.enabled:
            got.merge = await run_merge(run, job, lambda: opts.backend or get_backend())
    finally:
        register(run.id, None)  # the run's budget, whatever ended the fan-out


def _last_status(run: RunDir, member: str) -> str | None:
    """A member's or parallel attempt's last status in the run's journal."""
    state = run.state()
    return state.attempts.get(member) or state.members.get(member)


def boxes_at_once(units: list[MemberUnit], parallel: int) -> int:
    """Boxes the run may hold at once: ``parallel`` members, each with all its attempts
    (the members with the most attempts, to be safe)."""
    widths = sorted((u.attempts for u in units), reverse=True)
    return max(1, sum(widths[:parallel]))


async def _begin_life(run: RunDir, nodes: Nodes, approver: FileApprover, *, resume: bool) -> None:
    """A resume first clears what the dead life left; then the run is this process's."""
    if resume:
        reaped = await nodes.reap(run.id)  # the dead run's boxes and network
        run.journal.append(ReapedEntry(boxes=reaped))
        approver.abandon_earlier(run.journal.append)
    run.mark_live()
    reaper.mark_live(run.id)
    run.journal.append(RunStartedEntry(pid=os.getpid(), resume=resume))


async def _members(run: RunDir, job: Job, opts: RunOptions, got: _Progressed) -> list[MemberJob]:
    """The run's members: a lead's spawned so far, else the job's after planning."""
    if job.lead is not None:
        return [s.job for s in spawned_members(run)]
    planner = _traced(opts.make_model, got.live_otel, "coordinator.planner")
    return await plan_members(run, job, planner)


def _pending(
    run: RunDir, job: Job, members: list[MemberJob], opts: RunOptions, *, resume: bool
) -> list[MemberJob]:
    """The members this life runs."""
    pending = run.pending_members(members, retry_failed=opts.retry_failed) if resume else members
    if job.lead is not None and lead_finished(run, retry_failed=opts.retry_failed):
        return []  # a finished lead's unfinished members would reach no one
    return pending


def _start_budget(run: RunDir, job: Job, opts: RunOptions, *, resume: bool) -> None:
    """The run's budget, going on from what earlier lives spent, made the one every
    member's and the lead's model calls reserve from."""
    budget = make_budget(
        job,
        run.journal.read(),
        usd=opts.budget_usd,
        tokens=opts.budget_tokens,
        journal=run.journal.note,  # the journal tells its listeners
        say=lambda line: print(f"fleet: {line}", file=opts.out, flush=True),
    )
    if budget is not None:
        budget.start(resume=resume)
        if resume:  # what members an earlier life finished cost: admission starts from it
            kinds: dict[str, str] = {
                m.id or "": m.kind for m in run.planned_members() or job.members
            }
            for kind, cost in finished_costs(run.journal.read(), kinds):
                budget.learned(kind, cost)
    register(run.id, budget)


def _route_asks(run: RunDir, approver: FileApprover, progress: Progress) -> None:
    """Asks are journalled and shown in the live table."""
    approver.journal = run.journal.append
    approver.changed = progress.approvals_changed
    progress.approvals = approver.queue if approver.mode == "wait" else None
    progress.approve_hint = f"fleet approve {run.id}"


def _watch_terminal(tg: Any, progress: Progress, approver: FileApprover, opts: RunOptions) -> None:
    """On a terminal: the live table, and the keys that answer asks."""
    tg.start_soon(progress.run)
    keys = opts.keys if opts.keys is not None else sys.stdin.isatty()
    if keys and approver.mode == "wait":
        tg.start_soon(read_keys, approver.queue, sys.stdin.fileno(), progress.approvals_changed)


def _already_ok(run: RunDir, members: list[MemberJob], pending: list[MemberJob]) -> int:
    """Members an earlier life finished ``ok``: they count towards the quorum."""
    waiting = {m.id for m in pending}
    return sum(
        1
        for m in members
        if m.id not in waiting and (o := run.outcome(m.id or "")) is not None and o.status == "ok"
    )


async def _lead_run(
    run: RunDir,
    job: Job,
    opts: RunOptions,
    nodes: Nodes,
    got: _Progressed,
    deps: Recorder,
    fan: Fanout,
    parallel: int,
    pending: list[MemberJob],
) -> dict[str, MemberOutcome]:
    """The lead and the members it spawns, over the run's fan-out."""
    lead = job.lead
    assert lead is not None and got.progress is not None
    return await run_lead(
        run,
        job,
        make_model=opts.make_model,
        nodes=nodes,
        deps=deps,
        progress=got.progress,
        fan=fan,
        make_units=lambda ms: _units(run, job, ms),
        services=Services(
            max_parallel=parallel,
            warm_pool=job.fanout.warm_pool,
            corpus=any(kind_is(k, "reads_web") for k in lead.kinds) and _wants_corpus(job),
            members=lead.max_members,  # later waves' members need slots too
        ),
        pending=pending,
        on_members=lambda ms: setattr(got, "members", ms),
        retry_failed=opts.retry_failed,
    )


_OTLP_ENDPOINTS = ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")


def _live_otel(run_id: str, name: str) -> Any:
    """Live OpenTelemetry export when ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` or
    ``OTEL_EXPORTER_OTLP_ENDPOINT`` is set (``otel`` extra)."""
    named = [v for v in _OTLP_ENDPOINTS if os.environ.get(v, "").strip()]
    if not named:
        return None
    try:
        from ..traceview.otel import live_from_env
    except ImportError as exc:
        print(
            f"fleet: {named[0]} is set but {exc.name} is missing; "
            "install the 'otel' extra (pip install 'fleet[otel]') to export spans",
            file=sys.stderr,
        )
        return None
    return live_from_env(run_id, start=time.time(), name=name)


def _attach_otel(live: Any, deps: Recorder) -> None:
    """Members' trace events, and the lead's spawns, go to the live export too."""
    deps.listeners.append(live)
    journal = deps.journal

    def noting(entry: JournalEntryModel) -> Any:
        if isinstance(entry, LeadSpawnEntry):  # the spans of a lead's members go under the lead's
            live.spawned(entry)
        return journal(entry) if journal is not None else None

    deps.journal = noting


def _traced(make_model: Callable[..., Model], live: Any, agent: str) -> Callable[..., Model]:
    """``make_model``, its calls traced as ``agent``'s when spans are exported live."""
    return make_model if live is None else live.traced(make_model, agent)


async def _finish(
    run: RunDir,
    job: Job,
    members: list[MemberJob],
    progress: Progress,
    opts: RunOptions,
    extra: dict[str, MemberOutcome],
    signals: _Signals,
    make_model: Callable[..., Model],
) -> RunSummary:
    # result.json is the record; members cancelled while queued have none, so the
    # fan-out's own outcome (status cancelled, with its reason) fills the gap.
    outcomes = {
        m.id or "": o for m in members if (o := run.outcome(m.id or "") or extra.get(m.id or ""))
    }
    recorded = run.state().members
    for mid, o in extra.items():
        last = recorded.get(mid)
        if (last is None or last == "queued" or last.startswith("waiting")) and mid in outcomes:
            # Never started (fail_fast stopped the run first): the journal says so too,
            # or `fleet runs` and `fleet trace` would show it queued forever.
            run.journal.append(MemberFinishedEntry(member=mid, status=o.status, reason=o.reason))
    finished = [outcomes[m.id or ""] for m in members if m.id in outcomes]
    ok = sum(1 for o in finished if o.status == "ok")
    report_path = None
    lead_done = job.lead is not None and lead_finished(run)
    if not signals.got and job.synthesis.enabled and (finished or lead_done):
        with anyio.CancelScope() as signals.scope:  # Ctrl-C stops the analyst too
            report_path = await write_report(run, job, members, finished, make_model)
    if signals.got:
        run.journal.append(RunInterruptedEntry())
        run.clear_live()
        print(
            progress.summary(str(run.path), f"interrupted: resume with '{run.resume_command()}'"),
            file=opts.out,
        )
        return RunSummary(run, "interrupted", EXIT_INTERRUPTED, outcomes)
    quorum = ok >= job.fanout.min_success
    status = "succeeded" if quorum else "failed"
    run.journal.append(RunFinishedEntry(status=status, ok=ok, members=len(members)))
    run.clear_live()
    verdict = f"{status}: {ok} of {len(members)} members ok (quorum {job.fanout.min_success})"
    problems = memory_problems(run.journal.read())
    if problems:
        verdict += "\nmemory: " + "\nmemory: ".join(memory_lines(problems))
    spending = budget_lines(run.journal.read())
    if spending:
        verdict += "\nbudget: " + "\nbudget: ".join(spending)
    got_merge = read_merge(run.path) if job.merge is not None and job.merge.enabled else None
    if got_merge is not None:
        verdict += "\nmerge: " + merge_line(got_merge)
    if report_path:
        verdict += f"\nreport: {report_path}"
    print(progress.summary(str(run.path), verdict), file=opts.out)
    return RunSummary(run, status, EXIT_OK if quorum else EXIT_FAILED, outcomes, report_path)
