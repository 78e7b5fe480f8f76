"""A member's model with a fallback: when its own model stays overloaded, the member
goes on with another from its next call instead of failing.

Overloaded means the call failed for good with the API's ``529 overloaded_error``, or
with ``429``: the adapter (:mod:`.claude`) keeps a call waiting on those as the rate
governor's pauses say, for its patience, before it fails. A member with a fallback has
a patience of :data:`FALLBACK_AFTER_S` (60 s) on its own model instead of the governor's
15 minutes: overload episodes shorter than a minute usually pass while the governor
pauses, and past that a member spends its deadline waiting on capacity another model
has. Any other failure (a bad request, an authentication error) is the member's to meet,
fallback or not: the other model would fail the same way.

The switch happens once and is for good: the failed call is sent again to the fallback,
and every later call goes there (a member that flipped back and forth would read two
models' answers in one conversation for no gain). It is traced as a ``model_switch``
event, and :attr:`FallbackModel.switched` says it in words, for ``result.json`` and the
report. Pricing and the run's budget follow: :attr:`profile` is the model in use.
"""

from __future__ import annotations

from typing import Any

from .base import Model, ModelError, ModelRequest, ModelResponse

FALLBACK_AFTER_S = 60.0
"""How long one call of a member that has a fallback waits on 429/529 before it goes to
the fallback (see the module docstring)."""


def overloaded(exc: ModelError) -> bool:
    """Whether a failed call is the model's capacity, not the request's fault."""
    return exc.status in (429, 529) or exc.error_type in ("overloaded_error", "rate_limit_error")


class FallbackModel:
    """``primary`` until it stays overloaded, then ``fallback`` for good."""

    def __init__(self, primary: Model, fallback: Model, *, trace: Any = None) -> None:
        self.primary, self.fallback = primary, fallback
        self.current: Model = primary
        self.trace = trace
        self.switched: str | None = None
        """``"claude-a -> claude-b: <why>"`` once the member switched; None before."""
        self.profile = primary.profile
        """The model in use's (prices, window, output limit)."""
        self.offline = primary.offline

    @property
    def name(self) -> str:
        return str(getattr(self.current, "name", "") or self.current.profile.name)

    async def complete(self, request: ModelRequest) -> ModelResponse:
        try:
            return await self.current.complete(request)
        except ModelError as exc:
            if self.current is self.fallback or not overloaded(exc):
                raise
            self._switch(exc)
        return await self.current.complete(request)

    def _switch(self, exc: ModelError) -> None:
        before = str(getattr(self.primary, "name", "") or self.primary.profile.name)
        self.current = self.fallback
        self.profile, self.offline = self.fallback.profile, self.fallback.offline
        why = str(exc).strip().splitlines()[0][:300] if str(exc).strip() else "overloaded"
        self.switched = f"{before} -> {self.name}: {why}"
        if self.trace is not None:
            from ..trace import ModelSwitch

            self.trace.emit(ModelSwitch(model=before, to=self.name, reason=why))

    async def count_tokens(self, request: ModelRequest) -> int | None:
        return await self.current.count_tokens(request)

    async def aclose(self) -> None:
        try:
            await self.primary.aclose()
        finally:
            await self.fallback.aclose()
