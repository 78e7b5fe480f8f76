"""The rate governor: many models on one key against a fake API that limits like the real one.

Each test runs several real ``AnthropicModel`` clients at once against
``FakeMessagesAPI(limits=...)`` on 127.0.0.1, with the limits' "minute" shrunk to a
few seconds so the test sees many minutes' worth of pacing.
"""

from __future__ import annotations

import time
from typing import Any

import anyio
import pytest

from subagents.fake_api import FakeMessagesAPI, text
from subagents.fake_api.limits import Overload, RateLimits
from subagents.model.base import ModelRequest
from subagents.model.claude import AnthropicModel
from subagents.model.governor import RateGovernor
from subagents.trace import RateWait

pytestmark = pytest.mark.anyio
MODEL = "claude-sonnet-5"


def request(size: int = 10) -> ModelRequest:
    words = "word " * size
    return ModelRequest(messages=[{"role": "user", "content": words}], max_tokens=64)


class _Sink:
    """A trace writer stand-in that keeps the rate_wait events."""

    def __init__(self) -> None:
        self.waits: list[RateWait] = []

    def emit(self, event: Any) -> None:
        if isinstance(event, RateWait):
            self.waits.append(event)


async def _fan_out(
    api: FakeMessagesAPI,
    governor: RateGovernor | None,
    members: int,
    calls: int,
    size: int = 10,
    max_retries: int = 4,
) -> tuple[list[str], list[_Sink]]:
    """``members`` models each making ``calls`` calls; each member's outcome."""
    outcomes = ["?"] * members
    sinks = [_Sink() for _ in range(members)]

    async def member(i: int) -> None:
        model = AnthropicModel(
            MODEL,
            api_key="test",
            base_url=api.url,
            backoff_s=0.05,
            max_retries=max_retries,
            governor=governor,
            trace=sinks[i],  # type: ignore[arg-type]
        )
        try:
            for _ in range(calls):
                await model.complete(request(size))
            outcomes[i] = "ok"
        except Exception as exc:  # the outcome is what the test checks
            outcomes[i] = f"failed: {exc}"
        finally:
            await model.aclose()

    async with anyio.create_task_group() as tg:
        for i in range(members):
            tg.start_soon(member, i)
    return outcomes, sinks


async def test_sixteen_members_under_a_request_limit_all_finish_paced_by_the_headers() -> None:
    # 30 requests a 3 s "minute" = 10 a second; 16 members x 4 calls = 64 calls.
    limits = RateLimits(requests_per_minute=30, minute_s=3.0)
    with FakeMessagesAPI(lambda body: text("ok"), limits=limits) as api:
        started = time.monotonic()
        outcomes, sinks = await _fan_out(api, RateGovernor(), members=16, calls=4)
        elapsed = time.monotonic() - started
        assert api.limiter is not None
        rejected = api.limiter.rejected
    assert outcomes == ["ok"] * 16
    # The bucket holds 30 at the start and refills 10 a second: 34 more take >= 3.4 s;
    # near the limit means not much longer.
    assert 3.0 <= elapsed < 9.0
    # Paced from the headers, the account sees few 429s (the first calls went out
    # before any header was read; a busy machine's late answers cost a few more: 0-3 on
    # a quiet machine, 12 once in a fresh clone's suite beside image builds). Unpaced,
    # the 64 calls go out in well under a second against a bucket of 30: about 30
    # would be refused, so a quarter of the calls still tells the two apart.
    assert rejected <= 16
    waits = [w for s in sinks for w in s.waits]
    assert waits and any("requests per minute" in w.reason for w in waits)


async def test_a_burst_of_overloads_pauses_everyone_and_fails_no_one() -> None:
    limits = RateLimits(overloads=[Overload(start_s=0.0, end_s=2.5)])
    with FakeMessagesAPI(lambda body: text("ok"), limits=limits) as api:
        outcomes, sinks = await _fan_out(api, RateGovernor(), members=12, calls=2, max_retries=1)
        assert api.limiter is not None
        overloaded = api.limiter.overloaded
    assert outcomes == ["ok"] * 12
    # Everyone pauses on the first 529s instead of each member hammering the API:
    # 12 members retrying alone with 1 s-4 s backoffs would send about 36 in 2.5 s.
    assert overloaded <= 30
    assert any("overloaded" in w.reason for s in sinks for w in s.waits)


async def test_input_tokens_per_minute_are_paced_before_the_call_goes_out() -> None:
    # Each request is about 500 uncached input tokens; 2,000 a 2 s "minute".
    limits = RateLimits(input_tokens_per_minute=2000, minute_s=2.0)
    with FakeMessagesAPI(lambda body: text("ok"), limits=limits) as api:
        governor = RateGovernor()
        started = time.monotonic()
        outcomes, sinks = await _fan_out(api, governor, members=4, calls=4, size=400)
        elapsed = time.monotonic() - started
        assert api.limiter is not None
        rejected = api.limiter.rejected
    assert outcomes == ["ok"] * 4
    assert elapsed >= 4.0  # 16 x ~500 = ~8,000 tokens: the 2,000 at hand, then 1,000/s
    assert rejected <= 4
    assert any("input tokens per minute" in w.reason for s in sinks for w in s.waits)


async def test_a_429_pauses_every_member_for_its_retry_after() -> None:
    governor = RateGovernor()
    permit = await governor.acquire(10)
    pause = governor.release(permit, status=429, retry_after=0.6)
    assert pause == pytest.approx(0.6)
    started = time.monotonic()
    permits = []
    for _ in range(3):
        permits.append(await governor.acquire(10))
    assert time.monotonic() - started >= 0.55
    assert all("429" in p.reason for p in permits[:1])
    assert governor.window == pytest.approx(32.0)  # halved from 64


async def test_a_long_overload_never_overflows_the_pause() -> None:
    # Thousands of 529s in a row (a model down for the whole patience): the backoff's
    # exponent stays bounded and the pause at its cap; no OverflowError.
    governor = RateGovernor()
    for _ in range(5_000):
        permit = await governor.acquire(100, 100)
        pause = governor.release(permit, status=529)
        governor.paused_until = 0.0  # as if the pause had passed
    assert 0 < pause <= 60.0
