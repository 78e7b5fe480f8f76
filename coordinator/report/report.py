"""The run's report: what ``report.json`` holds and how ``report.md`` shows it.

:class:`Report` is the contract between the analyst step
(:mod:`coordinator.report.synthesis`, which fills it) and its readers (``report.json`` on
disk, ``report.md`` for people, ``fleet trace``). Every claim carries the member
citations the code resolved; failed members are listed with their reasons, and so
are memory saves that left a conflict or failed (from the run's journal: a conflict
is kept in the profile's file between markers, and a person should resolve it).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Literal

from pydantic import Field

from sandbox.strict import Strict

from ..journal.entries import AnyEntry, MemorySavedEntry


class Citation(Strict):
    member: str
    """The member whose finding this is."""
    wave: int | None = None
    """A lead run: the wave that member was spawned in."""
    claim: int | None = None
    """Index of the claim in that member's findings (None: the member's summary)."""
    url: str = ""
    quote: str = ""
    partial: bool = False
    """The member did not end ok: this is from what it had when a limit stopped it."""


class ReportClaim(Strict):
    text: str
    citations: list[Citation] = Field(default_factory=list)
    uncited: bool = False
    """True when none of the analyst's citations resolved to a member's finding."""


class MemberLine(Strict):
    member: str
    kind: str
    task: str
    status: str
    reason: str = ""
    wave: int | None = None
    """A lead run: the wave the member was spawned in."""
    resumed_from: int | None = None
    """The turn its last attempt went on from (None: it started at turn 0)."""
    model_switch: str | None = None
    """Its model stayed overloaded and it went on with its fallback (``a -> b: why``)."""


Verdict = Literal["verified", "contradicted", "inconclusive"]


class Check(Strict):
    """A lead run's coding member that put a documented behaviour to the test."""

    member: str
    """The coding member that ran it."""
    wave: int | None = None
    claim_member: str = ""
    """The member whose claim was checked ("" when the lead named none)."""
    claim: int | None = None
    claim_text: str = ""
    command: str = ""
    """What Fleet ran in the member's box after it ended."""
    exit_code: int | None = None
    verdict: Verdict
    """verified: the command exited 0; contradicted: it ran and failed (the
    documented behaviour did not hold); inconclusive: it could not say (the member
    did not end ok, the command did not run, or the example needs what the box lacks)."""
    detail: str = ""
    """Why, in a line (the output's telling line, or the member's status)."""


class WaveLine(Strict):
    wave: int
    members: list[str]


class MemoryProblem(Strict):
    """A memory save that left a conflict in its profile, or failed."""

    kind: Literal["conflict", "not_saved"]
    member: str
    attempt: int = 1
    profile: str
    """The profile directory."""
    path: str = ""
    """The file, relative to the profile (empty for a save that failed as a whole)."""
    detail: str = ""


def memory_problems(journal: Iterable[AnyEntry]) -> list[MemoryProblem]:
    """Conflicts and failed saves among the journal's ``memory_saved`` entries."""
    out = []
    for rec in journal:
        if not isinstance(rec, MemorySavedEntry):
            continue
        who: dict[str, Any] = {
            "member": rec.member,
            "attempt": rec.attempt or 1,
            "profile": rec.profile,
        }
        if rec.error:
            out.append(MemoryProblem(kind="not_saved", detail=rec.error, **who))
        for f in rec.files:
            if f.action == "conflict":
                path, detail = f.path, f.detail
                out.append(MemoryProblem(kind="conflict", path=path, detail=detail, **who))
    return out


def memory_lines(problems: list[MemoryProblem]) -> list[str]:
    """One line per problem, for people (report.md, the run's last lines, fleet trace)."""
    out = []
    for p in problems:
        attempt = f", attempt {p.attempt}" if p.attempt > 1 else ""
        if p.kind == "conflict":
            out.append(f"conflict in {p.profile}/{p.path} ({p.member}{attempt}): {p.detail}")
        else:
            out.append(f"not saved to {p.profile} ({p.member}{attempt}): {p.detail}")
    return out


class Report(Strict):
    """``report.json``: what the run found, with every claim citing its members."""

    title: str
    question: str = ""
    analyst: str
    """``offline`` or the analyst model's name."""
    offline: bool
    summary: str
    claims: list[ReportClaim] = Field(default_factory=list)
    open_questions: list[str] = Field(default_factory=list)
    answers: list[dict[str, Any]] = Field(default_factory=list)
    """Per ok member: its task (sub-question), its own summary and confidence."""
    code: list[dict[str, Any]] = Field(default_factory=list)
    merge: dict[str, Any] | None = None
    """``[merge]``'s record (``merge/merge.json``), when the job asked for one."""
    """Coding members' changes: summary, files changed, tests, patch path, and
    ``status`` (a ``failed`` entry is a patch whose test fails, kept for reading, or
    one that could not be collected: ``collection_error``, its files in ``edits``)."""
    members: list[MemberLine] = Field(default_factory=list)
    failed: list[MemberLine] = Field(default_factory=list)
    memory: list[MemoryProblem] = Field(default_factory=list)
    """Memory conflicts (both versions kept in the file, between markers) and saves
    that failed (the member's edits are only in its run directory)."""
    budget: list[str] = Field(default_factory=list)
    """What the run's ``[budget]`` did: spent against the hard line, soft and hard
    lines passed, and how to go on past it."""
    lead: str = ""
    """A lead run: how the lead ended (``ok``, or its status and reason)."""
    waves: list[WaveLine] = Field(default_factory=list)
    """A lead run: each wave's members, in order."""
    checks: list[Check] = Field(default_factory=list)
    """A lead run: claims coding members checked by running code, with the verdict."""


def _check_line(check: Check) -> str:
    ran = f"`{check.command}` exit {check.exit_code}" if check.command else "nothing ran"
    why = f" - {check.detail}" if check.detail else ""
    return f"**{check.verdict}** by {check.member} (wave {check.wave}): {ran}{why}"


def _quoted(quote: str) -> list[str]:
    """A claim's quote under its list item: a block quote, or a code block when it
    spans lines (an example with its output keeps its layout)."""
    if "\n" not in quote.strip():
        return [f"  > {quote}"]
    fence = "~~~" if "```" in quote else "```"
    return [f"  {fence}", *(f"  {line}" for line in quote.strip("\n").split("\n")), f"  {fence}"]


def _merge_lines(merge: dict[str, Any]) -> list[str]:
    """The report's merge section, from ``merge/merge.json``."""
    out = ["## Merge", ""]
    verdict = str(merge.get("verdict", ""))
    test = merge.get("test") or {}
    if verdict == "error":
        out.append(f"The merge could not run: {merge.get('error', '')}")
    else:
        head = {
            "passed": "The merged patches pass the merge test",
            "failed": "**The merged patches fail the merge test**",
            "untested": "The patches were merged; no merge test was given",
            "nothing": "There was nothing to merge",
        }.get(verdict, verdict)
        if test:
            head += f" (`{test.get('command')}` exit {test.get('exit_code')})"
        out.append(head + ".")
        applied = merge.get("applied") or []
        out.append("")
        out.append(f"- applied, in order: {', '.join(applied) if applied else 'none'}")
        for c in merge.get("conflicts") or []:
            files = ", ".join(c.get("files") or []) or "its files"
            out.append(f"- **{c.get('member')}** left out whole: it conflicts on {files}")
        for k in merge.get("skipped") or []:
            out.append(f"- {k.get('member')} not merged: {k.get('reason')}")
        if merge.get("merged_diff"):
            out.append(f"- merged patch: `{merge['merged_diff']}`")
    out.append("")
    return out


def render_markdown(report: Report) -> str:
    """``report.md``: the same content as ``report.json``, for people."""
    out = [f"# {report.title}", ""]
    if report.question:
        out += [f"**Question:** {report.question}", ""]
    label = f"{report.analyst} (deterministic, no model)" if report.offline else report.analyst
    if report.analyst == "offline":
        label = "offline analyst (deterministic, no model)"
    who = "Lead" if report.lead else "Analyst"
    out += [f"_{who}: {label}._", "", "## Summary", "", report.summary, ""]
    if report.claims:
        out += ["## Findings", ""]
        urls: dict[str, int] = {}
        for claim in report.claims:
            refs = []
            for c in claim.citations:
                tag = f"{c.member}#{c.claim}" if c.claim is not None else c.member
                tag += " (partial)" if c.partial else ""
                if c.url:
                    n = urls.setdefault(c.url, len(urls) + 1)
                    tag += f" [{n}]"
                refs.append(tag)
            mark = " _(uncited)_" if claim.uncited else ""
            waves = sorted({c.wave for c in claim.citations if c.wave is not None})
            if waves:
                mark += f" _(wave {', '.join(map(str, waves))})_"
            out.append(f"- {claim.text} ({'; '.join(refs) or 'no source'}){mark}")
            quote = next((c.quote for c in claim.citations if c.quote), "")
            if quote and quote.strip() != claim.text.strip():
                out += _quoted(quote)
            cited = {(c.member, c.claim) for c in claim.citations}
            for check in report.checks:
                if (check.claim_member, check.claim) in cited:
                    out.append(f"  - {_check_line(check)}")
        out.append("")
        if urls:
            out += ["### Sources", ""] + [f"[{n}] {u}" for u, n in urls.items()] + [""]
    if report.answers:
        out += ["## What each member found", ""]
        for a in report.answers:
            conf = f" (confidence: {a['confidence']})" if a.get("confidence") is not None else ""
            out += [f"**{a['member']}** - {a['task']}", "", f"{a['summary']}{conf}", ""]
    if report.code:
        out += ["## Code changes", ""]
        for entry in report.code:
            files = ", ".join(entry.get("files_changed") or []) or "none"
            verified = entry.get("verified") or {}
            failing = (
                f" **Its test fails** (`{verified.get('command')}` exit "
                f"{verified.get('exit_code')}): kept for reading, not a result."
                if entry.get("status", "ok") != "ok"
                else ""
            )
            if entry.get("collection_error"):
                failing = (
                    f" **Its patch could not be collected** ({entry['collection_error']}); "
                    f"its changed files are in `{entry.get('edits', 'nothing kept')}`."
                )
            out.append(
                f"- **{entry['member']}**: {entry.get('summary', '')} (files: {files}; "
                f"patch: `{entry['patch']}`){failing}"
            )
            if entry.get("attempts"):
                out.append(f"  {entry['attempts']}")
        out.append("")
    if report.merge:
        out += _merge_lines(report.merge)
    if report.checks:
        out += ["## Checked by running code", ""]
        for check in report.checks:
            about = (
                f"{check.claim_member}#{check.claim}" if check.claim_member else "no claim named"
            )
            text = f' "{check.claim_text[:160]}"' if check.claim_text else ""
            out.append(f"- {about}{text}: {_check_line(check)}")
        out.append("")
    if report.open_questions:
        out += ["## Open questions", ""] + [f"- {q}" for q in report.open_questions] + [""]
    if report.waves:
        out += ["## Waves", "", f"The lead ended {report.lead}.", ""]
        out += [f"{w.wave}. {', '.join(w.members)}" for w in report.waves] + [""]
    wave = bool(report.waves)  # a lead run's table says each member's wave
    out += [
        "## Members",
        "",
        "| member | kind |" + (" wave |" if wave else "") + " status | task | reason |",
        "|---|---|" + ("---|" if wave else "") + "---|---|---|",
    ]
    for m in report.members:
        resumed = f"resumed from turn {m.resumed_from}" if m.resumed_from else ""
        switched = f"went on with its fallback model ({m.model_switch})" if m.model_switch else ""
        why = "; ".join(x for x in (m.reason, resumed, switched) if x)
        task, reason = (x.replace("|", "/").replace("\n", " ") for x in (m.task, why))
        col = f" {m.wave if m.wave is not None else ''} |" if wave else ""
        out.append(f"| {m.member} | {m.kind} |{col} {m.status} | {task[:160]} | {reason[:300]} |")
    if report.failed:
        out += [
            "",
            f"**{len(report.failed)} member(s) failed:** "
            + "; ".join(f"{m.member} ({m.status}: {m.reason})" for m in report.failed),
        ]
    if report.memory:
        out += ["", "## Memory", ""]
        out += [f"- {line}" for line in memory_lines(report.memory)]
    if report.budget:
        out += ["", "## Budget", ""]
        out += [f"- {line}" for line in report.budget]
    return "\n".join(out) + "\n"
