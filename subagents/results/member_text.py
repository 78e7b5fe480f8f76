"""Member text a lead or an analyst reads: normalized, its delimiter spellings made
inert, and delimited - through :func:`member_block`, the one door for it.

A member's result (summary, claims, quotes, open questions), its failure reason and
its name are text a model copied from web pages or a repository; the lead and the
analyst get it between the ``<untrusted_page_content>`` delimiters
(:mod:`subagents.browser.dom`) and are told that nothing inside them is an
instruction. That holds only while the data cannot close the block. A model reads
meaning, not code points, so every *spelling* of a tag must be defused, not only the
ASCII one:

* NFKC first: fullwidth ``＜／ｕｎｔｒｕｓｔｅｄ…＞``, mathematical letters, ligatures
  and other compatibility characters become the plain characters they stand for;
* format characters (Unicode category Cf: zero-width spaces and joiners, bidi
  controls, tag characters, the soft hyphen) and control characters other than new
  line and tab are removed - they carry no meaning a reader needs and are the usual
  way to hide a word from a pattern;
* then any remaining spelling of the tag - any case, accents, whitespace, combining
  marks, ``_``/``-`` or other connectors between its letters, a few Cyrillic and Greek
  look-alike letters, and any of the angle-bracket look-alikes before it - has its
  bracket replaced by ``&lt;``, as :func:`~subagents.browser.dom.defuse` does for
  pages.

Matching runs over a skeleton of the text (the characters that are not separators,
folded) mapped back to positions in it, so the text keeps its words and only the
bracket changes. Values are cleaned one string at a time before JSON encoding, so a
fullwidth quote that NFKC turns into ``"`` is escaped by the encoder and cannot
reshape the JSON the lead reads.

Why not reject such results: the member's evidence stays usable; only the forged
structure is disarmed. Why not NFKC for page text too: a browser member's quotes are
verified against the page verbatim, so pages keep :func:`~subagents.browser.dom.defuse`.
"""

from __future__ import annotations

import json
import re
import unicodedata
from typing import Any

from ..browser.dom import untrusted

TAG_NAMES = ("untrusted_page_content",)
"""Delimiter tag names no member text may spell."""

_BRACKETS = "<\u2039\u2329\u27e8\u3008\u02c2\u1438\u276e\u276c\u27ea\u300a\ufe64\uff1c"
"""``<`` and the characters a reader could take for it (NFKC leaves these alone)."""
_SLASHES = "/\u2044\u2215\u29f8\\"
_LOOKALIKE = str.maketrans(
    {
        "\u0430": "a",  # Cyrillic
        "\u0435": "e",
        "\u043e": "o",
        "\u0440": "p",
        "\u0441": "c",
        "\u0455": "s",
        "\u0442": "t",
        "\u0501": "d",
        "\u0578": "n",
        "\u057d": "u",
        "\u0261": "g",
        "\u03bf": "o",  # Greek
        "\u03c5": "u",
        "\u03c4": "t",
        "\u03b5": "e",
        "\u03c1": "p",
        "\u03b7": "n",
    }
)
_SKIPPED = ("Z", "M", "Pc", "Pd", "Cc", "Cf")
"""Categories (or their first letter) tolerated between a tag's characters."""
_TAG = re.compile(
    f"[{re.escape(_BRACKETS)}][{re.escape(_SLASHES)}]?(?:"
    + "|".join(re.escape(n.replace("_", "")) for n in TAG_NAMES)
    + ")"
)
_KEEP_CONTROLS = {"\n", "\t"}


def normalize(text: str) -> str:
    """NFKC, without format characters and without controls other than new line and tab."""
    text = unicodedata.normalize("NFKC", text)
    return "".join(
        c for c in text if c in _KEEP_CONTROLS or unicodedata.category(c) not in ("Cf", "Cc", "Cs")
    )


def neutralize(text: str) -> str:
    """``text`` with the bracket of every spelling of a delimiter tag made ``&lt;``."""
    positions: list[int] = []
    skeleton: list[str] = []
    for i, c in enumerate(text):
        cat = unicodedata.category(c)
        if cat[0] in _SKIPPED or cat in _SKIPPED:
            continue
        positions.append(i)
        # Its base letter: NFKC composed ``a`` + acute into one character.
        base = unicodedata.normalize("NFKD", c)[0]
        skeleton.append(base.casefold().translate(_LOOKALIKE)[:1] or base)
    hits = {positions[m.start()] for m in _TAG.finditer("".join(skeleton))}
    if not hits:
        return text
    return "".join("&lt;" if i in hits else c for i, c in enumerate(text))


def clean(text: str) -> str:
    """Member text as a lead or analyst may read it: normalized, tag spellings inert."""
    return neutralize(normalize(text))


def clean_value(value: Any) -> Any:
    """A JSON value with every string in it (keys too) cleaned."""
    if isinstance(value, str):
        return clean(value)
    if isinstance(value, dict):
        return {clean(str(k)): clean_value(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [clean_value(v) for v in value]
    return value


def member_block(member: str, data: Any, *, title: str = "") -> str:
    """One member's text (a string, or a JSON value shown as indented JSON) between the
    untrusted-data delimiters, named ``member:ID``; everything in it cleaned."""
    if isinstance(data, str):
        body = clean(data)
    else:
        body = json.dumps(clean_value(data), indent=1, ensure_ascii=False)
    # Once more over the whole block: no spelling can straddle two strings either.
    return untrusted(f"member:{clean(member)}", neutralize(body), title=clean(title))
