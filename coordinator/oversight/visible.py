"""Hostile text as a person sees it on a terminal: whole, and with nothing hidden.

Tool arguments, reasons and last actions come from a model, a page or a box. Shown
raw, they can lie to the person reading them: an ANSI escape rewrites or clears the
screen, a bidi override reverses what follows, a zero-width or tag character hides a
word, a hundred spaces push the tail of a command out of sight. So every character a
reader could not see for what it is becomes a visible escape:

* control characters (C0, DEL, C1), format characters (Cf: bidi controls, zero-width
  characters, tag characters), line and paragraph separators, surrogates, private-use
  and unassigned code points, spaces other than U+0020, and blank letters (Hangul
  fillers, the braille blank) are written ``\\u001b``, ``\\u202e``, ``\\U000e0041``;
* a combining mark on an ASCII character (it could turn ``/`` into something else to
  the eye) likewise;
* four or more spaces in a row become ``⟨150 spaces⟩``, and a literal ``⟨`` or ``⟩`` in
  the text is escaped, so every ``⟨...⟩`` on screen is ours.

Given JSON (whose encoder already escapes backslashes, quotes and C0 controls), the
result is unambiguous: two different arguments are never shown alike. That is what
:func:`shown` relies on, and why its sha256 identifies an argument exactly.
"""

from __future__ import annotations

import hashlib
import json
import re
import unicodedata
from typing import Any

_HIDDEN_CATEGORIES = {"Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp"}
_BLANK_LETTERS = {"\u115f", "\u1160", "\u3164", "\uffa0", "\u2800", "\u034f"}
_OURS = {"\u27e8", "\u27e9"}
_SPACES = re.compile(r" {4,}")


def _escape(c: str) -> str:
    o = ord(c)
    return f"\\u{o:04x}" if o <= 0xFFFF else f"\\U{o:08x}"


def visible(text: str) -> str:
    """``text`` with every character a reader could not see for what it is escaped."""
    out: list[str] = []
    after_ascii = False
    for c in text:
        cat = unicodedata.category(c)
        hidden = (
            cat in _HIDDEN_CATEGORIES
            or (cat == "Zs" and c != " ")
            or c in _BLANK_LETTERS
            or c in _OURS
            or (cat in ("Mn", "Me", "Mc") and after_ascii)
        )
        if hidden:
            out.append(_escape(c))
            after_ascii = True  # a mark after it would sit on the escape's last digit
        else:
            out.append(c)
            after_ascii = ord(c) < 0x80
    return _SPACES.sub(lambda m: f"\u27e8{len(m.group())} spaces\u27e9", "".join(out))


def on_terminal(text: str) -> str:
    """A whole view (``fleet trace``'s tables and turns) made safe to print: its line
    breaks and tabs kept, every other control, format, separator, surrogate, private
    or unassigned character escaped as :func:`visible` does - no escape sequence from a
    model, a page or a box reaches the terminal, none reorders what follows. Spaces are
    left alone (a table's columns are runs of them)."""
    out: list[str] = []
    for c in text:
        if c in "\n\t" or unicodedata.category(c) not in _HIDDEN_CATEGORIES:
            out.append(c)
        else:
            out.append(_escape(c))
    return "".join(out)


def shown(value: Any) -> str:
    """A tool call's arguments as a person is shown them: JSON, whole, :func:`visible`."""
    return visible(json.dumps(value, ensure_ascii=False, default=str))


def digest(text: str) -> str:
    """The sha256 of what was shown (an answer is bound to it)."""
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()
