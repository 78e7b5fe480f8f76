"""The report of a lead run: the lead's ``finish`` in, ``report.json`` and ``report.md`` out.

The lead's words are the report's summary, claims and open questions; every citation
is resolved by code against the members' results (:func:`~coordinator.synthesis.report_from`),
as for the analyst, so the lead cannot cite a claim no member returned. A lead that
ended without finishing (failed, a limit, its deadline) loses none of its members'
work: the offline analyst assembles their results, and the report says why.
"""

from __future__ import annotations

from subagents.model import resolve_model
from subagents.outcome import MemberOutcome

from .lead import lead_outcome
from .report import Report
from .runs import RunDir
from .spec import Job, MemberJob
from .synthesis import digest, offline_report, report_from


def lead_report(
    run: RunDir, job: Job, members: list[MemberJob], outcomes: list[MemberOutcome]
) -> Report:
    """The report's content (see the module docstring)."""
    lead = job.lead
    assert lead is not None
    tasks = {m.id or "": m.task for m in members}
    digests = digest(outcomes, tasks, job.synthesis.max_result_chars)
    ended = lead_outcome(run)
    if ended is not None and ended.status == "ok" and ended.result:
        analyst = "offline lead" if ended.offline else resolve_model(lead.model or job.model.name)
        return report_from(
            job.name, lead.question, ended.result, digests, analyst=analyst, offline=ended.offline
        )
    report = offline_report(job.name, lead.question, digests)
    why = f"{ended.status}: {ended.reason}" if ended is not None else "it did not run to its end"
    report.summary += f" (The lead did not finish - {why} - so the offline analyst assembled this.)"
    return report
