"""One shape from the box to the record: a member's outcome reaches its trace's
``member_end`` and the journal's ``member_finished`` field for field, not by copies
written out by hand - a field both models have travels without anyone listing it."""

from __future__ import annotations

from coordinator.journal.entries import MemberFinishedEntry
from coordinator.nodes.worker import finished_entry
from subagents.results.outcome import MemberOutcome
from subagents.trace import MemberEnd


def _outcome() -> MemberOutcome:
    return MemberOutcome(
        member="m",
        kind="coding",
        status="incomplete",
        reason="turn limit (3) reached",
        limit="turns",
        turns=3,
        input_tokens=1200,
        output_tokens=340,
        cache_read_tokens=800,
        cache_write_tokens=90,
        cost_usd=0.0123,
        duration_s=4.5,
        offline=True,
    )


def test_member_end_carries_every_field_it_shares_with_the_outcome() -> None:
    outcome = _outcome()
    event = outcome.end_event(span="m", parent="run-1")
    shared = (set(MemberEnd.model_fields) & set(MemberOutcome.model_fields)) - {"member"}
    assert len(shared) >= 12
    for name in shared - {"result", "partial_result"}:
        assert getattr(event, name) == getattr(outcome, name), name
    assert event.result is None and event.partial_result is None
    assert (event.span, event.parent) == ("m", "run-1")
    # What the caller says otherwise wins (an attempts member's own review tokens).
    assert outcome.end_event(input_tokens=7).input_tokens == 7


def test_member_finished_carries_what_it_shares_and_counts_the_attempts() -> None:
    outcome = _outcome()
    entry = finished_entry("m", outcome, attempts=2)
    shared = (set(MemberFinishedEntry.model_fields) & set(MemberOutcome.model_fields)) - {
        "member",
        "attempts",
    }
    assert {"status", "reason", "turns", "input_tokens", "output_tokens"} <= shared
    for name in shared:
        assert getattr(entry, name) == getattr(outcome, name), name
    assert entry.attempts == 2 and entry.member == "m"
