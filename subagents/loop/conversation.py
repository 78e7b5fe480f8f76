"""One member's conversation with its model: the messages, the turn, the usage.

Every model call of a member goes through :meth:`Conversation.call`, in this order:
the context mechanisms shape what is sent (``context.prepare``: offload, clip,
compaction, todo recitation); one Messages API call is made; its usage is counted
(the context's compaction summary calls too - they are this member's calls like any
other, toward its token limit and its cost); the call is traced as ``ModelCall``
plus the new assistant message. ``Messages`` events carry only new messages, so a
trace grows linearly with turns.

What to do with an answer - run its tools, remind, stop, close - is the loop's
(:mod:`subagents.loop.loop`); this module only keeps the exchange and its accounts.

A durable conversation (``save_to``: the lead's, a member's) is kept in that file
after every change (:mod:`.transcript`: new messages appended, the file rewritten
atomically only when the context replaced an older message), so a coordinator killed
at any instant leaves the last complete exchange on disk - a write cut short reads
back as the messages before it. The appends are fsynced together before each model
call (:meth:`Conversation.sync`; the transcript module says what a power loss may
take); :meth:`Conversation.restore` reads
it back for the member to continue from where it was. It holds the messages as
the context left them (compacted, offloaded), which is what the model saw last - so
its size is the member's context budget, not its history. A member's transcript was
written from what the model and the box produced: it is read back only up to
``TRANSCRIPT_BYTES`` and only when every message has the shape the loop writes;
anything else is no transcript (the member starts from turn 0).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from ..context.base import ContextLike
from ..model.base import Model, ModelRequest
from ..model.errors import ModelError
from ..spend.usage import Usage, model_call_event
from ..trace import ErrorEvent, Messages, Prompt, TraceWriter
from .transcript import TranscriptFile, read_messages

TRANSCRIPT_BYTES = 64 * 1024 * 1024
"""Largest saved conversation read back (a context window is a few MB at most)."""


def _well_formed(messages: Any) -> bool:
    """The saved messages have the shape the loop writes (roles, block lists)."""
    if not isinstance(messages, list) or not messages:
        return False
    for m in messages:
        if not isinstance(m, dict) or m.get("role") not in ("user", "assistant"):
            return False
        content = m.get("content")
        if not isinstance(content, str) and not (
            isinstance(content, list) and all(isinstance(b, dict) for b in content)
        ):
            return False
    return messages[0].get("role") == "user"


class Conversation:
    """The messages of one member, the current turn and what the calls cost."""

    def __init__(
        self,
        *,
        member: str,
        model: Model,
        context: ContextLike,
        trace: TraceWriter,
        system: str,
        tools: list[dict[str, Any]],
        max_output_tokens: int,
        save_to: Path | None = None,
    ) -> None:
        self.member, self.model, self.context, self.trace = member, model, context, trace
        self.system, self.tools = system, tools
        self.max_output_tokens = min(max_output_tokens, model.profile.max_output)
        """Output bound of a regular call: the member's, never above the model's own."""
        self.messages: list[dict[str, Any]] = []
        self.turn = 0
        self.usage = Usage()
        self.last_text = ""
        """The model's last words (capped), which often say where it was."""
        self.offline = model.offline
        """Labelled from the model itself too: a member that failed before its first
        call was still an offline member."""
        self._summaries_counted = 0
        """How many of the context's compaction summary calls are in ``usage``."""
        self.save_to = save_to
        """Where the conversation is kept after every change (None: nowhere)."""
        self._file = TranscriptFile(save_to) if save_to is not None else None

    @property
    def turn_span(self) -> str:
        return f"{self.member}/t{self.turn}"

    def append(self, message: dict[str, Any]) -> None:
        """Add a message and trace it (and keep the conversation, when durable)."""
        self.messages.append(message)
        self.trace_message(message)
        self.save()

    def save(self) -> None:
        """Make ``save_to`` hold the messages (a no-op without it): the new ones appended,
        or the whole file rewritten when an older one was replaced (:mod:`.transcript`)."""
        if self._file is not None:
            self._file.save(self.messages)

    def sync(self) -> None:
        """Make the saved messages durable (fsync; a no-op without ``save_to`` or when
        nothing was appended since the last sync)."""
        if self._file is not None:
            self._file.sync()

    def restore(self) -> bool:
        """Continue from the saved conversation, if there is one; True when there was.

        The turn count goes on from the saved assistant messages, so limits count the
        member's whole life, not this process's share of it."""
        if self.save_to is None:
            return False
        messages = read_messages(self.save_to, TRANSCRIPT_BYTES)
        if not _well_formed(messages):
            return False
        assert isinstance(messages, list)
        self.messages = messages
        self.turn = sum(1 for m in messages if m.get("role") == "assistant")
        return True

    @property
    def completed_turn(self) -> int:
        """The last turn whose tool calls all answered (the saved conversation ends with
        their results); the turn before it when its answer's tool calls are pending."""
        last = self.messages[-1] if self.messages else None
        pending = (
            last is not None
            and last.get("role") == "assistant"
            and any(b.get("type") == "tool_use" for b in last.get("content") or [])
        )
        return self.turn - 1 if pending else self.turn

    def trace_prompt(self) -> None:
        """Trace what the model is told besides the messages (once, at the start)."""
        self.trace.emit(Prompt(system=self.system, tools=self.tools))

    def trace_message(self, message: dict[str, Any]) -> None:
        """Trace a message (or the part of one) the conversation gained this turn."""
        self.trace.emit(
            Messages(span=self.turn_span, parent=self.member, turn=self.turn, messages=[message])
        )

    async def call(
        self,
        *,
        tool_choice: dict[str, Any] | None = None,
        max_tokens: int | None = None,
        prepare: bool = True,
        closing: bool = False,
    ) -> tuple[list[dict[str, Any]], str | None]:
        """One model call; appends and traces the assistant message. Its content
        blocks (as JSON) and stop reason."""
        sent = self.messages
        if prepare:
            with self.trace.scope(self.turn_span, self.member, self.turn):
                sent = await self.context.prepare(
                    self.messages, turn=self.turn, system=self.system, tools=self.tools
                )
            self.count_summary_calls()
        profile = self.model.profile
        # model_construct: the messages were built here (already valid); not
        # re-validating hundreds of dicts keeps harness CPU per turn flat.
        request = ModelRequest.model_construct(
            system=self.system,
            messages=sent,
            tools=self.tools,
            max_tokens=max_tokens or self.max_output_tokens,
            temperature=None,
            tool_choice=tool_choice,
            # The context owns the budget, so it alone knows where the server should
            # compact or clear (None: no server-side edits).
            context_management=self.context.context_management(),
        )
        span = f"{self.turn_span}/model"
        requested = getattr(self.model, "name", "") or profile.name
        self.sync()  # the turn before, answer and results, in one fsync
        started = time.monotonic()
        with self.trace.scope(span, self.turn_span, self.turn):  # the adapter's retries
            try:
                response = await self.model.complete(request)
            except ModelError as exc:
                # A call that got no answer is traced too, so it can be seen as the
                # failed call it was, not only in the member's end reason.
                self.trace.emit(
                    ErrorEvent(
                        error=exc.error_type or "model_error",
                        message=str(exc)[:2_000],
                        model=requested,
                        status=exc.status or 0,
                        latency_s=round(time.monotonic() - started, 4),
                    )
                )
                raise
        message = response.message
        self.offline = self.offline or response.offline
        self.usage.add(message.usage, profile)
        self.context.observe_usage(message.usage, sent)
        content = [b.model_dump(mode="json", exclude_none=True) for b in message.content]
        self.trace.emit(
            model_call_event(
                response,
                content,
                span=span,
                parent=self.turn_span,
                turn=self.turn,
                default_model=profile.name,
                request_model=requested,
                max_tokens=request.max_tokens,
                closing=closing,
            )
        )
        texts = [b["text"] for b in content if b.get("type") == "text" and b.get("text")]
        if texts:
            self.last_text = texts[-1][-1_000:]
        # The API refuses an empty assistant message later in the conversation.
        self.append(
            {"role": "assistant", "content": content or [{"type": "text", "text": "(no output)"}]}
        )
        return content, message.stop_reason

    def next_context_tokens(self) -> int:
        """Tokens the next call would send, by the context's estimate."""
        return self.context.estimate(self.messages, self.system, self.tools)

    def count_summary_calls(self) -> None:
        """Add the context's compaction summary calls to the member's usage, so the
        outcome's totals match the traced calls."""
        calls = self.context.summary_usage
        for usage in calls[self._summaries_counted :]:
            self.usage.add(usage, self.model.profile)
        self._summaries_counted = len(calls)
