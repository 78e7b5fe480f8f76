"""Serve the fake Messages API until interrupted, for trying a job without a real model.

    python -m subagents.fake_api [--port 18080] [--script replies.json] [--policy echo]
        [--rpm N] [--itpm N] [--otpm N] [--minute-s 60] [--overload START:END ...]
    ANTHROPIC_BASE_URL=http://127.0.0.1:18080 ANTHROPIC_API_KEY=test fleet ...

``--rpm`` / ``--itpm`` / ``--otpm`` limit requests, input tokens and output tokens per
minute as a real account does (429 with ``retry-after``, the ``anthropic-ratelimit-*``
headers on every answer); ``--overload 10:40`` answers 529 from 10 s to 40 s after the
first request; ``--minute-s`` shortens the limits' minute for quick trials.

A script file is a JSON list of message dicts (``{"content": [...]}``) and faults
(``{"fault": "rate_limited" | "overloaded" | "server_error" | "overloaded_mid_stream"}``).
Without one, every request is answered by an offline policy (default ``echo``).

The default port is fixed (18080), so the ``ANTHROPIC_BASE_URL`` line above can be
typed once, and kept clear of ``fleet view``'s 8765 so both run side by side;
``--port 0`` takes any free port (the banner prints the URL). Bad input - an unknown
policy, an unreadable script, a busy port - is one line and exit code 2.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from subagents.fake_api.limits import Overload, RateLimits
from subagents.fake_api.script import (
    ScriptItem,
    overloaded,
    overloaded_mid_stream,
    rate_limited,
    server_error,
)
from subagents.fake_api.server import FakeMessagesAPI

_FAULTS = {
    "rate_limited": rate_limited,
    "overloaded": overloaded,
    "server_error": server_error,
    "overloaded_mid_stream": overloaded_mid_stream,
}


PROG = "python -m subagents.fake_api"
DEFAULT_PORT = 18080
"""Not 8765, which ``fleet view`` serves on by default."""


def load_script(path: Path) -> list[ScriptItem]:
    """Parse a script file; a bad item names its index and what is allowed."""
    try:
        listed = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise SystemExit(f"{path}: cannot read the script ({exc.strerror or exc})") from None
    except ValueError as exc:
        raise SystemExit(f"{path}: not JSON ({exc}); give a JSON list of replies") from None
    if not isinstance(listed, list):
        raise SystemExit(f'{path}: expected a JSON list, e.g. [{{"content": [...]}}]')
    items: list[ScriptItem] = []
    for i, raw in enumerate(listed):
        if isinstance(raw, dict) and "fault" in raw:
            if raw["fault"] not in _FAULTS:
                raise SystemExit(f"{path}: item {i}: fault must be one of {', '.join(_FAULTS)}")
            items.append(_FAULTS[raw["fault"]]())
        elif isinstance(raw, dict) and isinstance(raw.get("content"), list):
            items.append(raw)
        else:
            raise SystemExit(f'{path}: item {i}: expected {{"content": [...]}} or {{"fault": ...}}')
    return items


def policy_answer(name: str) -> Any:
    """A fake-server policy that asks the named offline policy."""
    from subagents.model.base import ModelRequest
    from subagents.model.offline import answer_blocks, get_policy

    policy = get_policy(name)

    def answer(body: dict[str, Any]) -> dict[str, Any]:
        fields = ("system", "messages", "tools", "max_tokens", "tool_choice")
        request = ModelRequest(**{k: body[k] for k in fields if body.get(k) is not None})
        blocks, stop = answer_blocks(policy(request))  # type: ignore[arg-type]
        return {"content": blocks, "stop_reason": stop}

    return answer


def _parser() -> argparse.ArgumentParser:
    from subagents.model.offline import policy_names

    parser = argparse.ArgumentParser(
        prog=PROG, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--port",
        type=int,
        default=DEFAULT_PORT,
        help=f"port on 127.0.0.1 (default {DEFAULT_PORT}, not fleet view's 8765; "
        "0 = any free port, the URL is printed)",
    )
    parser.add_argument("--script", type=Path, help="JSON list of replies and faults")
    parser.add_argument(
        "--policy",
        default="echo",
        help=f"offline policy when no script: {', '.join(policy_names())} (default echo)",
    )
    parser.add_argument("--rpm", type=int, help="requests per minute (default: no limit)")
    parser.add_argument("--itpm", type=int, help="uncached input tokens per minute")
    parser.add_argument("--otpm", type=int, help="output tokens per minute")
    parser.add_argument("--minute-s", type=float, default=60.0, help="length of a minute")
    parser.add_argument(
        "--overload",
        action="append",
        default=[],
        metavar="START:END",
        help="answer 529 from START to END seconds after the first request (repeatable)",
    )
    return parser


def _limits(args: argparse.Namespace) -> RateLimits | None:
    """The limits the flags ask for; None when none was given."""
    overloads = []
    for window in args.overload:
        start, sep, end = window.partition(":")
        try:
            overloads.append(Overload(start_s=float(start), end_s=float(end)))
        except (ValueError, ValidationError):
            raise SystemExit(
                f"--overload {window!r}: give START:END in seconds, START < END, e.g. 10:40"
            ) from None
        if not sep or overloads[-1].start_s >= overloads[-1].end_s:
            raise SystemExit(f"--overload {window!r}: START must be before END, e.g. 10:40")
    try:
        limits = RateLimits(
            requests_per_minute=args.rpm,
            input_tokens_per_minute=args.itpm,
            output_tokens_per_minute=args.otpm,
            minute_s=args.minute_s,
            overloads=overloads,
        )
    except ValidationError as exc:
        first = exc.errors()[0]
        name = {"requests_per_minute": "--rpm", "input_tokens_per_minute": "--itpm"}.get(
            str(first["loc"][0]), f"--{str(first['loc'][0]).replace('_', '-')}"
        )
        example = "6" if name == "--minute-s" else "50"
        raise SystemExit(f"{name}: {first['msg'].lower()}, e.g. {name} {example}") from None
    if not (args.rpm or args.itpm or args.otpm or overloads):
        return None
    return limits


def main(argv: list[str] | None = None) -> int:
    from subagents.model.offline import policy_names

    args = _parser().parse_args(argv)
    if not 0 <= args.port <= 65535:
        return _fail(f"--port {args.port} is not a TCP port; use 0-65535, e.g. --port 0")
    if args.script is None and args.policy not in policy_names():
        return _fail(
            f"no offline policy named {args.policy!r}; use one of: {', '.join(policy_names())}"
        )
    try:
        script = load_script(args.script) if args.script else policy_answer(args.policy)
        limits = _limits(args)
    except SystemExit as exc:  # their messages are already one line
        return _fail(str(exc))
    try:
        api = FakeMessagesAPI(script, port=args.port, limits=limits).start()
    except OSError as exc:
        return _fail(
            f"cannot listen on 127.0.0.1:{args.port} ({exc.strerror or exc}); "
            "pick another --port, or --port 0 for any free one"
        )
    print(
        f"fake Messages API on {api.url} (Ctrl-C to stop); use it with "
        f"ANTHROPIC_BASE_URL={api.url} ANTHROPIC_API_KEY=test",
        file=sys.stderr,
        flush=True,
    )
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        return 0
    finally:
        api.stop()


def _fail(message: str) -> int:
    print(f"{PROG}: {message}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    raise SystemExit(main())
