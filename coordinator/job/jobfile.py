"""Reading job files: TOML in, a validated :class:`~coordinator.job.spec.Job` out, or errors
a person can act on.

Why errors are rendered here and not by pydantic: a user editing a TOML file needs
the dotted path of the field (``members[1].limits.max_turns``), what was wrong in
words, and a line of TOML that would be right (or, for an unknown key, the keys that
table does accept) - not a traceback or pydantic's internal error codes.
:func:`load_job` raises :class:`JobError` carrying exactly that.
"""

from __future__ import annotations

import json
import os
import re
import tomllib
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from sandbox.prepared.spec import SetupSpec
from subagents.rules.policy import ToolPolicy
from subagents.spec import Limits
from subagents.tools.mcp import McpServerSpec
from subagents.tools.registry import CustomToolSpec, ParamSpec

from . import job_problems as problems
from .job_problems import EXAMPLES, JobError, dotted
from .spec import (
    Budget,
    Egress,
    FanoutPolicy,
    Job,
    JobSandbox,
    Lead,
    MemberJob,
    MemoryProfile,
    Merge,
    ModelDefaults,
    Research,
    RetryPolicy,
    SandboxOverrides,
    Synthesis,
)


def known_fields(loc: tuple[str | int, ...]) -> str:
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
        "merge": Merge,
        "setup": SetupSpec,
    }
    names = [p for p in loc[:-1] if isinstance(p, str)]
    if len(names) >= 2 and names[-2] == "parameters":  # parameters.<name>.<field>
        return ", ".join(ParamSpec.model_fields)
    if names == ["sandbox"]:  # the job's [sandbox], not a member's sandbox = {...}
        return ", ".join(JobSandbox.model_fields)
    model = sections.get(names[-1], Job) if names else Job
    # The table's own fields first, then those it shares (a member's MemberWork): what
    # a person looks for first in a member's table is id, kind and task.
    own = [n for n in vars(model).get("__annotations__", {}) if n in model.model_fields]
    return ", ".join(own + [n for n in model.model_fields if n not in own])


def describe_validation(exc: ValidationError, *, prefix: tuple[str | int, ...] = ()) -> list[str]:
    """Each pydantic error of a job as ``path: what was wrong. example: ...``."""
    return problems.describe_validation(exc, known_fields, prefix=prefix)


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
            return dotted(loc[:6]) + "..."
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
    resolve_paths(job, p.resolve().parent, source=str(p), relative_to="the job file")
    return job, text


def resolve_paths(job: Job, base: Path, *, source: str, relative_to: str) -> None:
    """Make the job's paths (members' ``repo``, MCP ``files``, memory ``dir``) absolute
    against ``base``, in place; :class:`JobError` naming each one that is missing.
    Every way in - a job file, TOML text, a dict - is checked the same: a missing
    repository is refused before the run exists, not found empty in the box."""
    problems = []
    for i, m in enumerate(job.members):
        if m.repo is not None:
            repo = (base / m.repo).resolve()
            if not repo.is_dir():
                problems.append(
                    f"members[{i}].repo: {m.repo!r} is not a directory (paths are relative "
                    f"to {relative_to}).\n    example of right: {EXAMPLES['repo']}"
                )
            m.repo = str(repo)
        for j, server in enumerate(m.mcp):
            if server.files is not None:
                files = (base / server.files).resolve()
                if not files.exists():
                    problems.append(
                        f"members[{i}].mcp[{j}].files: {server.files!r} does not exist (paths "
                        f"are relative to {relative_to}).\n    example of right: {EXAMPLES['files']}"
                    )
                server.files = str(files)
        if m.memory is not None and m.memory.dir is not None:
            m.memory.dir = str((base / m.memory.dir).resolve())
        if m.setup is not None:
            problems += _setup_on_host(m, i, base, relative_to)
    if problems:
        raise JobError(source, problems)


def _setup_on_host(m: MemberJob, i: int, base: Path, relative_to: str) -> list[str]:
    """A member's setup against this host: its wheelhouse made absolute and found a
    directory, each of its secrets set (the values are read when the setup runs)."""
    assert m.setup is not None
    problems = []
    if m.setup.wheels is not None:
        wheels = (base / m.setup.wheels).resolve()
        if not wheels.is_dir():
            what = "does not exist" if not wheels.exists() else "is not a directory"
            problems.append(
                f"members[{i}].setup.wheels: {m.setup.wheels!r} {what} (paths are relative "
                f'to {relative_to}); name a directory of wheels, e.g. wheels = "./wheelhouse"'
            )
        m.setup = m.setup.model_copy(update={"wheels": str(wheels)})
    for name in m.setup.secrets:
        if name not in os.environ:
            problems.append(
                f"members[{i}].setup.secrets: {name!r} is not set in this environment; "
                f"export it before the run (its value goes to the setup command only)"
            )
    return problems


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
