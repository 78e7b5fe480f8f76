"""The words of a bash command line as bash will expand them, as far as that can be
told before it runs, and how a policy's glob meets them (:mod:`.commands`).

A word is a tuple of characters where ``None`` is a *hole*: text only running the line
can tell (a variable, a substitution, a glob, a brace or tilde expansion, ``$'...'``).
:func:`may_match` says whether some text in the holes would make a glob match (how deny
and ask rules read a command, failing closed), :func:`must_match` whether the command
has no hole and matches (how allow rules read it).
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass

import tree_sitter_bash
from tree_sitter import Language, Node, Parser

Shape = tuple[str | None, ...]
"""Text one character per element; ``None`` is a hole: any text, spaces included."""

HOLE: Shape = (None,)
"""A word that is all hole."""


@dataclass(frozen=True)
class Invocation:
    """One command the line runs: its words as spelled (assignments and redirections
    left out)."""

    words: tuple[Shape, ...]
    function: bool = False
    """Its name is a function the line defined before, at its top level: what the
    call runs is the function's body, whose commands are reported themselves."""

    def shapes(self, *, by_name: bool) -> list[Shape]:
        """The command as one text (words joined by spaces); ``by_name`` adds it with
        the program's path cut to its name (``/usr/bin/touch x`` -> ``touch x``)."""
        out = [join_words(self.words)]
        name = literal(self.words[0]) if self.words else None
        if by_name and name is not None and "/" in name:
            base = tuple(name.rsplit("/", 1)[-1])
            out.append(join_words((base, *self.words[1:])))
        return out


UNKNOWN = Invocation((HOLE,))
"""A command that cannot be told: any program, any arguments."""


def may_match(pattern: str, shape: Shape) -> bool:
    """Whether some text in the holes of ``shape`` makes the glob ``pattern`` (``*``
    any run of characters, ``?`` one) match it whole: a search of the product of the
    two patterns for a common end."""
    p, s = pattern.strip(), _strip(shape)
    stack, seen = [(0, 0)], {(0, 0)}
    while stack:
        i, j = stack.pop()
        if i == len(p) and j == len(s):
            return True
        steps = []
        if i < len(p) and p[i] == "*":
            steps.append((i + 1, j))
        if j < len(s) and s[j] is None:
            steps.append((i, j + 1))
        if i < len(p) and j < len(s):
            a, b = p[i], s[j]
            if a in "*?" or b is None or a == b:
                steps.append((i if a == "*" else i + 1, j if b is None else j + 1))
        for step in steps:
            if step not in seen:
                seen.add(step)
                stack.append(step)
    return False


def must_match(pattern: str, shape: Shape) -> bool:
    """Whether ``shape`` has no hole and the glob ``pattern`` matches it whole."""
    if any(c is None for c in shape):
        return False
    regex = "".join(
        ".*" if c == "*" else "." if c == "?" else re.escape(c) for c in pattern.strip()
    )
    return re.fullmatch(regex, "".join(c for c in _strip(shape) if c), re.S) is not None


@functools.cache
def _parser() -> Parser:
    return Parser(Language(tree_sitter_bash.language()))


def parse_bash(text: str) -> Node:
    """The root of ``text``'s bash syntax tree (``has_error`` when bash would refuse it
    or the grammar cannot read it)."""
    return _parser().parse(text.encode("utf-8", "surrogatepass")).root_node


def text_of(node: Node) -> str:
    """A node's source text."""
    return (node.text or b"").decode("utf-8", "surrogateescape")


def literal(word: Shape) -> str | None:
    """The word's text when it has no hole, else None."""
    return None if any(c is None for c in word) else "".join(c for c in word if c)


def join_words(words: tuple[Shape, ...]) -> Shape:
    """The words as one text, joined by spaces."""
    out: list[str | None] = []
    for i, word in enumerate(words):
        if i:
            out.append(" ")
        out += word
    return tuple(out)


def _strip(shape: Shape) -> Shape:
    start, end = 0, len(shape)
    while start < end and _space(shape[start]):
        start += 1
    while end > start and _space(shape[end - 1]):
        end -= 1
    return shape[start:end]


def _space(c: str | None) -> bool:
    return c is not None and c.isspace()


_BRACES = re.compile(r"\{[^{}]*(,|\.\.)[^{}]*\}")


def shape_of(node: Node) -> Shape:
    """What a word becomes once bash has expanded it, holes where it cannot be told."""
    kind = node.type
    if kind in ("word", "number"):
        text = text_of(node)
        if _BRACES.search(text):
            return HOLE
        return _unquoted(text)
    if kind == "raw_string":
        return tuple(text_of(node)[1:-1])
    if kind == "string":
        out: list[str | None] = []
        for child in node.named_children:
            if child.type == "string_content":
                out += re.sub(r'\\([$`"\\\n])', lambda m: m.group(1).strip("\n"), text_of(child))
            else:
                out.append(None)
        return tuple(out)
    if kind == "concatenation":
        if _BRACES.search(text_of(node)):
            return HOLE
        return tuple(c for part in node.named_children for c in shape_of(part))
    return HOLE  # expansions, substitutions, $'...', $"...", and anything unforeseen


def _unquoted(text: str) -> Shape:
    """An unquoted word: backslashes removed, globs and a leading ``~`` as holes."""
    out: list[str | None] = []
    i = 0
    while i < len(text):
        c = text[i]
        if c == "\\" and i + 1 < len(text):
            if text[i + 1] != "\n":
                out.append(text[i + 1])
            i += 2
            continue
        out.append(None if c in "*?[" or (c == "~" and i == 0) else c)
        i += 1
    return tuple(out)


# Variables that change which program a name runs, or what a shell runs first.
DANGEROUS_NAMES = re.compile(
    r"^(PATH|BASH_ENV|ENV|SHELLOPTS|BASHOPTS|PS4|IFS|LD_\w*|BASH_FUNC_.*)$"
)
