"""A node's reservations reach the run's one budget on the coordinator, and what a node
sends cannot stretch it (``coordinator/nodes/node_budget.py``): the node's relay and the
coordinator's, joined here by an in-memory stream in place of Ray's, against a real
:class:`~subagents.spend.budget.RunBudget` and its journal."""

from __future__ import annotations

import math
from typing import Any

import anyio
import pytest

from coordinator.nodes.node_asks import NodeAsks
from coordinator.nodes.node_budget import BudgetRelay, RelayBudget
from coordinator.nodes.stream import Message, Reserve, Settle, Spent, StreamError, receive
from subagents.spend.budget import Amount, BudgetExhausted, RunBudget

CALL = Amount(0.0, 1000)


class _Link:
    """One attempt's stream: node items go to the coordinator's relay, answers back."""

    def __init__(self, budget: RunBudget, tg: Any) -> None:
        self.asks = NodeAsks()
        self.items: list[Message] = []
        self.coord = BudgetRelay(budget, "m", self._reply, tg)
        self.node = RelayBudget(self._send, self.asks)

    def _send(self, item: Message) -> None:
        msg = receive(item.wire())  # on the wire and back, as the coordinator reads it
        self.items.append(msg)
        getattr(self.coord, msg.kind)(msg)

    async def _reply(self, rid: str, answer: dict[str, Any]) -> None:
        self.asks.answer(rid, answer)


def _budget(tokens: int) -> tuple[RunBudget, list[tuple[str, dict[str, Any]]]]:
    journal: list[tuple[str, dict[str, Any]]] = []
    budget = RunBudget(tokens=tokens, journal=lambda e, **f: journal.append((e, f)))
    return budget, journal


def test_a_node_members_calls_stop_at_the_runs_line_and_close_at_the_attempts_end():
    budget, journal = _budget(5000)

    async def go() -> None:
        async with anyio.create_task_group() as tg:
            link = _Link(budget, tg)
            seq = await link.node.reserve("m", CALL, closing=False)
            link.node.settle(seq, "m", Amount(0.0, 900))
            # 900 spent: a call of 2,100 and its closing call would cross the line -
            # refused on the coordinator, raised on the node.
            with pytest.raises(BudgetExhausted, match="run budget reached"):
                await link.node.reserve("m", Amount(0.0, 2100), closing=False)
            await link.node.reserve("m", CALL, closing=False)  # this one fits
            # The attempt ends (its node lost) with a call never settled: it counts.
            link.coord.close()
            tg.cancel_scope.cancel()

    anyio.run(go)
    assert budget.spent.tokens == 900 + 1000
    assert [e for e, _ in journal].count("budget_hard") == 1
    assert budget.reserved(1) == Amount() and not budget._held  # nothing left held


@pytest.mark.parametrize(
    "sent",
    [
        {"kind": "reserve", "id": "r1", "usd": math.nan, "tokens": 10},
        {"kind": "reserve", "id": "r1", "usd": 0, "tokens": -5},
        {"kind": "reserve", "id": "r1", "usd": True, "tokens": 10},
        {"kind": "reserve", "id": "r1", "usd": "0", "tokens": 10},
        {"kind": "reserve", "id": "x" * 65, "usd": 0, "tokens": 10},
        {"kind": "reserve", "id": "r1", "usd": 0, "tokens": 10, "member": "other"},
        {"kind": "settle", "id": "r1", "used": {"usd": 0, "tokens": -1e9}},
        ["reserve", {"id": "r1", "usd": 0, "tokens": 10}],
        {"kind": "reserve", "id": "r1", "usd": 0, "tokens": 10, "max_out": 0},
        {"kind": "reserve", "id": "r1", "usd": 0, "tokens": 10, "min_out": True},
        {"kind": "reserve", "id": "r1", "usd": 0, "tokens": 10, "max_out": 10**9},
        {
            "kind": "reserve",
            "id": "r1",
            "usd": 0,
            "tokens": 10,
            "per_out": {"usd": -1, "tokens": 1},
        },
    ],
)
def test_a_reservation_that_is_not_an_amount_is_never_made(sent):
    """Refused on receipt, before any relay sees it (the attempt then ends)."""
    with pytest.raises(StreamError, match=r"reserve|settle|no known kind"):
        receive(sent)


def test_a_node_can_neither_settle_for_less_nor_touch_another_reservation():
    budget, _ = _budget(50_000)

    async def go() -> None:
        async with anyio.create_task_group() as tg:
            link = _Link(budget, tg)
            await link.node.reserve("m", CALL, closing=False)
            rid = next(m.id for m in link.items if isinstance(m, Reserve))
            # Reserving again under a granted id makes no second reservation ...
            link.coord.reserve(Reserve(id=rid, usd=0, tokens=10))
            await anyio.wait_all_tasks_blocked()
            assert list(link.coord.granted) == [rid] and budget.reserved(2) == Amount()
            # ... settling an id it never reserved changes nothing ...
            link.coord.settle(Settle(id="someone-else", used=Spent(usd=0, tokens=0)))
            assert budget.reserved(1) == CALL
            # ... and a usage that is not an amount ends the attempt, which counts the
            # whole reservation.
            with pytest.raises(StreamError):
                receive({"kind": "settle", "id": rid, "used": {"usd": 0, "tokens": -1e9}})
            link.coord.close()
            link.coord.settle(Settle(id=rid, used=None))  # settled once only
            tg.cancel_scope.cancel()

    anyio.run(go)
    assert budget.spent == CALL


def test_a_node_members_call_near_the_line_goes_out_with_the_bound_that_fits():
    # As on one machine (subagents.spend.budget.RunBudget.reserve_upto): the coordinator grants
    # the most output that fits, never under what the node says its member needs.
    budget, _ = _budget(6000)
    one = Amount(0.0, 1)

    async def go() -> None:
        async with anyio.create_task_group() as tg:
            link = _Link(budget, tg)
            seq, out = await link.node.reserve_upto(
                "m", Amount(0.0, 500), one, max_out=4096, min_out=4096, closing=False,
                hold=Amount(0.0, 756),
            )  # fmt: skip
            assert out == 4096  # room for it: its whole bound
            link.node.settle(seq, "m", Amount(0.0, 700), hold=Amount(0.0, 700 + 256))
            # 700 spent: a call of 500 input with its own hold of 756 leaves room for
            # 4,044 tokens of output - not 4,096.
            seq, out = await link.node.reserve_upto(
                "m", Amount(0.0, 500), one, max_out=4096, min_out=256, closing=False,
                hold=Amount(0.0, 756),
            )  # fmt: skip
            assert out == 4044 and budget.reserved(2) == Amount(0.0, 500 + 4044)
            link.node.settle(seq, "m", Amount(0.0, 600))
            # Less room than its least: refused, as a whole call would be.
            with pytest.raises(BudgetExhausted):
                await link.node.reserve_upto(
                    "m", Amount(0.0, 5000), one, max_out=4096, min_out=2048, closing=False
                )
            link.coord.close()
            tg.cancel_scope.cancel()

    anyio.run(go)
    assert budget.spent.tokens <= 6000
