"""A node's reservations reach the run's one budget on the coordinator, and what a node
sends cannot stretch it (``coordinator/nodes/node_budget.py``): the node's relay and the
coordinator's, joined here by an in-memory stream in place of Ray's, against a real
:class:`~subagents.budget.RunBudget` and its journal."""

from __future__ import annotations

import math
from typing import Any

import anyio
import pytest

from coordinator.nodes.node_asks import NodeAsks
from coordinator.nodes.node_budget import RESERVE, SETTLE, BudgetRelay, RelayBudget
from subagents.budget import Amount, BudgetExhausted, RunBudget

CALL = Amount(0.0, 1000)


class _Link:
    """One attempt's stream: node items go to the coordinator's relay, answers back."""

    def __init__(self, budget: RunBudget, tg: Any) -> None:
        self.asks = NodeAsks()
        self.items: list[tuple[str, Any]] = []
        self.coord = BudgetRelay(budget, "m", self._reply, tg)
        self.node = RelayBudget(self._send, self.asks)

    def _send(self, item: tuple[str, Any]) -> None:
        self.items.append(item)
        kind, payload = item
        getattr(self.coord, kind)(payload)

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
        {"id": "r1", "usd": math.nan, "tokens": 10},
        {"id": "r1", "usd": 0, "tokens": -5},
        {"id": "r1", "usd": True, "tokens": 10},
        {"id": "r1", "usd": "0", "tokens": 10},
        {"id": "x" * 65, "usd": 0, "tokens": 10},
        ["r1", 0, 10],
    ],
)
def test_a_reservation_that_is_not_an_amount_is_never_made(sent):
    budget, _ = _budget(5000)
    answers: list[dict[str, Any]] = []

    async def reply(rid: str, answer: dict[str, Any]) -> None:
        answers.append(answer)

    async def go() -> None:
        async with anyio.create_task_group() as tg:
            relay = BudgetRelay(budget, "m", reply, tg)
            relay.reserve(sent)
            await anyio.wait_all_tasks_blocked()
            assert relay.granted == {}

    anyio.run(go)
    assert all("refused" in a for a in answers)
    assert budget.reserved(1) == Amount() and budget._held == {}


def test_a_node_can_neither_settle_for_less_nor_touch_another_reservation():
    budget, _ = _budget(50_000)

    async def go() -> None:
        async with anyio.create_task_group() as tg:
            link = _Link(budget, tg)
            await link.node.reserve("m", CALL, closing=False)
            rid = next(p["id"] for k, p in link.items if k == RESERVE)
            # Reserving again under a granted id makes no second reservation ...
            link.coord.reserve({"id": rid, "usd": 0, "tokens": 10})
            await anyio.wait_all_tasks_blocked()
            assert list(link.coord.granted) == [rid] and budget.reserved(2) == Amount()
            # ... settling an id it never reserved changes nothing ...
            link.coord.settle({"id": "someone-else", "used": {"usd": 0, "tokens": 0}})
            assert budget.reserved(1) == CALL
            # ... and a usage that is not an amount counts the whole reservation.
            link._send((SETTLE, {"id": rid, "used": {"usd": 0, "tokens": -1e9}}))
            link.coord.settle({"id": rid, "used": None})  # settled once only
            tg.cancel_scope.cancel()

    anyio.run(go)
    assert budget.spent == CALL
