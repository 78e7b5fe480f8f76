"""The run's ``[budget]`` for members on cluster nodes: reserved on the coordinator.

A run's budget (:mod:`subagents.spend.budget`) is one object, and its state is the run's
journal, which only the coordinator writes. On one machine every member's model calls
reserve from it directly. A member on a cluster node reserves through its attempt's
stream, the one that carries its trace events and policy asks back:

* on the node, :class:`RelayBudget` stands in for the budget: a call's reservation
  becomes a ``reserve`` message (:mod:`coordinator.nodes.stream`) and only that call
  waits for the answer (the answer comes back through ``NodeService.answer``, as a
  policy ask's does); how the call ended (``settle``), a wait given up
  (``unreserve``) and the member's end (``release``) are messages the node does not
  wait on;
* on the coordinator, :class:`BudgetRelay` (one per attempt) reserves each call from
  the run's one :class:`~subagents.spend.budget.RunBudget` - the same reservation a member
  on this host makes, its closing call held the same way - and answers. So a fan-out
  across any number of nodes stops where one on this host does: short of the hard
  line by less than one call of each member, never a turn of every member past it.

The attempt's end closes what the node left open, whatever ended it (its node lost,
its deadline, Ctrl-C): a reservation granted and never settled counts as spent at
its estimate - its call may have been answered and billed, and the node can no
longer say (erring on the side of the line) - and the member's held closing call is
released.

Trust. The node is less trusted than the coordinator: it names only its own
reservations (by the id it chose; the member is the attempt's, never the node's
word; an id already in use makes no second reservation), and amounts must be finite
and not negative (the stream's models refuse any other, ending the attempt). What a call really spent is the
node's report of the API's usage - the node makes the call, as on one machine the
harness does. This module imports no Ray: the cluster passes in how an answer
reaches the node.
"""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
from anyio.abc import TaskGroup

from subagents.spend.budget import CLOSING_TOKENS, Amount, BudgetExhausted, RunBudget

from .node_asks import NodeAsks, Send
from .stream import Release, Reserve, Settle, Spent, Unreserve


class RelayBudget:
    """A node member's budget: reservations go through its attempt's stream (``send``)
    and wait until :meth:`NodeAsks.answer` delivers the coordinator's answer."""

    def __init__(self, send: Send, asks: NodeAsks, closing_tokens: int = CLOSING_TOKENS) -> None:
        self.send = send
        self.asks = asks
        self.closing_tokens = closing_tokens
        """The run's ``closing_max_tokens`` (it came with the attempt's request)."""
        self._ids: dict[int, str] = {}
        self._seq = 0

    async def reserve(
        self, member: str, estimate: Amount, *, closing: bool, hold: Amount | None = None
    ) -> int:
        rid = uuid.uuid4().hex
        item = Reserve(
            id=rid, usd=estimate.usd, tokens=estimate.tokens, closing=closing, hold=_spent(hold)
        )
        answer = await self.asks.wait(self.send, rid, item, Unreserve(id=rid)) or {}
        if not answer.get("ok"):
            raise BudgetExhausted(str(answer.get("refused") or "run budget reached"))
        self._seq += 1
        self._ids[self._seq] = rid
        return self._seq

    async def reserve_upto(
        self,
        member: str,
        given: Amount,
        per_out: Amount,
        *,
        max_out: int,
        min_out: int | Callable[[], int],
        closing: bool,
        hold: Amount | None = None,
    ) -> tuple[int, int]:
        """:meth:`RunBudget.reserve_upto` through the stream: the call's input, its
        output's unit and bounds go to the coordinator, which answers with the output
        bound granted (the least this member may be sent with is said once, here)."""
        least = min_out() if callable(min_out) else min_out
        least = max(1, min(least, max_out))
        worst = given + Amount(per_out.usd * max_out, per_out.tokens * max_out)
        rid = uuid.uuid4().hex
        item = Reserve(
            id=rid,
            usd=worst.usd,
            tokens=worst.tokens,
            closing=closing,
            hold=_spent(hold),
            per_out=_spent(per_out),
            max_out=max_out,
            min_out=least,
        )
        answer = await self.asks.wait(self.send, rid, item, Unreserve(id=rid)) or {}
        if not answer.get("ok"):
            raise BudgetExhausted(str(answer.get("refused") or "run budget reached"))
        out = answer.get("out", max_out)
        # The coordinator's word, bounded: never more than asked, never under the least.
        out = max_out if isinstance(out, bool) or not isinstance(out, int) else out
        self._seq += 1
        self._ids[self._seq] = rid
        return self._seq, max(least, min(out, max_out))

    def settle(
        self, seq: int, member: str, used: Amount | None, hold: Amount | None = None
    ) -> None:
        rid = self._ids.pop(seq, None)
        if rid is not None:
            self.send(Settle(id=rid, used=_spent(used), hold=_spent(hold)))

    def release(self, member: str) -> None:
        self.send(Release())


def _spent(amount: Amount | None) -> Spent | None:
    return None if amount is None else Spent(usd=amount.usd, tokens=amount.tokens)


def _amount(spent: Spent | None) -> Amount | None:
    return None if spent is None else Amount(spent.usd, spent.tokens)


class BudgetRelay:
    """One attempt's reservations, on the coordinator (see the module docstring): each
    is made in a task of ``tg`` (the attempt's; cancelling it gives up what still
    waits), and the answer goes to the node through ``reply(id, answer)``."""

    def __init__(
        self,
        budget: RunBudget,
        member: str,
        reply: Callable[[str, dict[str, Any]], Awaitable[None]],
        tg: TaskGroup,
    ) -> None:
        self.budget, self.member, self.reply, self.tg = budget, member, reply, tg
        self.waiting: dict[str, anyio.CancelScope] = {}
        self.granted: dict[str, int] = {}
        """The node's reservation id -> the budget's, until settled."""

    def reserve(self, msg: Reserve) -> None:
        rid = msg.id
        if rid in self.granted or rid in self.waiting:
            return  # one reservation per id: a second would be one nobody settles
        # Made now, not in the task: an unreserve may come before the task first runs.
        scope = self.waiting[rid] = anyio.CancelScope()
        estimate = Amount(msg.usd, msg.tokens)
        # The budget keeps a hold no larger than the call's own estimate.
        self.tg.start_soon(self._reserve, rid, estimate, msg, scope)

    async def _reserve(
        self, rid: str, estimate: Amount, msg: Reserve, scope: anyio.CancelScope
    ) -> None:
        closing, hold = msg.closing, _amount(msg.hold)
        with scope:
            answer: dict[str, Any] = {"ok": True}
            try:
                if msg.per_out is not None and msg.max_out is not None:
                    most = msg.max_out
                    unit = Amount(msg.per_out.usd, msg.per_out.tokens)
                    # Its input: the estimate less its whole output (never below nothing).
                    given = Amount(
                        max(0.0, estimate.usd - unit.usd * most),
                        max(0.0, estimate.tokens - unit.tokens * most),
                    )
                    seq, answer["out"] = await self.budget.reserve_upto(
                        self.member,
                        given,
                        unit,
                        max_out=most,
                        min_out=min(msg.min_out or most, most),
                        closing=closing,
                        hold=hold,
                    )
                else:
                    seq = await self.budget.reserve(
                        self.member, estimate, closing=closing, hold=hold
                    )
            except BudgetExhausted as exc:
                answer = {"refused": str(exc)}
            else:
                self.granted[rid] = seq
            self.waiting.pop(rid, None)
            await self._answer(rid, answer)

    async def _answer(self, rid: str, answer: dict[str, Any]) -> None:
        await self.reply(rid, answer)

    def unreserve(self, msg: Unreserve) -> None:
        scope = self.waiting.pop(msg.id, None)
        if scope is not None:
            scope.cancel()
        seq = self.granted.pop(msg.id, None)
        if seq is not None:
            self.budget.settle(seq, self.member, None)

    def settle(self, msg: Settle) -> None:
        seq = self.granted.pop(msg.id, None)
        if seq is None:
            return
        self.budget.settle(seq, self.member, _amount(msg.used), _amount(msg.hold))

    def release(self, _msg: Release | None = None) -> None:
        self.budget.release(self.member)

    def close(self) -> None:
        """The attempt ended: what its node left open is given back."""
        for scope in self.waiting.values():
            scope.cancel()
        self.waiting.clear()
        for seq in self.granted.values():
            self.budget.settle(seq, self.member, self.budget.reserved(seq))
        self.granted.clear()
        self.budget.release(self.member)
