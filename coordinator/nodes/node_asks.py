"""Tool-policy asks of a member on a cluster node, answered by the coordinator.

A member's policy may ``ask`` before a call (:mod:`subagents.rules.policy`). On one machine
the harness asks the run's :class:`~coordinator.oversight.approvals.FileApprover` itself. On a
cluster node the run's approval queue is out of reach - it is ``runs/RUN/approvals/``
on the coordinator, which stays the only writer of the run directory, and nodes share
no file system with it - so the ask travels:

* on the node, :class:`RelayApprover` is the member's approver: an ask becomes an
  ``ask`` message of the attempt's stream (:mod:`coordinator.nodes.stream`), the one
  that carries its trace events back, and only the asking call waits for the answer;
* on the coordinator, :class:`AskRelay` (one per attempt) hands each ask to the run's
  own approver - the queue that ``fleet approve RUN``, ``--approve-all`` and the
  run's terminal answer, as for a member on this host - and sends the answer back to
  the node with one actor call (``NodeService.answer``);
* a wait the node gives up (the member's deadline, the attempt stopped) comes as
  an ``unask`` message, and the coordinator closes the request as it does for a member
  on its own host (abandoned, "member stopped"). An attempt that ends any other way,
  its node lost included, closes its open requests the same way when it ends: the
  member's outcome is decided by the attempt alone (``crashed`` for a lost node).

What crosses: the request (member, call, tool, arguments, rule, ``ask_default``) and
the answer (allowed, by whom, always) - nothing secret. The ask's timeout
(``ask_timeout_s``) is kept by the coordinator's approver, the member's deadline by
the node, as on one machine. This module imports no Ray: the cluster passes in how an
answer reaches the node.
"""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import anyio
from anyio.abc import TaskGroup

from subagents.rules.policy import Approval, ApprovalRequest, Approver, NoApprover

from .stream import Ask, Message, Unask

Send = Callable[[Message], None]
"""Puts a message into the attempt's stream."""


@dataclass
class _Waiting:
    done: anyio.Event = field(default_factory=anyio.Event)
    answer: dict[str, Any] | None = None


class RelayApprover:
    """A node member's approver: an ask goes into its attempt's stream (``send``) and
    waits until :meth:`NodeAsks.answer` delivers the coordinator's answer."""

    def __init__(self, send: Send, asks: NodeAsks) -> None:
        self.send = send
        self.asks = asks

    async def ask(self, request: ApprovalRequest, timeout_s: float | None) -> Approval:
        aid = uuid.uuid4().hex
        item = Ask(id=aid, request=request, timeout_s=timeout_s)
        answer = await self.asks.wait(self.send, aid, item, Unask(id=aid))
        return Approval.model_validate(answer)


class NodeAsks:
    """The asks of a run's members on one node that wait for their answers."""

    def __init__(self) -> None:
        self.waiting: dict[str, _Waiting] = {}

    def approver(self, send: Send) -> RelayApprover:
        """The approver of one attempt whose stream items go to ``send``."""
        return RelayApprover(send, self)

    async def wait(
        self,
        send: Send,
        aid: str,
        item: Message,
        gave_up: Message,
    ) -> dict[str, Any] | None:
        """Send ``item`` and wait for the coordinator's answer to ``aid``; ``gave_up`` is
        sent instead when the wait is cancelled."""
        slot = self.waiting[aid] = _Waiting()
        send(item)
        try:
            await slot.done.wait()
        except anyio.get_cancelled_exc_class():
            send(gave_up)
            raise
        finally:
            self.waiting.pop(aid, None)
        return slot.answer

    def answer(self, aid: str, approval: dict[str, Any]) -> bool:
        """Deliver the answer to ask ``aid``; False when nobody waits for it any more."""
        slot = self.waiting.get(aid)
        if slot is None or slot.done.is_set():
            return False
        slot.answer = approval
        slot.done.set()
        return True


class AskRelay:
    """One attempt's asks, on the coordinator: each is answered by the run's approver
    in a task of ``tg`` (the attempt's; cancelling it closes what is still open), and
    the answer goes to the node through ``reply(id, approval)``."""

    def __init__(
        self,
        approver: Approver | None,
        reply: Callable[[str, dict[str, Any]], Awaitable[None]],
        tg: TaskGroup,
    ) -> None:
        self.approver = approver or NoApprover()
        self.reply = reply
        self.tg = tg
        self.scopes: dict[str, anyio.CancelScope] = {}

    def ask(self, msg: Ask) -> None:
        # Made now, not in the task: an unask may come before the task first runs.
        scope = self.scopes[msg.id] = anyio.CancelScope()
        self.tg.start_soon(self._answer, msg, scope)

    def unask(self, msg: Unask) -> None:
        scope = self.scopes.pop(msg.id, None)
        if scope is not None:
            scope.cancel()

    async def _answer(self, msg: Ask, scope: anyio.CancelScope) -> None:
        aid, request = msg.id, msg.request
        with scope:
            try:
                approval = await self.approver.ask(request, msg.timeout_s)
            except Exception as exc:  # the approver broke its contract: the safe answer
                approval = Approval(
                    allowed=request.ask_default == "allow",
                    by=f"ask failed ({type(exc).__name__}: {exc})",
                )
            self.scopes.pop(aid, None)
            await self.reply(aid, approval.model_dump())
