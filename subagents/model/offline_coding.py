"""The ``coding`` offline policy: a deterministic coding member for demos and tests.

No model writes code here, so the policy never pretends to: it does what can be done
faithfully without one, through the same tools a model would call.

1. look: ``glob`` the workspace and, when the job gave a check command (the coding
   kind states it in the first message), run it - both in one turn (they are
   independent);
2. apply the edits the task states explicitly, one per turn, in the form
   ``replace `old` with `new` in `path``` (backticks or quotes);
3. run the test command again after the last edit;
4. ``submit_result`` with a summary built from what the tool results said (files
   seen, edits applied or refused, the test's exit codes) - ``tests_passed`` comes
   from the real exit code, and the notes say that an offline policy produced it.

Everything it knows comes from the request's messages, so it is a pure function of
the request and replays identically.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from .base import ModelRequest
from .offline import register_policy, with_required_fields

_EDIT = re.compile(
    r"replace\s+(?P<q1>[`'\"])(?P<old>.+?)(?P=q1)\s+with\s+(?P<q2>[`'\"])(?P<new>.*?)(?P=q2)"
    r"\s+in\s+[`'\"]?(?P<path>[\w./-]+)",
    re.I | re.S,
)
_INPUTS = "Inputs (JSON):\n"
_CHECK = "The job's check command - "
"""How the coding kind's brief of the check command opens (subagents/kinds/coding.py);
the command is what follows the brief's first line."""
_EXIT = re.compile(r"^exit code (-?\d+)", re.M)


@dataclass
class _History:
    """What the conversation shows the member has done so far."""

    task: str = ""
    test: str | None = None
    """The job's check command, when the first message states one."""
    calls: list[dict[str, Any]] = field(default_factory=list)
    """tool_use blocks in order."""
    results: dict[str, tuple[str, bool]] = field(default_factory=dict)
    """tool_use id -> (result text, is_error)."""


def _text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    return "".join(b.get("text", "") for b in content if isinstance(b, dict))


def read_history(request: ModelRequest) -> _History:
    h = _History()
    for i, msg in enumerate(request.messages):
        blocks = (
            msg["content"]
            if isinstance(msg["content"], list)
            else [{"type": "text", "text": msg["content"]}]
        )
        for b in blocks:
            kind = b.get("type")
            if i == 0 and kind == "text":
                text = b.get("text", "")
                if text.startswith(_CHECK) and "\n" in text:
                    h.test = text.split("\n", 1)[1]
                elif not h.task and not text.startswith(_INPUTS):
                    h.task = text
            elif kind == "tool_use":
                h.calls.append(b)
            elif kind == "tool_result":
                h.results[b["tool_use_id"]] = (
                    _text_of(b.get("content", "")),
                    bool(b.get("is_error")),
                )
    return h


def parse_edits(task: str) -> list[dict[str, str]]:
    """The explicit ``replace `old` with `new` in `path``` edits a task states."""
    return [
        {"path": m["path"].rstrip("."), "old_string": m["old"], "new_string": m["new"]}
        for m in _EDIT.finditer(task)
    ]


def _tool(name: str, args: dict[str, Any]) -> dict[str, Any]:
    return {"type": "tool_use", "name": name, "input": args}


def coding_policy(request: ModelRequest) -> list[dict[str, Any]]:
    """The next step of the deterministic coding member (see the module docstring)."""
    h = read_history(request)
    test = h.test
    names = [c.get("name") for c in h.calls]
    if not h.calls:
        first = [_tool("glob", {"pattern": "**/*"})]
        if test:
            first.append(_tool("shell", {"command": test, "timeout_s": 300}))
        return [{"type": "text", "text": "Looking at the workspace first."}, *first]
    edits = parse_edits(h.task)
    done = [c["input"] for c in h.calls if c.get("name") == "edit_file"]
    pending = [e for e in edits if e not in done]
    if pending:
        e = pending[0]
        return [
            {"type": "text", "text": f"Applying the edit the task states in {e['path']}."},
            _tool("edit_file", e),
        ]
    last_edit = max((i for i, n in enumerate(names) if n == "edit_file"), default=-1)
    tested_after = any(
        c.get("name") == "shell" and c["input"].get("command") == test
        for c in h.calls[last_edit + 1 :]
    )
    if test and done and not tested_after:
        return [_tool("shell", {"command": test, "timeout_s": 300})]
    return [_tool("submit_result", with_required_fields(request, _report(h, test, done)))]


def _report(h: _History, test: str | None, edits: list[dict[str, Any]]) -> dict[str, Any]:
    applied: list[str] = []
    refused: list[str] = []
    files_seen = 0
    exits: list[int] = []
    for call in h.calls:
        text, is_error = h.results.get(call.get("id", ""), ("", True))
        if call.get("name") == "edit_file":
            (refused if is_error else applied).append(call["input"]["path"])
        elif call.get("name") == "glob" and not is_error:
            # The first look and the first test run go out together, so a cache the
            # test writes (__pycache__) may or may not be listed yet: not counted, so
            # the same task gives the same summary every time.
            seen = [ln for ln in text.splitlines() if ln.startswith("/")]
            files_seen = len([ln for ln in seen if "/__pycache__/" not in ln])
        elif call.get("name") == "shell" and call["input"].get("command") == test:
            m = _EXIT.search(text)
            if m:
                exits.append(int(m.group(1)))
    parts = [f"Looked at {files_seen} files."]
    if applied:
        parts.append(f"Applied {len(applied)} stated edit(s) in {', '.join(sorted(set(applied)))}.")
    if not edits:
        parts.append("The task states no explicit edit, so nothing was changed.")
    if exits:
        parts.append(f"Test exit codes: {' -> '.join(map(str, exits))}.")
    notes = ["Produced by the offline coding policy: no model was involved."]
    notes += [f"edit in {p} was refused by edit_file (see the trace)" for p in refused]
    return {
        "summary": " ".join(parts),
        "tests_run": [test] if test and exits else [],
        "tests_passed": (exits[-1] == 0) if exits else None,
        "notes": notes,
    }


register_policy("coding", coding_policy)
