"""The member's final answer: the ``submit_result`` tool, its validation and its cap.

A member ends by calling ``submit_result`` whose input schema is its kind's result
model. :class:`ResultGate` decides what happens to each call:

* arguments that fail the model -> an error result listing every problem; the model
  tries again (an error is never taken as the answer);
* a valid result over the cap (default 2,000 tokens: the coordinator wants a
  distilled summary, not the exploration) -> sent back *once* with the measured size
  and the cap, asking for a condensed version;
* still over the cap after that -> accepted, truncated to fit with a visible marker
  (longest strings shortened first, then trailing list items dropped), and flagged.

The gate keeps the member's progress even when it is never satisfied: the loop asks
it whether a result was accepted.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from typing import Any, ClassVar

from pydantic import BaseModel, ValidationError

from ..model.tokens import estimate_text as estimate_tokens
from ..tools.base import Tool, ToolContext, ToolOutput
from ..tools.registry import format_validation_error

SUBMIT_TOOL = "submit_result"
TRUNCATION_MARKER = " [...truncated by Fleet: result over its {cap}-token cap]"


class ResultGate:
    """Validates ``submit_result`` calls and enforces the result cap."""

    def __init__(
        self,
        model: type[BaseModel],
        *,
        cap_tokens: int = 2_000,
        estimate: Callable[[str], int] = estimate_tokens,
        name: str = SUBMIT_TOOL,
    ) -> None:
        self.model = model
        self.name = name
        """The tool's name (a kind may call it otherwise: the lead's is ``finish``)."""
        self.cap_tokens = cap_tokens
        self.estimate = estimate
        self.condense_asked = False
        """True once an oversized result was sent back for condensing."""
        self.accepted: dict[str, Any] | None = None
        """The accepted result (JSON-ready), once there is one."""
        self.truncated = False
        """True when the accepted result was cut to fit the cap."""
        self.attempts = 0
        self.partial: dict[str, Any] | None = None
        """A partial result taken by :meth:`take_partial` (a limit ended the member)."""

    def tool(self, description: str) -> Tool:
        """The result tool for this gate (its schema is the result model)."""
        return _SubmitTool(self, description)

    def submit(self, raw: Any) -> ToolOutput:
        """Judge one ``submit_result`` call; the text says what happened and why."""
        self.attempts += 1
        if self.accepted is not None:
            return ToolOutput("A result was already accepted; the member is finishing.")
        try:
            value = self.model.model_validate(raw if raw is not None else {})
        except ValidationError as exc:
            return ToolOutput(
                format_validation_error(self.name, exc, self.model.model_json_schema()),
                is_error=True,
            )
        data = value.model_dump(mode="json")
        tokens = self.estimate(json.dumps(data, ensure_ascii=False))
        if tokens > self.cap_tokens:
            if not self.condense_asked:
                self.condense_asked = True
                return ToolOutput(
                    f"Result not accepted: it is about {tokens} tokens and the cap is "
                    f"{self.cap_tokens}. Condense it - keep the conclusions, evidence and "
                    "what the reader must act on, drop exploration detail - and call "
                    f"{self.name} again.",
                    is_error=True,
                )
            data = truncate_to_cap(data, self.cap_tokens, self.estimate)
            self.truncated = True
        self.accepted = data
        note = " (truncated to the cap, marked)" if self.truncated else ""
        return ToolOutput(f"Result accepted{note}. Stop here; do not call more tools.")

    def take_partial(self, raw: Any) -> ToolOutput:
        """Judge the closing ``submit_result`` of a member a limit stopped.

        Validated like any submission, but an oversized one is cut at once: there
        is no further turn in which to condense it."""
        try:
            value = self.model.model_validate(raw if raw is not None else {})
        except ValidationError as exc:
            return ToolOutput(
                format_validation_error(self.name, exc, self.model.model_json_schema()),
                is_error=True,
            )
        data = value.model_dump(mode="json")
        if self.estimate(json.dumps(data, ensure_ascii=False)) > self.cap_tokens:
            data = truncate_to_cap(data, self.cap_tokens, self.estimate)
        self.partial = data
        return ToolOutput("Partial result recorded; the member ends without a full result.")


class _SubmitTool(Tool):
    name: ClassVar[str] = SUBMIT_TOOL
    description: ClassVar[str] = ""

    def __init__(self, gate: ResultGate, description: str) -> None:
        self.gate = gate
        self.name = gate.name  # type: ignore[misc]
        self.description = description  # type: ignore[misc]
        self.Input = gate.model  # type: ignore[misc]

    async def run(self, args: Any, ctx: ToolContext) -> ToolOutput:
        return self.gate.submit(args.model_dump(mode="json"))


def truncate_to_cap(
    data: dict[str, Any], cap_tokens: int, estimate: Callable[[str], int] = estimate_tokens
) -> dict[str, Any]:
    """Shorten ``data`` until its JSON fits ``cap_tokens``, marking every cut.

    The longest string is halved first (repeatedly), so short fields - names, URLs,
    flags - survive intact; when strings cannot shrink further, trailing list items
    are dropped. The marker makes the cut visible to whoever reads the result.
    """
    marker = TRUNCATION_MARKER.format(cap=cap_tokens)
    out = json.loads(json.dumps(data))

    def size() -> int:
        return estimate(json.dumps(out, ensure_ascii=False))

    for _ in range(500):
        if size() <= cap_tokens:
            return out
        path, text = _longest_string(out)
        if path is not None and len(text) > 4 * len(marker):
            body = text.removesuffix(marker)
            _set(out, path, body[: len(body) // 2] + marker)
            continue
        # Drop a share of the biggest list's tail matching the excess, so a
        # thousand-item list converges in a few rounds rather than one item per round.
        total = size()
        if not _drop_tail(out, (total - cap_tokens) / total):
            break
    return out


def _walk(node: Any, path: tuple[Any, ...] = ()):
    if isinstance(node, dict):
        for k, v in node.items():
            yield from _walk(v, (*path, k))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from _walk(v, (*path, i))
    elif isinstance(node, str):
        yield path, node


def _longest_string(node: Any) -> tuple[tuple[Any, ...] | None, str]:
    best: tuple[tuple[Any, ...] | None, str] = (None, "")
    for path, text in _walk(node):
        if len(text) > len(best[1]):
            best = (path, text)
    return best


def _set(node: Any, path: tuple[Any, ...], value: Any) -> None:
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value


def _drop_tail(node: Any, fraction: float) -> bool:
    """Drop about ``fraction`` of the biggest list's items (at least one) from its end;
    False when no list has items left."""
    lists: list[list[Any]] = []

    def collect(n: Any) -> None:
        if isinstance(n, dict):
            for v in n.values():
                collect(v)
        elif isinstance(n, list):
            if n:
                lists.append(n)
            for v in n:
                collect(v)

    collect(node)
    if not lists:
        return False
    biggest = max(lists, key=lambda lst: len(json.dumps(lst)))
    drop = max(1, math.ceil(len(biggest) * fraction))
    del biggest[len(biggest) - drop :]
    return True
