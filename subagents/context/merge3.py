"""Line-based three-way merge of one text file (diff3-style), for shared memory.

Given the version a member loaded (``base``), the member's edit (``ours``) and the
file as it is now (``theirs``: what other members saved meanwhile), :func:`merge3`
applies both sides' changes to ``base``. It works on edits, not on common regions:
each side's changes against ``base`` become a list of hunks (``difflib``
opcodes: replace base lines ``[i, j)`` by some lines; ``i == j`` is an insertion),
and the two lists are merged by base position.

- Hunks of one side that no hunk of the other side touches are applied as they are,
  also when they only *border* a hunk of the other side (one member edits a line,
  another inserts a line after it: both land, in base order).
- Hunks of both sides over the same base lines that produce the same text are one
  change, applied once - so a save applied again to a file that already holds it
  changes nothing.
- Insertions of both sides at the same point (two members each adding a fact at
  the end of ``notes.md``) are *not* a conflict: both are kept, the profile's lines
  first, lines both inserted once. Memory is mostly lists of facts, and an order
  between two facts added at one place is no disagreement. (``git merge-file``
  calls this a conflict, and its ``--union`` would also hide true conflicts.)
- Anything else over the same base lines - both replaced or deleted them
  differently - is a true conflict: both versions are kept, with the base between
  them, between git-style markers that name each side, and it is counted.

Why our own diff3 on ``difflib`` rather than ``git merge-file``: memory is used by
research members on hosts that need no git at all, the merge runs under the
profile's lock (no subprocess per file there), and the insertion rule above is not
something git offers without also hiding true conflicts. Files are small (the
memory tool writes at most 100 KB per file), so difflib's quadratic worst case is
not a concern.
"""

from __future__ import annotations

from dataclasses import dataclass
from difflib import SequenceMatcher

Hunk = tuple[int, int, list[str]]
"""(first base line, end base line, lines that replace them); first == end inserts."""

START, BASE, SEP, END = "<<<<<<<", "|||||||", "=======", ">>>>>>>"


@dataclass
class Merged:
    text: str
    conflicts: int
    """Conflict regions left marked in ``text``."""


def _hunks(base: list[str], other: list[str]) -> list[Hunk]:
    sm = SequenceMatcher(None, base, other, autojunk=False)
    return [(i1, i2, other[j1:j2]) for tag, i1, i2, j1, j2 in sm.get_opcodes() if tag != "equal"]


def _touch(a: Hunk, b: Hunk) -> bool:
    """Do two hunks (of different sides) act on the same place of the base?"""
    if a[0] == a[1] and b[0] == b[1]:
        return a[0] == b[0]  # two insertions: only at the same point
    if a[0] == a[1]:
        return b[0] < a[0] < b[1]  # an insertion strictly inside the other's lines
    if b[0] == b[1]:
        return a[0] < b[0] < a[1]
    return max(a[0], b[0]) < min(a[1], b[1])  # shared base lines


def _apply(base: list[str], lo: int, hi: int, hunks: list[Hunk]) -> list[str]:
    """``base[lo:hi]`` with one side's hunks (all inside that range) applied."""
    out: list[str] = []
    at = lo
    for i, j, lines in hunks:
        out += base[at:i] + lines
        at = j
    return out + base[at:hi]


def _union(theirs: list[str], ours: list[str]) -> list[str]:
    """Two insertions at one point: theirs, then ours; lines both inserted once."""
    out: list[str] = []
    sm = SequenceMatcher(None, theirs, ours, autojunk=False)
    for tag, i1, i2, j1, j2 in sm.get_opcodes():
        out += theirs[i1:i2] if tag == "equal" else theirs[i1:i2] + ours[j1:j2]
    return out


def _ended(lines: list[str]) -> list[str]:
    """Lines whose last one ends with a newline (a marker must start a line)."""
    if lines and not lines[-1].endswith("\n"):
        return [*lines[:-1], lines[-1] + "\n"]
    return lines


def _clusters(ours: list[Hunk], theirs: list[Hunk]) -> list[tuple[list[Hunk], list[Hunk]]]:
    """Group the two sides' hunks, in base order, into clusters that touch each other
    (transitively); a cluster holding hunks of one side only is no overlap."""
    tagged = sorted([(h[0], h[1], 0, h) for h in ours] + [(h[0], h[1], 1, h) for h in theirs])
    out: list[tuple[list[Hunk], list[Hunk]]] = []
    for _, _, side, hunk in tagged:
        # Hunks of one side never touch each other, and a hunk that starts a new
        # cluster starts at or past every earlier cluster's end (hunks come in base
        # order), so comparing with the last cluster's other side is enough.
        if out and any(_touch(hunk, h) for h in out[-1][1 - side]):
            out[-1][side].append(hunk)
            continue
        out.append(([], []))
        out[-1][side].append(hunk)
    return out


def merge3(base: str, ours: str, theirs: str, *, ours_label: str, theirs_label: str) -> Merged:
    """Apply ``ours``' and ``theirs``' changes against ``base`` (see the module docstring)."""
    b = base.splitlines(keepends=True)
    o = ours.splitlines(keepends=True)
    t = theirs.splitlines(keepends=True)
    out: list[str] = []
    conflicts = 0
    at = 0
    for mine, other in _clusters(_hunks(b, o), _hunks(b, t)):
        hunks = mine + other
        lo, hi = min(h[0] for h in hunks), max(h[1] for h in hunks)
        out += b[at:lo]
        at = hi
        mine_text, other_text = _apply(b, lo, hi, mine), _apply(b, lo, hi, other)
        if not mine or not other or mine_text == other_text:
            out += mine_text if mine else other_text
        elif lo == hi:
            out += _union(other_text, mine_text)
        else:
            conflicts += 1
            out = _ended(out)
            out += [f"{START} {theirs_label}\n", *_ended(other_text)]
            out += [f"{BASE} before both changes\n", *_ended(b[lo:hi])]
            out += [f"{SEP}\n", *_ended(mine_text), f"{END} {ours_label}\n"]
    out += b[at:]
    return Merged(text="".join(out), conflicts=conflicts)
