"""Command templates of job-defined tools: how a model's arguments reach the command
without ever being read as shell syntax.

A template (``command = "wc -l {path}"``) is a POSIX shell command line run by
``/bin/sh -c`` in the member's box. Its placeholders are not filled in as text. Each
``{name}`` becomes a quoted positional parameter (``"$1"``, ``"$2"``, ...) and the
arguments travel as words of their own in the argv::

    /bin/sh -c 'wc -l "$1"' count_lines 'notes.txt; touch /tmp/pwn'

The shell reads the template once, as the job's author wrote it; an argument is only
ever the value of ``$1``. No quote, ``$``, ``;``, backquote, new line, ``${IFS}`` or
glob in it is read as syntax, whatever it holds - the guarantee string formatting
with :func:`shlex.quote` gives only while the author's own quoting does not undo it
(``echo "{msg}"`` closed the author's quotes around a quoted value and let it out).
``/bin/sh`` rather than bash: dash does not evaluate a variable's text as an
arithmetic expression, which bash does and which runs ``$(...)`` inside ``a[...]``.

``"$1"`` means "this value, as one word" only where a plain word stands, so a template
is checked when the job is read (:func:`compile_template`), with tree-sitter's bash
grammar, and refused with the tool's name and the right spelling when a placeholder
sits inside single or double quotes, ``$(...)``, backquotes, ``<(...)``, ``${...}``, a
here-document, arithmetic or ``[[ ]]``, a comment, after a backslash (``\\"$1"``
would leave it unquoted), or is the program to run, or is the code given to ``eval``,
``trap`` or ``sh -c``; and when the template reads ``$1``, ``$@`` or ``$*`` itself.

Options. A program reads an argument that starts with ``-`` as an option
(``wc -l --files0-from=/etc/passwd`` reads the names in that file), which quoting does
not stop. So a string argument starting with ``-`` is refused when the call is made,
unless the template writes ``--`` before the placeholder in the same command (the
program then reads it as an operand) or the parameter says ``options = true`` (the
author means the model to choose options). Integers and numbers are exempt: ``-5``
names no option. A string holding a NUL byte cannot be a program argument and is
refused; so is one over :data:`MAX_ARGUMENT_CHARS`.

What the program does with its argument is the template's own meaning: a template
that hands an argument to ``python -c`` gives the model Python. Only ``eval``,
``trap`` and the shells' ``-c`` are known to this module.
"""

from __future__ import annotations

import re
import shlex
import string
from dataclasses import dataclass

from tree_sitter import Node

from ..commandline.words import parse_bash

MAX_ARGUMENT_CHARS = 100_000
"""Longest argument passed (Linux refuses one word over 128 KiB)."""
_PLAIN = {
    "word",
    "concatenation",
    "command",
    "variable_assignment",
    "declaration_command",
    "array",
    "file_redirect",
    "herestring_redirect",
    "redirected_statement",
    "for_statement",
    "case_statement",
    "case_item",
    "list",
    "pipeline",
    "subshell",
    "compound_statement",
    "if_statement",
    "elif_clause",
    "else_clause",
    "while_statement",
    "do_group",
    "negated_command",
    "function_definition",
    "program",
}
"""Where a placeholder may stand: in a word, in a plain command or statement."""
_WHERE = {
    "raw_string": "inside single quotes",
    "string": "inside double quotes",
    "string_content": "inside double quotes",
    "command_substitution": "inside $(...) or backquotes",
    "process_substitution": "inside <(...) or >(...)",
    "heredoc_body": "inside a here-document",
    "heredoc_redirect": "inside a here-document",
    "arithmetic_expansion": "inside arithmetic",
    "c_style_for_statement": "inside arithmetic",
    "subscript": "inside an array subscript",
    "test_command": "inside [[ ]]",
    "expansion": "inside ${...}",
    "simple_expansion": "after a $",
    "command_name": "as the program to run",
    "comment": "inside a comment",
}
_SHELLS = {"sh", "bash", "dash", "zsh", "ksh", "ash", "mksh"}


class TemplateError(ValueError):
    """A template whose placeholders could not be passed as plain arguments."""

    def __init__(self, message: str, fix: str | None = None) -> None:
        super().__init__(message)
        self.fix = fix
        """The template spelled right, when there is one obvious spelling."""


@dataclass(frozen=True)
class Template:
    """A checked template: the script ``/bin/sh -c`` runs, and its parameters in the
    order of the positional parameters they become."""

    script: str
    order: tuple[str, ...]
    parts: tuple[tuple[str, str | None], ...]
    """The template's literal text and placeholders, in turn (to show the command)."""
    operands: frozenset[str]
    """Parameters every use of which follows a ``--`` of its command."""

    def argv(self, tool: str, values: dict[str, object], options: set[str]) -> list[str]:
        """``/bin/sh -c SCRIPT TOOL ARG1 ARG2 ...``; ``options``: the parameters that
        may start with ``-``. Raises :class:`ValueError` for an argument no program
        may be given, saying which and why."""
        args = []
        for name in self.order:
            value = values[name]
            text = str(value)
            if "\x00" in text:
                raise ValueError(
                    f"argument {name!r} holds a NUL byte, which no program argument can carry"
                )
            if len(text) > MAX_ARGUMENT_CHARS:
                raise ValueError(
                    f"argument {name!r} is {len(text)} characters; at most "
                    f"{MAX_ARGUMENT_CHARS} are passed"
                )
            dash = isinstance(value, str) and text.startswith("-")
            if dash and name not in options and name not in self.operands:
                raise ValueError(
                    f"argument {name!r} starts with '-', so the command would read it as an "
                    f"option; {tool} takes no options there (for a file whose name starts "
                    f"with '-', write ./{text})"
                )
            args.append(text)
        return ["/bin/sh", "-c", self.script, tool, *args]

    def shown(self, values: dict[str, object]) -> str:
        """The command as a person reads it, arguments shell-quoted (for display only)."""
        return "".join(
            text + (shlex.quote(str(values.get(name, ""))) if name else "")
            for text, name in self.parts
        )


def compile_template(tool: str, command: str) -> Template:
    """Check a template and turn its placeholders into positional parameters; raise
    :class:`TemplateError` naming the tool, the placeholder and the right spelling."""
    parts = _fields(tool, command)
    order: list[str] = []
    marked, script = "", ""
    spans: list[tuple[str, int, int]] = []
    for literal, name in parts:
        marked += literal
        script += literal
        if name is None:
            continue
        if (len(literal) - len(literal.rstrip("\\"))) % 2:
            # `\"$1"` would make the opening quote a character and leave $1 unquoted
            raise TemplateError(
                f"tool {tool!r}: placeholder {{{name}}} follows a backslash in its command "
                f"{command!r}, which would leave the argument unquoted; write it without "
                "the backslash, e.g. 'wc -l {path}'"
            )
        if name not in order:
            order.append(name)
        n = order.index(name) + 1
        start = len(marked.encode("utf-8", "surrogatepass"))
        marked += f"fleet_arg{n}_"  # a plain word where "$n" will stand
        spans.append((name, start, len(marked.encode("utf-8", "surrogatepass"))))
        script += f'"${n}"' if n < 10 else f'"${{{n}}}"'
    root = parse_bash(marked)
    if root.has_error:
        raise TemplateError(
            f"tool {tool!r}: its command is not a shell command line that can be read "
            f"({command!r}); check its quotes and brackets"
        )
    dashed: dict[str, bool] = {}
    for name, start, end in spans:
        node = root.descendant_for_byte_range(start, end)
        _check_place(tool, command, name, node, start)
        dashed[name] = dashed.get(name, True) and _after_double_dash(node, start)
    _check_positional(tool, root)
    operands = frozenset(n for n, ok in dashed.items() if ok)
    return Template(script, tuple(order), tuple(parts), operands)


def _check_positional(tool: str, root: Node) -> None:
    """A template's own ``$1``, ``$@`` or ``$*`` would read the model's arguments."""
    stack = [root]
    while stack:
        node = stack.pop()
        if node.type in ("simple_expansion", "expansion"):
            inner = re.sub(r"^\$\{?#?", "", _text(node))
            if inner[:1].isdigit() or inner[:1] in ("@", "*"):
                raise TemplateError(
                    f"tool {tool!r}: its command reads the positional parameter "
                    f"{_text(node)!r}, which holds the tool's arguments; name each "
                    "argument with a {placeholder} instead"
                )
        stack.extend(node.children)


def _fields(tool: str, command: str) -> list[tuple[str, str | None]]:
    try:
        parsed = list(string.Formatter().parse(command))
    except ValueError as exc:
        raise TemplateError(
            f"tool {tool!r}: its command {command!r} has a stray brace ({exc}); write a "
            "literal { or } as {{ or }}"
        ) from None
    out: list[tuple[str, str | None]] = []
    for literal, name, spec, conversion in parsed:
        if name is not None and (spec or conversion or not name.isidentifier()):
            raise TemplateError(
                f"tool {tool!r}: placeholder {{{name}{'!' + conversion if conversion else ''}"
                f"{':' + spec if spec else ''}}} is not a parameter name; write {{name}} "
                "for a parameter declared in 'parameters' (and {{ }} for literal braces)"
            )
        out.append((literal, name))
    return out


def _check_place(tool: str, command: str, name: str, node: Node | None, start: int) -> None:
    chain: list[str] = []
    while node is not None:
        kind = node.type
        if kind == "compound_statement" and node.children and node.children[0].type == "((":
            kind = "arithmetic_expansion"
        chain.append(kind)
        if kind == "command" and _runs_as_code(node, start):
            raise TemplateError(
                f"tool {tool!r}: placeholder {{{name}}} is code that its command runs "
                f"(eval, trap or a shell's -c string, in {command!r}), so the argument "
                "would be read as shell syntax; pass it as a plain argument of a program, "
                "e.g. 'wc -l {path}' rather than 'eval wc -l {path}'"
            )
        node = node.parent
    odd = [k for k in chain if k not in _PLAIN]
    if odd:
        known = [k for k in chain if k in _WHERE]
        where = _WHERE[known[0]] if known else f"inside {odd[0].replace('_', ' ')}"
        raise _misplaced(tool, command, name, where)


def _misplaced(tool: str, command: str, name: str, where: str) -> TemplateError:
    ph = "{" + name + "}"
    fix = "put it where a word of a plain command stands, e.g. 'wc -l {path}'"
    quote = '"' if "double" in where else "'" if "single" in where else ""
    right = None
    if quote:
        right = command.replace(ph, quote + ph + quote).replace(quote * 2 + ph, ph)
        right = right.replace(ph + quote * 2, ph)
        fix = f"write it outside the quotes: {right!r}"
    return TemplateError(
        f"tool {tool!r}: placeholder {ph} stands {where} in its command {command!r}; "
        f"an argument is passed as one word that no quoting can change, so {fix}",
        right,
    )


def _runs_as_code(command: Node, start: int) -> bool:
    """Whether the word at byte ``start`` is code its command runs: an argument of
    ``eval``, the first of ``trap``, the command string of ``sh -c``."""
    words = [c for c in command.named_children if c.type not in ("variable_assignment",)]
    if not words:
        return False
    name = _text(words[0]).rsplit("/", 1)[-1]
    at = next((i for i, w in enumerate(words) if w.start_byte <= start < w.end_byte), -1)
    if name == "eval":
        return at > 0
    if name == "trap":
        return at == 1
    if name not in _SHELLS:
        return False
    flag = next(
        (i for i, w in enumerate(words) if re.fullmatch(r"-[a-zA-Z]*c[a-zA-Z]*", _text(w))), None
    )
    return flag is not None and at == flag + 1


def _after_double_dash(node: Node | None, start: int) -> bool:
    while node is not None and node.type != "command":
        node = node.parent
    if node is None:
        return False
    return any(c.end_byte <= start and _text(c) == "--" for c in node.named_children)


def _text(node: Node) -> str:
    return (node.text or b"").decode("utf-8", "replace")
