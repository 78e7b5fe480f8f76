"""Code examples in documentation that running them can check: interactive sessions.

Documentation shows behaviour as a Python session - ``>>>`` lines (and ``...``
continuations) with the output the session printed after them. Such an example
states its own expected behaviour, so a coding member can check it by running it
(``python3 -m doctest FILE`` compares what the code prints with what the page says).
The offline browser policy quotes one such example per member as a claim, verbatim;
the offline lead recognises a claim holding one and spawns a coding member to run it.

Sessions are found by the stdlib's :class:`doctest.DocTestParser`, the parser that
will run them, not by rules of our own: what counts as an example, where its
expected output ends (at a blank line or the next ``>>>``) and what a continuation is
are doctest's, so the check runs exactly the example that was found. A page whose
output holds a blank line (Sphinx hides doctest's ``<BLANKLINE>`` marker) is an
example doctest cannot run as written; the verdict says so
(:mod:`coordinator.lead.lead_report`) rather than call the page wrong.
"""

from __future__ import annotations

import doctest
import re

PROMPT = ">>> "
_PARSER = doctest.DocTestParser()


def _examples(text: str) -> list[doctest.Example]:
    """doctest's examples in ``text``; a paragraph doctest refuses (inconsistent
    indentation, ``>>>`` without a space) is skipped, not the whole page."""
    try:
        return _PARSER.get_examples(text)
    except ValueError:
        pass
    out: list[doctest.Example] = []
    offset = 0
    for part in text.split("\n\n"):
        try:
            found = _PARSER.get_examples(part)
        except ValueError:
            found = []
        for ex in found:
            ex.lineno += offset
        out += found
        offset += part.count("\n") + 2
    return out


def session_blocks(text: str) -> list[tuple[int, str]]:
    """Each interactive session in ``text`` as (index of its first line, its text):
    doctest's examples, from the first to the end of the last one's expected output,
    consecutive examples with at most one blank line between them in one session."""
    lines = text.split("\n")
    out: list[tuple[int, str]] = []
    start = end = -1
    for ex in _examples(text):
        first = ex.lineno
        last = first + ex.source.count("\n") + ex.want.count("\n") - 1
        if start >= 0 and first - end <= 2:
            end = last
            continue
        if start >= 0:
            out.append((start, "\n".join(lines[start : end + 1])))
        start, end = first, last
    if start >= 0:
        out.append((start, "\n".join(lines[start : end + 1])))
    return out


def checkable(block: str) -> bool:
    """True when a session shows output to compare against (an example with an
    expected output, as doctest reads it)."""
    return any(ex.want.strip() for ex in _examples(block))


def example_in(quote: str) -> str | None:
    """The checkable session a quote holds, or None."""
    for _start, block in session_blocks(quote):
        if checkable(block):
            return block
    return None


def words_before(text: str, start_line: int, lines: int = 3) -> str:
    """The prose just before a session (what it is an example of)."""
    before = [ln.strip() for ln in text.split("\n")[max(0, start_line - lines) : start_line]]
    return " ".join(ln for ln in before if ln and ln != ">>>")


_SPACES = re.compile(r"\s+")


def one_line(text: str, limit: int = 160) -> str:
    flat = _SPACES.sub(" ", text).strip()
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."
