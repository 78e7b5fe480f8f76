"""Job-defined result fields: a small JSON Schema subset, turned into pydantic fields.

A job may ask every member for fields of its own (``MemberSpec.result_schema``, or
``inputs["result_schema"]`` when a caller puts it there), e.g. a vote or a number
the analyst wants in a fixed place::

    {"type": "object",
     "properties": {"answer": {"type": "string", "description": "One line."},
                    "votes": {"type": "integer"},
                    "tags": {"type": "array", "items": {"type": "string"}}},
     "required": ["answer"]}

Supported: an object whose properties are ``string`` (with ``enum``, ``minLength``,
``maxLength``), ``number``, ``integer``, ``boolean`` or ``array`` of strings (with
``minItems``, ``maxItems``), each with an optional ``description``, and a
``required`` list (job properties, or fields the kind has anyway). Anything else
(nested objects, formats, ``$ref``) is refused when the spec is validated, naming
the property, rather than half-checked.

Decision - the job's fields are *added* to the kind's result, never a replacement:
the kind's fields are what its own machinery relies on (a coding member's patch, a
browser member's claims with checked quotes), and the coordinator states a job
schema as one the result must satisfy "beyond the kind's model". So the
``submit_result`` input schema is the kind's submit model extended with the job's
properties (one pydantic model built with :func:`pydantic.create_model`, so the
tool schema and the validation can never disagree). A job property with the name
of a kind field is accepted only when its type is one the kind's field already has
(the kind's definition, at least as strict, is kept); a different type is refused.
Optional job properties default to null.

Decision - the job's schema travels whole and the member's part is derived here
(:func:`member_part`), not handed over beside it: the schema is said once, so the
fields the model is asked for and the fields checked after the member ends
(:func:`.schema_check.problems`) can never come from two versions of it. What a job
says of the kind's own fields (``claims`` with ``minItems``) is not the model's to
fill in: it is left out of ``submit_result`` and checked after the end. Whatever can
never be satisfied is refused when the schema is read, not after every member ran:
a property that names a kind's field with another type, a ``required`` name that is
neither a property nor a kind's field.
"""

from __future__ import annotations

from functools import cache
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model

from .schema_check import member_fields, unreadable

JsonType = Literal["string", "number", "integer", "boolean", "array"]
_PY_TYPES: dict[str, Any] = {
    "string": str,
    "number": float,
    "integer": int,
    "boolean": bool,
    "array": list[str],
}
EXAMPLE = (
    '{"type": "object", "properties": {"answer": {"type": "string"}, '
    '"tags": {"type": "array", "items": {"type": "string"}}}, "required": ["answer"]}'
)


class _Items(BaseModel):
    model_config = ConfigDict(extra="forbid")

    type: Literal["string"]
    """Arrays hold strings only."""


class PropertySchema(BaseModel):
    """One job-defined result field."""

    model_config = ConfigDict(extra="forbid")

    type: JsonType
    """string, number, integer, boolean or array (of strings)."""
    description: str = ""
    """Shown to the model in the submit_result schema."""
    items: _Items | None = None
    """For arrays: ``{"type": "string"}``."""
    enum: list[str] | None = Field(default=None, min_length=1)
    """Strings: the allowed values."""
    # The constraint names keep JSON Schema's spelling: jobs write them that way.
    minLength: int | None = Field(default=None, ge=0)
    """Strings: fewest characters."""
    maxLength: int | None = Field(default=None, ge=0)
    """Strings: most characters."""
    minItems: int | None = Field(default=None, ge=0)
    """Arrays: fewest items."""
    maxItems: int | None = Field(default=None, ge=0)
    """Arrays: most items."""
    title: str | None = None
    """Accepted and ignored (JSON Schema habit)."""


class ResultSchema(BaseModel):
    """The supported subset of JSON Schema for a job's result fields."""

    model_config = ConfigDict(extra="forbid")

    type: Literal["object"]
    """Always ``object``."""
    properties: dict[str, PropertySchema] = Field(default_factory=dict)
    """Field name -> its schema."""
    required: list[str] = Field(default_factory=list)
    """Names that must be present: job properties or fields of the kind's result."""
    additionalProperties: bool | None = None
    """Accepted and ignored: submissions never take unknown fields."""
    title: str | None = None
    description: str | None = None


def parse_result_schema(raw: Any) -> ResultSchema:
    """``raw`` as a :class:`ResultSchema`; ValueError naming what is unsupported."""
    try:
        schema = ResultSchema.model_validate(raw)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or 'schema'}: {e['msg']}" for e in exc.errors()
        )
        raise ValueError(
            f"unsupported result_schema ({problems}). Supported: an object whose properties "
            f"are string, number, integer, boolean or array of strings, plus a required "
            f"list, e.g. {EXAMPLE}"
        ) from None
    for name, prop in schema.properties.items():
        if not name.isidentifier() or name.startswith("_"):
            raise ValueError(f"result_schema property {name!r} must be a plain identifier")
        if prop.type == "array" and prop.items is None:
            raise ValueError(
                f'result_schema property {name!r}: arrays need items = {{"type": "string"}}'
            )
        string_only = prop.enum or prop.minLength is not None or prop.maxLength is not None
        array_only = prop.minItems is not None or prop.maxItems is not None
        if (string_only and prop.type != "string") or (array_only and prop.type != "array"):
            raise ValueError(f"result_schema property {name!r}: a constraint of another type")
    return schema


def extend_model(base: type[BaseModel], schema: ResultSchema) -> type[BaseModel]:
    """``base`` plus the job's properties (see the module docstring for collisions)."""
    kind_props = _json_properties(base)
    unknown = [n for n in schema.required if n not in schema.properties and n not in kind_props]
    if unknown:
        raise ValueError(
            f"result_schema requires {unknown}: neither job properties nor fields of the "
            f"{base.__name__} result ({', '.join(kind_props)})"
        )
    fields: dict[str, Any] = {}
    for name, prop in schema.properties.items():
        if name in base.model_fields:
            _same_type(base, name, prop.type, kind_props)
            continue
        py: Any = Literal[tuple(prop.enum)] if prop.enum else _PY_TYPES[prop.type]
        text = prop.type == "string"
        info = Field(
            default=... if name in schema.required else None,
            description=prop.description or None,
            min_length=prop.minLength if text else prop.minItems,
            max_length=prop.maxLength if text else prop.maxItems,
        )
        fields[name] = (py if name in schema.required else py | None, info)
    return create_model(f"{base.__name__}WithJobFields", __base__=base, **fields)


def member_part(raw: Any, submit: type[BaseModel], result: type[BaseModel]) -> ResultSchema | None:
    """The part of a job's whole result schema ``raw`` that the member's model fills in:
    the properties neither its kind's ``submit`` nor its ``result`` model has
    (:func:`.schema_check.member_fields`), as :func:`extend_model` adds them; None when
    the job asks for no field of its own. ValueError names what can never be: a schema
    that is no object, a field the model could not submit, a kind's field asked for
    with another type, a required name that is neither a property nor a kind's field,
    a constraint the check after the end could not read
    (:func:`.schema_check.unreadable`)."""
    if not isinstance(raw, dict) or raw.get("type") != "object" or not _well_formed(raw):
        raise _refused(raw)
    why = unreadable(raw)
    if why:
        raise ValueError(f"unsupported result_schema ({why})")
    props: dict[str, Any] = raw.get("properties") or {}
    kind_fields = {**submit.model_fields, **result.model_fields}
    for base in (submit, result):
        kind_props = _json_properties(base)
        for name, prop in props.items():
            want = prop.get("type") if isinstance(prop, dict) else None
            if name in base.model_fields and isinstance(want, str):
                _same_type(base, name, want, kind_props)
    unknown = [n for n in raw.get("required") or [] if n not in props and n not in kind_fields]
    if unknown:
        raise ValueError(
            f"result_schema requires {unknown}: neither job properties nor fields of the "
            f"{submit.__name__} result ({', '.join(kind_fields)})"
        )
    part = member_fields(raw, set(kind_fields))
    return None if part is None else parse_result_schema(part)


def _well_formed(raw: dict[str, Any]) -> bool:
    """Whether ``properties`` is a table and ``required`` lists names (what
    :func:`member_part` reads before the member's part is parsed)."""
    props, required = raw.get("properties") or {}, raw.get("required") or []
    return (
        isinstance(props, dict)
        and isinstance(required, list)
        and all(isinstance(r, str) for r in required)
    )


def _refused(raw: Any) -> ValueError:
    """The error for a schema :func:`member_part` cannot read: the parser's, which names
    the part it could not take."""
    try:
        parse_result_schema(raw)
    except ValueError as exc:
        return exc
    return ValueError(f"unsupported result_schema; e.g. {EXAMPLE}")


@cache
def _json_properties(model: type[BaseModel]) -> dict[str, Any]:
    """``model``'s JSON Schema properties, made once per model (a kind's models are
    classes that do not change; making the schema costs about a millisecond, and every
    member's spec is checked). Read only."""
    return dict(model.model_json_schema().get("properties", {}))


def _same_type(base: type[BaseModel], name: str, want: str, kind_props: dict[str, Any]) -> None:
    """Refuse a job property ``name`` of type ``want`` where the kind's ``base`` has the
    field with other JSON types (an integer is a number); a field whose JSON type cannot
    be read is left to the check after the end."""
    have = _json_types(kind_props.get(name, {}))
    if have and want not in have and not (want == "number" and "integer" in have):
        raise ValueError(
            f"result_schema property {name!r} has type {want}, but the "
            f"{base.__name__} result already has {name!r} as {'/'.join(sorted(have))}; "
            "rename the job's field"
        )


def job_field_names(base: type[BaseModel], schema: ResultSchema | None) -> list[str]:
    """The job's properties that ``base`` does not already have."""
    if schema is None:
        return []
    return [n for n in schema.properties if n not in base.model_fields]


def _json_types(prop: dict[str, Any]) -> set[str]:
    types = {prop["type"]} if isinstance(prop.get("type"), str) else set()
    for option in prop.get("anyOf", []):
        types |= _json_types(option)
    return types
