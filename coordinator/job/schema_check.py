"""A job's ``result_schema``: extra checks a member's result must pass.

A kind's result model (Findings, CodingResult) is enforced by the harness; a job can
demand more of it - a field that must be present, a list that must not be empty.
Fleet checks the JSON Schema keywords that matter for that, and no more: ``type``,
``required``, ``properties``, ``items``, ``minItems``, ``maxItems``, ``minLength``,
``enum`` (nested). A result that fails is the member's failure, with the reason;
it is not retried (the same task would produce the same shape).
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


def member_fields(schema: dict[str, Any] | None, kind_fields: set[str]) -> dict[str, Any] | None:
    """The part of a job's result schema the member's model must fill in itself: the
    properties its kind's result does not have, with their ``required`` entries.

    Those go to the harness (``MemberSpec.result_schema``), which adds them to
    ``submit_result``, so the model is told about them and its answer is checked as
    it submits. Constraints on the kind's own fields (a list of claims that must not
    be empty) stay with :func:`problems`, checked after the member ends; None when the
    job asks for nothing new."""
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
