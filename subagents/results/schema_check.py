"""A job's ``result_schema`` as a whole: what the member's model fills in, what is
checked after the member ends.

A kind's result model (Findings, CodingResult) is enforced by the harness; a job can
demand more of it - a field that must be present, a list that must not be empty.
The job's schema travels once, whole, in ``MemberSpec.result_schema``, and is split
where each part is used: :func:`member_fields` is the part the member's own model
fills in (the properties its kind lacks: the harness adds them to ``submit_result``,
:mod:`.result_schema`), and :func:`problems` checks the whole schema against the
result after the member ends (the coordinator, where the attempt ran), for what the
kind's own fields must satisfy too (a list of claims that must not be empty).

:func:`problems` checks the JSON Schema keywords that matter for that, and no more:
``type``, ``required``, ``properties``, ``items``, ``minItems``, ``maxItems``,
``minLength``, ``enum`` (nested). A result that fails is the member's failure, with
the reason; it is not retried (the same task would produce the same shape).

It lives with the harness (``subagents``), not the coordinator, because the harness
derives its part from the same schema and the harness never imports the coordinator.
"""

from __future__ import annotations

from typing import Any

_TYPES: dict[str, tuple[type, ...]] = {
    "object": (dict,),
    "array": (list,),
    "string": (str,),
    "integer": (int,),
    "number": (int, float),
    "boolean": (bool,),
    "null": (type(None),),
}


def problems(value: Any, schema: dict[str, Any], path: str = "result") -> list[str]:
    """What is wrong with ``value`` under ``schema`` (empty when it passes)."""
    out: list[str] = []
    want = schema.get("type")
    if isinstance(want, str) and want in _TYPES:
        ok = isinstance(value, _TYPES[want]) and not (
            want in ("integer", "number") and isinstance(value, bool)
        )
        if not ok:
            return [f"{path} should be of type {want}"]
    if "enum" in schema and value not in schema["enum"]:
        out.append(f"{path} should be one of {schema['enum']}")
    if isinstance(value, str) and len(value) < schema.get("minLength", 0):
        out.append(f"{path} should have at least {schema['minLength']} characters")
    if isinstance(value, list):
        if len(value) < schema.get("minItems", 0):
            out.append(f"{path} should have at least {schema['minItems']} items")
        if "maxItems" in schema and len(value) > schema["maxItems"]:
            out.append(f"{path} should have at most {schema['maxItems']} items")
        if isinstance(schema.get("items"), dict):
            for i, item in enumerate(value):
                out += problems(item, schema["items"], f"{path}[{i}]")
    if isinstance(value, dict):
        for key in schema.get("required", []):
            if key not in value:
                out.append(f"{path}.{key} is required")
        for key, sub in (schema.get("properties") or {}).items():
            if key in value and isinstance(sub, dict):
                out += problems(value[key], sub, f"{path}.{key}")
    return out


MAX_DEPTH = 16
"""Deepest nesting of ``properties`` and ``items`` a job's schema may have: a result is
a few levels deep, and :func:`problems` recurses once a level."""
_COUNTS = ("minLength", "minItems", "maxItems")


def unreadable(schema: Any, path: str = "", depth: int = 0) -> str | None:
    """Where ``schema`` has a keyword :func:`problems` checks with a value it cannot use
    (an ``enum`` that is no list, a ``minItems`` that is no whole number, nesting past
    :data:`MAX_DEPTH`), and what is wrong there; None when every one is usable. Checked
    when the schema is read, so that the check after the end never fails on it."""
    if not isinstance(schema, dict):
        return None  # a boolean or other schema: problems() passes over it
    at = f"{path}." if path else ""
    if depth > MAX_DEPTH:
        return f"{path}: nested more than {MAX_DEPTH} levels deep"
    if "enum" in schema and not isinstance(schema["enum"], list):
        return f"{at}enum: should be a list of the allowed values"
    for name in _COUNTS:
        n = schema.get(name)
        if name in schema and (isinstance(n, bool) or not isinstance(n, int) or n < 0):
            return f"{at}{name}: should be a whole number, 0 or more (got {n!r:.40})"
    required = schema.get("required", [])
    if not isinstance(required, list) or not all(isinstance(r, str) for r in required):
        return f"{at}required: should be a list of property names"
    props = schema.get("properties") or {}
    if not isinstance(props, dict):
        return f"{at}properties: should be a table of property name -> schema"
    inner = [(f"{at}properties.{k}", v) for k, v in props.items()]
    inner += [(f"{at}items", schema["items"])] if "items" in schema else []
    for where, sub in inner:
        why = unreadable(sub, where, depth + 1)
        if why:
            return why
    return None


def member_fields(schema: dict[str, Any] | None, kind_fields: set[str]) -> dict[str, Any] | None:
    """The part of a job's result schema the member's model must fill in itself: the
    properties its kind's result does not have, with their ``required`` entries.

    Those are added to ``submit_result`` (:func:`.result_schema.member_part`), so the
    model is told about them and its answer is checked as it submits. Constraints on
    the kind's own fields (a list of claims that must not be empty) stay with
    :func:`problems`, checked after the member ends; None when the job asks for
    nothing new."""
    if not schema:
        return None
    props = {k: v for k, v in (schema.get("properties") or {}).items() if k not in kind_fields}
    if not props:
        return None
    out: dict[str, Any] = {"type": "object", "properties": props}
    required = [r for r in schema.get("required") or [] if r in props]
    if required:
        out["required"] = required
    return out
