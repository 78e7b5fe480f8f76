"""One rate governor per API key and endpoint: every model call of every member asks it first.

Why one shared governor rather than each member retrying alone: an account's limits
(requests, input tokens and output tokens per minute) are shared by every member
that uses the key. Members retrying independently each learn the limit by hitting
it, each back off on their own clock, and a wide fan-out keeps the account in 429s
until members run out of retries. A governor sees every call and every answer:

- **It reads what the API says about the account.** Every response carries
  ``anthropic-ratelimit-{requests,input-tokens,output-tokens}-{limit,remaining,reset}``.
  The buckets refill continuously; the refill rate is taken from the headers
  themselves ((limit - remaining) / (reset - now)), falling back to limit per 60 s,
  so the governor paces correctly whatever the account's tier. Before a call goes
  out it reserves one request, the call's estimated uncached input tokens and its
  expected output tokens from those buckets, waiting (in first-come order) until they
  are there; a response's headers replace the estimate, less what calls sent after
  it still hold.
- **One 429 or 529 pauses every caller.** The pause lasts the response's
  ``retry-after``; 529 ``overloaded_error`` has none, so the pause doubles with each
  overload in a row (1 s to 60 s) and resets on the first success. Callers never fail
  for a 429/529 while the governor's patience allows (the member's own deadline still
  ends it): a rate limit is a reason to wait, not a member's failure.
- **Adaptive concurrency** (additive increase, multiplicative decrease, as TCP's
  congestion control and the AIMD limiters of service meshes do): each 429/529 halves
  the calls allowed in flight (never below 1), each success grows it by 1/limit, up to
  ``max_concurrency``. Header pacing keeps a well-described account out of 429s; the
  window protects against what the headers do not show (529 overloads, limits shared
  with processes outside this one).

Waiting is visible: :meth:`RateGovernor.acquire` returns how long a call waited and
why, and :class:`~subagents.model.claude.AnthropicModel` records it as a ``rate_wait``
trace event that the live table and ``fleet trace`` show.

Scope: one governor per (endpoint, key) in a process (:func:`governor_for`), so two
runs started from one script share it too - they share the account. On a cluster the
members run in the nodes' processes: there the run installs a source
(:func:`use_source`) that hands out proxies of one governor for the whole run
(:mod:`coordinator.nodes.run_governor`), so the nodes share one view of the account.
"""

from __future__ import annotations

import email.utils
import hashlib
import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Protocol

import anyio
import anyio.lowlevel

_DIMENSIONS = ("requests", "input-tokens", "output-tokens")
_MIN_PAUSE_S = 1.0
_MAX_PAUSE_S = 60.0
_NOTICEABLE_S = 0.5
"""A wait this long is shown while it lasts (the live table), not only afterwards."""


@dataclass
class _Bucket:
    """What the governor believes of one of the account's buckets."""

    limit: float
    level: float
    """Believed available at ``at`` (may be negative after reservations)."""
    rate: float
    """Refill per second."""
    at: float

    def available(self, now: float) -> float:
        return min(self.limit, self.level + (now - self.at) * self.rate)

    def wait_for(self, amount: float, now: float) -> float:
        need = min(amount, self.limit) - self.available(now)
        return 0.0 if need <= 0 else need / self.rate

    def take(self, amount: float, now: float) -> None:
        self.level = self.available(now) - amount
        self.at = now


@dataclass
class Permit:
    """One admitted call: what it reserved, and how long it waited for admission."""

    seq: int
    cost: dict[str, float]
    waited_s: float = 0.0
    reason: str = ""
    """Why it waited longest ('' when it did not wait)."""
    done: bool = False


@dataclass
class RateGovernor:
    """Admits model calls for one API key; shared by every member that uses the key."""

    max_concurrency: int = 64
    """Most calls in flight at once, whatever the headers allow."""
    patience_s: float = 900.0
    """How long one call may keep waiting on 429/529 before it fails (the member's own
    deadline usually ends it first)."""
    expected_output: float = 1024.0
    """Output tokens a call is expected to produce before any has been seen."""
    window: float = field(init=False)
    """Calls allowed in flight now (adaptive)."""
    paused_until: float = 0.0
    pause_reason: str = ""
    _buckets: dict[str, _Bucket] = field(default_factory=dict)
    _in_flight: dict[int, Permit] = field(default_factory=dict)
    _seq: int = 0
    _overloads: int = 0
    """529 episodes in a row (reset by a success)."""
    _last_reason: str = "calls ahead"
    """Why the caller at the head of the queue last waited."""
    _episode: int = -1
    """The last call admitted when the current 429/529 episode began."""
    _admit: anyio.Lock | None = None
    _changed: anyio.Event | None = None
    _loop: object = None
    """The event loop the lock and event belong to (a process may run several in turn)."""
    stats: dict[str, float] = field(default_factory=dict)
    """Counters: calls, limited (429), overloaded (529), waited_s."""

    def __post_init__(self) -> None:
        self.window = float(self.max_concurrency)
        self.stats = {"calls": 0, "limited": 0, "overloaded": 0, "waited_s": 0.0}

    # -- admission -------------------------------------------------------------
    async def acquire(
        self,
        input_tokens: int,
        max_tokens: int | None = None,
        on_wait: Callable[[str, float], None] | None = None,
    ) -> Permit:
        """Wait until a call of this size may go out (first come, first served), then
        reserve it. ``input_tokens``: the call's estimated uncached input; ``on_wait(
        reason, seconds)`` is told once when the call will wait a noticeable time."""
        output = min(float(max_tokens or self.expected_output), self.expected_output)
        cost = {"requests": 1.0, "input-tokens": float(input_tokens), "output-tokens": output}
        started = time.monotonic()
        reason = ""
        # The lock is FIFO: the caller at its head waits for capacity, the rest queue
        # behind it, so a large call is not starved by a stream of small ones.
        async with self._lock():
            while True:
                now = time.monotonic()
                wait, why = self._wait(cost, now)
                if wait <= 0:
                    break
                if not reason and on_wait is not None and wait >= _NOTICEABLE_S:
                    on_wait(why, wait)
                reason = reason or why
                self._last_reason = why
                with anyio.move_on_after(wait):
                    await self._next_change()
            self._seq += 1
            permit = Permit(self._seq, cost)
            for name, amount in cost.items():
                if name in self._buckets:
                    self._buckets[name].take(amount, now)
            self._in_flight[permit.seq] = permit
        permit.waited_s = time.monotonic() - started
        if permit.waited_s >= 0.001:
            # A call that only queued behind others waited for what they waited for.
            permit.reason = reason or f"queued behind other calls ({self._last_reason})"
        self.stats["calls"] += 1
        self.stats["waited_s"] += permit.waited_s
        return permit

    def _wait(self, cost: Mapping[str, float], now: float) -> tuple[float, str]:
        """Seconds to wait before ``cost`` may go out, and why (0: go now)."""
        if self.paused_until > now:
            return self.paused_until - now, self.pause_reason
        if len(self._in_flight) >= max(1, int(self.window)):
            # Woken when a call ends; the timeout only guards against a lost wake-up.
            return 5.0, f"{len(self._in_flight)} calls in flight (adaptive limit)"
        waits = [
            (bucket.wait_for(cost[name], now), name)
            for name, bucket in self._buckets.items()
            if name in cost
        ]
        wait, name = max(waits, default=(0.0, ""))
        if wait <= 0:
            return 0.0, ""
        return wait, f"{name.replace('-', ' ')} per minute"

    def _lock(self) -> anyio.Lock:
        loop = anyio.lowlevel.current_token()
        if self._admit is None or self._loop != loop:
            # A new event loop (a second anyio.run in one process): the old loop's calls
            # are gone with it.
            # fast_acquire: an uncontended admission goes on without a trip through the
            # event loop (one a model call); waiters still queue in order.
            lock = anyio.Lock(fast_acquire=True)
            self._loop, self._admit, self._changed = loop, lock, anyio.Event()
            self._in_flight.clear()
        return self._admit

    async def _next_change(self) -> None:
        assert self._changed is not None
        await self._changed.wait()

    def _signal(self) -> None:
        if self._changed is not None:
            self._changed.set()
            self._changed = anyio.Event()

    # -- outcomes --------------------------------------------------------------
    def release(
        self,
        permit: Permit,
        *,
        status: int,
        headers: Mapping[str, str] | None = None,
        retry_after: float | None = None,
        input_tokens: int | None = None,
        output_tokens: int | None = None,
    ) -> float:
        """Record how a call ended: its HTTP status (0: no answer), the response headers,
        and, on success, the tokens it really used. Returns the pause a 429/529 set (0
        otherwise)."""
        if permit.done:
            return 0.0
        permit.done = True
        pause = 0.0
        self._in_flight.pop(permit.seq, None)
        now = time.monotonic()
        if headers:
            self._learn(headers, permit, now)
        if status == 200:
            self._overloads = 0
            self.window = min(float(self.max_concurrency), self.window + 1.0 / self.window)
            if output_tokens is not None:
                self.expected_output = 0.8 * self.expected_output + 0.2 * max(1, output_tokens)
                self._correct("output-tokens", permit, output_tokens, now, headers)
            if input_tokens is not None:
                self._correct("input-tokens", permit, input_tokens, now, headers)
        elif status in (429, 529):
            # One episode per pause: answers to calls that were already in flight when
            # the first 429/529 came back say nothing new, so they neither halve the
            # window again nor lengthen the pause (TCP cuts its window once per round
            # trip for the same reason).
            fresh = permit.seq > self._episode
            if fresh:
                self._episode = self._seq
                self.window = max(1.0, self.window / 2)
            if status == 429:
                self.stats["limited"] += 1
                pause = retry_after if retry_after is not None else _MIN_PAUSE_S
                why = "rate limited (429)"
            else:
                self.stats["overloaded"] += 1
                self._overloads += fresh
                # The exponent is capped: a long overload (thousands of 529s) must not
                # overflow a float; the pause is capped below that anyway.
                doublings = min(max(0, self._overloads - 1), 32)
                backoff = min(_MAX_PAUSE_S, _MIN_PAUSE_S * 2**doublings)
                pause = retry_after if retry_after is not None else backoff
                why = "API overloaded (529)"
            pause = min(max(pause, 0.0), _MAX_PAUSE_S)
            if now + pause > self.paused_until:
                self.paused_until = now + pause
                self.pause_reason = f"{why}, retry-after {pause:g} s"
        else:
            self._refund(permit, now)
        self._signal()
        return pause

    def _learn(self, headers: Mapping[str, str], permit: Permit, now: float) -> None:
        """Replace the belief about each bucket with what the API reports, less what
        calls sent after this one hold (the API had not seen them yet)."""
        wall = time.time()
        for name in _DIMENSIONS:
            limit = _number(headers.get(f"anthropic-ratelimit-{name}-limit"))
            remaining = _number(headers.get(f"anthropic-ratelimit-{name}-remaining"))
            if limit is None or remaining is None or limit <= 0:
                continue
            reset = _timestamp(headers.get(f"anthropic-ratelimit-{name}-reset"))
            rate = limit / 60.0
            if reset is not None and reset - wall > 0.05 and limit > remaining:
                rate = max(rate / 100, (limit - remaining) / (reset - wall))
            later = sum(
                p.cost.get(name, 0.0) for seq, p in self._in_flight.items() if seq > permit.seq
            )
            self._buckets[name] = _Bucket(limit, remaining - later, rate, now)

    def _correct(
        self,
        name: str,
        permit: Permit,
        used: float,
        now: float,
        headers: Mapping[str, str] | None,
    ) -> None:
        """A call used other than it reserved: give back or take the difference (unless
        the headers already told the truth)."""
        bucket = self._buckets.get(name)
        if bucket is None or (headers and f"anthropic-ratelimit-{name}-remaining" in headers):
            return
        bucket.take(used - permit.cost.get(name, 0.0), now)

    def _refund(self, permit: Permit, now: float) -> None:
        """A call that failed without an answer used nothing: give its reservation back."""
        for name, amount in permit.cost.items():
            if name in self._buckets:
                self._buckets[name].take(-amount, now)

    def cancel(self, permit: Permit) -> None:
        """The call was abandoned before an answer (cancelled): release its slot."""
        if not permit.done:
            self.release(permit, status=0)

    def snapshot(self) -> dict[str, float]:
        """The governor's state for a bench or a test: window, pause, buckets' levels."""
        now = time.monotonic()
        out = {"window": self.window, "in_flight": float(len(self._in_flight))}
        out["paused_s"] = max(0.0, self.paused_until - now)
        for name, bucket in self._buckets.items():
            out[name] = bucket.available(now)
        return out


def _number(value: str | None) -> float | None:
    if value is None:
        return None
    try:
        number = float(value)
    except ValueError:
        return None
    return number if math.isfinite(number) else None


def _timestamp(value: str | None) -> float | None:
    """An RFC 3339 (or HTTP-date) reset time as Unix time; None when unreadable."""
    if not value:
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
    except ValueError:
        pass
    try:
        parsed = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return parsed.timestamp()


class Governor(Protocol):
    """What a model adapter needs of a governor: :class:`RateGovernor` in this process,
    or a proxy of the run's one governor on a cluster node."""

    patience_s: float

    async def acquire(
        self,
        input_tokens: int,
        max_tokens: int | None = None,
        on_wait: Callable[[str, float], None] | None = None,
    ) -> Permit: ...

    def release(
        self,
        permit: Permit,
        *,
        status: int,
        headers: Mapping[str, str] | None = None,
        retry_after: float | None = None,
        input_tokens: int | None = None,
        output_tokens: int | None = None,
    ) -> float: ...

    def cancel(self, permit: Permit) -> None: ...


_GOVERNORS: dict[str, RateGovernor] = {}
_SOURCE: Callable[[str], Governor] | None = None


def key_digest(base_url: str, api_key: str | None) -> str:
    """Who shares a governor: an endpoint and key, as a hash (the key is never kept)."""
    return hashlib.sha256(f"{base_url}\0{api_key or ''}".encode()).hexdigest()[:16]


def use_source(source: Callable[[str], Governor] | None) -> None:
    """Take this process's governors from ``source(digest)`` (a cluster node's proxies
    of the run's governor); None: back to this process's own."""
    global _SOURCE
    _SOURCE = source


def governor_for(base_url: str, api_key: str | None) -> Governor:
    """The governor for this endpoint and key: the process's own (made on first use),
    or the run's, where a source was installed."""
    digest = key_digest(base_url, api_key)
    if _SOURCE is not None:
        return _SOURCE(digest)
    governor = _GOVERNORS.get(digest)
    if governor is None:
        governor = _GOVERNORS[digest] = RateGovernor()
    return governor
