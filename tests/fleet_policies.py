"""Fake Messages API policies for coordinator tests and ``bench/fanout.py``.

A policy answers each request from what the request holds: the member's task (in
its first user message) picks a behaviour, and the number of tool results so far is
the step. So many members can share one fake server, concurrently, in any order.

Task markers: ``[hang]`` the model never answers in time; ``[bad-request]`` the API
rejects the call for good (400); ``[edit:PATH:OLD:NEW]`` edit a file then submit;
``[slow]`` every answer takes at least a second; anything else: ``turns`` shell
steps, then submit_result.
"""

from __future__ import annotations

import json
import re
from typing import Any

from subagents.fake_api import fault, tool_use


def _first_user_text(body: dict[str, Any]) -> str:
    msgs = body.get("messages") or []
    return json.dumps(msgs[0]) if msgs else ""


def _step(body: dict[str, Any]) -> int:
    n = 0
    for m in body.get("messages") or []:
        if m.get("role") == "user" and isinstance(m.get("content"), list):
            n += sum(1 for b in m["content"] if b.get("type") == "tool_result")
    return n


def coding_policy(*, turns: int = 3, latency_s: float = 0.0) -> Any:
    """Each member runs ``turns`` shell commands in its box, then submits."""

    def policy(body: dict[str, Any]) -> Any:
        task = _first_user_text(body)
        step = _step(body)
        delay = max(latency_s, 1.0) if "[slow]" in task else latency_s
        if "[hang]" in task:
            return tool_use("shell", {"command": "true"}, latency_s=3600)
        if "[bad-request]" in task:
            return fault(400, "invalid_request_error", "prompt is too long: 999999 tokens")
        edit = re.search(r"\[edit:([^:\]]+):([^:\]]+):([^:\]]+)\]", task)
        if edit and step == 0:
            path, old, new = edit.groups()
            return tool_use(
                "edit_file",
                {"path": path, "old_string": old, "new_string": new},
                latency_s=delay,
            )
        if not edit and step < turns:
            return tool_use("shell", {"command": f"echo step {step} && hostname"}, latency_s=delay)
        return tool_use(
            "submit_result",
            {"summary": f"finished after {step} steps", "tests_run": [], "notes": []},
            latency_s=delay,
        )

    return policy
