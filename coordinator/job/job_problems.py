"""What is wrong with a job, in words a person editing its TOML can act on.

Why errors are rendered here and not by pydantic: a user editing a TOML file needs
the dotted path of the field (``members[1].limits.max_turns``), what was wrong in
words, and a line of TOML that would be right (or, for an unknown key, the keys that
table does accept) - not a traceback or pydantic's internal error codes. This module
knows no job model: :mod:`.spec` (whose models raise :class:`JobError` when built
directly) and :mod:`.jobfile` (which reads TOML) both use it, and it uses neither.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from pydantic import ValidationError


class FieldProblem(ValueError):
    """A cross-field check that failed; ``field`` is the path below the model checked."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


# One line of TOML that would be right, by the field's last name.
EXAMPLES: dict[str, str] = {
    "name": 'name = "asyncio-survey"',
    "kind": 'kind = "browser"        # or "coding"',
    "task": 'task = "Find how asyncio tasks are cancelled"',
    "id": 'id = "cancel-docs"',
    "inputs": 'inputs = { topic = "asyncio", depth = 2 }',
    "model": 'model = "offline"      # or "claude-sonnet-4-5"',
    "max_tokens": "max_tokens = 4096",
    "max_turns": "max_turns = 30",
    "deadline_s": "deadline_s = 600",
    "result_tokens": "result_tokens = 2000",
    "cpus": "cpus = 1.5",
    "memory": 'memory = "1g"',
    "pids": "pids = 256",
    "workspace_size": 'workspace_size = "2g"',
    "image": 'image = "python:3.12-slim"   # already on this engine; Fleet never pulls',
    "profile": 'memory = { profile = "python-docs" }',
    "context": "context = { compact_fraction = 0.9, offload_result_tokens = 20000 }",
    "todos": "todos = true",
    "result_schema": 'result_schema = { type = "object", properties = { answer = { type = "string" } } }',
    "repo": 'repo = "./my-project"   # coding members only',
    "test": 'test = "python -m pytest -q"',
    "tools": '[[members.tools]]\nname = "word_count"\ndescription = "Count words"\ncommand = "wc -w {path}"\nparameters = { path = { type = "string" } }',
    "command": 'command = "wc -w {path}"   # run in the box; each {name} is a shell-quoted argument',
    "parameters": 'parameters = { path = { type = "string", description = "file to count" } }',
    "callable": 'callable = "mypkg.tools:lookup"   # runs on the host: needs host = true',
    "host": "host = true   # only for a callable, which runs outside every box",
    "description": 'description = "Count the words of a file in /workspace"',
    "timeout_s": "timeout_s = 120",
    "deny": 'deny = ["shell:git push*", "write_file:/workspace/.git/**"]',
    "ask": 'ask = ["shell:rm *", "mcp__docs__*"]   # TOOL, or TOOL:PATTERN on its arguments',
    "ask_default": 'ask_default = "deny"   # or "allow": the answer when nobody can answer',
    "ask_timeout_s": "ask_timeout_s = 300",
    "mcp": '[[members.mcp]]\nname = "echo"\ncommand = "python3 echo_server.py"\nfiles = "mcp"',
    "files": 'files = "mcp"   # copied into the box at /tmp/mcp/<name>; the command runs there',
    "url": 'url = "https://mcp.example.com/mcp"   # its host must be in [egress] allow',
    "start_timeout_s": "start_timeout_s = 30",
    "question": 'question = "How does asyncio cancel tasks?"',
    "max_members": "max_members = 12",
    "max_waves": "max_waves = 3",
    "kinds": 'kinds = ["browser", "coding"]',
    "member_limits": "member_limits = { max_turns = 30, deadline_s = 600, max_tokens = 200000 }",
    "token_budget": "token_budget = 2000000",
    "usd": "usd = 5.0             # [budget]: the run's hard line in US dollars",
    "budget.tokens": "tokens = 2000000      # [budget]: input + output (+ cache reads at their price)",
    "soft": "soft = 0.8            # [budget]: warn past this fraction of the hard line",
    "result_chars": "result_chars = 4000",
    "members.files": 'files = { "check.py" = "print(1 + 1)" }   # coding members only',
    "test_gate": "test_gate = false   # the test's exit code is a finding, not a gate",
    # Where a field's last name means something else elsewhere: table.field first.
    "lead.members": "members = 3            # the first wave; at most max_members",
    "member_limits.max_tokens": "member_limits = { max_tokens = 200000 }",
    "members": '[[members]]\nkind = "coding"\ntask = "Add a --verbose flag"   (or a [research] table)',
    "max_parallel": "max_parallel = 4",
    "min_success": "min_success = 2        # at most the number of members",
    "fail_fast": "fail_fast = false",
    "warm_pool": "warm_pool = true",
    "attempts": "attempts = 2",
    "backoff_s": "backoff_s = 1.0",
    "backoff_max_s": "backoff_max_s = 30",
    "on": 'on = ["crashed", "overloaded"]   # the task itself failing is never retried',
    "allow": 'allow = ["corpus:8080", "docs.python.org"]',
    "search_url": 'search_url = "http://corpus:8080/search?q={query}"',
    "instructions": 'instructions = "Compare the approaches; name trade-offs"',
    "max_result_chars": "max_result_chars = 8000",
    "output_dir": 'output_dir = "runs"',
    "runtime": 'runtime = "gvisor"       # or "runc" (the default)',
}

_SECTION_EXAMPLES: dict[str, str] = {
    "model": '[model]\nname = "offline"',
    "research": '[research]\nquestion = "How does asyncio cancel tasks?"\nmembers = 3',
    "lead": '[lead]\nquestion = "How does asyncio cancel tasks?"\nmax_members = 12',
    "fanout": "[fanout]\nmax_parallel = 4\nmin_success = 1",
    "retry": '[fanout.retry]\nattempts = 2\non = ["crashed", "overloaded"]',
    "egress": '[egress]\nallow = ["corpus:8080"]',
    "synthesis": '[synthesis]\ninstructions = "Focus on pitfalls"',
    "limits": "limits = { max_turns = 30, deadline_s = 600 }",
    "sandbox": 'sandbox = { memory = "1g", cpus = 1 }',
    "memory": 'memory = { profile = "python-docs" }',
    "policy": '[policy]\ndeny = ["shell:git push*"]\nask = ["shell:rm *"]',
    "budget": "[budget]\nusd = 5.0\nsoft = 0.8",
}


class JobError(Exception):
    """A job file that cannot be used; the message names each bad field."""

    def __init__(self, source: str, problems: list[str]) -> None:
        self.source = source
        self.problems = problems
        body = "\n".join(f"  {p}" for p in problems)
        # "<dict>", "<MemberJob>": a job given to the Python API, not read from a file.
        what = f"the job ({source[1:-1]})" if source.startswith("<") else f"job file {source}"
        super().__init__(f"{what} is invalid:\n{body}")


def dotted(loc: tuple[str | int, ...]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + str(part)
    return out or "(top level)"


def _example(loc: tuple[str | int, ...], error_type: str) -> str:
    names = [p for p in loc if isinstance(p, str)]
    last = names[-1] if names else ""
    if error_type in {"model_type", "dict_type"} and last in _SECTION_EXAMPLES:
        return _SECTION_EXAMPLES[last]
    both = ".".join(names[-2:])
    return EXAMPLES.get(both) or EXAMPLES.get(last, "")


def _words(err: Any) -> str:
    kind, msg, value = err["type"], err["msg"], err.get("input")
    if kind == "extra_forbidden":
        return "is not a known field (check the spelling; unknown keys are refused)"
    if kind == "missing":
        return "is required but missing"
    if kind == "literal_error":
        return f"{value!r} is not allowed; {msg[0].lower()}{msg[1:]}"
    if kind == "value_error":
        return msg.removeprefix("Value error, ")
    msg = re.sub(r" or instance of \w+", "", msg)
    got = repr(value)
    if len(got) > 80:  # a huge value is not printed back whole
        got = f"{got[:60]}... ({len(got):,} characters)"
    return f"{msg[0].lower()}{msg[1:]} (got {got})"


def describe_validation(
    exc: ValidationError,
    known_fields: Callable[[tuple[str | int, ...]], str],
    *,
    prefix: tuple[str | int, ...] = (),
) -> list[str]:
    """Each pydantic error as ``path: what was wrong. example: ...``; ``known_fields``
    names the fields the table holding an unknown key accepts."""
    problems: list[str] = []
    for err in exc.errors():
        loc = prefix + tuple(err["loc"])
        cause = (err.get("ctx") or {}).get("error")
        if isinstance(cause, FieldProblem):
            loc = loc + tuple(int(p) if p.isdigit() else p for p in cause.field.split("."))
        line = f"{dotted(loc)}: {_words(err)}."
        example = _example(loc, err["type"])
        if err["type"] == "extra_forbidden":
            line += f"\n    known fields here: {known_fields(loc)}"
        elif example:
            example = example.replace("\n", "\n" + " " * 22)
            line += f"\n    example of right: {example}"
        problems.append(line)
    return problems
