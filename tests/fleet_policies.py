"""Fake Messages API policies for coordinator tests and ``bench/fanout.py``.

A policy answers each request from what the request holds: the member's task (in
its first user message) picks a behaviour, and the number of tool results so far is
the step. So many members can share one fake server, concurrently, in any order.

Task markers: ``[hang]`` the model never answers in time; ``[bad-request]`` the API
rejects the call for good (400); ``[edit:PATH:OLD:NEW]`` edit a file then submit;
``[slow]`` every answer takes at least a second; ``[oom]`` the first command makes the
box's main process the OOM killer's choice and then allocates past the box's memory
limit, so the whole box dies (``oom-killed``); ``[oom-once]`` does that on the
member's first attempt only; anything else: ``turns`` shell steps, then submit_result.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
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


# PID 1 (the box's init) gets the highest OOM score, the hog the lowest it may set, so
# the kernel kills init and with it the box - a crash of the box, not of one command.
OOM_BOX = (
    "echo 1000 > /proc/1/oom_score_adj; echo 0 > /proc/$$/oom_score_adj; "
    "exec python3 -c 'x = bytearray(4 << 30)'"
)


def coding_policy(*, turns: int = 3, latency_s: float = 0.0) -> Any:
    """Each member runs ``turns`` shell commands in its box, then submits."""
    first_attempts: set[str] = set()

    def policy(body: dict[str, Any]) -> Any:
        task = _first_user_text(body)
        step = _step(body)
        delay = max(latency_s, 1.0) if "[slow]" in task else latency_s
        if "[hang]" in task:
            return tool_use("shell", {"command": "true"}, latency_s=3600)
        if step == 0 and ("[oom]" in task or ("[oom-once]" in task and task not in first_attempts)):
            first_attempts.add(task)
            return tool_use("shell", {"command": OOM_BOX}, latency_s=delay)
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


def _ran(body: dict[str, Any]) -> int:
    """Calls that ran (a call answered as interrupted did not)."""
    return sum(
        1
        for m in body.get("messages") or []
        if m.get("role") == "user" and isinstance(m.get("content"), list)
        for b in m["content"]
        if b.get("type") == "tool_result" and not b.get("is_error")
    )


def appending_policy(steps: int, *, latency_s: float = 0.0, oom_at: int | None = None) -> Any:
    """Step k appends ``line k`` to /workspace/log.txt; after ``steps`` of them, submit.
    ``oom_at``: on the member's first attempt, that step kills its box instead."""
    crashed: list[bool] = []

    def policy(body: dict[str, Any]) -> Any:
        step = _ran(body)
        if oom_at is not None and step == oom_at and not crashed:
            crashed.append(True)
            return tool_use("shell", {"command": OOM_BOX}, latency_s=latency_s)
        if step < steps:
            return tool_use(
                "shell", {"command": f"echo line {step} >> /workspace/log.txt"}, latency_s=latency_s
            )
        return tool_use("submit_result", {"summary": f"appended {step} lines"}, latency_s=latency_s)

    return policy


def _task_and_memory(body: dict[str, Any]) -> tuple[str, str]:
    """The member's task (first block of its first message) and its loaded memory."""
    msgs = body.get("messages") or []
    blocks = msgs[0].get("content") if msgs else []
    if isinstance(blocks, str):
        return blocks, ""
    texts = [b.get("text", "") for b in blocks or [] if b.get("type") == "text"]
    memory = next((t for t in texts if t.startswith("<memory")), "")
    return (texts[0] if texts else ""), memory


def memory_policy(
    before_submit: Callable[[str, str], None] = lambda task, memory: None,
) -> Any:
    """Members that edit ``/memories/notes.md`` once, then submit.

    Task markers: ``[insert:TEXT]`` inserts TEXT after the file's first line - or
    ``TEXT (again)`` when the memory it loaded already holds TEXT, as a model that
    reads its memory would; ``[replace:OLD:NEW]`` replaces OLD by NEW;
    ``[crash-once]`` after the edit, the member's first attempt runs a command that
    OOM-kills its box (give it ``sandbox = { memory = "64m" }``). Before answering
    with ``submit_result``, ``before_submit(task, loaded memory)`` is called: a test's
    gate (e.g. wait until every member has loaded and edited its memory).
    """
    crashed: set[str] = set()

    def policy(body: dict[str, Any]) -> Any:
        task, memory = _task_and_memory(body)
        step = _step(body)
        if step == 0:
            insert = re.search(r"\[insert:([^\]]+)\]", task)
            if insert:
                line = insert.group(1)
                text = f"{line} (again)" if line in memory else line
                args = {"command": "insert", "path": "/memories/notes.md", "insert_line": 1}
                return tool_use("memory", {**args, "insert_text": text})
            old, new = re.search(r"\[replace:([^:\]]+):([^\]]+)\]", task).groups()  # type: ignore[union-attr]
            return tool_use(
                "memory",
                {
                    "command": "str_replace",
                    "path": "/memories/notes.md",
                    "old_str": old,
                    "new_str": new,
                },
            )
        if step == 1 and "[crash-once]" in task and task not in crashed:
            crashed.add(task)
            return tool_use("shell", {"command": OOM_BOX})
        before_submit(task, memory)
        return tool_use(
            "submit_result",
            {"summary": "memory edited", "tests_run": [], "notes": []},
        )

    return policy


LEAD_PROMPT = "You lead a research team"


def tool_results(body: dict[str, Any]) -> list[tuple[str, bool]]:
    """Every tool result of the conversation so far: (its text, is_error), in order."""
    out = []
    for m in body.get("messages") or []:
        content = m.get("content")
        for b in content if isinstance(content, list) else []:
            if b.get("type") == "tool_result":
                parts = b.get("content") or []
                text = (
                    parts if isinstance(parts, str) else "".join(p.get("text", "") for p in parts)
                )
                out.append((text, bool(b.get("is_error"))))
    return out


def with_lead(
    lead: Callable[[dict[str, Any]], Any], members: Callable[[dict[str, Any]], Any]
) -> Any:
    """One fake server for a lead run: lead requests (told apart by the lead's system
    prompt) go to ``lead``, every member's to ``members``."""

    def policy(body: dict[str, Any]) -> Any:
        system = body.get("system")
        system = system if isinstance(system, str) else json.dumps(system)
        return (lead if LEAD_PROMPT in system else members)(body)

    return policy
