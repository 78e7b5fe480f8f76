"""Members against an account's limits: how many fail, and how much of the limit is used.

N members (each a real ``AnthropicModel``, the real ``anthropic`` client) each hold a
conversation that grows by about ``--chunk`` uncached input tokens a turn and make
``--calls`` calls, all at once, against the fake Messages API on 127.0.0.1 limited
like a real account: ``--rpm`` requests and ``--itpm`` input tokens per minute, token
buckets that refill continuously, the real ``anthropic-ratelimit-*`` headers, 429 with
``retry-after``. ``--overload START:END`` adds a window of 529s (seconds after the
first request). The limits' minute lasts ``--minute-s`` real seconds (6 by default:
ten times faster than an account, every figure scaled alike).

Two ways are timed one after the other:

- ``governor``: this tree's model adapter, every member behind one rate governor;
- ``before``: the model adapter of ``--before REV`` (default: the commit before the
  governor), loaded from git, each member retrying alone (4 retries, ``retry-after``
  honoured for itself only).

Printed per way: members ok / failed, 429s and 529s the API sent, wall time, and the
throughput from the first call to the last as a share of the limits (requests and
input tokens per minute; the full bucket at the start is subtracted, as it is a burst,
not a rate).

Usage: ``.venv/bin/python bench/ratelimit.py [--members 32] [--calls 10] [--rpm 50]
[--itpm 400000] [--chunk 6000] [--minute-s 6] [--overload 10:40] [--only governor]``
"""

from __future__ import annotations

import argparse
import importlib.util
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import ModuleType
from typing import Any

import anyio

# The script's own directory holds bench/sandbox.py, which would shadow the sandbox
# package: put the repository first.
ROOT = Path(__file__).resolve().parent.parent
sys.path[0] = str(ROOT)

BEFORE = "5124eca"
"""The last commit whose adapter retried each member alone."""
MODEL = "claude-sonnet-5"


def _old_adapter(rev: str) -> ModuleType:
    """``subagents/model/claude.py`` as it was at ``rev``, imported beside today's."""
    source = subprocess.run(
        ["git", "-C", str(ROOT), "show", f"{rev}:subagents/model/claude.py"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    path = Path(tempfile.mkdtemp(prefix="fleet-bench-")) / "claude_before.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location("claude_before", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


async def _member(make: Any, chunk: int, calls: int, i: int, out: list[str]) -> None:
    from subagents.model.base import ModelRequest

    model = make()
    messages: list[dict[str, Any]] = []
    try:
        for turn in range(calls):
            # About `chunk` tokens of new text a turn (4 characters a token).
            words = f"member {i} turn {turn} " + "lorem " * (chunk * 4 // 6)
            messages.append({"role": "user", "content": words})
            response = await model.complete(ModelRequest(messages=messages, max_tokens=64))
            messages.append({"role": "assistant", "content": response.message.content[0].text})
        out[i] = "ok"
    except Exception as exc:  # the figure is how many members end this way
        out[i] = f"failed: {str(exc)[:120]}"
    finally:
        await model.aclose()


def run_once(way: str, args: argparse.Namespace, before: ModuleType | None) -> dict[str, Any]:
    from subagents.fake_api import FakeMessagesAPI, Overload, RateLimits, text
    from subagents.model.claude import AnthropicModel
    from subagents.model.governor import RateGovernor

    overloads = []
    if args.overload:
        start, end = (float(x) for x in args.overload.split(":"))
        overloads.append(Overload(start_s=start, end_s=end))
    limits = RateLimits(
        requests_per_minute=args.rpm,
        input_tokens_per_minute=args.itpm,
        minute_s=args.minute_s,
        overloads=overloads,
    )
    outcomes = ["?"] * args.members
    with FakeMessagesAPI(lambda body: text("ok"), limits=limits) as api:
        api.record = lambda entry: None  # type: ignore[method-assign]  # keep no bodies
        governor = RateGovernor()

        def make() -> Any:
            if way == "before":
                assert before is not None
                return before.AnthropicModel(MODEL, api_key="bench", base_url=api.url)
            return AnthropicModel(MODEL, api_key="bench", base_url=api.url, governor=governor)

        async def main() -> None:
            async with anyio.create_task_group() as tg:
                for i in range(args.members):
                    tg.start_soon(_member, make, args.chunk, args.calls, i, outcomes)

        started = time.monotonic()
        anyio.run(main)
        wall = time.monotonic() - started
        limiter = api.limiter
        assert limiter is not None
        return {
            "way": way,
            "ok": outcomes.count("ok"),
            "failed": [o for o in outcomes if o != "ok"],
            "429": limiter.rejected,
            "529": limiter.overloaded,
            "wall": wall,
            "calls": limiter.admitted,
            "input": limiter.input_admitted,
        }


def _share(r: dict[str, Any], args: argparse.Namespace) -> tuple[float, float]:
    """Requests and input tokens per minute past the starting bucket, as shares of the
    limits."""
    minutes = r["wall"] / args.minute_s
    rpm = max(0, r["calls"] - args.rpm) / minutes
    itpm = max(0, r["input"] - args.itpm) / minutes
    return rpm / args.rpm, itpm / args.itpm


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--members", type=int, default=32)
    parser.add_argument("--calls", type=int, default=10)
    parser.add_argument("--rpm", type=int, default=50)
    parser.add_argument("--itpm", type=int, default=400_000)
    parser.add_argument("--chunk", type=int, default=6000, help="new input tokens a turn")
    parser.add_argument("--minute-s", type=float, default=6.0)
    parser.add_argument("--overload", default="", help="START:END seconds of 529s")
    parser.add_argument("--before", default=BEFORE, help="git revision of the old adapter")
    parser.add_argument("--only", choices=["governor", "before"])
    args = parser.parse_args()
    ways = [args.only] if args.only else ["before", "governor"]
    before = _old_adapter(args.before) if "before" in ways else None
    print(
        f"{args.members} members x {args.calls} calls, ~{args.chunk} new input tokens a "
        f"turn; limits {args.rpm} requests and {args.itpm:,} input tokens a minute "
        f"(a minute = {args.minute_s:g} s)"
        + (f"; 529s from {args.overload} s" if args.overload else ""),
        flush=True,
    )
    print(f"{'way':<9} {'ok':>4} {'failed':>6} {'429s':>5} {'529s':>5} {'wall':>7} "
          f"{'req/limit':>9} {'in/limit':>9}")  # fmt: skip
    for way in ways:
        r = run_once(way, args, before)
        req, inp = _share(r, args)
        print(
            f"{way:<9} {r['ok']:>4} {len(r['failed']):>6} {r['429']:>5} {r['529']:>5} "
            f"{r['wall']:>6.1f}s {req:>8.0%} {inp:>8.0%}",
            flush=True,
        )
        for reason in sorted(set(r["failed"]))[:3]:
            print(f"    {r['failed'].count(reason)} x {reason}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
