"""The run's budget as the coordinator sets it up: its lines, what an earlier life spent,
and what the run's last lines and report say of it.

The lines come from, first to last: a resume's ``--budget-usd`` / ``--budget-tokens``
(raising or setting a line), the journal's last ``budget`` entry (a line an earlier
resume raised stays raised), the job's ``[budget]``. What was spent comes from the
journal (:func:`from_journal`), so a resume goes on from it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import Any

from subagents.spend.budget import CLOSING_TOKENS, Amount, RunBudget

from ..errors import UsageError
from ..job.spec import Job, split_attempt
from ..journal.entries import (
    AnyEntry,
    BudgetEntry,
    BudgetHardEntry,
    BudgetSoftEntry,
    BudgetSpentEntry,
    MemberFinishedEntry,
)


def make_budget(
    job: Job,
    entries: Iterable[AnyEntry],
    *,
    usd: float | None,
    tokens: int | None,
    journal: Callable[..., None],
    say: Callable[[str], None],
) -> RunBudget | None:
    """The run's budget (None when it has none), with what earlier lives spent."""
    spent, last = from_journal(entries)
    lines: dict[str, Any] = {}
    if job.budget is not None:
        lines = job.budget.model_dump()
    if last is not None:
        lines = {"usd": last.usd, "tokens": last.tokens, "soft": last.soft}
    if usd is not None:
        lines["usd"] = usd
    if tokens is not None:
        lines["tokens"] = tokens
    if lines.get("usd") is None and lines.get("tokens") is None:
        return None
    budget = RunBudget(
        usd=lines.get("usd"),
        tokens=lines.get("tokens"),
        soft=float(lines.get("soft") or 0.8),
        closing_tokens=job.budget.closing_max_tokens if job.budget else CLOSING_TOKENS,
        journal=journal,
        say=say,
    )
    budget.spent = spent
    return budget


def finished_costs(entries: Iterable[AnyEntry], kinds: dict[str, str]) -> list[tuple[str, Amount]]:
    """What each member that an earlier life finished ``ok`` spent (its attempts' calls
    and their review included), with its kind (``kinds``: member id -> kind): what a
    resumed run's admission starts from (:meth:`RunBudget.learned`)."""
    spent: dict[str, Amount] = {}
    last: dict[str, str] = {}
    for e in entries:
        if isinstance(e, BudgetSpentEntry) and e.member:
            attempt = split_attempt(e.member)  # an attempt's calls are its member's
            owner = attempt[0] if attempt is not None else e.member
            spent[owner] = spent.get(owner, Amount()) + Amount(e.usd, e.tokens)
        elif isinstance(e, MemberFinishedEntry):
            last[e.member] = e.status
    return [
        (kinds[m], cost)
        for m, cost in spent.items()
        if m in kinds and last.get(m) == "ok" and cost.tokens > 0
    ]


def check_raise(entries: Iterable[AnyEntry], *, usd: float | None, tokens: int | None) -> None:
    """``fleet resume --budget-usd/--budget-tokens``: a line must be a positive number
    above what the run has spent; :class:`UsageError` (exit 2) says why not."""
    spent, _ = from_journal(entries)
    if usd is not None:
        if not math.isfinite(usd) or usd <= 0:
            raise UsageError(f"--budget-usd must be a positive number of dollars (got {usd:g})")
        if usd <= spent.usd:
            raise UsageError(
                f"--budget-usd {usd:g} is not above what the run has spent (${spent.usd:.4f}); "
                f"give more, e.g. --budget-usd {max(1.0, 2 * spent.usd):.2f}"
            )
    if tokens is not None:
        if tokens <= 0:
            raise UsageError(f"--budget-tokens must be a positive number (got {tokens})")
        if tokens <= spent.tokens:
            raise UsageError(
                f"--budget-tokens {tokens} is not above what the run has spent "
                f"({round(spent.tokens):,} tokens); give more, e.g. "
                f"--budget-tokens {2 * round(spent.tokens)}"
            )


def from_journal(entries: Iterable[AnyEntry]) -> tuple[Amount, BudgetEntry | None]:
    """What an earlier life of the run spent, and its last ``budget`` entry (its lines)."""
    spent, lines = Amount(), None
    for e in entries:
        if isinstance(e, BudgetEntry):
            lines = e
        if isinstance(e, BudgetEntry | BudgetSpentEntry):
            spent = Amount(e.spent_usd, e.spent_tokens)
    return spent, lines


def budget_lines(entries: Iterable[AnyEntry]) -> list[str]:
    """What the run's budget did, for people (the run's last lines, report.md)."""
    entries = list(entries)
    spent, last = from_journal(entries)
    if last is None:
        return []
    # This life of the run only: a line an earlier life reached may have been raised.
    entries = entries[max(i for i, e in enumerate(entries) if isinstance(e, BudgetEntry)) :]
    hard = []
    if last.usd:
        hard.append(f"${last.usd:g}")
    if last.tokens:
        hard.append(f"{last.tokens:,} tokens")
    shown = " and ".join(hard)
    lines = []
    lines.append(f"spent ${spent.usd:.4f} and {round(spent.tokens):,} tokens (hard line {shown})")
    if any(isinstance(e, BudgetSoftEntry) for e in entries):
        soft = last.soft if last.soft is not None else 0.8
        lines.append(f"passed the soft line ({soft:g} of the hard line)")
    if any(isinstance(e, BudgetHardEntry) for e in entries):
        lines.append(
            "reached the hard line: members stopped there ended incomplete (budget) with "
            "their partial results; 'fleet resume RUN --budget-usd X' (or --budget-tokens N) "
            "raises it and finishes them"
        )
    last_status = {e.member: e.status for e in entries if isinstance(e, MemberFinishedEntry)}
    skipped = sorted(m for m, status in last_status.items() if status == "skipped")
    if skipped:
        lines.append(
            f"{len(skipped)} never started (skipped: the line could not carry them by what "
            f"finished members cost): {', '.join(skipped)}; 'fleet resume RUN --budget-usd X' "
            "(or --budget-tokens N) starts them"
        )
    return lines


def budget_use(entries: Iterable[AnyEntry], outcomes: Iterable[Any]) -> dict[str, Any] | None:
    """How a run used its budget, as data (``fleet runs``): the lines, what was spent, and
    the members that finished, were stopped by the budget after starting, and never
    started for it. None for a run without a budget."""
    spent, last = from_journal(entries)
    if last is None:
        return None
    ended = list(outcomes)
    by_budget = [o for o in ended if getattr(o, "limit", None) == "budget"]
    return {
        "usd": last.usd,
        "tokens": last.tokens,
        "spent_usd": round(spent.usd, 6),
        "spent_tokens": round(spent.tokens),
        "finished": sum(1 for o in ended if getattr(o, "status", "") == "ok"),
        "stopped": sum(1 for o in by_budget if getattr(o, "turns", 0)),
        "never_started": sum(1 for o in by_budget if not getattr(o, "turns", 0)),
    }


def budget_use_line(use: dict[str, Any]) -> str:
    """``11,799 of 15,500 tokens spent; 4 finished, 3 stopped, 1 never started``."""
    parts = []
    if use.get("tokens"):
        parts.append(f"{use['spent_tokens']:,} of {use['tokens']:,} tokens")
    if use.get("usd"):
        parts.append(f"${use['spent_usd']:.4f} of ${use['usd']:g}")
    said = " and ".join(parts) + " spent"
    said += f"; {use['finished']} finished, {use['stopped']} stopped by it"
    if use["never_started"]:
        said += f", {use['never_started']} never started"
    return said
