"""Tool policies: which calls a member makes alone, which wait for a person's yes, which
it may never make - checked by the harness before every call, not asked of the model.

A policy has three lists of rules and a default. A rule is ``TOOL`` (every call of the
tool; ``*`` and ``?`` glob the name, in any case, so ``mcp__docs__*`` is every tool of
the MCP server ``docs``) or ``TOOL:PATTERN`` (only calls whose arguments match). The
first list holding a matching rule decides, in the order ``deny``, ``ask``, ``allow``;
no match means ``default`` (``allow``). So a job's ``deny`` can never be loosened by an
``allow``, and ``default = "deny"`` with a short ``allow`` list is an allowlist.

Rules fail closed. What cannot be told about a call before it runs matches every deny
and ask rule and no allow rule: the policy refuses what it cannot read rather than
guess it harmless.

What a pattern is matched against, per tool:

* ``shell``: each command the line runs, as :mod:`subagents.commandline` reads it
  with a bash grammar: wherever it stands (compound commands, conditions, loops,
  pipelines, substitutions, here-documents, functions), under its wrappers (``nice``,
  ``env``, ``timeout``, ``sudo``, ``xargs``, ``bash -c``, ``eval``, ...; the wrapper
  counts as a command too), quotes and backslashes removed, and by its path's last
  part too for deny and ask rules (``/usr/bin/touch x`` is ``touch x``). ``*``
  matches anything, so ``shell:rm *`` is every ``rm`` with arguments. A deny or ask
  rule matches when any command could match - a variable or a glob in it may hold
  anything, and a command that cannot be read (``$c x``, a script piped to ``sh``, a
  parse error) matches every such rule. A line is allowed when each of its commands
  is matched by an allow rule (``sleep 3; echo done`` under ``shell:sleep *`` and
  ``shell:echo *``), each as spelled and with no variable or glob in it
  (``true; rm -rf x`` is not allowed by ``shell:true``). Calling a function the line
  defined before, outside any condition, needs no rule: its body's commands are
  checked.
* ``read_file``, ``write_file``, ``edit_file``, ``glob``, ``grep``: the path, made
  absolute under ``/workspace`` and normalised (``..`` resolved); ``*`` stays within
  one directory, ``**`` crosses them, and ``DIR/**`` also matches ``DIR`` itself.
* ``navigate``: the URL. Any other tool (job-defined, MCP): each string argument; an
  argument nested deeper than 4 levels or past 100 items of a list is not read, so
  such a call matches every deny and ask rule with a pattern and no allow rule.

The policy is a guard against a member doing what the job's owner did not want done
unasked; it is not the isolation boundary - the box is. A line is read for what it
says, not for what the programs it starts do: a script written, then run, or
``python -c`` doing the same work, is the command ``python``. So ``deny`` rules are
best written on tools (``deny = ["shell"]``) when a call must never happen. No
other built-in tool runs a file the member can write, so ``deny = ["shell"]`` keeps
the model's own code from running through Fleet's tools; it does not stop what the
job runs in the box (a coding member's check command runs the code it checks).

``submit_result`` and ``tool_search`` are never checked: they touch nothing outside
the member's own context, and a member must always be able to finish.

Asking. An ``ask`` goes to an :class:`Approver` (the coordinator's: a person at the
run's terminal or ``fleet approve``), and only the asking call waits: the member's
other calls of the same turn, and its siblings, go on. The wait counts against the
member's deadline; ``ask_timeout_s`` bounds it, after which ``ask_default`` applies. An
"always" a person gave a rule answers the later calls the rule surely matches, never
one it matched only because the call could not be read (``$c x`` under
``ask = ["shell:rm *"]`` is asked about each time).

Error contract of :class:`Approver`: :meth:`Approver.ask` returns an
:class:`Approval` for every ending it can see (an answer, a timeout, nobody to ask);
it raises only cancellation, after recording that the request is no longer waiting.
"""

from __future__ import annotations

import fnmatch
import posixpath
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

import anyio
from pydantic import BaseModel, ConfigDict, Field, field_validator

from ..commandline.commands import commands_of
from ..commandline.words import may_match, must_match
from ..trace import PolicyDecision, TraceWriter

Action = Literal["allow", "ask", "deny"]
EXEMPT = frozenset({"submit_result", "tool_search"})
"""Tools no policy gates (see the module docstring)."""
_PATH_TOOLS = {"read_file", "write_file", "edit_file", "glob", "grep"}
_RULE_RE = re.compile(r"^([A-Za-z0-9_*?-]+)(?::(.+))?$", re.S)


def check_rules(rules: list[str]) -> list[str]:
    """Refuse a rule that is not ``TOOL`` or ``TOOL:PATTERN``."""
    for rule in rules:
        if not _RULE_RE.match(rule):
            raise ValueError(
                f"{rule!r} is not a rule; write a tool name (glob), optionally with a "
                "pattern for its arguments after a colon, e.g. 'shell:rm *' or 'mcp__docs__*'"
            )
    return rules


class ToolPolicy(BaseModel):
    """Allow / ask / deny rules on tool calls (job ``[policy]``, member ``policy``)."""

    model_config = ConfigDict(extra="forbid")

    deny: list[str] = Field(default_factory=list)
    """Calls that are refused: the model gets an error result saying so."""
    ask: list[str] = Field(default_factory=list)
    """Calls that wait for a person's yes (only the asking member waits)."""
    allow: list[str] = Field(default_factory=list)
    """Calls made without asking (matters when ``default`` is not ``allow``)."""
    default: Action = "allow"
    """What a call no rule matches gets."""
    ask_default: Literal["allow", "deny"] = "deny"
    """The answer to an ask when nobody can answer (no terminal) or nobody did in time."""
    ask_timeout_s: float | None = Field(default=None, gt=0, le=86_400)
    """Longest wait for an answer; None: until the member's deadline."""

    @field_validator("deny", "ask", "allow")
    @classmethod
    def _rules(cls, rules: list[str]) -> list[str]:
        return check_rules(rules)

    def merged(self, member: MemberPolicy | None) -> ToolPolicy:
        """This (the job's) policy with a member's: rules added, settings it gave replaced."""
        if member is None:
            return self
        given = {
            k: v
            for k in ("default", "ask_default", "ask_timeout_s")
            if (v := getattr(member, k)) is not None
        }
        return self.model_copy(
            update={
                "deny": [*self.deny, *member.deny],
                "ask": [*self.ask, *member.ask],
                "allow": [*self.allow, *member.allow],
                **given,
            }
        )

    @property
    def empty(self) -> bool:
        return not (self.deny or self.ask or self.allow) and self.default == "allow"

    @property
    def may_ask(self) -> bool:
        """Whether any call can wait for a person's answer under this policy."""
        return bool(self.ask) or self.default == "ask"

    def check(self, tool: str, args: Any) -> Decision:
        """The decision for one call: the first matching rule's action, else the default."""
        if tool in EXEMPT:
            return Decision("allow", "")
        for action in ("deny", "ask"):
            for rule in getattr(self, action):
                if rule_matches(rule, tool, args):
                    return Decision(action, rule, surely_matches(rule, tool, args))  # type: ignore[arg-type]
        allowed_by = allowing_rules(self.allow, tool, args)
        if allowed_by:
            return Decision("allow", ", ".join(allowed_by))
        return Decision(self.default, "")


class MemberPolicy(BaseModel):
    """A member's additions to the job's policy (``policy = {...}``): its rules join the
    job's; a setting it gives (not None) replaces the job's. Unset settings stay None
    through JSON and TOML, so a job read back keeps the job's settings in force."""

    model_config = ConfigDict(extra="forbid")

    deny: list[str] = Field(default_factory=list)
    ask: list[str] = Field(default_factory=list)
    allow: list[str] = Field(default_factory=list)
    default: Action | None = None
    ask_default: Literal["allow", "deny"] | None = None
    ask_timeout_s: float | None = Field(default=None, gt=0, le=86_400)

    @field_validator("deny", "ask", "allow")
    @classmethod
    def _rules(cls, rules: list[str]) -> list[str]:
        return check_rules(rules)


@dataclass(frozen=True)
class Decision:
    action: Action
    rule: str
    """The rule that decided; "" for the policy's default."""
    sure: bool = True
    """The rule matched for certain, not only because the call could not be read."""


def rule_matches(rule: str, tool: str, args: Any, *, every: bool = False) -> bool:
    """Whether ``rule`` covers this call. ``every`` (allow rules): every command of a
    shell line must match, and what cannot be told about a call never matches; else
    (deny and ask rules) any one command, and what cannot be told always matches."""
    m = _RULE_RE.match(rule)
    if m is None or not fnmatch.fnmatchcase(tool.lower(), m.group(1).lower()):
        return False
    pattern = m.group(2)
    if pattern is None:
        return True
    args = args if isinstance(args, dict) else {}
    if tool == "shell":
        command = args.get("command")
        if not isinstance(command, str):
            return not every
        found = commands_of(command)
        if every:
            return bool(found) and all(
                inv.function or must_match(pattern, inv.shapes(by_name=False)[0]) for inv in found
            )
        return _glob(pattern, command) or any(
            may_match(pattern, shape) for inv in found for shape in inv.shapes(by_name=True)
        )
    if tool in _PATH_TOOLS:
        path = args.get("path")
        if not isinstance(path, str):
            path = "/workspace"
        return _path_glob(pattern, _absolute(path))
    if tool == "navigate":
        return isinstance(args.get("url"), str) and _glob(pattern, args["url"])
    strings = list(_strings(args))
    if None in strings:  # nested past what is read: cannot be told
        return not every
    return any(_glob(pattern, s) for s in strings if s is not None)


def surely_matches(rule: str, tool: str, args: Any) -> bool:
    """Whether ``rule`` matches this call as it stands, without a hole or an unread
    argument standing in for what it might be (what fail-closed matching adds)."""
    m = _RULE_RE.match(rule)
    if m is None or not fnmatch.fnmatchcase(tool.lower(), m.group(1).lower()):
        return False
    pattern = m.group(2)
    if pattern is None or tool in _PATH_TOOLS or tool == "navigate":
        return rule_matches(rule, tool, args)
    args = args if isinstance(args, dict) else {}
    if tool == "shell":
        command = args.get("command")
        return isinstance(command, str) and (
            _glob(pattern, command)
            or any(
                must_match(pattern, shape)
                for inv in commands_of(command)
                for shape in inv.shapes(by_name=True)
            )
        )
    return any(_glob(pattern, s) for s in _strings(args) if s is not None)


def allowing_rules(rules: list[str], tool: str, args: Any) -> list[str]:
    """The allow rules that together cover this call, [] when they do not: one rule
    that covers it whole, or for a shell line, a rule for each of its commands
    (``sleep 3; echo done`` under ``shell:sleep *`` and ``shell:echo *``)."""
    for rule in rules:
        if rule_matches(rule, tool, args, every=True):
            return [rule]
    command = args.get("command") if isinstance(args, dict) else None
    if tool != "shell" or not isinstance(command, str):
        return []
    patterns = [
        (rule, m.group(2))
        for rule in rules
        if (m := _RULE_RE.match(rule))
        and m.group(2)
        and fnmatch.fnmatchcase(tool, m.group(1).lower())
    ]
    used: list[str] = []
    for inv in commands_of(command):
        if inv.function:
            continue
        shape = inv.shapes(by_name=False)[0]
        covering = next((r for r, p in patterns if must_match(p, shape)), None)
        if covering is None:
            return []
        used += [covering] if covering not in used else []
    return used


def _glob(pattern: str, text: str) -> bool:
    """Whole-string match where ``*`` is any run of characters, ``?`` one."""
    regex = "".join(
        ".*" if c == "*" else "." if c == "?" else re.escape(c) for c in pattern.strip()
    )
    return re.fullmatch(regex, text.strip(), re.S) is not None


def _path_glob(pattern: str, path: str) -> bool:
    """``*`` within one directory, ``**`` across them; ``DIR/**`` also matches ``DIR``."""
    pattern = _absolute(pattern) if not pattern.startswith("*") else pattern
    out, i = "", 0
    while i < len(pattern):
        if pattern.startswith("/**", i) and i + 3 == len(pattern):
            out += "(/.*)?"
            i += 3
        elif pattern.startswith("**", i):
            out += ".*"
            i += 2
        elif pattern[i] == "*":
            out += "[^/]*"
            i += 1
        elif pattern[i] == "?":
            out += "[^/]"
            i += 1
        else:
            out += re.escape(pattern[i])
            i += 1
    return re.fullmatch(out, path) is not None


def _absolute(path: str) -> str:
    if not path.startswith("/"):
        path = "/workspace/" + path
    return posixpath.normpath(path) if "**" not in path else path


def _strings(value: Any, depth: int = 0) -> Iterator[str | None]:
    """Each string in a call's arguments; None for what lies past 4 levels of nesting
    or 100 items of a list, which is not read."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict | list) and depth > 4:
        yield None
    elif isinstance(value, dict):
        for v in value.values():
            yield from _strings(v, depth + 1)
    elif isinstance(value, list):
        for v in value[:100]:
            yield from _strings(v, depth + 1)
        if len(value) > 100:
            yield None


class ApprovalRequest(BaseModel):
    """One call waiting for a person's yes."""

    model_config = ConfigDict(extra="forbid")

    member: str
    call_id: str
    tool: str
    input: dict[str, Any]
    rule: str
    """The ask rule that matched ("" when the policy's default is ``ask``)."""
    sure: bool = True
    """The rule matched for certain; False when it matched only because the call could
    not be read (``$c x``): an earlier "always" for the rule does not answer it then."""
    ask_default: Literal["allow", "deny"] = "deny"


class Approval(BaseModel):
    """How an ask ended."""

    model_config = ConfigDict(extra="forbid")

    allowed: bool
    by: str
    """Who or what decided: ``terminal``, ``fleet approve``, ``always`` (an earlier
    "always" for the rule), ``approve-all``, ``timeout``, ``no terminal``; a yes given
    to another argument than the one asked about is a no, its ``by`` saying so."""
    always: bool = False
    """The person said yes for every call this rule matches, for the rest of the run."""


class Approver(Protocol):
    """Where an ask goes (the error contract is in the module docstring)."""

    async def ask(self, request: ApprovalRequest, timeout_s: float | None) -> Approval: ...


class NoApprover:
    """Nobody to ask (a member run without a coordinator): ``ask_default`` applies."""

    async def ask(self, request: ApprovalRequest, timeout_s: float | None) -> Approval:
        return Approval(allowed=request.ask_default == "allow", by="no one to ask")


@dataclass
class PolicyGate:
    """One member's policy in force: decides each call, asks when a rule says so,
    traces every decision a rule (or a non-allow default) made."""

    policy: ToolPolicy
    approver: Approver
    member: str
    trace: TraceWriter
    waiting: dict[str, str] = field(default_factory=dict)
    """Calls waiting for an answer now: call id -> ``tool(arguments)``."""
    cut_off: list[str] = field(default_factory=list)
    """Calls whose wait was cancelled (the member's deadline), as ``tool(arguments)``."""

    async def admit(self, call_id: str, tool: str, raw: Any) -> str | None:
        """None when the call may run; else the error text the model gets instead."""
        decision = self.policy.check(tool, raw)
        if decision.action == "allow" and not decision.rule:
            return None
        args = raw if isinstance(raw, dict) else {"_raw": raw}
        started = time.monotonic()
        if decision.action == "allow":
            self._traced(call_id, tool, args, decision, True, "rule", started)
            return None
        if decision.action == "deny":
            self._traced(call_id, tool, args, decision, False, "rule", started)
            return (
                f"{tool} is not permitted here: the job's policy denies this call ({_named(decision)})."
                " Do the work another way, or finish and say what you could not do."
            )
        request = ApprovalRequest(
            member=self.member,
            call_id=call_id,
            tool=tool,
            input=args,
            rule=decision.rule,
            sure=decision.sure,
            ask_default=self.policy.ask_default,
        )
        self.waiting[call_id] = f"{tool}({_short(args)})"
        try:
            approval = await self.approver.ask(request, self.policy.ask_timeout_s)
        except anyio.get_cancelled_exc_class():
            self.cut_off.append(self.waiting[call_id])
            raise
        except Exception as exc:  # the approver broke its contract: the safe answer
            approval = Approval(
                allowed=self.policy.ask_default == "allow",
                by=f"ask failed ({type(exc).__name__}: {exc})",
            )
        finally:
            self.waiting.pop(call_id, None)
        self._traced(
            call_id, tool, args, decision, approval.allowed, approval.by, started, approval.always
        )
        if approval.allowed:
            return None
        if approval.by == "timeout":
            why = (
                f"nobody answered within {self.policy.ask_timeout_s or 0:g} s, and the job's "
                f"ask_default is {self.policy.ask_default}"
            )
        elif approval.by in ("no terminal", "no one to ask"):
            why = (
                "nobody can be asked in this run, and the job's ask_default is "
                f"{self.policy.ask_default}"
            )
        else:
            why = f"the person asked said no ({approval.by})"
        return (
            f"{tool} was not permitted: this call needs a person's approval ({_named(decision)}) "
            f"and {why}. Do the work another way, or finish and say what you could not do."
        )

    def _traced(
        self,
        call_id: str,
        tool: str,
        args: dict[str, Any],
        decision: Decision,
        allowed: bool,
        by: str,
        started: float,
        always: bool = False,
    ) -> None:
        self.trace.emit(
            PolicyDecision(
                call_id=call_id,
                tool=tool,
                input=args,
                action=decision.action,
                rule=decision.rule,
                allowed=allowed,
                by=by,
                always=always,
                waited_s=round(time.monotonic() - started, 3),
            )
        )


def _named(decision: Decision) -> str:
    return f"rule {decision.rule!r}" if decision.rule else f"default {decision.action!r}"


def _short(args: dict[str, Any], limit: int = 80) -> str:
    import json

    text = json.dumps(args, ensure_ascii=False, default=str)
    return text if len(text) <= limit else text[: limit - 3] + "..."
