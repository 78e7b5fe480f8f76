"""What a shell command line runs, as far as it can be told without running it: the
commands the ``shell`` rules of a tool policy (:mod:`subagents.rules.policy`) are checked on.

The line is parsed with tree-sitter's bash grammar, the grammar editors and code hosts
read bash with, rather than a tokenizer of our own: compound commands (``{ ...; }``,
``if``, loops, ``case``, functions), pipelines, ``!``, subshells, command and process
substitutions, here-documents and redirections come out as bash sees them, and every
simple command found anywhere in that tree is reported. A tokenizer that splits at
``;`` and ``|`` misses most of these (``{ touch x; }`` hid ``touch`` behind ``{``).

Each command is then looked through its wrappers: ``env``, ``nice``, ``nohup``,
``timeout``, ``time``, ``command``, ``builtin``, ``exec``, ``xargs``, ``sudo``,
``doas``, ``stdbuf``, ``setsid``, ``chroot``, ``ionice``, ``taskset``, ``flock``,
``busybox``, ``coproc`` and ``find -exec`` run the command they are given (the wrapper
is reported too, and so is the command it runs); ``bash``/``sh``/... ``-c``, ``eval``,
``trap``, ``env -S`` and a shell fed a here-document run a string, which is parsed in
turn, up to :data:`MAX_DEPTH` levels deep.

What cannot be known before the line runs is a *hole*: a variable, a substitution, a
glob, a brace or tilde expansion, ``$'...'``. A command is a tuple of words, a word a
tuple of characters where ``None`` is a hole standing for any text. Some lines cannot be
read with confidence at all - a parse error, a command name with a hole (``$c x``),
a shell reading a script from a pipe or from ``/dev/stdin``, ``source``-ing one,
``alias``, ``mapfile -C``, arithmetic on variables (bash evaluates a variable's text as
an expression, and ``a[$(cmd)]`` in that text runs ``cmd``), an assignment to
``PATH``, ``BASH_ENV`` or ``LD_*``, a wrapper option this module does not know, nesting
past :data:`MAX_DEPTH`: each yields :data:`UNKNOWN`, a command that is all hole.

The policy reads holes so that it fails closed: a deny or ask rule matches a command
when some text in its holes would make it match (:func:`.words.may_match`), an allow
rule only when the command has no hole and matches (:func:`.words.must_match`). So ``echo $HOME`` stays
clear of ``deny = ["shell:rm *"]``, ``rm $f`` does not, and ``$c x`` matches every deny
rule and no allow rule.

This is a reading of what the line says, not of what the programs it starts do: a
script written, then run, or ``python -c`` doing the same work, is the command
``python``. The box is the isolation boundary; the policy is the job owner's guard.
"""

from __future__ import annotations

import functools
import re

from tree_sitter import Node

from .words import (
    DANGEROUS_NAMES,
    HOLE,
    UNKNOWN,
    Invocation,
    Shape,
    literal,
    parse_bash,
    shape_of,
    text_of,
)
from .wrappers import Unwrapping

MAX_DEPTH = 4
"""Command strings inside command strings (``bash -c "eval '...'"``) looked into;
deeper ones are :data:`UNKNOWN`."""
MAX_CHARS = 100_000
"""Longer lines are not parsed: :data:`UNKNOWN`."""
_MAX_NODES = 50_000


@functools.lru_cache(maxsize=64)
def commands_of(line: str) -> tuple[Invocation, ...]:
    """:func:`invocations` of a whole line, kept for the next rule that asks."""
    return tuple(invocations(line))


def invocations(line: str, depth: int = 0) -> list[Invocation]:
    """Every command ``line`` runs (see the module docstring), wrappers reported too."""
    if depth > MAX_DEPTH or len(line) > MAX_CHARS:
        return [UNKNOWN]
    root = parse_bash(line)
    out = [UNKNOWN] if root.has_error else []
    functions = _top_level_functions(root)
    stack, seen = [root], 0
    while stack:
        node = stack.pop()
        seen += 1
        if seen > _MAX_NODES:
            return [*out, UNKNOWN]
        kind = node.type
        if kind == "command":
            out += _command(node, depth, functions)
        elif kind in ("raw_string", "string_content"):
            text = text_of(node)[1:-1] if kind == "raw_string" else text_of(node)
            if "$(" in text or "`" in text:  # code in quotes that an evaluation may run
                out += invocations(text, depth + 1)
        elif kind == "variable_assignment" and _dangerous_assignment(node):
            out.append(UNKNOWN)
        elif _arithmetic_on_variables(node):
            out.append(UNKNOWN)
        stack.extend(reversed(node.children))
    return out


def _top_level_functions(root: Node) -> dict[str, int]:
    """Functions the line defines outside every condition: name -> where it ends."""
    return {
        text_of(name): child.end_byte
        for child in root.named_children
        if child.type == "function_definition"
        and (name := child.child_by_field_name("name")) is not None
    }


def _dangerous_assignment(node: Node) -> bool:
    """An assignment that changes which program a name runs or what a shell runs first."""
    name = node.child_by_field_name("name")
    return name is not None and bool(DANGEROUS_NAMES.match(text_of(name)))


_ARITH_TEST = {"-eq", "-ne", "-lt", "-le", "-gt", "-ge"}


def _arithmetic_on_variables(node: Node) -> bool:
    kind = node.type
    arithmetic = (
        kind in ("arithmetic_expansion", "c_style_for_statement", "subscript")
        or (kind == "compound_statement" and node.child_count > 0 and node.children[0].type == "((")
        or (
            kind == "test_command"  # [[ ]] evaluates -eq's sides; [ ] does not
            and node.child_count > 0
            and node.children[0].type == "[["
            and any(text_of(n) in _ARITH_TEST for n in _descendants(node, "test_operator"))
        )
    )
    if not arithmetic:
        return False
    for n in _descendants(node, None):
        if n.type in ("variable_name", "simple_expansion", "expansion"):
            return True
        if n.type == "word" and re.match(r"^[A-Za-z_]", text_of(n)):
            return True
    return False


def _descendants(node: Node, kind: str | None) -> list[Node]:
    out: list[Node] = []
    stack = list(node.children)
    while stack and len(out) < _MAX_NODES:
        n = stack.pop()
        if kind is None or n.type == kind:
            out.append(n)
        stack.extend(n.children)
    return out


# ------------------------------------------------------------------- one command


def _command(node: Node, depth: int, functions: dict[str, int]) -> list[Invocation]:
    words: list[Shape] = []
    stdin: str | None = None
    stdin_given = False
    for child in node.named_children:
        kind = child.type
        if kind in ("variable_assignment", "comment"):
            continue
        if kind == "command_name":
            words.append(shape_of(child.named_children[0]) if child.named_children else HOLE)
        elif kind == "file_redirect":
            words += _redirect_arguments(child)
        elif kind in ("herestring_redirect", "heredoc_redirect"):
            stdin_given, stdin = True, _stdin_text(child)
        else:
            words.append(shape_of(child))
    parent = node.parent
    if parent is not None and parent.type == "redirected_statement":
        for child in parent.named_children:
            if child.type in ("herestring_redirect", "heredoc_redirect"):
                stdin_given, stdin = True, _stdin_text(child)
            elif child.type == "file_redirect":
                words += _redirect_arguments(child)
    if not words:
        return []
    end = functions.get(literal(words[0]) or "")
    defined = end is not None and end <= node.start_byte
    reading = Unwrapping(invocations, depth, stdin if stdin_given else None)
    return reading.unwrap(words, defined)


def _redirect_arguments(redirect: Node) -> list[Shape]:
    """Words after a redirection's target, which bash takes as arguments (``echo >f x``)."""
    targets = [c for c in redirect.named_children if c.type != "file_descriptor"]
    return [shape_of(c) for c in targets[1:]]


def _stdin_text(redirect: Node) -> str | None:
    """A here-document's or here-string's text when it has no expansions, else None."""
    if redirect.type == "heredoc_redirect":
        body = next((c for c in redirect.named_children if c.type == "heredoc_body"), None)
        if body is None:
            return ""
        if any(c.type != "heredoc_content" for c in body.named_children):
            return None
        return text_of(body)
    shapes = [shape_of(c) for c in redirect.named_children]
    return literal(shapes[0]) if shapes else None
