"""A coding member's parallel attempts (``attempts = N``): N independent tries at its
task, run at once, one of whose patches becomes the member's.

Each attempt is a member unit of its own (:func:`attempt_units`): id ``coder.2``, files
in ``members/coder/attempts/2/`` (its trace, transcript, ``patch.diff`` and
``result.json``), the member's limits, retry policy, box spec and setup - so it gets
everything a member gets, wherever members run: its own box from the same tree (the
prepared snapshot, set up once for all of them), the run's budget and rate governor,
its own retries, a place on any cluster node. :func:`run_attempts` runs them in one task
group under the member's row: one attempt crashing, OOM-killed or timing out is that
attempt's outcome, and the others go on. When all have ended, the choice
(:mod:`.selection`) names the member's patch; the member's ``result.json`` is the
chosen attempt's outcome with every attempt listed (:class:`AttemptRecord`) and the
choice (:class:`Choice`), its tokens and cost those of all attempts and the review.
The member is ``ok`` when an attempt was chosen; when none could be, it takes the
status of its most advanced attempt (a failed test before a timeout before a crash)
and names each attempt's end.

Resume: an attempt with a ``result.json`` ended in an earlier life and is not run
again; the others go on as any unfinished member does (from their saved turn).

How attempts differ on purpose. Anthropic's sampling is already at its most varied by
default (temperature 1.0 is both the default and the ceiling, and extended thinking
requires it), so sampling settings cannot spread attempts further; what can is the
prompt. Attempt 1 gets the task as written; each later attempt gets a note naming it
(``attempt 2 of 3``), saying that others work on the same task independently and a
verified patch will be chosen among them, and giving it one approach to lead with
(:data:`APPROACHES`: reproduce first, read the callers first, the smallest change, a
fresh reading of the task). Varied plans are what make best-of-N pay: N samples of
the same plan tend to fail the same way.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import anyio

from subagents.durable import forget
from subagents.kinds.coding import PATCH_BYTES, read_patch
from subagents.model import Model
from subagents.results.outcome import AttemptRecord, Choice, MemberOutcome
from subagents.trace import AttemptsChosen, MemberEnd, MemberStart, TraceWriter

from ..job.spec import attempt_id
from ..journal.entries import MemberFinishedEntry, MemberStartedEntry
from ..nodes.worker import (
    CANCELLED,
    MemberUnit,
    Nodes,
    Recorder,
    finished_entry,
    run_unit,
    write_result,
)
from ..rundir.runs import FINISHED
from .selection import Candidate, changed_lines, choose

APPROACHES = (
    "Lead with reproducing the problem: write or run a check that shows it before you "
    "change code, and make that check pass.",
    "Lead with reading: find where the behaviour lives and who calls it, and fix it "
    "where the cause is rather than where it shows.",
    "Lead with the smallest change that could work; touch as few lines and files as "
    "you can, and leave everything else as it is.",
    "Read the task afresh and question its easy reading: look for the case a quick fix "
    "would miss, and handle it.",
)


def attempt_note(attempt: int, of: int) -> str:
    """What attempt ``attempt`` (from 2) is told besides the task."""
    lead = APPROACHES[(attempt - 2) % len(APPROACHES)]
    return (
        f"\n\n(Attempt {attempt} of {of}. Other attempts work on this same task "
        "independently, in their own sandboxes; the patch that passes the job's check "
        f"and is judged best will be kept. Take your own approach. {lead})"
    )


def attempts_dir(member_dir: Path) -> Path:
    return member_dir / "attempts"


def attempt_units(unit: MemberUnit) -> list[MemberUnit]:
    """The member's attempts as units of their own (``attempts = 1`` each)."""
    out = []
    n = unit.attempts
    for k in range(1, n + 1):
        task = unit.spec.task if k == 1 else unit.spec.task + attempt_note(k, n)
        spec = unit.spec.model_copy(update={"id": attempt_id(unit.spec.id, k), "task": task})
        out.append(
            unit.model_copy(
                update={
                    "spec": spec,
                    "member_dir": str(attempts_dir(Path(unit.member_dir)) / str(k)),
                    "attempts": 1,
                }
            )
        )
    return out


async def run_attempts(
    unit: MemberUnit,
    deps: Recorder,
    nodes: Nodes,
    make_model: Callable[..., Model],
) -> MemberOutcome:
    """Every attempt of ``unit`` at once, then the choice; writes the member's
    result.json last (see the module docstring)."""
    started = time.monotonic()
    mdir = Path(unit.member_dir)
    await anyio.Path(mdir).mkdir(parents=True, exist_ok=True)
    trace = TraceWriter(mdir / "trace.jsonl", run=unit.run_id, member=unit.spec.id)
    trace.listeners.extend(deps.listeners)
    member = unit.spec.id
    deps.note(MemberStartedEntry(member=member, attempt=1, node=None))
    trace.emit(
        MemberStart(
            kind=unit.spec.kind,
            task=unit.spec.task,
            model=unit.spec.model,
            config={"attempts": unit.attempts},
        )
    )
    subs = attempt_units(unit)
    outcomes: dict[int, MemberOutcome] = {}
    for k, sub in enumerate(subs, 1):
        done = _recorded(Path(sub.member_dir) / "result.json")
        if done is not None:
            outcomes[k] = done  # ended in an earlier life of the run
            # Its result is written before its journal entry: a life killed between
            # the two left the journal saying it runs. It ended; the journal says so.
            if deps.recorded is not None and deps.recorded(sub.spec.id) not in FINISHED:
                deps.note(finished_entry(sub.spec.id, done, 1))

    async def one(k: int, sub: MemberUnit) -> None:
        outcomes[k] = await run_unit(sub, deps, nodes)

    try:
        async with anyio.create_task_group() as tg:
            for k, sub in enumerate(subs, 1):
                if k not in outcomes:
                    tg.start_soon(one, k, sub)
    except CANCELLED():
        deps.note(MemberFinishedEntry(member=member, status="cancelled", reason="cancelled"))
        trace.close()
        raise
    candidates = [
        Candidate(
            attempt=k,
            outcome=outcomes[k],
            patch=read_patch(Path(sub.member_dir) / "patch.diff", PATCH_BYTES),
        )
        for k, sub in enumerate(subs, 1)
    ]
    for c in candidates:
        c.lines = changed_lines(c.patch)
    chosen = await choose(
        member,
        unit.spec.task,
        candidates,
        model_name=unit.spec.model,
        make_model=make_model,
        run_id=unit.run_id,
        trace=trace,
    )
    trace.emit(
        AttemptsChosen(
            attempt=chosen.choice.attempt,
            by=chosen.choice.by,
            reason=chosen.choice.reason,
            candidates=chosen.candidates,
        )
    )
    outcome = member_outcome(unit, candidates, chosen.choice, time.monotonic() - started)
    _keep_patch(mdir, candidates, outcome)
    forget(mdir)
    write_result(mdir, outcome)
    deps.note(finished_entry(member, outcome, len(subs)))
    # The member's own trace counts only its own call, the review: each attempt's
    # trace counts its own, so a run's totals over traces count nothing twice.
    choice = chosen.choice
    trace.emit(
        MemberEnd(
            status=outcome.status,
            reason=outcome.reason,
            cost_usd=choice.cost_usd,
            duration_s=outcome.duration_s,
            input_tokens=choice.input_tokens,
            output_tokens=choice.output_tokens,
            cache_read_tokens=choice.cache_read_tokens,
            cache_write_tokens=choice.cache_write_tokens,
        )
    )
    trace.close()
    return outcome


def _recorded(path: Path) -> MemberOutcome | None:
    """An attempt's outcome from an earlier life of the run (None: it has none)."""
    try:
        return MemberOutcome.model_validate_json(path.read_bytes())
    except (OSError, ValueError):
        return None


_ADVANCED = ("failed", "incomplete", "timed_out", "crashed", "cancelled")
"""Statuses of attempts none of which was chosen, the furthest along first."""


def _stand_in(candidates: list[Candidate]) -> Candidate:
    """The attempt whose outcome a member none of whose attempts was chosen takes."""

    def rank(c: Candidate) -> tuple[int, int, int]:
        o = c.outcome
        status = _ADVANCED.index(o.status) if o.status in _ADVANCED else -1
        return (status, 0 if (o.result or o.partial_result) else 1, c.attempt)

    return min(candidates, key=rank)


def member_outcome(
    unit: MemberUnit, candidates: list[Candidate], choice: Choice, duration_s: float
) -> MemberOutcome:
    """The member's outcome: the chosen attempt's (else a stand-in's), with every
    attempt listed and everything they spent."""
    by_number = {c.attempt: c for c in candidates}
    if choice.attempt is not None:
        base = by_number[choice.attempt].outcome
        reason = ""
    else:
        base = _stand_in(candidates).outcome
        reason = f"none of {len(candidates)} attempts was chosen: {choice.reason}"
    records = [
        AttemptRecord(
            attempt=c.attempt,
            status=c.outcome.status,
            reason=c.outcome.reason[:500],
            verified=c.verified,
            files_changed=list(getattr(c.result, "files_changed", []) or [])[:200],
            lines=c.lines,
            patch=f"attempts/{c.attempt}/patch.diff" if c.patch.strip() else "",
            same_as=c.same_as,
            turns=c.outcome.turns,
            input_tokens=c.outcome.input_tokens,
            output_tokens=c.outcome.output_tokens,
            cache_read_tokens=c.outcome.cache_read_tokens,
            cache_write_tokens=c.outcome.cache_write_tokens,
            cost_usd=c.outcome.cost_usd,
            duration_s=c.outcome.duration_s,
        )
        for c in candidates
    ]

    def total(name: str) -> int:
        return sum(getattr(c.outcome, name) for c in candidates) + getattr(choice, name)

    return base.model_copy(
        update={
            "member": unit.spec.id,
            "reason": reason or base.reason,
            "attempts": records,
            "choice": choice,
            "turns": sum(c.outcome.turns for c in candidates),
            "input_tokens": total("input_tokens"),
            "output_tokens": total("output_tokens"),
            "cache_read_tokens": total("cache_read_tokens"),
            "cache_write_tokens": total("cache_write_tokens"),
            "cost_usd": round(sum(c.outcome.cost_usd for c in candidates) + choice.cost_usd, 6),
            "duration_s": round(duration_s, 3),
            "retryable": False,
            "resumed_from": None,
        }
    )


def _keep_patch(mdir: Path, candidates: list[Candidate], outcome: MemberOutcome) -> None:
    """The member's ``patch.diff``: the chosen attempt's (or the stand-in's, for
    reading: a member that is not ``ok`` is never applied), as collected."""
    target = mdir / "patch.diff"
    target.unlink(missing_ok=True)
    number = outcome.choice.attempt if outcome.choice else None
    source = (
        next((c for c in candidates if c.attempt == number), None)
        if number is not None
        else _stand_in(candidates)
    )
    if source is not None and source.patch:
        target.write_bytes(source.patch)
