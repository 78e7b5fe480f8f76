r"""File names as the model sees them: any byte name, in text it can hand back.

A Linux file name is bytes, not text: ``caf\xe9.txt`` (Latin-1) is a valid name that
is not UTF-8. Python carries such a name as a str with surrogate escapes (U+DCE9 for
the byte 0xE9), which the box agent's JSON transports faithfully but which no UTF-8
encoder accepts - not the trace, not the Messages API. So every name a tool shows goes
through :func:`show` and every path a tool is given goes through :func:`parse`:

* a name that is valid UTF-8 and has no backslash is shown as it is (nearly all);
* otherwise each byte that is not UTF-8 is shown as ``\xNN`` and a backslash as
  ``\\`` - the escapes of bash's ``$'...'`` quoting, so the model can write the same
  name in a shell command (``cat $'caf\xe9.txt'``);
* :func:`parse` undoes exactly that, so ``parse(show(name)) == name`` for every name,
  and a name typed without escapes still works (an unknown escape stays as typed).

:func:`clean_text` is the net under everything else a tool returns (command output,
error messages naming a path): a surrogate left in text becomes ``\xNN`` too, so one
odd name can never take a member down.
"""

from __future__ import annotations

import re

_SURROGATE = re.compile("[\ud800-\udfff]")
_ESCAPE = re.compile(r"\\(\\|x[89a-fA-F][0-9a-fA-F])")


def _byte(char: str) -> str:
    code = ord(char)
    return f"\\x{code - 0xDC00:02x}" if 0xDC80 <= code <= 0xDCFF else "\ufffd"


def show(name: str) -> str:
    """``name`` (surrogate-escaped str) as text the model can read and hand back."""
    if "\\" not in name and not _SURROGATE.search(name):
        return name
    return _SURROGATE.sub(lambda m: _byte(m.group()), name.replace("\\", "\\\\"))


def parse(text: str) -> str:
    """The name :func:`show` showed as ``text`` (surrogate-escaped, as ``os`` takes it)."""
    if "\\" not in text:
        return text

    def one(m: re.Match[str]) -> str:
        esc = m.group(1)
        return "\\" if esc == "\\" else chr(0xDC00 + int(esc[1:], 16))

    return _ESCAPE.sub(one, text)


def clean_text(text: str) -> str:
    """Any surrogate left in ``text`` as ``\\xNN`` (its byte), so the text is valid UTF-8."""
    return _SURROGATE.sub(lambda m: _byte(m.group()), text) if _SURROGATE.search(text) else text
