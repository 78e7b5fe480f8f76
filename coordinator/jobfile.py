"""Reading job files: TOML in, a validated :class:`~coordinator.spec.Job` out, or errors
a person can act on.

Why errors are rendered here and not by pydantic: a user editing a TOML file needs
the dotted path of the field (``members[1].limits.max_turns``), what was wrong in
words, and a line of TOML that would be right (or, for an unknown key, the keys that
table does accept) - not a traceback or pydantic's internal error codes.
:func:`load_job` raises :class:`JobError` carrying exactly that.
"""

from __future__ import annotations

import json
import re
import tomllib
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from subagents.policy import ToolPolicy
from subagents.spec import Limits
from subagents.tools.mcp import McpServerSpec
from subagents.tools.registry import CustomToolSpec, ParamSpec

from .spec import (
    Budget,
    Egress,
    FanoutPolicy,
    FieldProblem,
    Job,
    JobSandbox,
    Lead,
    MemberJob,
    MemoryProfile,
    ModelDefaults,
    Research,
    RetryPolicy,
    SandboxOverrides,
    Synthesis,
)

# One line of TOML that would be right, by the field's last name.
_EXAMPLES: dict[str, str] = {
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
        super().__init__(f"job file {source} is invalid:\n{body}")


def _dotted(loc: tuple[str | int, ...]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + str(part)
    return out or "(top level)"


def _known_fields(loc: tuple[str | int, ...]) -> str:
    """The fields the table holding an unknown key does accept."""
    sections: dict[str, type[BaseModel]] = {
        "members": MemberJob,
        "tools": CustomToolSpec,
        "mcp": McpServerSpec,
        "parameters": ParamSpec,
        "limits": Limits,
        "sandbox": SandboxOverrides,
        "memory": MemoryProfile,
        "research": Research,
        "lead": Lead,
        "member_limits": Limits,
        "fanout": FanoutPolicy,
        "retry": RetryPolicy,
        "egress": Egress,
        "synthesis": Synthesis,
        "model": ModelDefaults,
        "policy": ToolPolicy,  # a member's MemberPolicy has the same fields
        "budget": Budget,
    }
    names = [p for p in loc[:-1] if isinstance(p, str)]
    if len(names) >= 2 and names[-2] == "parameters":  # parameters.<name>.<field>
        return ", ".join(ParamSpec.model_fields)
    if names == ["sandbox"]:  # the job's [sandbox], not a member's sandbox = {...}
        return ", ".join(JobSandbox.model_fields)
    model = sections.get(names[-1], Job) if names else Job
    return ", ".join(model.model_fields)


def _example(loc: tuple[str | int, ...], error_type: str) -> str:
    names = [p for p in loc if isinstance(p, str)]
    last = names[-1] if names else ""
    if error_type in {"model_type", "dict_type"} and last in _SECTION_EXAMPLES:
        return _SECTION_EXAMPLES[last]
    both = ".".join(names[-2:])
    return _EXAMPLES.get(both) or _EXAMPLES.get(last, "")


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


def describe_validation(exc: ValidationError, *, prefix: tuple[str | int, ...] = ()) -> list[str]:
    """Each pydantic error as ``path: what was wrong. example: ...``."""
    problems: list[str] = []
    for err in exc.errors():
        loc = prefix + tuple(err["loc"])
        cause = (err.get("ctx") or {}).get("error")
        if isinstance(cause, FieldProblem):
            loc = loc + tuple(int(p) if p.isdigit() else p for p in cause.field.split("."))
        line = f"{_dotted(loc)}: {_words(err)}."
        example = _example(loc, err["type"])
        if err["type"] == "extra_forbidden":
            line += f"\n    known fields here: {_known_fields(loc)}"
        elif example:
            example = example.replace("\n", "\n" + " " * 22)
            line += f"\n    example of right: {example}"
        problems.append(line)
    return problems


MAX_JOB_FILE_BYTES = 8 * 1024 * 1024
"""Largest job file read: room for the most members a job may have, each with a task."""
MAX_DEPTH = 32
"""Deepest nesting of tables and arrays a job file may use (a result schema needs a few)."""


def _too_deep(data: Any) -> str | None:
    """The dotted path of the first value nested past :data:`MAX_DEPTH`, or None.

    Iterative, so a hostile file cannot make the check itself run out of stack.
    """
    stack: list[tuple[Any, tuple[str | int, ...]]] = [(data, ())]
    while stack:
        value, loc = stack.pop()
        if len(loc) > MAX_DEPTH:
            return _dotted(loc[:6]) + "..."
        if isinstance(value, dict):
            stack += [(v, (*loc, k)) for k, v in value.items()]
        elif isinstance(value, list):
            stack += [(v, (*loc, i)) for i, v in enumerate(value)]
    return None


def _too_large(size: int) -> str:
    return (
        f"(file): {size / 2**20:.1f} MB; a job file is at most {MAX_JOB_FILE_BYTES // 2**20} MB. "
        "Put large material in a member's repo or in files it reads, and split a job of "
        "very many members into several jobs"
    )


def _syntax_error(source: str, what: str, example: str = "") -> JobError:
    line = f"(syntax): {what}."
    if example:
        line += f"\n    example of right: {example}"
    return JobError(source, [line])


def parse_job(text: str, *, source: str = "<job>") -> Job:
    """Validate TOML text into a :class:`Job`; raises :class:`JobError`."""
    if len(text) > MAX_JOB_FILE_BYTES:
        raise JobError(source, [_too_large(len(text))])
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        example = 'name = "survey"   (strings in double quotes)'
        raise _syntax_error(source, f"not valid TOML: {exc}", example) from None
    except RecursionError:  # the TOML reader recurses once per level of nesting
        what = (
            f"values are nested too deeply to read; tables and arrays nest at most {MAX_DEPTH} deep"
        )
        raise _syntax_error(source, what) from None
    deep = _too_deep(data)
    if deep is not None:
        raise JobError(
            source,
            [f"{deep}: nested more than {MAX_DEPTH} tables or arrays deep; flatten the value."],
        )
    try:
        return Job.model_validate(data)
    except ValidationError as exc:
        raise JobError(source, describe_validation(exc)) from None


def load_job(path: str | Path) -> tuple[Job, str]:
    """Read and validate a job file; returns the job and the file's text."""
    p = Path(path)
    try:
        if p.is_file() and p.stat().st_size > MAX_JOB_FILE_BYTES:  # not read at all
            raise JobError(str(p), [_too_large(p.stat().st_size)])
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise JobError(
            str(p), ["(file): no such file; give the path of a .toml job file"]
        ) from None
    except (IsADirectoryError, UnicodeDecodeError, PermissionError) as exc:
        raise JobError(
            str(p), [f"(file): cannot be read as UTF-8 text ({exc.__class__.__name__})"]
        ) from None
    job = parse_job(text, source=str(p))
    base = p.resolve().parent
    problems = []
    for i, m in enumerate(job.members):
        if m.repo is not None:
            repo = (base / m.repo).resolve()
            if not repo.is_dir():
                problems.append(
                    f"members[{i}].repo: {m.repo!r} is not a directory (paths are relative "
                    f"to the job file).\n    example of right: {_EXAMPLES['repo']}"
                )
            m.repo = str(repo)
        for j, server in enumerate(m.mcp):
            if server.files is not None:
                files = (base / server.files).resolve()
                if not files.exists():
                    problems.append(
                        f"members[{i}].mcp[{j}].files: {server.files!r} does not exist (paths "
                        f"are relative to the job file).\n    example of right: {_EXAMPLES['files']}"
                    )
                server.files = str(files)
        if m.memory is not None and m.memory.dir is not None:
            m.memory.dir = str((base / m.memory.dir).resolve())
    if problems:
        raise JobError(str(p), problems)
    return job, text


def render_toml(data: dict[str, Any]) -> str:
    """A job (as JSON-ready data, e.g. ``job.model_dump(mode="json")``) as TOML text that
    :func:`parse_job` reads back to the same job: kept as a run's ``job.toml`` when the
    job did not come from a file. ``None`` values are left out (TOML has no null)."""
    lines: list[str] = []
    tables: list[str] = []
    for key, value in data.items():
        if value is None:
            continue
        if isinstance(value, dict):
            tables += ["", f"[{_toml_key(key)}]", *_toml_pairs(value)]
        elif isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
            for item in value:
                tables += ["", f"[[{_toml_key(key)}]]", *_toml_pairs(item)]
        else:
            lines.append(f"{_toml_key(key)} = {_toml_value(value)}")
    return "\n".join(lines + tables).strip() + "\n"


def _toml_pairs(table: dict[str, Any]) -> list[str]:
    return [f"{_toml_key(k)} = {_toml_value(v)}" for k, v in table.items() if v is not None]


def _toml_key(key: str) -> str:
    return key if re.fullmatch(r"[A-Za-z0-9_-]+", key) else json.dumps(key)


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)  # a JSON string is a TOML basic string
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value if v is not None) + "]"
    if isinstance(value, dict):
        inner = ", ".join(
            f"{_toml_key(k)} = {_toml_value(v)}" for k, v in value.items() if v is not None
        )
        return "{ " + inner + " }" if inner else "{}"
    raise TypeError(f"cannot write {type(value).__name__} as TOML")
