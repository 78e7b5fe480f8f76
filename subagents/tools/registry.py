"""The tool registry: validate arguments, run a tool, turn every failure into an error result.

:meth:`ToolRegistry.call` is the single place where a model's tool call meets code.
It never raises for the tool's own failure: unknown tool names, arguments that fail
the tool's pydantic schema, :class:`~subagents.tools.base.ToolError`, sandbox errors
such as :class:`~sandbox.errors.PathRefused`, a per-call timeout and any other
exception all come back as an ``is_error`` :class:`ToolOutput` whose text says
exactly what was wrong - the model can fix its call and the run goes on. The one
exceptions are :data:`BOX_GONE` (``SandboxCrashed``, ``SandboxClosed``,
``SandboxUnavailable``): a dead or unreachable box cannot be fixed by the model, so
they propagate and the member ends ``crashed``.

Jobs add their own tools with :class:`CustomToolSpec`:

* a **command template** (``command = "pytest -q {path}"``) run inside the member's
  box by ``/bin/sh -c``; each ``{name}`` placeholder is a positional parameter and
  its argument a word of its own in the argv, so no argument is ever read as shell
  syntax, and one starting with ``-`` is refused unless the template allows options
  there (:mod:`subagents.tools.templates`, which also refuses, when the job is read,
  a template that places a placeholder where that would not hold);
* a **Python callable** named by import path (``callable = "mypkg.tools:lookup"``)
  whose signature is pydantic-typed; it runs on the *host*, outside every box, so it
  is refused unless the job says ``host = true`` explicitly.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable, Iterable
from typing import Any, ClassVar, Literal

import anyio
from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model, model_validator

from sandbox.errors import SandboxClosed, SandboxCrashed, SandboxError, SandboxUnavailable

from .base import Blocked, Tool, ToolContext, ToolError, ToolOutput
from .names import clean_text
from .templates import TemplateError, compile_template

_NAME_PATTERN = r"^[a-zA-Z][a-zA-Z0-9_-]{0,63}$"
BOX_GONE = (SandboxCrashed, SandboxClosed, SandboxUnavailable)
"""Errors no tool call can fix: the box is dead or unreachable, so the member ends."""
_PARAM_TYPES: dict[str, type] = {"string": str, "integer": int, "number": float, "boolean": bool}


def format_validation_error(
    tool: str, exc: ValidationError, schema: dict[str, Any] | None = None
) -> str:
    """One line per problem: which argument, what was wrong, the type expected (read
    from the tool's input ``schema`` when given) and what was given."""
    lines = [f"Invalid arguments for {tool}: {exc.error_count()} problem(s)."]
    names = list((schema or {}).get("properties", {}))
    for err in exc.errors(include_url=False):
        loc = [p for p in err["loc"] if not isinstance(p, str) or not p.startswith("function-")]
        where = ".".join(str(p) for p in loc) or "(arguments)"
        expected = _expected(schema, loc) if schema else None
        hint = f"; expected {expected}" if expected else ""
        if err["type"] == "missing":
            lines.append(f"- {where}: required argument missing{hint}")
            continue
        if err["type"] == "extra_forbidden" and len(loc) == 1 and names:
            lines.append(
                f"- {where}: not an argument of {tool} (its arguments: {', '.join(names)})"
            )
            continue
        given = repr(err.get("input"))
        if len(given) > 80:
            given = given[:77] + "..."
        lines.append(f"- {where}: {err['msg']}{hint} (got {given})")
    lines.append("Fix the arguments and call the tool again.")
    return "\n".join(lines)


def _expected(schema: dict[str, Any], loc: list[Any]) -> str | None:
    """The JSON type expected at ``loc`` in ``schema``, in words (None if unknown)."""
    node: dict[str, Any] | None = schema
    for part in loc:
        node = _resolve(schema, node)
        if node is None:
            return None
        if isinstance(part, int):
            node = node.get("items")
        else:
            node = node.get("properties", {}).get(part)
    return _describe_type(schema, _resolve(schema, node))


def _resolve(root: dict[str, Any], node: dict[str, Any] | None) -> dict[str, Any] | None:
    if node is not None and "$ref" in node:
        return root.get("$defs", {}).get(str(node["$ref"]).rsplit("/", 1)[-1])
    return node


def _describe_type(root: dict[str, Any], node: dict[str, Any] | None, depth: int = 0) -> str | None:
    if node is None or depth > 3:
        return None
    if "enum" in node:
        return "one of " + ", ".join(repr(v) for v in node["enum"])
    if "const" in node:
        return repr(node["const"])
    options = node.get("anyOf") or node.get("oneOf")
    if options:
        words = [_describe_type(root, _resolve(root, o), depth + 1) for o in options]
        return " or ".join(w for w in words if w) or None
    kind = node.get("type")
    if kind == "array":
        inner = _describe_type(root, _resolve(root, node.get("items")), depth + 1)
        return f"array of {inner}" if inner else "array"
    if kind == "object":
        fields = list(node.get("properties", {}))
        return f"object with {', '.join(fields)}" if fields else "object"
    return str(kind) if kind else None


def error_output(text: str) -> ToolOutput:
    return ToolOutput(text=clean_text(text), is_error=True)


class ToolRegistry:
    """The tools one member may call, by name."""

    def __init__(self, tools: Iterable[Tool], *, timeout_s: float = 600.0) -> None:
        self._tools: dict[str, Tool] = {}
        self.timeout_s = timeout_s
        """Host-side ceiling of one tool call (in-box timeouts are the tools' own)."""
        for tool in tools:
            if tool.name in self._tools:
                raise ValueError(f"two tools are named {tool.name!r}; tool names must be unique")
            self._tools[tool.name] = tool

    def add(self, tool: Tool) -> None:
        """One more tool (an MCP server's, known once the server has started)."""
        if tool.name in self._tools:
            raise ValueError(f"two tools are named {tool.name!r}; tool names must be unique")
        self._tools[tool.name] = tool

    def names(self) -> list[str]:
        return list(self._tools)

    def get(self, name: str) -> Tool | None:
        return self._tools.get(name)

    def definitions(self) -> list[dict[str, Any]]:
        """Messages API tool definitions, in registration order."""
        return [tool.definition() for tool in self._tools.values()]

    async def call(self, name: str, raw: Any, ctx: ToolContext) -> ToolOutput:
        """Validate ``raw`` against the tool's schema and run it; failures become errors."""
        tool = self._tools.get(name)
        if tool is None:
            return error_output(
                f"Unknown tool {name!r}. Available tools: {', '.join(self._tools)}."
            )
        try:
            args = tool.Input.model_validate(raw if raw is not None else {})
        except ValidationError as exc:
            return error_output(format_validation_error(name, exc, tool.Input.model_json_schema()))
        with anyio.move_on_after(self.timeout_s) as scope:
            return await self._run(tool, args, ctx)
        if scope.cancelled_caught:
            return error_output(
                f"{name} did not finish within {self.timeout_s:g} s and was stopped; "
                "try a smaller request or a shorter command."
            )
        raise AssertionError("unreachable")  # pragma: no cover

    async def _run(self, tool: Tool, args: BaseModel, ctx: ToolContext) -> ToolOutput:
        try:
            out = await tool.run(args, ctx)
        except BOX_GONE:
            raise
        except Blocked as exc:
            out = error_output(str(exc) or f"{tool.name} was refused")
            out.blocked = True
            return out
        except ToolError as exc:
            return error_output(str(exc) or f"{tool.name} failed")
        except (SandboxError, OSError) as exc:
            return error_output(f"{tool.name} failed: {exc}")
        except Exception as exc:
            return error_output(f"{tool.name} raised {type(exc).__name__}: {exc}")
        out = out if isinstance(out, ToolOutput) else ToolOutput(text=str(out))
        out.text = clean_text(out.text)  # a byte name in command output, from any tool
        return out


class ParamSpec(BaseModel):
    """One argument of a command-template tool."""

    model_config = ConfigDict(extra="forbid")

    type: Literal["string", "integer", "number", "boolean"] = "string"
    """JSON type of the argument."""
    description: str = ""
    """What the argument means, shown to the model."""
    default: str | int | float | bool | None = None
    """Value used when the model leaves the argument out; None makes it required."""
    options: bool = False
    """A string argument may start with ``-`` (the command reads it as an option). Off:
    such an argument is refused, unless the template writes ``--`` before it."""


class CustomToolSpec(BaseModel):
    """A tool a job adds: a command template run in the box, or a host callable."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=_NAME_PATTERN)
    """Tool name the model calls (letters, digits, ``_``, ``-``)."""
    description: str
    """What the tool does and when to use it, shown to the model."""
    command: str | None = None
    """Shell command template run in the box, e.g. ``"pytest -q {path}"``."""
    parameters: dict[str, ParamSpec] = Field(default_factory=dict)
    """Arguments of a command template, by placeholder name."""
    callable: str | None = None
    """Import path of a Python callable, ``"package.module:function"``."""
    host: bool = False
    """Must be true for a callable tool: it runs on the host, outside the box."""
    timeout_s: float = Field(default=120.0, gt=0)
    """In-box timeout of a command template."""

    @model_validator(mode="after")
    def _one_kind(self) -> CustomToolSpec:
        if (self.command is None) == (self.callable is None):
            raise ValueError(
                f"tool {self.name!r}: give exactly one of 'command' (run in the box) "
                "or 'callable' (a Python function run on the host)"
            )
        if self.command is not None:
            try:
                template = compile_template(self.name, self.command)
            except TemplateError as exc:
                raise ValueError(str(exc)) from None
            unknown = sorted(set(template.order) - set(self.parameters))
            if unknown:
                raise ValueError(
                    f"tool {self.name!r}: command uses {unknown} but 'parameters' does "
                    f"not declare them; add e.g. parameters.{unknown[0]} = {{type = 'string'}}"
                )
        if self.callable is not None and not self.host:
            raise ValueError(
                f"tool {self.name!r}: a callable runs on the host, outside the sandbox; "
                "set host = true to allow that, or use a 'command' template instead"
            )
        return self


class CommandTool(Tool):
    """A command template run in the box, its arguments passed as positional parameters."""

    name: ClassVar[str] = "command"
    description: ClassVar[str] = ""

    def __init__(self, spec: CustomToolSpec) -> None:
        fields: dict[str, Any] = {}
        for pname, p in spec.parameters.items():
            typ = _PARAM_TYPES[p.type]
            default = ... if p.default is None else p.default
            fields[pname] = (typ, Field(default, description=p.description or None))
        self.Input = create_model(  # type: ignore[misc]
            f"{spec.name}_input", __config__=ConfigDict(extra="forbid"), **fields
        )
        self.name = spec.name  # type: ignore[misc]
        self.description = spec.description  # type: ignore[misc]
        self.spec = spec
        assert spec.command is not None  # a CommandTool is built for a command template
        self.template = compile_template(spec.name, spec.command)
        self.options = {n for n, p in spec.parameters.items() if p.options}

    async def run(self, args: Any, ctx: ToolContext) -> ToolOutput:
        if ctx.sandbox is None:
            raise ToolError(f"{self.name} runs in the member's box, and this member has none")
        values = args.model_dump()
        try:
            argv = self.template.argv(self.name, values, self.options)
        except ValueError as exc:
            raise ToolError(f"{self.name} was not run: {exc}") from None
        res = await ctx.sandbox.exec(argv, timeout=self.spec.timeout_s)
        shown = self.template.shown(values)
        text = f"$ {shown}\n" + render_exec(res.stdout, res.stderr, res.exit_code, res.timed_out)
        return ToolOutput(text=text, is_error=not res.ok, truncated=res.truncated)


def render_exec(stdout: str, stderr: str, exit_code: int, timed_out: bool, limit: float = 0) -> str:
    """A command's outcome as the model reads it: exit status, then both streams."""
    status = f"exit code {exit_code}"
    if timed_out:
        status += (
            f" (timed out after {limit:g} s; partial output below)" if limit else " (timed out)"
        )
    parts = [status]
    if stdout:
        parts.append("stdout:\n" + stdout.rstrip("\n"))
    if stderr:
        parts.append("stderr:\n" + stderr.rstrip("\n"))
    if not stdout and not stderr:
        parts.append("(no output)")
    return "\n".join(parts)


class CallableTool(Tool):
    """A Python function run on the host; its typed signature is the tool's schema."""

    name: ClassVar[str] = "callable"
    description: ClassVar[str] = ""

    def __init__(self, spec: CustomToolSpec, func: Callable[..., Any]) -> None:
        self.func = func
        self.name = spec.name  # type: ignore[misc]
        self.description = spec.description  # type: ignore[misc]
        self.Input = signature_model(spec.name, func)  # type: ignore[misc]

    async def run(self, args: Any, ctx: ToolContext) -> ToolOutput:
        kwargs = {k: getattr(args, k) for k in type(args).model_fields}
        if inspect.iscoroutinefunction(self.func):
            value = await self.func(**kwargs)
        else:
            # Host callables may block (files, HTTP to a local service): keep them
            # off the event loop so sibling tool calls keep running.
            value = await anyio.to_thread.run_sync(lambda: self.func(**kwargs))
        if isinstance(value, ToolOutput):
            return value
        if isinstance(value, BaseModel):
            return ToolOutput(text=value.model_dump_json(indent=1))
        return ToolOutput(text=str(value))


def signature_model(name: str, func: Callable[..., Any]) -> type[BaseModel]:
    """A pydantic model of ``func``'s parameters; every parameter must be annotated."""
    fields: dict[str, Any] = {}
    hints = _type_hints(func)
    for pname, param in inspect.signature(func).parameters.items():
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            raise ValueError(f"tool {name!r}: *args/**kwargs cannot be described to a model")
        if pname not in hints:
            raise ValueError(
                f"tool {name!r}: parameter {pname!r} has no type annotation; "
                "annotate every parameter (e.g. 'query: str') so it can be validated"
            )
        default = ... if param.default is param.empty else param.default
        fields[pname] = (hints[pname], default)
    return create_model(f"{name}_input", __config__=ConfigDict(extra="forbid"), **fields)


def _type_hints(func: Callable[..., Any]) -> dict[str, Any]:
    import typing

    try:
        return typing.get_type_hints(func)
    except Exception as exc:
        raise ValueError(f"cannot read the type hints of {func!r}: {exc}") from None


def load_callable(path: str) -> Callable[..., Any]:
    """Import ``"package.module:function"`` (or ``package.module.function``)."""
    module_name, sep, attr = path.partition(":")
    if not sep:
        module_name, _, attr = path.rpartition(".")
    if not module_name or not attr:
        raise ValueError(f"{path!r} is not an import path; write e.g. 'mypkg.tools:lookup'")
    try:
        obj: Any = importlib.import_module(module_name)
    except ImportError as exc:
        raise ValueError(
            f"cannot import {module_name!r} for tool callable {path!r}: {exc}"
        ) from None
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise ValueError(f"{module_name!r} has no attribute {attr!r} (from {path!r})")
        obj = getattr(obj, part)
    if not callable(obj):
        raise ValueError(f"{path!r} is not callable")
    return obj


def build_custom_tool(spec: CustomToolSpec) -> Tool:
    """The :class:`Tool` a job's :class:`CustomToolSpec` describes."""
    if spec.command is not None:
        return CommandTool(spec)
    assert spec.callable is not None  # guaranteed by the spec's validator
    return CallableTool(spec, load_callable(spec.callable))
