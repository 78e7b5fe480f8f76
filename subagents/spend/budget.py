"""One budget for the run: every model call of every member is reserved against it first.

Why reserve before the call rather than count after it: a wide fan-out that only
counts what came back overshoots the line by one turn of every member running at
once (16 members, 16 turns past the line). Here a call goes out only when its
*estimate* fits: the request's input tokens at their price (assumed uncached unless
the previous call of that model read the prompt cache, as the rate governor
estimates; what is new since is priced as input, the rest as cache reads) plus its
``max_tokens`` of output at the output price. The reservation is settled with the
API's own usage when the answer comes back (a call that failed without an answer
spent nothing). A call whose reservation would cross the hard line does not go out:
:class:`BudgetExhausted` is raised in the member, which ends ``incomplete`` with
``limit = "budget"`` after its closing call.

Room for that closing call is *held*, not hoped for (as the token limit reserves it,
:mod:`subagents.loop.closing`): a member whose call is admitted also holds its closing
call - its context as of that call (its answer included, once it came) and
``closing_max_tokens`` of output (:data:`CLOSING_TOKENS`), the bound its closing call
is sent with - so a regular call needs room for itself and its member's closing call,
and a closing call uses what its member held. Every member that has started keeps its
closing call, so each one stopped at the line still hands in its partial result.

Near the line, a call is not refused while a smaller one would do: it is sent with the
output bound that fits (:meth:`RunBudget.reserve_upto`; a cluster node's member asks the
coordinator's budget the same through its relay), never less than twice what
answers produce at the 95th percentile (this member's, else the run's; the whole
``max_tokens`` before anything is known and after one of the member's answers was cut at
its bound). What it may spend is still reserved in full before it goes out. Holding a
whole ``max_tokens`` call for every member and sending every call with its whole bound
made eight members meet a line 1.3x their need with a third of it unspent and three of
them finished (``tests/test_budget_room.py``).

Who waits. A call that does not fit waits while calls are in flight (they usually spend
less than they reserved); a member's *first* call also waits while other members are at
work - a member that has started goes before one that has not, and their ends give back
what they held - and is refused only when no one is left to give anything back. A
started member's call never waits on another member's end, so no two members wait on
each other.

Who starts (:meth:`RunBudget.admit`). A member starts - its box and its first call -
only when the line can carry it to its end by the run's estimate of what a member of its
kind costs, on top of what is spent, reserved and held and what the members already at
work are still expected to spend; the others wait in the run's queue (journalled as
``member_queued`` with ``waiting = "budget"``, shown as ``waiting (budget)``). The
estimate is the most a finished member of that kind cost; before one has finished, the
job's turn limit times what the kind's first call cost (an upper bound: members seldom
use every turn); before any first call is known, one member of the kind goes ahead
alone until its first call has settled. A member that waits until no member is at work
goes ahead if the line can carry the least a finished member of its kind cost (it
finishes, or hands in a partial result: the line is spent on work rather than left) and
its first call's room; otherwise it ends ``skipped`` (``limit = "budget"``) with no box
and no call. So eight members that cost 1.1x of the line run a few at a time and all of
them finish, where started together they met the line in step, halfway, each holding
its closing call (``tests/test_budget_room.py``). Why not start all and pause some near
the line: a paused member still holds its closing call, so pausing frees nothing; only
not starting does. The cost is time: under a tight line members run fewer at once.

Tokens: input + cache writes + output, with cache reads counted at their price
relative to uncached input (``cache_read_per_mtok / input_per_mtok``, 0.1 on every
Claude model), so a token budget tracks what the run costs. Offline models cost
0 USD and still count their tokens (their cache reads at weight 1).

The budget is one object per run in the coordinator process (:func:`register`,
:func:`budgeted`), shared by every member and the lead, like the rate governor;
members on cluster nodes reserve from it through their attempt's stream
(:mod:`coordinator.nodes.node_budget`), so a run has one budget wherever its members run. Its
state is the run's journal: ``budget`` (the lines, and what was spent so far, when a
run starts or resumes), ``budget_spent`` after each call (the running totals: what a
resume starts from), ``budget_soft`` (the soft line was passed, once per line) and
``budget_hard`` (the first call refused).
"""

from __future__ import annotations

import json
import math
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol

import anyio

from ..model.base import Model, ModelProfile, ModelRequest, ModelResponse
from ..model.tokens import CHARS_PER_TOKEN, estimate_bytes

OBSERVED = 1000
"""Answers whose output a run remembers for its estimates."""
MIN_OUTPUT = 256
"""Least output bound a call is ever sent with when the line lowers it."""
SURE_CALLS = 3
"""A member's first calls (before it has this many answers of its own) are sent with
their whole ``max_tokens`` unless the run's other answers say what to expect."""

CLOSING_TOKENS = 1024
"""Default output bound of a closing call in a run with a budget (``[budget]
closing_max_tokens``): a partial result says what was done, what was found and what is
left - a few hundred words, about 1,000 tokens - and every started member holds this
much output for it. Holding a whole ``max_tokens`` (4,096 and more) for each of eight
members made a line "reached" while most of it was unspent."""

Journal = Callable[..., None]
"""``journal(event, **fields)``: appends one entry to the run's journal."""


class BudgetExhausted(Exception):
    """A call's reservation would cross the run's hard line; the call did not go out."""


@dataclass(frozen=True)
class Amount:
    """Dollars and budget tokens (cache reads weighted by price)."""

    usd: float = 0.0
    tokens: float = 0.0

    def __add__(self, other: Amount) -> Amount:
        return Amount(self.usd + other.usd, self.tokens + other.tokens)

    def __sub__(self, other: Amount) -> Amount:
        return Amount(self.usd - other.usd, self.tokens - other.tokens)


def _times(unit: Amount, n: int) -> Amount:
    return Amount(unit.usd * n, unit.tokens * n)


def high(observed: Iterable[int], fraction: float = 0.95) -> int:
    """The ``fraction`` percentile of ``observed`` (0 when empty)."""
    values = sorted(observed)
    if not values:
        return 0
    return values[min(len(values) - 1, max(0, math.ceil(fraction * len(values)) - 1))]


def _at_most(amount: Amount, bound: Amount) -> Amount:
    return Amount(min(amount.usd, bound.usd), min(amount.tokens, bound.tokens))


def _total(amounts: Iterable[Amount]) -> Amount:
    out = Amount()
    for a in amounts:
        out = out + a
    return out


def cache_weight(profile: ModelProfile) -> float:
    """What one cache-read token counts in a token budget (1 for a model that is free)."""
    if profile.input_per_mtok <= 0:
        return 1.0
    return profile.cache_read_per_mtok / profile.input_per_mtok


def usage_amount(usage: Any, profile: ModelProfile) -> Amount:
    """What a call's usage (the API's ``usage``) spent."""
    inp = usage.input_tokens or 0
    out = usage.output_tokens or 0
    read = getattr(usage, "cache_read_input_tokens", None) or 0
    write = getattr(usage, "cache_creation_input_tokens", None) or 0
    usd = (
        inp * profile.input_per_mtok
        + out * profile.output_per_mtok
        + read * profile.cache_read_per_mtok
        + write * profile.cache_write_per_mtok
    ) / 1_000_000
    return Amount(usd, inp + write + out + read * cache_weight(profile))


def _most(amounts: Iterable[Amount]) -> Amount:
    out = Amount()
    for a in amounts:
        out = Amount(max(out.usd, a.usd), max(out.tokens, a.tokens))
    return out


def _not_below_zero(amount: Amount) -> Amount:
    return Amount(max(0.0, amount.usd), max(0.0, amount.tokens))


@dataclass
class _Kind:
    """What a run learned of its members of one kind, for admission."""

    first_call: Amount = field(default_factory=Amount)
    """The most a member's first call of this kind cost (its first settled call)."""
    costs: list[Amount] = field(default_factory=list)
    """What each member of this kind that finished ``ok`` spent (per attempt)."""
    closing: Amount = field(default_factory=Amount)
    """The most a member of this kind held for its closing call."""
    first_call_room: tuple[Amount, Amount, int] | None = None
    """The latest first call of a member of this kind: its input and its member's
    closing room, the price of one output token, and its ``max_tokens``."""


@dataclass
class _Admitted:
    """A member admitted to start (:meth:`RunBudget.admit`), until it ends."""

    kind: str
    turns: int
    share: int = 1
    """Parallel attempts: each costs what a member does."""
    calls: int = 0
    """Its calls settled with an answer so far."""
    spent: Amount = field(default_factory=Amount)


@dataclass
class RunBudget:
    """The run's lines and what is spent, reserved and held against them."""

    usd: float | None = None
    """Hard line in USD (None: no USD line)."""
    tokens: int | None = None
    """Hard line in budget tokens (None: no token line)."""
    soft: float = 0.8
    """Fraction of each hard line past which the run is warned (once)."""
    closing_tokens: int = CLOSING_TOKENS
    """Output bound of a member's closing call in this run, and the output a started
    member holds room for (``[budget] closing_max_tokens``)."""
    journal: Journal | None = None
    say: Callable[[str], None] | None = None
    """Prints a line in the live output."""
    spent: Amount = field(default_factory=Amount)
    _in_flight: dict[int, Amount] = field(default_factory=dict)
    _held: dict[str, Amount] = field(default_factory=dict)
    """Each started member's closing call: its context as of its last call, plus
    ``closing_tokens`` of output."""
    observed: deque[int] = field(default_factory=lambda: deque(maxlen=OBSERVED))
    """Output tokens of the run's recent answers (what members' calls really produce)."""
    cached_models: set[str] = field(default_factory=set)
    """Models whose answers in this run read the prompt cache: a member's first call of
    one shares its system prompt and tools with calls already made."""
    _seq: int = 0
    _changed: anyio.Event | None = None
    """Set when a call settles or a member ends (room may have come back)."""
    _soft_told: bool = False
    _hard_told: bool = False
    _kinds: dict[str, _Kind] = field(default_factory=dict)
    _admitted: dict[str, _Admitted] = field(default_factory=dict)
    waiters: set[str] = field(default_factory=set)
    """Holders that wait on members (a run's lead): room they hold is no reason for a
    member to wait, since they end only after the members they wait on."""

    # -- lines -----------------------------------------------------------------
    def _over(self, total: Amount, fraction: float = 1.0) -> bool:
        if self.usd is not None and total.usd > self.usd * fraction + 1e-12:
            return True
        return self.tokens is not None and total.tokens > self.tokens * fraction

    def describe(self) -> str:
        """The lines and what was spent, in words."""
        parts = []
        if self.usd is not None:
            parts.append(f"${self.spent.usd:.4f} of ${self.usd:g}")
        if self.tokens is not None:
            parts.append(f"{round(self.spent.tokens):,} of {self.tokens:,} tokens")
        return " and ".join(parts)

    def start(self, *, resume: bool) -> None:
        """Journal the lines (and what was spent) as the run starts or resumes."""
        self._soft_told = self._over(self.spent, self.soft)
        self._note(
            "budget",
            usd=self.usd,
            tokens=self.tokens,
            soft=self.soft,
            spent_usd=round(self.spent.usd, 6),
            spent_tokens=round(self.spent.tokens),
            resume=resume,
        )

    # -- calls -----------------------------------------------------------------
    async def reserve(
        self, member: str, estimate: Amount, *, closing: bool, hold: Amount | None = None
    ) -> int:
        """Reserve one call of ``member`` (its id for :meth:`settle`), or raise
        :class:`BudgetExhausted` when it would cross the hard line. ``estimate`` is the
        call's worst case (its input and its whole ``max_tokens``): what it reserves.
        ``hold`` is what a regular call keeps for its member's closing call (its input
        and ``closing_tokens`` of output; never more than ``estimate``; None: the
        estimate itself).

        A call that fits only once calls in flight have settled waits for them: their
        reservations are worst cases, and what they really spend is usually less."""
        if closing and member not in self._held:
            # Its first call was refused: it never started, there is nothing to close.
            raise BudgetExhausted("run budget reached before the member's first call")
        keep = estimate if hold is None else _at_most(hold, estimate)
        while True:
            others = _total(a for m, a in self._held.items() if m != member)
            committed = self.spent + _total(self._in_flight.values()) + others
            # A regular call also holds its member's closing call; a closing call uses it.
            need = committed + estimate if closing else committed + estimate + keep
            if not closing:
                self._first_call(member, estimate + keep, Amount(), 0)
            if not self._over(need):
                break
            if not self._may_wait(member):
                if closing:
                    self._held.pop(member, None)
                raise BudgetExhausted(self._refusal(member, estimate))
            await self._next_change()
        self._seq += 1
        self._in_flight[self._seq] = estimate
        if closing:
            self._held.pop(member, None)
        else:
            self._held[member] = keep
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
        """Reserve a call whose output bound may be lowered to fit the line: its input
        ``given`` and between ``min_out`` and ``max_out`` tokens of output at ``per_out``
        each. Returns its id and the output bound granted - the most that fits, up to
        ``max_out`` - which the call must be sent with: what it may spend is covered.
        ``min_out`` may be a function, asked again each time the call looks for room
        (what other calls' answers taught meanwhile lowers it). Waits and refuses as
        :meth:`reserve` does."""
        if closing and member not in self._held:
            raise BudgetExhausted("run budget reached before the member's first call")
        worst = given + _times(per_out, max_out)
        keep = worst if hold is None else _at_most(hold, worst)
        while True:
            others = _total(a for m, a in self._held.items() if m != member)
            committed = self.spent + _total(self._in_flight.values()) + others
            base = committed + given if closing else committed + given + keep
            out = self._affordable(base, per_out, max_out)
            least = min_out() if callable(min_out) else min_out
            if not closing:
                self._first_call(member, given + keep, per_out, max_out)
            if out >= least:
                break
            if not self._may_wait(member):
                if closing:
                    self._held.pop(member, None)
                raise BudgetExhausted(self._refusal(member, given + _times(per_out, least)))
            await self._next_change()
        self._seq += 1
        self._in_flight[self._seq] = given + _times(per_out, out)
        if closing:
            self._held.pop(member, None)
        else:
            self._held[member] = keep
        return self._seq, out

    def _may_wait(self, member: str) -> bool:
        """Whether a call that does not fit now may wait for room rather than be
        refused: while calls are in flight (they usually spend less than reserved); and
        a member's first call also while other members are at work - a member that has
        started goes before one that has not, and their ends give back what they hold.
        A started member never waits on another's end, so no two wait on each other."""
        if self._in_flight:
            return True
        others = (m for m in self._held if m != member and m not in self.waiters)
        return member not in self._held and any(True for _ in others)

    def _affordable(self, base: Amount, per_out: Amount, most: int) -> int:
        """Output tokens (at most ``most``) that fit on top of ``base`` under every line."""
        out = most
        for line, used, unit in (
            (self.usd, base.usd, per_out.usd),
            (self.tokens, base.tokens, per_out.tokens),
        ):
            if line is None:
                continue
            room = line - used
            if room < 0:
                return -1
            if unit > 0:
                out = min(out, int(room // unit))
        return out

    def observe(self, output_tokens: int, *, cached: str | None = None) -> None:
        """An answer's output tokens, for the estimate of what later calls produce;
        ``cached``: the model whose answer it was read the prompt cache."""
        self.observed.append(max(0, int(output_tokens)))
        if cached:
            self.cached_models.add(cached)

    def reserved(self, seq: int) -> Amount:
        """What the call ``seq`` holds until it settles (nothing once it has)."""
        return self._in_flight.get(seq, Amount())

    def settle(
        self, seq: int, member: str, used: Amount | None, hold: Amount | None = None
    ) -> None:
        """The call ``seq`` ended: ``used`` is what it spent (None: no answer, nothing).
        ``hold``: its member's closing call as it now stands (its context grew by the
        call's answer), held from here on while the member has not ended."""
        self._in_flight.pop(seq, None)
        if hold is not None and member in self._held:
            self._held[member] = hold
        self._signal()
        if used is None:
            return
        self.spent = self.spent + used
        self._learn(member, used)
        self._note(
            "budget_spent",
            member=member,
            usd=round(used.usd, 6),
            tokens=round(used.tokens),
            spent_usd=round(self.spent.usd, 6),
            spent_tokens=round(self.spent.tokens),
        )
        if not self._soft_told and self._over(self.spent, self.soft):
            self._soft_told = True
            line = f"budget: past the soft line ({self.soft:g} of the budget): {self.describe()}"
            self._tell(line)
            self._note("budget_soft", member=member, soft=self.soft, detail=self.describe())

    def release(self, member: str) -> None:
        """The member ended: the closing call it held is free again."""
        self._held.pop(member, None)
        self._signal()

    # -- who starts ------------------------------------------------------------------
    @property
    def limited(self) -> bool:
        """Whether the run has a hard line at all."""
        return self.usd is not None or self.tokens is not None

    def _owner(self, key: str) -> _Admitted | None:
        """The admitted member a call's member key belongs to (``coder`` for its
        attempts' ``coder.2``)."""
        found = self._admitted.get(key)
        while found is None and "." in key:
            key = key.rpartition(".")[0]
            found = self._admitted.get(key)
        return found

    def _hold_of(self, member: str) -> bool:
        return any(k == member or k.startswith(member + ".") for k in self._held)

    def _expected(self, kind: str, turns: int) -> Amount | None:
        """What a member of ``kind`` is expected to cost: the most a finished one did;
        else its turn limit times the kind's first call; None when nothing is known."""
        known = self._kinds.get(kind)
        if known is None:
            return None
        if known.costs:
            return _most(known.costs)
        if known.first_call.tokens > 0 or known.first_call.usd > 0:
            return _times(known.first_call, turns)
        return None

    def _least(self, kind: str) -> Amount | None:
        """The least a finished member of ``kind`` cost (None: none has finished)."""
        costs = (self._kinds.get(kind) or _Kind()).costs
        if not costs:
            return None
        return Amount(min(c.usd for c in costs), min(c.tokens for c in costs))

    def _closing_room(self, kind: str) -> Amount:
        known = self._kinds.get(kind) or _Kind()
        return _most([known.closing, known.first_call])

    def _still_to_spend(self, *, closing: bool = True) -> Amount:
        """What the members at work are still expected to spend (``closing``: with the
        room for the closing calls of those that hold none yet)."""
        total = Amount()
        for member, a in self._admitted.items():
            each = self._expected(a.kind, a.turns)
            if each is not None:
                total = total + _not_below_zero(_times(each, a.share) - a.spent)
            if closing and not self._hold_of(member):
                total = total + _times(self._closing_room(a.kind), a.share)
        return total

    async def admit(
        self,
        member: str,
        kind: str,
        *,
        turns: int,
        share: int = 1,
        waiting: Callable[[], None] | None = None,
    ) -> str | None:
        """Wait until ``member`` (of ``kind``, at most ``turns`` turns, ``share``
        attempts) may start - see the module docstring - then count it as at work until
        :meth:`ended`. Returns None when admitted, or why it is skipped. ``waiting`` is
        called once if it has to wait."""
        told = False
        while True:
            each = self._expected(kind, turns)
            if each is None:
                # Nothing known of its kind: one member of it goes first, alone.
                if not any(a.kind == kind and a.calls == 0 for a in self._admitted.values()):
                    break
            else:
                need = _times(each, share) + _times(self._closing_room(kind), share)
                ahead = self.spent + _total(self._in_flight.values())
                ahead = ahead + _total(self._held.values()) + self._still_to_spend()
                if not self._over(ahead + need):
                    break
                # Members at work, or calls in flight: what may still change. (The lead holds
                # room too, but waits on members: it is no reason to wait.)
                at_work = bool(self._admitted or self._in_flight)
                if not at_work:
                    # Judged on what was spent, not on estimates of others' rest: what
                    # the cheapest finished member cost, and what a first call needs free.
                    least = self._least(kind)
                    if least is not None and self._over(self.spent + _times(least, share)):
                        return self._skipped(kind, least)
                    first = self._first_need(kind) + _total(self._held.values())
                    if self._over(self.spent + first):
                        return self._skipped(kind, first, first_call=True)
                    # Alone, it goes: what it costs fits, only its closing room may not
                    # (it finishes, or hands in a partial result); or all that is known
                    # is the turn limit's bound, no reason to start nothing.
                    break
            if not told and waiting is not None:
                told = True
                waiting()
            await self._next_change()
        self._admitted[member] = _Admitted(kind=kind, turns=turns, share=max(1, share))
        return None

    def _skipped(self, kind: str, each: Amount, *, first_call: bool = False) -> str:
        cost = f"{round(each.tokens):,} tokens"
        if self.usd is not None:
            cost = f"${each.usd:.4f} ({cost})"
        why = f"skipped: the run's budget cannot carry it ({self.describe()} spent); "
        if first_call:
            return why + f"a {kind} member's first call needs {cost} free, with its closing room"
        return why + f"a {kind} member costs at least {cost} by those that finished"

    def ended(self, member: str, *, ok: bool) -> None:
        """An admitted member ended (``ok``: it finished by itself, and what it cost
        teaches the estimate of its kind)."""
        a = self._admitted.pop(member, None)
        if a is not None and ok and a.calls:
            n = max(1, a.share)
            self._kinds.setdefault(a.kind, _Kind()).costs.append(
                Amount(a.spent.usd / n, a.spent.tokens / n)
            )
        self._signal()

    def _first_call(self, key: str, base: Amount, per_out: Amount, max_out: int) -> None:
        a = self._owner(key)
        if a is not None and a.calls == 0:
            self._kinds.setdefault(a.kind, _Kind()).first_call_room = (base, per_out, max_out)

    def _first_need(self, kind: str) -> Amount:
        """What a member's first call of ``kind`` needs free now: its input, its
        closing room and the least output bound it would be sent with."""
        room = (self._kinds.get(kind) or _Kind()).first_call_room
        if room is None:
            return Amount()
        base, per_out, max_out = room
        least = max_out
        if self.observed:
            least = min(max_out, max(MIN_OUTPUT, 2 * high(self.observed)))
        return base + _times(per_out, least)

    def learned(self, kind: str, cost: Amount) -> None:
        """A member of ``kind`` finished ``ok`` having spent ``cost`` (in an earlier life
        of the run: a resumed run's admission starts from what it knew)."""
        self._kinds.setdefault(kind, _Kind()).costs.append(cost)

    def _learn(self, key: str, used: Amount) -> None:
        a = self._owner(key)
        if a is None:
            return
        known = self._kinds.setdefault(a.kind, _Kind())
        if a.calls == 0:
            known.first_call = _most([known.first_call, used])
        a.calls += 1
        a.spent = a.spent + used
        held = self._held.get(key)
        if held is not None:
            known.closing = _most([known.closing, held])

    async def _next_change(self) -> None:
        if self._changed is None:
            self._changed = anyio.Event()
        await self._changed.wait()

    def _signal(self) -> None:
        if self._changed is not None:
            self._changed.set()
            self._changed = None

    def _refusal(self, member: str, estimate: Amount) -> str:
        spent = self.describe()
        why = f"run budget reached: {spent} spent; the next call (about ${estimate.usd:.4f}, "
        why += f"{round(estimate.tokens):,} tokens) would cross the hard line"
        if not self._hard_told:
            self._hard_told = True
            self._tell(f"budget: hard line reached ({spent}); members stop with what they have")
            self._note("budget_hard", member=member, detail=spent)
        return why

    def _tell(self, line: str) -> None:
        if self.say is not None:
            self.say(line)

    def _note(self, event: str, **fields: Any) -> None:
        if self.journal is not None:
            self.journal(event, **fields)


# -- the process's budgets, by run -------------------------------------------------
_BUDGETS: dict[str, RunBudget] = {}


def register(run_id: str, budget: RunBudget | None) -> None:
    """Make ``budget`` the run's (None: the run has none)."""
    if budget is None:
        _BUDGETS.pop(run_id, None)
    else:
        _BUDGETS[run_id] = budget


def run_budget(run_id: str) -> RunBudget | None:
    """The run's budget in this process (None: it has none)."""
    return _BUDGETS.get(run_id)


class Reserves(Protocol):
    """What a member's calls reserve from: the run's :class:`RunBudget`, or on a
    cluster node its relay to the coordinator's (:mod:`coordinator.nodes.node_budget`)."""

    closing_tokens: int

    async def reserve(
        self, member: str, estimate: Amount, *, closing: bool, hold: Amount | None = None
    ) -> int: ...

    def settle(
        self, seq: int, member: str, used: Amount | None, hold: Amount | None = None
    ) -> None: ...

    def release(self, member: str) -> None: ...


def budgeted(model: Model, run_id: str, member: str, budget: Reserves | None = None) -> Model:
    """``model`` with its calls reserved against ``budget``, else the run's budget in
    this process, when it has one."""
    budget = budget or _BUDGETS.get(run_id)
    return model if budget is None else BudgetedModel(model, budget, member)


class BudgetedModel:
    """A model whose every call is reserved against the run's budget, then settled."""

    def __init__(self, inner: Model, budget: Reserves, member: str) -> None:
        self.inner, self.budget, self.member = inner, budget, member
        self.profile = inner.profile
        """The model in use: read again at every call (a member that switched to its
        fallback is priced as that one)."""
        self.offline = inner.offline
        self._last_size = 0
        self._cache_hit = False
        self._outputs: deque[int] = deque(maxlen=OBSERVED)
        """Output tokens of this member's answers."""
        self._cut = False
        """An answer of this member was cut at its output bound."""

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    @property
    def closing_tokens(self) -> int:
        """Output bound of this member's closing call (the run's ``closing_max_tokens``)."""
        return int(getattr(self.budget, "closing_tokens", CLOSING_TOKENS))

    def _output(self, tokens: int) -> Amount:
        return Amount(tokens * self.profile.output_per_mtok / 1_000_000, tokens)

    def estimate(self, request: ModelRequest) -> tuple[Amount, int]:
        """The call's reservation: its input at input price (what the previous call of
        this model cached, at the cache-read price) plus ``max_tokens`` of output; and the
        request's size."""
        size = self._size(request)
        return self._input(size) + self._output(request.max_tokens), size

    @staticmethod
    def _size(request: ModelRequest) -> int:
        body = {"system": request.system, "messages": request.messages, "tools": request.tools}
        return len(json.dumps(body, default=str))

    def _input(self, size: int) -> Amount:
        """A request of ``size`` bytes, as input (cached as the last call's was)."""
        tokens = estimate_bytes(size)
        cached = 0
        if self._cache_hit and size >= self._last_size:
            cached = self._last_size // CHARS_PER_TOKEN
        fresh = tokens - cached
        p = self.profile
        usd = (fresh * p.input_per_mtok + cached * p.cache_read_per_mtok) / 1_000_000
        return Amount(usd, fresh + cached * cache_weight(p))

    def _hold_input(self, request: ModelRequest, size: int) -> Amount:
        """The input of the closing call a regular call holds room for, before its answer:
        the call's own input estimate; for a member's first call of a model whose answers
        in this run read the prompt cache, its system prompt and tools (the prefix every
        member of a kind shares) priced as cache reads. What is held is an estimate, not
        the call's own worst case, which its reservation keeps whole."""
        given = self._input(size)
        if self._cache_hit or self.profile.name not in getattr(self.budget, "cached_models", ()):
            return given
        prefix = len(json.dumps({"system": request.system, "tools": request.tools}, default=str))
        shared = min(estimate_bytes(prefix), round(given.tokens))
        p = self.profile
        off = Amount(shared * (p.input_per_mtok - p.cache_read_per_mtok) / 1_000_000, 0)
        return given - off - Amount(0, shared * (1 - cache_weight(p)))

    def _after(self, given: Amount, usage: Any, closing_out: int) -> Amount:
        """The closing call's room once this call answered: this call's input - priced
        as the API says it will be read next time (what it read from or wrote to the
        prompt cache, as cache reads; the rest as input) when it used the cache at all,
        else as it was estimated - its answer read again as input, and ``closing_out``
        tokens of output."""
        out = usage.output_tokens or 0
        p = self.profile
        again = Amount(out * p.input_per_mtok / 1_000_000, out)
        read = getattr(usage, "cache_read_input_tokens", None) or 0
        write = getattr(usage, "cache_creation_input_tokens", None) or 0
        if read or write:
            fresh = usage.input_tokens or 0
            cached = read + write
            given = Amount(
                (fresh * p.input_per_mtok + cached * p.cache_read_per_mtok) / 1_000_000,
                fresh + cached * cache_weight(p),
            )
        return given + again + self._output(closing_out)

    def least_output(self, max_tokens: int) -> int:
        """The least output bound this member's next call may be sent with: twice what
        its answers (else the run's) produce at the 95th percentile, at least
        :data:`MIN_OUTPUT`; the whole ``max_tokens`` before anything is known, and after
        an answer of this member was cut at its bound."""
        seen = list(self._outputs)
        if len(seen) < SURE_CALLS:
            seen = list(getattr(self.budget, "observed", ()) or ()) or seen
        if self._cut or not seen:
            return max_tokens
        return min(max_tokens, max(MIN_OUTPUT, 2 * high(seen)))

    async def complete(self, request: ModelRequest) -> ModelResponse:
        self.profile, self.offline = self.inner.profile, self.inner.offline
        size = self._size(request)
        given = self._input(size)
        per_out = self._output(1)
        # The loop forces a named tool only in the closing call after a limit
        # (subagents.loop.closing): that call spends what its member held for it.
        closing = (request.tool_choice or {}).get("type") == "tool"
        # The closing call is sent with at most closing_tokens, and never with more
        # than this member's calls may produce.
        closing_out = min(self.closing_tokens, request.max_tokens)
        hold = None if closing else self._hold_input(request, size) + self._output(closing_out)
        upto = getattr(self.budget, "reserve_upto", None)
        if upto is not None:
            bound = request.max_tokens
            seq, out = await upto(
                self.member,
                given,
                per_out,
                max_out=bound,
                min_out=min(bound, MIN_OUTPUT) if closing else lambda: self.least_output(bound),
                closing=closing,
                hold=hold,
            )
            if out < request.max_tokens:  # what the line can carry: the call is bounded so
                request = request.model_copy(update={"max_tokens": out})
        else:  # a relay to the run's budget elsewhere: the call's whole bound
            estimate = given + self._output(request.max_tokens)
            seq = await self.budget.reserve(self.member, estimate, closing=closing, hold=hold)
        used: Amount | None = None
        after: Amount | None = None
        try:
            response = await self.inner.complete(request)
            usage = response.message.usage
            # Priced as the model that answered (a fallback may have taken the call).
            self.profile, self.offline = self.inner.profile, self.inner.offline
            used = usage_amount(usage, self.profile)
            after = None if closing else self._after(given, usage, closing_out)
            out_tokens = usage.output_tokens or 0
            self._outputs.append(out_tokens)
            observe = getattr(self.budget, "observe", None)
            if observe is not None:
                read = getattr(usage, "cache_read_input_tokens", None) or 0
                observe(out_tokens, cached=self.profile.name if read else None)
            if response.message.stop_reason == "max_tokens":
                self._cut = True  # from now on, this member's calls get their whole bound
            self._cache_hit = bool(getattr(usage, "cache_read_input_tokens", 0))
            self._last_size = size
            return response
        finally:
            # A call that failed (retries spent, cancelled) has no usage to settle with:
            # its reservation is given back.
            self.budget.settle(seq, self.member, used, after)

    async def count_tokens(self, request: ModelRequest) -> int | None:
        return await self.inner.count_tokens(request)

    async def aclose(self) -> None:
        self.budget.release(self.member)
        await self.inner.aclose()
