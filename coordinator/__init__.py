"""Fleet's coordinator, and Fleet's Python API (see :mod:`coordinator.api`).

    import coordinator as fleet
    result = fleet.run("examples/research.toml")

The journal's entry models (``fleet.MemberFinishedEntry`` and the rest, what
``on_journal`` hears) are exported too, and the types of a member's result
(``fleet.CodingMemberResult`` and the rest, :data:`fleet.MemberResult`: what
``MemberOutcome.result`` holds). The API's names are loaded on first use, so ``fleet sandbox ls`` (which imports
this package) does not pay for importing the model client and the fan-out.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sandbox.errors import SandboxError
    from sandbox.warm import WarmBoxes
    from subagents.kinds.results import (
        BrowserMemberResult,
        Cite,
        CodingMemberResult,
        JobValue,
        LeadClaim,
        LeadMemberResult,
        MemberResult,
        OtherResult,
        ResultProblem,
        UncheckedFindings,
        UnknownResult,
        VerifiedClaim,
        VerifiedTests,
    )
    from subagents.model import ModelError
    from subagents.results.outcome import MemberOutcome

    from .api import (
        RunFailed,
        RunInProgress,
        RunNotStarted,
        load,
        resume,
        resume_async,
        run,
        run_async,
    )
    from .job.jobfile import JobError
    from .job.spec import Job, MemberJob
    from .journal.entries import (
        AnalystFailedEntry,
        AnyEntry,
        ApprovalAbandonedEntry,
        ApprovalAnsweredEntry,
        ApprovalRequestedEntry,
        BoxesKeptEntry,
        BudgetEntry,
        BudgetHardEntry,
        BudgetSoftEntry,
        BudgetSpentEntry,
        Entry,
        FailFastEntry,
        JournalEntryModel,
        LeadFinishedEntry,
        LeadRetryEntry,
        LeadSpawnEntry,
        LeadStartedEntry,
        MemberFinishedEntry,
        MemberQueuedEntry,
        MemberRetryEntry,
        MemberStartedEntry,
        MemorySavedEntry,
        MergeEntry,
        PlanEntry,
        PolicyDecisionEntry,
        ReapedEntry,
        ReportWrittenEntry,
        RunCreatedEntry,
        RunFinishedEntry,
        RunInterruptedEntry,
        RunStartedEntry,
        SpawnedMember,
        UnknownEntry,
    )
    from .run_handle import (
        JournalEntry,
        RunCreated,
        RunEnded,
        RunHandle,
        start,
        start_resume,
        stream,
    )
    from .rundir.run_lookup import RunNotFound
    from .runner.driver import RunOptions, RunSummary

_EXPORTS = {
    "load": "coordinator.api",
    "run": "coordinator.api",
    "run_async": "coordinator.api",
    "resume": "coordinator.api",
    "resume_async": "coordinator.api",
    "RunFailed": "coordinator.api",
    "WarmBoxes": "sandbox.warm",
    "RunInProgress": "coordinator.api",
    "RunNotStarted": "coordinator.api",
    "RunNotFound": "coordinator.rundir.run_lookup",
    "RunOptions": "coordinator.runner.driver",
    "RunSummary": "coordinator.runner.driver",
    "JobError": "coordinator.job.jobfile",
    "Job": "coordinator.job.spec",
    "MemberJob": "coordinator.job.spec",
    "MemberOutcome": "subagents.results.outcome",
    "BrowserMemberResult": "subagents.kinds.results",
    "Cite": "subagents.kinds.results",
    "CodingMemberResult": "subagents.kinds.results",
    "JobValue": "subagents.kinds.results",
    "LeadClaim": "subagents.kinds.results",
    "LeadMemberResult": "subagents.kinds.results",
    "MemberResult": "subagents.kinds.results",
    "OtherResult": "subagents.kinds.results",
    "ResultProblem": "subagents.kinds.results",
    "UncheckedFindings": "subagents.kinds.results",
    "UnknownResult": "subagents.kinds.results",
    "VerifiedClaim": "subagents.kinds.results",
    "VerifiedTests": "subagents.kinds.results",
    "ModelError": "subagents.model",
    "SandboxError": "sandbox.errors",
    "start": "coordinator.run_handle",
    "start_resume": "coordinator.run_handle",
    "stream": "coordinator.run_handle",
    "RunHandle": "coordinator.run_handle",
    "RunCreated": "coordinator.run_handle",
    "JournalEntry": "coordinator.run_handle",
    "RunEnded": "coordinator.run_handle",
    "AnalystFailedEntry": "coordinator.journal.entries",
    "AnyEntry": "coordinator.journal.entries",
    "ApprovalAbandonedEntry": "coordinator.journal.entries",
    "ApprovalAnsweredEntry": "coordinator.journal.entries",
    "ApprovalRequestedEntry": "coordinator.journal.entries",
    "BoxesKeptEntry": "coordinator.journal.entries",
    "MergeEntry": "coordinator.journal.entries",
    "BudgetEntry": "coordinator.journal.entries",
    "BudgetHardEntry": "coordinator.journal.entries",
    "BudgetSoftEntry": "coordinator.journal.entries",
    "BudgetSpentEntry": "coordinator.journal.entries",
    "Entry": "coordinator.journal.entries",
    "FailFastEntry": "coordinator.journal.entries",
    "JournalEntryModel": "coordinator.journal.entries",
    "LeadFinishedEntry": "coordinator.journal.entries",
    "LeadRetryEntry": "coordinator.journal.entries",
    "LeadSpawnEntry": "coordinator.journal.entries",
    "LeadStartedEntry": "coordinator.journal.entries",
    "MemberFinishedEntry": "coordinator.journal.entries",
    "MemberQueuedEntry": "coordinator.journal.entries",
    "MemberRetryEntry": "coordinator.journal.entries",
    "MemberStartedEntry": "coordinator.journal.entries",
    "MemorySavedEntry": "coordinator.journal.entries",
    "PlanEntry": "coordinator.journal.entries",
    "PolicyDecisionEntry": "coordinator.journal.entries",
    "ReapedEntry": "coordinator.journal.entries",
    "ReportWrittenEntry": "coordinator.journal.entries",
    "RunCreatedEntry": "coordinator.journal.entries",
    "RunFinishedEntry": "coordinator.journal.entries",
    "RunInterruptedEntry": "coordinator.journal.entries",
    "RunStartedEntry": "coordinator.journal.entries",
    "SpawnedMember": "coordinator.journal.entries",
    "UnknownEntry": "coordinator.journal.entries",
}
__all__ = [
    "AnalystFailedEntry",
    "AnyEntry",
    "ApprovalAbandonedEntry",
    "ApprovalAnsweredEntry",
    "ApprovalRequestedEntry",
    "BoxesKeptEntry",
    "BrowserMemberResult",
    "BudgetEntry",
    "BudgetHardEntry",
    "BudgetSoftEntry",
    "BudgetSpentEntry",
    "Cite",
    "CodingMemberResult",
    "Entry",
    "FailFastEntry",
    "Job",
    "JobError",
    "JobValue",
    "JournalEntry",
    "JournalEntryModel",
    "LeadClaim",
    "LeadFinishedEntry",
    "LeadMemberResult",
    "LeadRetryEntry",
    "LeadSpawnEntry",
    "LeadStartedEntry",
    "MemberFinishedEntry",
    "MemberJob",
    "MemberOutcome",
    "MemberQueuedEntry",
    "MemberResult",
    "MemberRetryEntry",
    "MemberStartedEntry",
    "MemorySavedEntry",
    "MergeEntry",
    "ModelError",
    "OtherResult",
    "PlanEntry",
    "PolicyDecisionEntry",
    "ReapedEntry",
    "ReportWrittenEntry",
    "ResultProblem",
    "RunCreated",
    "RunCreatedEntry",
    "RunEnded",
    "RunFailed",
    "RunFinishedEntry",
    "RunHandle",
    "RunInProgress",
    "RunInterruptedEntry",
    "RunNotFound",
    "RunNotStarted",
    "RunOptions",
    "RunStartedEntry",
    "RunSummary",
    "SandboxError",
    "SpawnedMember",
    "UncheckedFindings",
    "UnknownEntry",
    "UnknownResult",
    "VerifiedClaim",
    "VerifiedTests",
    "WarmBoxes",
    "load",
    "resume",
    "resume_async",
    "run",
    "run_async",
    "start",
    "start_resume",
    "stream",
]


def __getattr__(name: str) -> Any:
    home = _EXPORTS.get(name)
    if home is None:
        raise AttributeError(f"module 'coordinator' has no attribute {name!r}")
    return getattr(importlib.import_module(home), name)


def __dir__() -> list[str]:
    """The lazy names too, so completion and ``dir(fleet)`` show the API."""
    return sorted(set(globals()) | set(_EXPORTS))
