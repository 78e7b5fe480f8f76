"""A lead run: the lead member on this host, its waves on the run's one fan-out.

The lead (:mod:`subagents.kinds.lead`) is a harness member with no box. It runs here,
in ``runs/<run>/lead/`` (``trace.jsonl``, ``conversation.json``, ``result.json``),
beside one :class:`~coordinator.fanout.fanout.Fanout` that takes the members it spawns
(:class:`~coordinator.lead.waves.Waves`) while it runs. The run's services (warm pools,
the corpus box) are up for the whole run; the first wave's boxes are warmed while
the lead makes its first call, later waves' as they are spawned.

The lead is retried as a member is (``fanout.retry``: an overloaded model, its
deadline when the job asks), each try going on from its saved conversation. When
the lead ends - it finished, failed, hit a limit - the run takes no more members, and members still running are cancelled (journalled ``lead_finished`` with
their ids): their results would reach no one.

Resume. The lead continues from its saved conversation (the loop answers a tool
call it was killed in; a repeated spawn gets its journalled answer), the members
spawned so far are read back from the journal and ``members.json``, those with a
final outcome are not run again, and the others are queued before the lead's first
call. A lead that had already finished is not run again: only its unfinished members
would be, and the report is written.

The offline lead gets the planner's offline plan as its first wave (``inputs.plan``);
a model lead plans its own.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio

from subagents.context.config import ContextConfig
from subagents.kinds import RESEARCH_KIND
from subagents.kinds.lead import LeadSettings
from subagents.member import run_member
from subagents.model import Model, resolve_model
from subagents.results.outcome import MemberOutcome
from subagents.rules.delegation import Reply
from subagents.spec import MemberSpec
from subagents.spend.budget import budgeted, run_budget
from subagents.trace import ModelCall, TraceWriter, read_trace

from ..fanout.fanout import Fanout
from ..job.planner import offline_plan
from ..job.spec import LEAD_ID, Job, MemberJob
from ..journal.entries import (
    LeadFinishedEntry,
    LeadRetryEntry,
    LeadSpawnEntry,
    LeadStartedEntry,
    MemberFinishedEntry,
    MemberStartedEntry,
    PlanEntry,
)
from ..nodes.worker import MemberUnit, Nodes, Recorder, Services, backoff, retry_class
from ..oversight.progress import Progress
from ..rundir.runs import FINISHED, RunDir
from .waves import Spawned, Waves

LEAD_DIR = "lead"


def lead_dir(run: RunDir) -> Path:
    d = run.path / LEAD_DIR
    d.mkdir(parents=True, exist_ok=True)
    return d


def lead_outcome(run: RunDir) -> MemberOutcome | None:
    """The lead's recorded outcome (None: it has none, or was stopped before its end)."""
    path = run.path / LEAD_DIR / "result.json"
    try:
        return MemberOutcome.model_validate_json(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def lead_finished(run: RunDir, *, retry_failed: bool = False) -> bool:
    """The lead has a final outcome (with ``retry_failed``: only ``ok`` is final, as
    ``fleet resume --retry-failed`` has it for members)."""
    o = lead_outcome(run)
    if o is None:
        return False
    return o.status == "ok" if retry_failed else o.status in FINISHED


def spawned_members(run: RunDir) -> list[Spawned]:
    """The members the lead started, in order, with their waves: the journal's
    ``lead_spawn`` entries (a spawn without one never happened) over ``members.json``."""
    planned = {m.id: m for m in run.planned_members() or []}
    out: list[Spawned] = []
    for e in run.journal.read():
        if not isinstance(e, LeadSpawnEntry):
            continue
        for m in e.members:
            job = planned.get(m.id)
            if job is not None:
                out.append(Spawned(job=job, wave=e.wave, checks_claim=m.checks_claim))
    return out


def restore(waves: Waves, run: RunDir) -> None:
    """What an earlier life of the run did: spawns and their answers, finished members,
    what the lead was told, and the tokens it used."""
    waves.spawned = spawned_members(run)
    for e in run.journal.read():
        if isinstance(e, LeadSpawnEntry) and e.call_id:
            waves.answers[e.call_id] = Reply(e.answer)
    for s in waves.spawned:
        o = run.outcome(s.job.id or "")
        if o is not None and o.status in FINISHED:
            waves.outcomes[s.job.id or ""] = o
    ldir = run.path / LEAD_DIR
    waves.told(ldir / "conversation.json")
    trace = ldir / "trace.jsonl"
    if trace.is_file():
        waves.lead_tokens = sum(
            e.input_tokens + e.output_tokens + e.cache_read_tokens + e.cache_write_tokens
            for e in read_trace(trace)
            if isinstance(e, ModelCall)
        )


def lead_spec(job: Job, model: str, *, offline: bool) -> MemberSpec:
    """The lead as a member: its settings (limits in words), its own limits, its
    question; an offline lead also gets the offline plan of its first wave."""
    lead = job.lead
    assert lead is not None
    inputs: dict[str, Any] = {"question": lead.question}
    if offline:
        inputs["plan"] = offline_plan(lead.question, lead.members)
    lim = lead.limits
    return MemberSpec(
        id=LEAD_ID,
        kind="lead",
        task=f"Answer this question by delegating research to members: {lead.question}",
        settings=LeadSettings(
            kinds=tuple(lead.kinds),
            max_members=lead.max_members,
            max_waves=lead.max_waves,
            first_wave=lead.members,
            token_budget=lead.token_budget,
            member_tokens=lead.member_limits.max_tokens,
        ),
        inputs=inputs,
        model=model,
        # The harness stops itself before the coordinator's hard deadline, as members do.
        limits=lim.model_copy(
            update={"deadline_s": max(lim.deadline_s * 0.9, lim.deadline_s - 60)}
        ),
        max_output_tokens=job.model.max_tokens,
        # A wait may last as long as the lead itself: no shorter host-side ceiling.
        tool_timeout_s=lim.deadline_s,
        context=ContextConfig.model_validate(lead.context),
    )


async def _run_the_lead(
    run: RunDir,
    job: Job,
    make_model: Callable[..., Model],
    waves: Waves,
    deps: Recorder,
    progress: Progress,
) -> MemberOutcome:
    """The lead member, to its end; never raises but for cancellation."""
    lead = job.lead
    assert lead is not None
    ldir = lead_dir(run)
    trace = TraceWriter(ldir / "trace.jsonl", run=run.id, member=LEAD_ID)
    trace.listeners.extend(deps.listeners)

    def count(ev: Any) -> None:
        if isinstance(ev, ModelCall):
            waves.lead_tokens += (
                ev.input_tokens + ev.output_tokens + ev.cache_read_tokens + ev.cache_write_tokens
            )

    trace.listeners.append(count)
    name = resolve_model(lead.model or job.model.name)
    model = budgeted(make_model(name, kind="lead", trace=trace), run.id, LEAD_ID)
    budget = run_budget(run.id)
    if budget is not None:  # the lead waits on its members: none of them waits on it
        budget.waiters.add(LEAD_ID)
    spec = lead_spec(job, name, offline=model.offline)
    resumed = (ldir / "conversation.json").is_file()
    if "plan" in spec.inputs and not resumed:
        deps.note(PlanEntry(planner="offline", sub_questions=spec.inputs["plan"], lead=True))
    deps.note(LeadStartedEntry(model=name, resumed=resumed))
    progress.on_journal(MemberStartedEntry(member=LEAD_ID))
    started = time.monotonic()
    try:
        with anyio.fail_after(lead.limits.deadline_s):
            outcome = await run_member(
                spec,
                sandbox=None,
                model=model,
                run_dir=ldir,
                trace=trace,
                delegate=waves,
                conversation_file=ldir / "conversation.json",
            )
    except TimeoutError:
        outcome = MemberOutcome(
            member=LEAD_ID,
            kind="lead",
            status="timed_out",
            reason=f"deadline of {lead.limits.deadline_s:g}s passed",
            duration_s=round(time.monotonic() - started, 3),
            offline=model.offline,
        )
        (ldir / "result.json").write_text(outcome.model_dump_json(indent=2), encoding="utf-8")
    finally:
        with anyio.CancelScope(shield=True):
            await model.aclose()
            trace.close()
    return outcome


async def _lead_with_retries(
    run: RunDir,
    job: Job,
    make_model: Callable[..., Model],
    waves: Waves,
    deps: Recorder,
    progress: Progress,
) -> MemberOutcome:
    """The lead, tried again as a member would be (the job's ``fanout.retry``: an
    overloaded model, a deadline when asked), each try going on from its conversation."""
    policy = job.fanout.retry
    attempt = 0
    while True:
        attempt += 1
        outcome = await _run_the_lead(run, job, make_model, waves, deps, progress)
        if retry_class(outcome) not in policy.on or attempt >= policy.attempts:
            return outcome
        delay = backoff(policy, attempt)
        deps.note(
            LeadRetryEntry(
                attempt=attempt, status=outcome.status, reason=outcome.reason, delay_s=delay
            )
        )
        await anyio.sleep(delay)


async def run_lead(
    run: RunDir,
    job: Job,
    *,
    make_model: Callable[..., Model],
    nodes: Nodes,
    deps: Recorder,
    progress: Progress,
    fan: Fanout,
    make_units: Callable[[list[MemberJob]], list[MemberUnit]],
    services: Services,
    pending: list[MemberJob],
    on_members: Callable[[list[MemberJob]], None],
    retry_failed: bool = False,
) -> dict[str, MemberOutcome]:
    """The lead and its waves, to the end; every member's outcome (see the module
    docstring). ``on_members`` hears of the members spawned so far, even when the run
    is interrupted."""
    lead = job.lead
    assert lead is not None

    waves = Waves(
        lead=lead,
        fan=fan,
        journal=deps.note,
        save_members=run.save_members,
        make_units=make_units,
        expect=nodes.expect,
    )
    restore(waves, run)
    warm = make_units(pending) if waves.spawned else make_units(_first_wave(job))
    outcome = lead_outcome(run) if lead_finished(run, retry_failed=retry_failed) else None
    again = outcome is None

    async def stream() -> None:
        result = await fan.stream()
        for mid, o in result.outcomes.items():  # fail-fast's cancelled never reached on_outcome
            waves.outcomes.setdefault(mid, o)
        waves.wake()

    try:
        async with nodes.serve(run.id, warm, services), anyio.create_task_group() as group:
            group.start_soon(stream)
            if pending:
                fan.add(make_units(pending))
            if outcome is None:
                outcome = await _lead_with_retries(run, job, make_model, waves, deps, progress)
            waves.stop_reason = "the lead has finished"
            fan.close()
            running = waves.running()
            if running:
                group.cancel_scope.cancel()  # their results would reach no one
            if again:
                deps.note(
                    LeadFinishedEntry(
                        status=outcome.status,
                        reason=outcome.reason,
                        turns=outcome.turns,
                        tokens=outcome.input_tokens + outcome.output_tokens,
                        cancelled=running,
                    )
                )
            progress.on_journal(
                MemberFinishedEntry(member=LEAD_ID, status=outcome.status, reason=outcome.reason)
            )
    finally:
        on_members(waves.members())
    return fan.result().outcomes


def _first_wave(job: Job) -> list[MemberJob]:
    """What the first wave's boxes will most likely be (browser members), for warming."""
    lead = job.lead
    assert lead is not None
    if RESEARCH_KIND not in lead.kinds:
        return []
    return [
        MemberJob(id=f"warm-{i + 1}", kind=RESEARCH_KIND, task="-", limits=lead.member_limits)
        for i in range(lead.members)
    ]
