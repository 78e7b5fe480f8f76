"""Rate limits for the fake server, as the real Messages API enforces and reports them.

The real API limits an organization per minute in three dimensions - requests,
input tokens, output tokens - with token buckets that refill continuously (a limit
of 60 a minute gives one back every second, not 60 at the top of each minute).
Cache reads do not count against the input-token limit; cache writes do. Every
response carries ``anthropic-ratelimit-{requests,input-tokens,output-tokens,tokens}-
{limit,remaining,reset}`` (reset: RFC 3339, when the bucket would be full again), and
a request over a limit gets 429 ``rate_limit_error`` with ``retry-after`` (whole
seconds). Independently of any limit, the API sheds load with 529
``overloaded_error``, which carries no ``retry-after``: :class:`Overload` windows
reproduce such bursts.

``minute_s`` shrinks the minute for tests (a 50-a-minute limit over a 6 s "minute"
behaves like the real one ten times faster); the headers' reset times and
``retry-after`` follow the shrunken clock, so a client that reads them paces
itself correctly at either speed.
"""

from __future__ import annotations

import math
import threading
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime

from pydantic import BaseModel, ConfigDict, Field


class Overload(BaseModel):
    """A window of 529 ``overloaded_error`` answers, in seconds since the ``after``-th
    ``/v1/messages`` request (not the server's start, so a test's timing does not
    depend on how long its members took to begin)."""

    model_config = ConfigDict(extra="forbid")

    start_s: float = Field(ge=0)
    end_s: float = Field(gt=0)
    after: int = Field(default=1, ge=1)
    """The request whose arrival starts this window's clock."""


class RateLimits(BaseModel):
    """Per-minute limits of one fake organization (None: that dimension is unlimited)."""

    model_config = ConfigDict(extra="forbid")

    requests_per_minute: int | None = Field(default=None, gt=0)
    input_tokens_per_minute: int | None = Field(default=None, gt=0)
    """Uncached input tokens (``input_tokens`` + cache writes), as the real API counts."""
    output_tokens_per_minute: int | None = Field(default=None, gt=0)
    minute_s: float = Field(default=60.0, gt=0)
    """Length of the limits' "minute" in real seconds (shorter in tests)."""
    overloads: list[Overload] = Field(default_factory=list)


@dataclass
class _Bucket:
    limit: int
    refill_s: float
    """Seconds to refill from empty to full."""
    level: float = -1.0
    at: float = field(default_factory=time.monotonic)

    def __post_init__(self) -> None:
        if self.level < 0:
            self.level = float(self.limit)

    def refill(self, now: float) -> None:
        self.level = min(self.limit, self.level + (now - self.at) * self.limit / self.refill_s)
        self.at = now

    def wait_for(self, amount: float) -> float:
        """Seconds until ``amount`` is available (an amount over the limit: until full)."""
        need = min(amount, self.limit) - self.level
        return max(0.0, need * self.refill_s / self.limit)

    def full_in(self) -> float:
        return (self.limit - self.level) * self.refill_s / self.limit


@dataclass
class Verdict:
    """What the limiter decided for one request."""

    status: int = 200
    """200, 429 (over a limit) or 529 (an overload window)."""
    message: str = ""
    retry_after: float | None = None
    headers: dict[str, str] = field(default_factory=dict)


class Limiter:
    """Thread-safe buckets for one :class:`RateLimits`; the server asks it per request."""

    _NAMES = (
        ("requests", "requests_per_minute"),
        ("input-tokens", "input_tokens_per_minute"),
        ("output-tokens", "output_tokens_per_minute"),
    )

    def __init__(self, limits: RateLimits) -> None:
        self.limits = limits
        self._lock = threading.Lock()
        self._arrivals: list[float] = []
        """When each of the first requests came (as many as the windows need)."""
        self._keep = max((w.after for w in limits.overloads), default=0)
        self._buckets: dict[str, _Bucket] = {}
        for name, attr in self._NAMES:
            limit = getattr(limits, attr)
            if limit is not None:
                self._buckets[name] = _Bucket(limit, limits.minute_s)
        self.rejected = 0
        """429s sent."""
        self.overloaded = 0
        """529s sent."""
        self.admitted = 0
        """Requests let through."""
        self.input_admitted = 0
        """Uncached input tokens of the requests let through."""

    def admit(self, input_tokens: int) -> Verdict:
        """Take one request and its uncached input tokens, or say why not (429/529)."""
        now = time.monotonic()
        with self._lock:
            if len(self._arrivals) < self._keep:
                self._arrivals.append(now)
            for window in self.limits.overloads:
                if len(self._arrivals) < window.after:
                    continue
                if window.start_s <= now - self._arrivals[window.after - 1] < window.end_s:
                    self.overloaded += 1
                    return Verdict(529, "Overloaded", headers=self._headers())
            for b in self._buckets.values():
                b.refill(now)
            want = {"requests": 1.0, "input-tokens": float(input_tokens), "output-tokens": 1.0}
            short = [
                (b.wait_for(want[name]), name)
                for name, b in self._buckets.items()
                if b.level < min(want[name], b.limit)
            ]
            if short:
                wait, name = max(short)
                self.rejected += 1
                return Verdict(
                    429,
                    f"This request would exceed the rate limit for your organization "
                    f"of {self._buckets[name].limit} {name.replace('-', ' ')} per minute.",
                    retry_after=float(max(1, math.ceil(wait))),
                    headers=self._headers(),
                )
            for name, b in self._buckets.items():
                if name != "output-tokens":
                    b.level -= want[name]
            self.admitted += 1
            self.input_admitted += input_tokens
            return Verdict(headers=self._headers())

    def spend_output(self, tokens: int) -> dict[str, str]:
        """Charge a finished answer's output tokens; the headers after that."""
        now = time.monotonic()
        with self._lock:
            bucket = self._buckets.get("output-tokens")
            if bucket is not None:
                bucket.refill(now)
                bucket.level -= tokens  # may go negative: the next requests wait it out
            return self._headers()

    def _headers(self) -> dict[str, str]:
        headers: dict[str, str] = {}
        for name, b in self._buckets.items():
            headers.update(_triple(name, b))
        tokens = [b for n, b in self._buckets.items() if n != "requests"]
        if tokens:  # the most restrictive token limit, as the real API reports it
            tightest = min(tokens, key=lambda b: b.level / b.limit)
            headers.update(_triple("tokens", tightest))
        return headers


def _triple(name: str, bucket: _Bucket) -> dict[str, str]:
    # Milliseconds, which RFC 3339 allows: over a shrunken minute a client derives the
    # refill rate from (limit - remaining) / (reset - now), and whole seconds would blur it.
    reset = datetime.fromtimestamp(time.time() + bucket.full_in(), UTC)
    prefix = f"anthropic-ratelimit-{name}"
    return {
        f"{prefix}-limit": str(bucket.limit),
        f"{prefix}-remaining": str(max(0, int(bucket.level))),
        f"{prefix}-reset": reset.strftime("%Y-%m-%dT%H:%M:%S.")
        + f"{reset.microsecond // 1000:03d}Z",
    }
