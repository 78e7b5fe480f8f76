"""Serve the fake Messages API until interrupted, for trying a job without a real model.

    python -m subagents.fake_api --port 8765 [--script replies.json] [--policy echo]
    ANTHROPIC_BASE_URL=http://127.0.0.1:8765 ANTHROPIC_API_KEY=test fleet ...

A script file is a JSON list of message dicts (``{"content": [...]}``) and faults
(``{"fault": "rate_limited" | "overloaded" | "server_error" | "overloaded_mid_stream"}``).
Without one, every request is answered by an offline policy (default ``echo``).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

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


def load_script(path: Path) -> list[ScriptItem]:
    """Parse a script file; a bad item names its index and what is allowed."""
    items: list[ScriptItem] = []
    for i, raw in enumerate(json.loads(path.read_text(encoding="utf-8"))):
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
    from subagents.model_base import ModelRequest
    from subagents.offline import answer_blocks, get_policy

    policy = get_policy(name)

    def answer(body: dict[str, Any]) -> dict[str, Any]:
        fields = ("system", "messages", "tools", "max_tokens", "tool_choice")
        request = ModelRequest(**{k: body[k] for k in fields if body.get(k) is not None})
        blocks, stop = answer_blocks(policy(request))  # type: ignore[arg-type]
        return {"content": blocks, "stop_reason": stop}

    return answer


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m subagents.fake_api", description=__doc__)
    parser.add_argument("--port", type=int, default=8765)
    parser.add_argument("--script", type=Path, help="JSON list of replies and faults")
    parser.add_argument("--policy", default="echo", help="offline policy when no script")
    args = parser.parse_args(argv)
    script = load_script(args.script) if args.script else policy_answer(args.policy)
    api = FakeMessagesAPI(script, port=args.port).start()
    print(f"fake Messages API on {api.url} (Ctrl-C to stop)", file=sys.stderr)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        return 0
    finally:
        api.stop()


if __name__ == "__main__":
    raise SystemExit(main())
