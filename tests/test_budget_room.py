"""What a budget line buys: eight members started at once under a line a little over
what all of them need. Each started member holds room for its closing call - its context
and ``closing_max_tokens`` of output, not a whole ``max_tokens`` call - and a call near the
line is sent with the output bound that fits (never under twice what answers produce),
so the line carries the members to their ends instead of being "reached" with a third of
it unspent; and it is never crossed. Real :class:`~subagents.spend.budget.BudgetedModel`
reservations over an in-process model whose calls answer with 120 output tokens."""

from __future__ import annotations

import anyio
import pytest

from subagents.model.base import ModelRequest, ModelResponse
from subagents.model.offline import build_message
from subagents.model.profiles import profile_for
from subagents.model.tokens import estimate_bytes
from subagents.spend.budget import BudgetedModel, BudgetExhausted, RunBudget

MAX_TOKENS = 4096
TURNS = 7  # six shell turns, then submit_result
OUTPUT = 120


class _Model:
    """Answers every call with ``OUTPUT`` tokens after a short wait; input counted
    from the request's size as the budget estimates it."""

    offline = False

    def __init__(self) -> None:
        self.profile = profile_for("claude-sonnet-4-6")

    async def complete(self, request: ModelRequest) -> ModelResponse:
        await anyio.sleep(0.01)
        size = len(str(request.messages)) + len(str(request.system))
        usage = {"input_tokens": estimate_bytes(size), "output_tokens": OUTPUT}
        message = build_message([{"type": "text", "text": "ok"}], model="m", input_tokens=0,
                                message_id="msg", usage=usage)  # fmt: skip
        return ModelResponse(message=message)

    async def count_tokens(self, request: ModelRequest) -> int | None:
        return None

    async def aclose(self) -> None:
        return None


async def _member(budget: RunBudget, name: str, ended: dict[str, str]) -> None:
    model = BudgetedModel(_Model(), budget, name)
    messages = [{"role": "user", "content": "task " + "x" * 1600}]
    turn = 0
    try:
        for turn in range(TURNS):  # noqa: B007 - read after the loop
            await model.complete(ModelRequest(messages=messages, max_tokens=MAX_TOKENS))
            messages = [*messages, {"role": "assistant", "content": "y" * 480}]
            await anyio.sleep(0.03)  # the tool call runs: no call of this member in flight
        ended[name] = "ok"
    except BudgetExhausted:
        try:  # the closing call, forced, bounded by closing_max_tokens
            request = ModelRequest(
                messages=messages,
                max_tokens=min(model.closing_tokens, MAX_TOKENS),
                tool_choice={"type": "tool", "name": "submit_result"},
            )
            await model.complete(request)
            ended[name] = "stopped, partial result"
        except BudgetExhausted:
            ended[name] = "never started" if turn == 0 else "stopped, nothing"
    finally:
        await model.aclose()


async def _admitted_member(budget: RunBudget, name: str, ended: dict[str, str]) -> None:
    """A member as the fan-out runs one under a budget: admitted first (or skipped)."""
    skipped = await budget.admit(name, "coding", turns=30)
    if skipped is not None:
        ended[name] = "skipped"
        return
    try:
        await _member(budget, name, ended)
    finally:
        budget.ended(name, ok=ended.get(name) == "ok")


def _fan_out(line: int, *, admission: bool = False) -> tuple[dict[str, str], RunBudget]:
    budget = RunBudget(tokens=line)
    ended: dict[str, str] = {}

    async def go() -> None:
        async with anyio.create_task_group() as tg:
            for i in range(8):
                tg.start_soon(_admitted_member if admission else _member, budget, f"m{i}", ended)

    anyio.run(go)
    return ended, budget


def _one_member_tokens() -> float:
    ended, budget = _fan_out(10_000_000)
    assert set(ended.values()) == {"ok"}
    return budget.spent.tokens / 8


@pytest.mark.parametrize("factor", [1.3, 1.5])
def test_a_line_that_can_carry_the_members_finishes_them(factor: float) -> None:
    # Before: 3 and 4 of 8 ended ok under these lines (every started member held a whole
    # max_tokens call for its closing, and calls were never sent with less).
    line = int(_one_member_tokens() * 8 * factor)
    ended, budget = _fan_out(line)
    assert set(ended.values()) == {"ok"}, ended
    assert budget.spent.tokens <= line


def test_a_line_barely_over_the_need_is_spent_not_left_and_never_crossed() -> None:
    # 1.1x: the members run in step and meet the line together (which members to start
    # first is the admission's to decide); the line is spent, never crossed, and every
    # member stopped hands in its partial result.
    line = int(_one_member_tokens() * 8 * 1.1)
    ended, budget = _fan_out(line)
    assert budget.spent.tokens <= line
    assert budget.spent.tokens >= 0.85 * line, (budget.spent.tokens, line)
    assert set(ended.values()) <= {"ok", "stopped, partial result"}, ended


def test_a_line_for_half_the_members_is_never_crossed_and_every_stopped_member_hands_in() -> None:
    line = int(_one_member_tokens() * 4.2)
    ended, budget = _fan_out(line)
    assert budget.spent.tokens <= line
    assert set(ended.values()) <= {"ok", "stopped, partial result", "never started"}, ended


def test_a_call_near_the_line_is_sent_with_the_output_bound_that_fits() -> None:
    seen: list[int] = []

    class Recording(_Model):
        async def complete(self, request: ModelRequest) -> ModelResponse:
            seen.append(request.max_tokens)
            return await super().complete(request)

    async def go() -> None:
        budget = RunBudget(tokens=12_000)
        for _ in range(5):  # what answers produce: about OUTPUT tokens
            budget.observe(OUTPUT)
        model = BudgetedModel(Recording(), budget, "m")
        request = ModelRequest(
            messages=[{"role": "user", "content": "x" * 4000}], max_tokens=MAX_TOKENS
        )
        await model.complete(request)  # far from the line: the whole bound
        budget.spent = budget.spent + type(budget.spent)(0, 6_000)
        await model.complete(request)  # near it: less, but never under twice the answers
        await model.aclose()

    anyio.run(go)
    assert seen[0] == MAX_TOKENS
    assert 2 * OUTPUT <= seen[1] < MAX_TOKENS


def test_a_member_not_started_waits_for_one_at_work_to_end_and_a_started_one_never_waits() -> None:
    from subagents.spend.budget import Amount

    budget = RunBudget(tokens=10_000)
    got: list[str] = []

    async def go() -> None:
        with anyio.fail_after(10):
            seq = await budget.reserve("a", Amount(0, 3_000), closing=False, hold=Amount(0, 3_000))
            budget.settle(seq, "a", Amount(0, 2_000), hold=Amount(0, 3_000))
            # Nothing in flight; "a" holds 3,000 and 2,000 are spent: 5,000 are free.
            # "b" (not started) needs 3,000 + 3,000: it waits for "a" to end.
            async with anyio.create_task_group() as tg:

                async def b() -> None:
                    await budget.reserve(
                        "b", Amount(0, 3_000), closing=False, hold=Amount(0, 3_000)
                    )
                    got.append("b")

                tg.start_soon(b)
                await anyio.sleep(0.05)
                assert got == []  # waiting, not refused
                # "a", started, asks for more than is free with nothing in flight: refused
                # at once (it never waits on another member, so none wait on each other).
                with pytest.raises(BudgetExhausted):
                    await budget.reserve("a", Amount(0, 4_500), closing=False)
                budget.release("a")  # "a" ended: what it held comes back
        assert got == ["b"]

    anyio.run(go)


def test_admitted_a_few_at_a_time_seven_of_eight_finish_under_a_line_just_over_their_need() -> None:
    # The 1.1x line above, with admission: members start as the line can carry them to
    # their ends (one alone until its first call, then by the turn limit's bound, then by
    # what finished members cost), so they no longer meet the line together.
    line = int(_one_member_tokens() * 8 * 1.1)
    ended, budget = _fan_out(line, admission=True)
    assert budget.spent.tokens <= line
    assert sum(v == "ok" for v in ended.values()) >= 7, ended
    assert set(ended.values()) <= {"ok", "skipped", "stopped, partial result"}, ended


def test_admitted_under_a_line_for_four_members_the_rest_are_skipped_not_started() -> None:
    line = int(_one_member_tokens() * 4.2)
    ended, budget = _fan_out(line, admission=True)
    assert budget.spent.tokens <= line
    assert sum(v == "ok" for v in ended.values()) >= 3, ended
    # None started and stopped with nothing: a member either finishes, hands in a partial
    # result, or never starts.
    assert set(ended.values()) <= {"ok", "skipped", "stopped, partial result"}, ended
    assert "skipped" in ended.values()
    assert budget.spent.tokens >= 0.8 * line, (budget.spent.tokens, line)


def test_a_generous_line_admits_every_member_once_the_first_call_is_known() -> None:
    from subagents.spend.budget import Amount

    budget = RunBudget(tokens=1_000_000)
    order: list[str] = []

    async def go() -> None:
        with anyio.fail_after(10):
            assert await budget.admit("a", "coding", turns=30) is None
            order.append("a")
            async with anyio.create_task_group() as tg:

                async def b() -> None:
                    assert await budget.admit("b", "coding", turns=30) is None
                    order.append("b")

                tg.start_soon(b)
                await anyio.sleep(0.05)
                assert order == ["a"]  # nothing known of a coding member: "a" goes alone
                seq = await budget.reserve("a", Amount(0, 3_000), closing=False)
                budget.settle(seq, "a", Amount(0, 2_000), hold=Amount(0, 3_000))
            # 30 turns x 2,000 fit many times over: "b" went as soon as "a"'s call was in.
            assert order == ["a", "b"]

    anyio.run(go)


def test_a_member_that_can_never_be_carried_is_skipped_with_the_reason() -> None:
    from subagents.spend.budget import Amount

    budget = RunBudget(tokens=10_000)

    async def go() -> None:
        with anyio.fail_after(10):
            assert await budget.admit("a", "coding", turns=30) is None
            seq = await budget.reserve("a", Amount(0, 3_000), closing=False)
            budget.settle(seq, "a", Amount(0, 6_000), hold=Amount(0, 1_000))
            budget.release("a")
            budget.ended("a", ok=True)  # a coding member costs 6,000: 4,000 are left
            why = await budget.admit("b", "coding", turns=30)
        assert why is not None and why.startswith("skipped: the run's budget cannot carry it")
        assert "6,000 tokens" in why

    anyio.run(go)


def test_a_resumed_run_starts_from_what_its_finished_members_cost() -> None:
    from coordinator.journal.entries import BudgetSpentEntry, MemberFinishedEntry
    from coordinator.runner.run_budget import finished_costs
    from subagents.spend.budget import Amount

    entries = [
        BudgetSpentEntry(member="a", usd=0.01, tokens=1_000),
        BudgetSpentEntry(member="coder.2", usd=0.02, tokens=2_000),  # an attempt's call
        BudgetSpentEntry(member="coder", usd=0.001, tokens=100),  # the review
        BudgetSpentEntry(member="b", usd=0.05, tokens=5_000),
        BudgetSpentEntry(member="a", usd=0.01, tokens=1_000),
        MemberFinishedEntry(member="a", status="ok"),
        MemberFinishedEntry(member="coder", status="ok"),
        MemberFinishedEntry(member="b", status="incomplete"),  # stopped: teaches nothing
    ]
    kinds = {"a": "browser", "b": "coding", "coder": "coding"}
    costs = sorted(finished_costs(entries, kinds), key=lambda kc: kc[0])
    assert [(k, round(c.tokens)) for k, c in costs] == [("browser", 2_000), ("coding", 2_100)]

    budget = RunBudget(tokens=5_000)
    budget.learned("coding", Amount(0, 4_000))

    async def go() -> str | None:
        budget.spent = Amount(0, 2_000)  # what the earlier life spent: 3,000 are left
        return await budget.admit("c", "coding", turns=30)

    why = anyio.run(go)
    assert why is not None and why.startswith("skipped:") and "4,000 tokens" in why


def test_a_first_call_holds_its_shared_prefix_as_cache_reads_once_the_cache_is_read() -> None:
    """What a member's first call holds for its closing call prices the system prompt and
    tools as cache reads once another member's answer read the prompt cache (they share
    that prefix); the call's own reservation stays its worst case, all input uncached."""
    from subagents.spend.budget import Amount

    class Cached(_Model):
        async def complete(self, request: ModelRequest) -> ModelResponse:
            size = len(str(request.messages)) + len(str(request.system))
            usage = {"input_tokens": 50, "output_tokens": OUTPUT,
                     "cache_read_input_tokens": estimate_bytes(size) - 50}  # fmt: skip
            message = build_message([{"type": "text", "text": "ok"}], model="m",
                                    input_tokens=0, message_id="msg", usage=usage)  # fmt: skip
            return ModelResponse(message=message)

    system = "s" * 8000
    request = ModelRequest(
        system=system, messages=[{"role": "user", "content": "task"}], max_tokens=1024
    )
    held: dict[str, Amount] = {}
    reserved: dict[str, Amount] = {}

    class Watching(RunBudget):
        async def reserve_upto(self, member, given, per_out, **kw):  # type: ignore[no-untyped-def]
            seq, out = await super().reserve_upto(member, given, per_out, **kw)
            held[member], reserved[member] = self._held[member], self.reserved(seq)
            return seq, out

    async def go() -> None:
        budget = Watching(tokens=1_000_000)
        first = BudgetedModel(Cached(), budget, "a")
        await first.complete(request)  # the run has not read the cache yet: held whole
        second = BudgetedModel(Cached(), budget, "b")
        await second.complete(request)
        await first.aclose()
        await second.aclose()

    anyio.run(go)
    prefix = estimate_bytes(len(system) + 30)
    assert reserved["b"] == reserved["a"]  # the call's own worst case, unchanged
    saved = held["a"].tokens - held["b"].tokens
    assert 0.85 * prefix < saved < prefix, (saved, prefix)  # 0.9 of the prefix, about
    assert held["b"].usd < held["a"].usd


def test_a_member_waiting_for_the_line_never_waits_on_the_lead() -> None:
    # The lead holds room for its closing call while it waits for its members: a member
    # the line cannot carry is judged once no member is at work, not left waiting on it.
    from subagents.spend.budget import Amount

    budget = RunBudget(tokens=10_000)

    async def go() -> str | None:
        with anyio.fail_after(5):
            seq = await budget.reserve("lead", Amount(0, 2_000), closing=False)
            budget.settle(seq, "lead", Amount(0, 1_000), hold=Amount(0, 2_000))
            budget.learned("coding", Amount(0, 9_500))
            return await budget.admit("m", "coding", turns=30)

    why = anyio.run(go)
    assert why is not None and why.startswith("skipped:")


def test_a_first_call_never_waits_on_the_lead() -> None:
    # A member's first call that does not fit waits for members at work to end - but not
    # for the lead, which ends only after its members: it is refused instead.
    from subagents.spend.budget import Amount

    budget = RunBudget(tokens=10_000)
    budget.waiters.add("lead")

    async def go() -> None:
        with anyio.fail_after(5):
            seq = await budget.reserve("lead", Amount(0, 2_000), closing=False)
            budget.settle(seq, "lead", Amount(0, 1_000), hold=Amount(0, 6_000))
            with pytest.raises(BudgetExhausted):
                await budget.reserve("m", Amount(0, 2_000), closing=False)

    anyio.run(go)
