"""The job-file reference (``docs/job-files.md``) against the models that read job files:
every table names exactly the fields of its model, and each default it quotes as a
literal is the model's. A field added to a model without a row, a row for a field that
is gone, or a default changed in one place only fails here."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel
from pydantic_core import PydanticUndefined

from coordinator.job import spec as job
from sandbox.prepared.spec import SetupSpec
from subagents.rules.policy import ToolPolicy
from subagents.spec import Limits
from subagents.tools.mcp import McpServerSpec
from subagents.tools.registry import CustomToolSpec

DOC = Path(__file__).resolve().parent.parent / "docs" / "job-files.md"

SECTIONS: dict[str, tuple[type[BaseModel], ...]] = {
    "## Top level": (job.Job,),
    "## `[model]`": (job.ModelDefaults,),
    "## `[[members]]`": (job.MemberJob,),
    "### `limits`": (Limits,),
    "### `sandbox`": (job.SandboxOverrides,),
    "### `setup`": (SetupSpec,),
    "### `[[members.tools]]`": (CustomToolSpec,),
    "### `[[members.mcp]]`": (McpServerSpec,),
    "## `[research]`": (job.Research,),
    "## `[lead]`": (job.Lead,),
    "## `[fanout]`": (job.FanoutPolicy, job.RetryPolicy),
    "## `[merge]`": (job.Merge,),
    "## `[budget]`": (job.Budget,),
    "## `[egress]`": (job.Egress,),
    "## `[sandbox]`": (job.JobSandbox,),
    "## `[policy]`": (ToolPolicy,),
    "## `[synthesis]`": (job.Synthesis,),
}
"""Each table's heading and the model (and, for ``[fanout]``, its ``retry`` table) it
documents."""


def _box_defaults() -> dict[str, Any]:
    from sandbox.spec import SandboxSpec

    box = SandboxSpec()
    return {n: getattr(box, n) for n in ("cpus", "memory", "pids", "workspace_size", "tmpfs_size")}


NOT_FROM_JOBS = {"### `[[members.mcp]]`": {"proxy"}}
"""Fields Fleet sets and a job file is refused for (``mcp.N.proxy``: the run's proxy)."""

BOX_DEFAULTS = {"### `sandbox`": _box_defaults()}
"""A member's ``sandbox`` table changes the box's defaults: its rows quote those."""


def _normal(value: Any) -> Any:
    if isinstance(value, tuple | list):
        return [_normal(v) for v in value]
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    return value


def _tables() -> dict[str, dict[str, str]]:
    """Heading -> {field: default cell} of the table under it."""
    parts = re.split(r"^(#{2,3} .*)$", DOC.read_text(encoding="utf-8"), flags=re.M)
    out = {}
    for head, body in zip(parts[1::2], parts[2::2], strict=True):
        rows = re.findall(r"^\| `([^`]+)` \| ([^|]*) \|", body, flags=re.M)
        out[head] = {name: cell.strip() for name, cell in rows}
    return out


def _fields(models: tuple[type[BaseModel], ...]) -> dict[str, Any]:
    """Field name (``retry.x`` for the second model) -> its default."""
    main, *nested = models
    found = {name: f for name, f in main.model_fields.items()}
    for inner in nested:
        outer = next(n for n, f in main.model_fields.items() if f.annotation is inner)
        del found[outer]
        found.update({f"{outer}.{n}": f for n, f in inner.model_fields.items()})
    return {
        name: (f.default_factory() if f.default_factory else f.default)  # type: ignore[call-arg]
        for name, f in found.items()
    }


def test_every_section_of_the_reference_is_checked_here() -> None:
    with_tables = {head for head, rows in _tables().items() if rows}
    assert with_tables == set(SECTIONS), with_tables ^ set(SECTIONS)


@pytest.mark.parametrize("head", list(SECTIONS))
def test_a_table_names_exactly_its_models_fields(head: str) -> None:
    documented = set(_tables()[head])
    fields = set(_fields(SECTIONS[head])) - NOT_FROM_JOBS.get(head, set())
    if head == "## Top level":  # the other fields of a job are the sections below
        sections = {h.strip("#` []") for h in SECTIONS if h.startswith("## `")}
        documented |= sections | {"members"}
    assert documented == fields, {
        "without a row": sorted(fields - documented),
        "not a field": sorted(documented - fields),
    }


@pytest.mark.parametrize("head", list(SECTIONS))
def test_each_literal_default_is_the_models(head: str) -> None:
    rows = _tables()[head]
    wrong = {}
    for name, default in _fields(SECTIONS[head]).items():
        cell = rows.get(name, "")
        if default is PydanticUndefined:
            if cell != "required":
                wrong[name] = (cell, "required")
            continue
        if cell == "none":
            if default not in (None, [], {}):
                wrong[name] = (cell, default)
            continue
        literal = re.fullmatch(r"`([^`]+)`", cell)
        if literal is None or isinstance(default, BaseModel):
            continue  # words ("see below", "the job's ...") say what the default is
        try:
            value = json.loads(literal.group(1))
        except ValueError:
            continue  # a pattern, not a value (`<kind>-<n>`)
        if head in BOX_DEFAULTS and default is None:
            default = BOX_DEFAULTS[head].get(name, default)
        if _normal(value) != _normal(default):
            wrong[name] = (cell, default)
    assert not wrong, wrong
