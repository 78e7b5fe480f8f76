"""The delegation seam: what a lead member asks of whoever runs its members.

A lead (:mod:`subagents.kinds.lead`) is a member like any other - a model, a loop, a
context - whose tools do not touch a box: they hand members to the coordinator and
read back what those members returned. This module is the whole of what the harness
knows about that: a :class:`Delegation` answers ``spawn``, ``wait`` and
``read_result`` with a :class:`Reply` (text for the model, or an error it can act
on). How members run - their boxes, retries, quorum, the journal - is the
coordinator's (:mod:`coordinator.lead.lead`), which implements this protocol; the harness
stays ignorant of fan-out, as the package's rule says.

Error contract: a request the delegation refuses (past a member, wave or token
limit; a member spec that does not validate; a member id it does not know) is a
:class:`Reply` with ``is_error=True`` whose text says what was wrong and what would
be right - never an exception. Only cancellation propagates.

What a reply may hold is the implementation's promise, stated here because the
lead's safety rests on it: a member's *distilled* result (capped), never its
transcript, pages or tool output, and always inside untrusted-data delimiters,
since a member's findings are text copied from web pages - through
:func:`subagents.results.member_text.member_block`, so no spelling of a delimiter tag in a
member's text reaches the lead verbatim.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, Protocol

WaitUntil = Literal["any", "all"]


@dataclass(frozen=True)
class Reply:
    """A delegation's answer to one lead tool call."""

    text: str
    is_error: bool = False


class Delegation(Protocol):
    """Runs a lead's members; see the module docstring for the contract."""

    async def spawn(self, members: list[dict[str, Any]], *, call_id: str) -> Reply:
        """Start ``members`` (member specs: kind, task, inputs, ...) as one wave.

        ``call_id`` identifies the lead's tool call: a spawn whose call id was already
        answered (a resumed lead repeating the call it was killed in) gets the same
        answer again and starts nothing twice."""
        ...

    async def wait(self, *, until: WaitUntil, timeout_s: float) -> Reply:
        """Block until a member the lead has not heard from finishes (``any``) or until
        every spawned member has (``all``), or ``timeout_s`` passes; then each newly
        finished member's status and distilled result, and who is still running."""
        ...

    async def read_result(self, member: str) -> Reply:
        """One finished member's whole result (still capped, still untrusted)."""
        ...
