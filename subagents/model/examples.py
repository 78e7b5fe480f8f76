"""Code examples in documentation that running them can check: interactive sessions.

Documentation shows behaviour as a Python session - ``>>>`` lines (and ``...``
continuations) with the output the session printed after them. Such an example
states its own expected behaviour, so a coding member can check it by running it
(``python3 -m doctest FILE`` compares what the code prints with what the page says).
The offline browser policy quotes one such example per member as a claim, verbatim;
the offline lead recognises a claim holding one and spawns a coding member to run it.
"""

from __future__ import annotations

import re

PROMPT = ">>> "
_CONTINUED = "... "


def session_blocks(text: str) -> list[tuple[int, str]]:
    """Each interactive session in ``text`` as (index of its first line, its text):
    from its first ``>>>`` line with code to its last output line, single blank lines
    inside kept (a session goes on after one when a ``>>>`` line follows)."""
    lines = text.split("\n")
    out: list[tuple[int, str]] = []
    i = 0
    while i < len(lines):
        if not lines[i].startswith(PROMPT) or not lines[i][len(PROMPT) :].strip():
            i += 1
            continue
        start, end = i, i
        j = i + 1
        while j < len(lines):
            line = lines[j]
            if line.strip():
                end = j
                j += 1
                continue
            after = next((k for k in range(j + 1, len(lines)) if lines[k].strip()), None)
            if after is None or after > j + 1 or not lines[after].startswith(PROMPT):
                break  # two blank lines, or prose after one: the session has ended
            j = after
        out.append((start, "\n".join(lines[start : end + 1])))
        i = end + 1
    return out


def checkable(block: str) -> bool:
    """True when a session shows output to compare against: some line after a prompt
    that is neither code nor a continuation."""
    lines = [ln for ln in block.split("\n") if ln.strip()]
    return any(not ln.startswith((PROMPT, ">>>", _CONTINUED, "...")) for ln in lines[1:]) and lines[
        0
    ].startswith(PROMPT)


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
