"""The page texts a browser member fetched, and quote verification against them.

Every time a tool reads a page, its whole body text is kept under the member's run
directory (``pages/NNN.txt`` plus one line in ``pages/index.jsonl``), so a person
can see what the member actually read and :func:`verify_quote` can check each
claim's quote against exactly that - never against a fresh fetch, which could
differ from what the member saw.

Matching is verbatim up to presentation: Unicode is NFKC-normalised, typographic
quotes and dashes become ASCII, and runs of whitespace collapse (``innerText``
line-breaks are layout, not words); soft hyphens and zero-width characters are
dropped. An ellipsis (``...`` or ``…``) inside a quote stands for omitted text:
every piece must appear, in order, each at least :data:`MIN_PIECE_CHARS` long and
at most :data:`MAX_GAP_CHARS` after the previous one - otherwise "The ... shield
... cancelled" would "quote" any page that has those words somewhere, which is a
paraphrase, not a quote. Letters, case and punctuation must otherwise match.
"""

from __future__ import annotations

import hashlib
import re
import time
import unicodedata
import urllib.parse
from pathlib import Path

from pydantic import BaseModel, ConfigDict

_TRANSLATE = str.maketrans(
    {
        "\u2018": "'",
        "\u2019": "'",
        "\u201c": '"',
        "\u201d": '"',
        "\u2013": "-",
        "\u2014": "-",
        "\u00a0": " ",
        "\u00b6": " ",
    }
)
_INVISIBLE = dict.fromkeys(map(ord, "\u00ad\u200b\u200c\u200d\u2060\ufeff"))
_ELLIPSIS = re.compile(r"\s*(?:\.\.\.|\u2026)\s*")
MIN_PIECE_CHARS = 10
"""Shortest piece of an ellipsis quote (a word or two quote nothing)."""
MAX_GAP_CHARS = 1_500
"""Most text an ellipsis may stand for (about a long paragraph)."""


class PageRecord(BaseModel):
    """One fetched page text, as listed in ``pages/index.jsonl``."""

    model_config = ConfigDict(extra="forbid")

    n: int
    url: str
    title: str = ""
    path: str
    """File name under ``pages/``."""
    sha256: str
    chars: int
    ts: float


def normalize_text(text: str) -> str:
    """Text as compared for quotes (see the module docstring)."""
    text = unicodedata.normalize("NFKC", text).translate(_TRANSLATE).translate(_INVISIBLE)
    return " ".join(text.split())


def normalize_url(url: str) -> str:
    """A URL without fragment and trailing slash, lower-case scheme and host."""
    parts = urllib.parse.urlsplit(url.strip())
    path = parts.path.rstrip("/") or "/"
    return urllib.parse.urlunsplit(
        (parts.scheme.lower(), parts.netloc.lower(), path, parts.query, "")
    )


def quote_in(quote: str, text: str) -> bool:
    """Whether ``quote`` occurs verbatim (as defined above) in ``text``."""
    hay = normalize_text(text)
    whole = normalize_text(quote)
    if whole.strip(". \u2026") and whole in hay:
        return True  # also a quote whose "..." is the page's own (``f(...)``)
    pieces = [normalize_text(p) for p in _ELLIPSIS.split(quote)]
    pieces = [p for p in pieces if p]
    if not pieces:
        return False
    if len(pieces) > 1 and any(len(p) < MIN_PIECE_CHARS for p in pieces):
        return False
    return any(_pieces_from(hay, pieces, start) for start in _all(hay, pieces[0]))


def _all(hay: str, needle: str) -> list[int]:
    out, at = [], hay.find(needle)
    while at >= 0:
        out.append(at)
        at = hay.find(needle, at + 1)
    return out


def _pieces_from(hay: str, pieces: list[str], start: int) -> bool:
    """The pieces in order from ``start``, each within MAX_GAP_CHARS of the last."""
    end = start + len(pieces[0])
    for piece in pieces[1:]:
        found = hay.find(piece, end, end + MAX_GAP_CHARS + len(piece) + 1)
        if found < 0:
            return False
        end = found + len(piece)
    return True


class PageStore:
    """Append-only store of page texts under ``<run_dir>/pages/``."""

    def __init__(self, run_dir: Path) -> None:
        self.dir = Path(run_dir) / "pages"
        self.index = self.dir / "index.jsonl"
        self._seen: set[str] = set()

    def records(self) -> list[PageRecord]:
        if not self.index.is_file():
            return []
        out = []
        for line in self.index.read_text(encoding="utf-8").splitlines():
            if line.strip():
                out.append(PageRecord.model_validate_json(line))
        return out

    def record(self, url: str, title: str, text: str) -> PageRecord | None:
        """Keep ``text`` as fetched from ``url``; None when this exact text is already kept."""
        digest = hashlib.sha256(f"{normalize_url(url)}\0{text}".encode()).hexdigest()
        if digest in self._seen:
            return None
        self._seen.add(digest)
        self.dir.mkdir(parents=True, exist_ok=True)
        n = len(self._seen)
        name = f"{n:04d}.txt"
        (self.dir / name).write_text(text, encoding="utf-8")
        rec = PageRecord(
            n=n, url=url, title=title, path=name, sha256=digest, chars=len(text), ts=time.time()
        )
        with self.index.open("a", encoding="utf-8") as fh:
            fh.write(rec.model_dump_json() + "\n")
        return rec

    def texts(self) -> list[tuple[PageRecord, str]]:
        return [(r, (self.dir / r.path).read_text(encoding="utf-8")) for r in self.records()]


class QuoteCheck(BaseModel):
    """The verdict on one quote."""

    model_config = ConfigDict(extra="forbid")

    verified: bool
    """True when the quote is on a page fetched from its claimed source URL."""
    note: str = ""
    """Why not, when not (or where else it was found)."""


def verify_quote(quote: str, source_url: str, store: PageStore) -> QuoteCheck:
    """Check ``quote`` against the texts this member fetched from ``source_url``."""
    pages = store.texts()
    if not quote.strip():
        return QuoteCheck(verified=False, note="empty quote")
    if len(normalize_text(quote)) < MIN_PIECE_CHARS:
        return QuoteCheck(
            verified=False,
            note=f"quote too short to support a claim (under {MIN_PIECE_CHARS} characters)",
        )
    want = normalize_url(source_url)
    from_source = [(r, t) for r, t in pages if normalize_url(r.url) == want]
    if any(quote_in(quote, t) for _r, t in from_source):
        return QuoteCheck(verified=True)
    elsewhere = [r.url for r, t in pages if quote_in(quote, t)]
    if elsewhere:
        return QuoteCheck(
            verified=False, note=f"quote is on {elsewhere[0]}, not on the cited source"
        )
    if not from_source:
        return QuoteCheck(verified=False, note="the member never fetched the cited source URL")
    return QuoteCheck(verified=False, note="quote not found on the fetched page")
