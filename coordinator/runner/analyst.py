"""The analyst step of a run: the members' structured results in, report.json and
report.md out. A failing analyst model never loses the members' work: the offline
analyst writes the report instead, and the report and the journal say so."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from subagents.model import Model, ModelError, resolve_model
from subagents.model.fallback import FALLBACK_AFTER_S, FallbackModel
from subagents.results.outcome import MemberOutcome

from ..job.spec import Job, MemberJob
from ..journal.entries import AnalystFailedEntry, ReportWrittenEntry
from ..lead.lead_report import lead_report
from ..merge.merge import read_merge
from ..report.report import Report, memory_problems
from ..report.synthesis import render_markdown, synthesize
from ..rundir.runs import RunDir
from .run_budget import budget_lines


async def write_report(
    run: RunDir,
    job: Job,
    members: list[MemberJob],
    outcomes: list[MemberOutcome],
    make_model: Callable[..., Model],
) -> Path:
    """The analyst step over the members' results; writes report.json and report.md.

    A member stopped by a limit counts with its partial result (marked partial). With
    no member ``ok`` and no partial result there is nothing to analyse: the offline analyst writes the
    report (what each member was asked, and why it ended as it did) without a model.
    A lead run's report is the lead's own (:mod:`coordinator.lead.lead_report`)."""
    if job.lead is not None:
        report = lead_report(run, job, members, outcomes)
    else:
        report = await _analyse(run, job, members, outcomes, make_model)
    journal = run.journal.read()
    merged = read_merge(run.path)
    if merged is not None:
        report.merge = merged.model_dump(mode="json")
    report.memory = memory_problems(journal)
    report.budget = budget_lines(journal)
    (run.path / "report.json").write_text(report.model_dump_json(indent=2), encoding="utf-8")
    path = run.path / "report.md"
    path.write_text(render_markdown(report), encoding="utf-8")
    run.journal.append(ReportWrittenEntry(analyst=report.analyst, claims=len(report.claims)))
    return path


async def _analyse(
    run: RunDir,
    job: Job,
    members: list[MemberJob],
    outcomes: list[MemberOutcome],
    make_model: Callable[..., Model],
) -> Report:
    """The analyst (a model, or the offline one) over the members' results."""
    name = resolve_model(job.synthesis.model or job.model.name)
    nothing = not any(o.status == "ok" or o.partial_result for o in outcomes)
    model = make_model("offline" if nothing else name)
    if job.model.fallback and not nothing and not model.offline:
        # Its model stays overloaded: the report is written by the fallback, as a
        # member's work would be (subagents.model.fallback).
        await model.aclose()
        model = FallbackModel(
            make_model(name, patience_s=FALLBACK_AFTER_S),
            make_model(resolve_model(job.model.fallback)),
        )
    question = job.research.question if job.research else ""
    tasks = {m.id or "": m.task for m in members}
    cap = job.synthesis.max_result_chars
    try:
        try:
            analyst = None if model.offline else model
            report = await synthesize(
                job.name,
                question,
                outcomes,
                tasks,
                model=analyst,
                cap=cap,
                instructions=job.synthesis.instructions,
            )
        except ModelError as exc:
            # The members' work is not lost because the analyst failed: fall back to the
            # offline analyst, and say so in the report and the journal.
            run.journal.append(AnalystFailedEntry(reason=str(exc)))
            report = await synthesize(job.name, question, outcomes, tasks, model=None, cap=cap)
            report.summary += f" (The analyst model {name} failed: {exc}.)"
    finally:
        await model.aclose()
    return report
