"""The report of a lead run: the lead's ``finish`` in, ``report.json`` and ``report.md`` out.

The lead's words are the report's summary, claims and open questions; every citation
is resolved by code against the members' results (:func:`~coordinator.report.synthesis.report_from`),
as for the analyst, so the lead cannot cite a claim no member returned. A lead that
ended without finishing (failed, a limit, its deadline) loses none of its members'
work: the offline analyst assembles their results, and the report says why.

A member a limit stopped counts too: its partial result is cited (marked partial),
and what it left open - its open questions, and its task when it found nothing - is
either re-asked (a later member's task is it) or added to the open questions here,
whatever the lead wrote: a lead can pass over it, the report cannot.

What the code adds, never the lead: the wave each finding (and member) came from, the
waves themselves, and each check a coding member ran - which claim it put to the test
(as the spawn named it), the command Fleet ran in its box and its exit code, and the
verdict: ``verified`` (exit 0), ``contradicted`` (it ran and the documented behaviour
did not hold), ``inconclusive`` (the member did not end ok, nothing ran, the example
needs what the box lacks - a name it never defined, a module, the network - or the
documented output goes on past a blank line, which doctest reads as its end: the
session printed what the page shows and then the rest of it, so the page is not shown
wrong; it cannot be run as written).
"""

from __future__ import annotations

import re
from typing import Any

from subagents.kinds import kind_is
from subagents.kinds.results import (
    CodingResult,
    Findings,
    LeadReport,
    UnknownResult,
    VerifiedTests,
)
from subagents.model import resolve_model
from subagents.results.outcome import MemberOutcome

from ..job.spec import Job, MemberJob
from ..report.report import Check, Report, Verdict, WaveLine
from ..report.synthesis import digest, keep_open, offline_report, report_from
from ..rundir.runs import RunDir
from .lead import lead_outcome, spawned_members

_CANNOT = re.compile(
    r"NameError|ModuleNotFoundError|ImportError|SyntaxError|command not found|"
    r"No such file|Temporary failure in name resolution|timed out",
)
"""Output that says the check could not run as meant, rather than that it failed."""
_ERROR = re.compile(r"^\s*(\w+(?:Error|Exception)\b.*)$", re.M)


def _blocks(tail: str) -> list[tuple[list[str], list[str]]]:
    """Each failed example of doctest's report as (expected lines, got lines)."""
    out = []
    for failure in tail.split("*" * 20):
        if "\nExpected:\n" not in failure or "\nGot:\n" not in failure:
            continue
        expected, got = failure.split("\nExpected:\n", 1)[1].split("\nGot:\n", 1)
        out.append(
            (
                [ln.strip() for ln in expected.splitlines() if ln.strip()],
                [ln.strip() for ln in got.splitlines() if ln.strip()],
            )
        )
    return out


def _cut_at_blank_line(tail: str) -> bool:
    """doctest got what the page expected and then a blank line and more: the page's
    output goes on past a blank line, which doctest takes as the end of the expected
    output - the example as the page shows it cannot be run as a doctest."""
    for expected, got in _blocks(tail):
        n = len(expected)
        if n and got[:n] == expected and got[n : n + 1] == ["<BLANKLINE>"] and got[n + 1 :]:
            return True
    return False


def _telling(tail: str) -> str:
    """The lines of a check's output that say what happened: doctest's first failed
    example with what was expected and what came, or the last error raised."""
    lines = [ln.strip() for ln in tail.splitlines() if ln.strip()]
    start = next((i for i, ln in enumerate(lines) if ln == "Failed example:"), None)
    if start is not None:
        stop = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("***")), None)
        return " ".join(lines[start : stop if stop is not None else start + 7])[:300]
    errors = _ERROR.findall(tail)
    return errors[-1].strip()[:300] if errors else ""


def lead_report(
    run: RunDir, job: Job, members: list[MemberJob], outcomes: list[MemberOutcome]
) -> Report:
    """The report's content (see the module docstring)."""
    lead = job.lead
    assert lead is not None
    tasks = {m.id or "": m.task for m in members}
    digests = digest(outcomes, tasks, job.synthesis.max_result_chars)
    ended = lead_outcome(run)
    if ended is not None and ended.status == "ok" and isinstance(ended.result, LeadReport):
        analyst = "offline lead" if ended.offline else resolve_model(lead.model or job.model.name)
        words = ended.result.model_dump(mode="json")
        report = report_from(
            job.name, lead.question, words, digests, analyst=analyst, offline=ended.offline
        )
    else:
        report = offline_report(job.name, lead.question, digests)
        why = (
            "it did not run to its end"
            if ended is None
            else f"its report does not read as one: {ended.result.problem}"
            if isinstance(ended.result, UnknownResult)
            else f"{ended.status}: {ended.reason}"
        )
        report.summary += (
            f" (The lead did not finish - {why} - so the offline analyst assembled this.)"
        )
    keep_open(report, digests)
    report.lead = (
        "ok"
        if ended is not None and ended.status == "ok"
        else (f"{ended.status}: {ended.reason}" if ended is not None else "without an outcome")
    )
    _add_waves(report, run, {o.member: o for o in outcomes})
    return report


def _add_waves(report: Report, run: RunDir, outcomes: dict[str, MemberOutcome]) -> None:
    """The waves, each citation's and member's wave, and the checks (see the module
    docstring)."""
    spawned = spawned_members(run)
    wave = {s.job.id or "": s.wave for s in spawned}
    for n in sorted(set(wave.values())):
        report.waves.append(WaveLine(wave=n, members=[m for m, w in wave.items() if w == n]))
    for claim in report.claims:
        for cite in claim.citations:
            cite.wave = wave.get(cite.member)
    for line in [*report.members, *report.failed]:
        line.wave = wave.get(line.member)
    for s in spawned:
        o = outcomes.get(s.job.id or "")
        if not kind_is(s.job.kind, "returns_patch") or (
            s.job.test is None and s.checks_claim is None
        ):
            continue
        report.checks.append(_check(s.job, s.wave, s.checks_claim or {}, o, outcomes))


def _check(
    job: MemberJob,
    wave: int,
    claim: dict[str, Any],
    o: MemberOutcome | None,
    outcomes: dict[str, MemberOutcome],
) -> Check:
    target = str(claim.get("member", ""))
    index = claim.get("claim") if isinstance(claim.get("claim"), int) else None
    text = ""
    source = outcomes.get(target)
    found = source.result if source is not None else None
    claims = found.claims if isinstance(found, Findings) else []
    if index is not None and 0 <= index < len(claims):
        text = claims[index].text
    ran = o.result if o is not None else None
    verified = ran.verified if isinstance(ran, CodingResult) else None
    verdict, detail = _verdict(o, verified)
    return Check(
        member=job.id or "",
        wave=wave,
        claim_member=target,
        claim=index,
        claim_text=text,
        command=verified.command if verified is not None else "",
        exit_code=verified.exit_code if verified is not None else None,
        verdict=verdict,
        detail=detail,
    )


def _verdict(o: MemberOutcome | None, verified: VerifiedTests | None) -> tuple[Verdict, str]:
    if o is None or o.status != "ok":
        status = f"{o.status}: {o.reason}" if o is not None else "it did not run"
        return "inconclusive", f"the member ended {status}"
    if verified is None:
        return "inconclusive", "no check command ran"
    tail = verified.output_tail
    if verified.exit_code == 0:
        return "verified", ""
    telling = _telling(tail)
    if _cut_at_blank_line(tail):
        return "inconclusive", (
            "the documented output goes on past a blank line, where doctest ends an "
            "example's expected output (a doctest writes such a line <BLANKLINE>): the "
            "example could not run as written - " + telling
        )[:300]
    if _CANNOT.search(tail):
        return "inconclusive", (_ERROR.findall(tail) or [telling])[-1].strip()[:300] or (
            "the example could not run as written here"
        )
    return "contradicted", telling or f"exit {verified.exit_code}"
