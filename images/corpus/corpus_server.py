"""Fleet's offline research corpus: a static documentation site with a search page.

Part of the ``fleet-corpus`` image's build context, baked in at
``/opt/fleet/corpus_server.py``; the host never imports it. Standard library only. It serves Debian's HTML documentation of Python 3.11 (real
documentation nobody in this project wrote) as an ordinary web site on the run's
internal network, so research members reach it exactly as they would reach any
allowlisted site, and a user points the same browser tools at the web by changing
the allowlist and the search page.

Two sub-commands:

``index --root DIR --out FILE``
    Parse every documentation page once (at image build time) into sections - one
    per ``<section id=...>`` of the Sphinx output - and write a JSON index: each
    section's URL with its anchor, its title, its plain text, and per-term counts.
``serve --root DIR --index FILE [--site DIR ...] [--port N]``
    Serve the pages, ``/search?q=...`` (ranked result links with snippets, 10 per
    page, ``&page=N``), ``/healthz``, ``/echo`` (echoes a submitted form, for form
    fixtures) and, under ``/site/``, extra pages from ``--site`` directories (read
    on every request, so pages written into the box later are served too).

What search covers: the documentation under ``--root`` only. Pages under ``/site/``
are fixtures - the sample form and the landing page baked into the image, and pages
a test writes into a running box to stage one scenario (an injection, a cookie jar)
- and are deliberately left out: they are reached by URL, they would otherwise
surface in research results, and a page written after start would need a live
re-index. To search your own pages, serve them as the root instead: ``serve --root
DIR --index FILE`` builds the index from ``DIR`` at start when ``FILE`` does not
exist (the 530 pages of the Python documentation take about 11 s on a loaded 2-core
machine), or build it once with ``index`` and keep the file.

Why sections and BM25: a question such as "how does shield protect a task from
cancellation" is answered by one section of one long page; ranking whole pages
would send the reader to a 150 KB page and leave them to find the paragraph.
BM25 (k1=1.2, b=0.75) with the section and page title counted three times is the
standard, explainable baseline and needs no dependency.
"""

from __future__ import annotations

import argparse
import html
import json
import math
import os
import re
import sys
import time
import urllib.parse
from collections import Counter
from html.parser import HTMLParser
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

_TOKEN = re.compile(r"[a-z0-9_]+")
_STOP = frozenset(
    "a an and are as at be by can do does for from has have how i if in into is it its "
    "of on or that the their then there these this to was what when where which while "
    "who why will with you your".split()
)
_SKIP_PAGES = re.compile(r"^(genindex|py-modindex|search|contents|_sources|_static|_images)")
_BLOCK = frozenset(
    "p div li dt dd pre h1 h2 h3 h4 h5 h6 tr table section ul ol dl blockquote br".split()
)
_HEADING = frozenset("h1 h2 h3 h4 h5 h6".split())
_TITLE_WEIGHT = 3
_K1, _B = 1.2, 0.75
PAGE_SIZE = 10


def tokens(text: str) -> list[str]:
    """Lower-case word tokens without stop words (identifiers keep underscores)."""
    return [t for t in _TOKEN.findall(text.lower()) if t not in _STOP]


class _SectionParser(HTMLParser):
    """Splits the main body of a Sphinx page into (anchor, title, text) sections."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.page_title = ""
        self.sections: list[dict[str, str]] = []
        self._stack: list[dict[str, str]] = []
        self._in_main = 0  # depth of nested divs inside the main body, 0 = outside
        self._skip = 0  # inside script/style/headerlink
        self._heading: list[str] | None = None
        self._in_title = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        if tag == "title":
            self._in_title = True
        if tag in ("script", "style") or (tag == "a" and "headerlink" in (a.get("class") or "")):
            self._skip += 1
            return
        if tag == "div" and self._in_main:
            self._in_main += 1
        elif tag == "div" and a.get("role") == "main":
            self._in_main = 1
        if not self._in_main:
            return
        if tag == "section" and a.get("id"):
            sec = {"anchor": a["id"] or "", "title": "", "text": ""}
            self.sections.append(sec)
            self._stack.append(sec)
        if tag in _HEADING:
            self._heading = []
        if tag in _BLOCK:
            self._add("\n")

    def handle_endtag(self, tag: str) -> None:
        if tag == "title":
            self._in_title = False
        if tag in ("script", "style") or (tag == "a" and self._skip):
            self._skip = max(0, self._skip - 1)
            return
        if not self._in_main:
            return
        if tag == "div":
            self._in_main -= 1
        if tag in _HEADING and self._heading is not None:
            if self._stack and not self._stack[-1]["title"]:
                self._stack[-1]["title"] = " ".join("".join(self._heading).split())
            self._heading = None
        if tag == "section" and self._stack:
            self._stack.pop()
        if tag in _BLOCK:
            self._add("\n")

    def handle_data(self, data: str) -> None:
        if self._in_title:
            self.page_title += data
        if self._skip or not self._in_main:
            return
        if self._heading is not None:
            self._heading.append(data)
        self._add(data)

    def _add(self, text: str) -> None:
        if self._stack:
            self._stack[-1]["text"] += text


def _clean(text: str) -> str:
    lines = (" ".join(line.split()) for line in text.split("\n"))
    return "\n".join(line for line in lines if line)


def build_index(root: Path) -> dict[str, object]:
    """Parse every page under ``root`` into a searchable section index."""
    docs: list[dict[str, object]] = []
    for path in sorted(root.rglob("*.html")):
        rel = path.relative_to(root).as_posix()
        if _SKIP_PAGES.match(rel):
            continue
        parser = _SectionParser()
        parser.feed(path.read_text(encoding="utf-8", errors="replace"))
        page_title = " ".join(parser.page_title.split()).split(" \u2014 ")[0]
        for i, sec in enumerate(parser.sections):
            # A parent section's text is only its own lead-in; children are their own docs.
            text = _clean(sec["text"])
            if len(text) < 40:
                continue
            url = "/" + rel + ("" if i == 0 else "#" + sec["anchor"])
            title = sec["title"] or page_title
            counts = Counter(tokens(text))
            for t in tokens(title + " " + page_title):
                counts[t] += _TITLE_WEIGHT
            docs.append(
                {"url": url, "title": title, "page": page_title, "text": text, "tf": counts}
            )
    return {"version": 1, "docs": docs}


class Index:
    """BM25 search over the sections of an index built by :func:`build_index`."""

    def __init__(self, data: dict[str, object]) -> None:
        self.docs: list[dict[str, object]] = data["docs"]  # type: ignore[assignment]
        self.postings: dict[str, list[tuple[int, int]]] = {}
        lengths = []
        for i, doc in enumerate(self.docs):
            tf: dict[str, int] = doc["tf"]  # type: ignore[assignment]
            lengths.append(sum(tf.values()))
            for term, n in tf.items():
                self.postings.setdefault(term, []).append((i, n))
        self.lengths = lengths
        self.avg_len = (sum(lengths) / len(lengths)) if lengths else 1.0

    def search(self, query: str) -> list[tuple[float, dict[str, object]]]:
        """Sections ranked by BM25 score for ``query``, best first."""
        n_docs = len(self.docs)
        scores: dict[int, float] = {}
        for term in set(tokens(query)):
            posting = self.postings.get(term, [])
            if not posting:
                continue
            idf = math.log(1 + (n_docs - len(posting) + 0.5) / (len(posting) + 0.5))
            for i, tf in posting:
                norm = tf + _K1 * (1 - _B + _B * self.lengths[i] / self.avg_len)
                scores[i] = scores.get(i, 0.0) + idf * tf * (_K1 + 1) / norm
        ranked = sorted(scores.items(), key=lambda kv: (-kv[1], kv[0]))
        return [(score, self.docs[i]) for i, score in ranked]


def snippet(text: str, query: str, width: int = 280) -> str:
    """The window of ``text`` with the most query terms, HTML-escaped, terms in <b>."""
    terms = set(tokens(query))
    words = text.split()
    if not words:
        return ""
    hits = [1 if set(tokens(w)) & terms else 0 for w in words]
    span = 40
    best, best_at, run = -1, 0, sum(hits[:span])
    for start in range(max(1, len(words) - span + 1)):
        if start:
            run += (hits[start + span - 1] if start + span - 1 < len(hits) else 0) - hits[start - 1]
        if run > best:
            best, best_at = run, start
    chosen = " ".join(words[best_at : best_at + span])[:width]
    out = []
    for w in chosen.split(" "):
        esc = html.escape(w)
        out.append(f"<b>{esc}</b>" if set(tokens(w)) & terms else esc)
    prefix = "... " if best_at else ""
    return prefix + " ".join(out) + " ..."


_PAGE = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{title}</title>
<style>body{{font-family:sans-serif;max-width:52em;margin:2em auto}} .snippet{{color:#333}}
.url{{color:#070;font-size:90%}}</style></head>
<body><main>
<h1>{heading}</h1>
<form action="/search" method="get" role="search">
<label for="q">Search the Python 3.11 documentation</label>
<input id="q" name="q" type="search" value="{q}"> <button type="submit">Search</button>
</form>
{body}
</main></body></html>
"""


def render_results(index: Index, query: str, page: int) -> str:
    """The HTML of one page of search results."""
    results = index.search(query) if query.strip() else []
    start = (page - 1) * PAGE_SIZE
    shown = results[start : start + PAGE_SIZE]
    items = []
    for _score, doc in shown:
        title = str(doc["title"])
        if doc["page"] and doc["page"] != title:
            title += f" \u2014 {doc['page']}"
        items.append(
            f'<li class="result"><a class="result-link" href="{html.escape(str(doc["url"]))}">'
            f'{html.escape(title)}</a><div class="url">{html.escape(str(doc["url"]))}</div>'
            f'<p class="snippet">{snippet(str(doc["text"]), query)}</p></li>'
        )
    q = html.escape(query)
    body = f'<p class="count">{len(results)} results for \u201c{q}\u201d</p>\n'
    body += f'<ol class="results" start="{start + 1}">\n' + "\n".join(items) + "\n</ol>"
    if start + PAGE_SIZE < len(results):
        nxt = urllib.parse.urlencode({"q": query, "page": page + 1})
        body += f'\n<p><a class="next" href="/search?{nxt}">Next results</a></p>'
    return _PAGE.format(
        title=f"Search: {q}", heading="Search results" if query else "Search", q=q, body=body
    )


def render_echo(fields: dict[str, list[str]], method: str) -> str:
    """A page listing submitted form fields (for form-filling fixtures)."""
    rows = "\n".join(
        f'<li><span class="name">{html.escape(k)}</span> = '
        f'<span class="value" id="field-{html.escape(k)}">{html.escape(", ".join(v))}</span></li>'
        for k, v in sorted(fields.items())
    )
    body = f'<p id="method">Received a {method} submission.</p>\n<ul id="fields">\n{rows}\n</ul>'
    return _PAGE.format(title="Form received", heading="Form received", q="", body=body)


_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".css": "text/css",
    ".js": "text/javascript",
    ".json": "application/json",
    ".png": "image/png",
    ".svg": "image/svg+xml",
    ".txt": "text/plain; charset=utf-8",
    ".xml": "application/xml",
}


class _Handler(BaseHTTPRequestHandler):
    server_version = "FleetCorpus/1"
    root: Path
    sites: list[Path]
    index: Index

    def log_message(self, format: str, *args: object) -> None:
        sys.stderr.write("corpus: " + (format % args) + "\n")

    def do_GET(self) -> None:
        url = urllib.parse.urlsplit(self.path)
        params = urllib.parse.parse_qs(url.query)
        path = urllib.parse.unquote(url.path)
        if path == "/healthz":
            return self._send(200, b"ok\n", "text/plain")
        if path in ("/search", "/search.html"):
            page = params.get("page", ["1"])[0]
            query = params.get("q", [""])[0]
            text = render_results(self.index, query, int(page) if page.isdigit() else 1)
            return self._send(200, text.encode(), _TYPES[".html"])
        if path == "/echo":
            return self._send(200, render_echo(params, "GET").encode(), _TYPES[".html"])
        if path.startswith("/site/"):
            return self._file(self.sites, path[len("/site/") :])
        return self._file([self.root], path.lstrip("/"))

    def do_POST(self) -> None:
        length = min(int(self.headers.get("Content-Length") or 0), 1 << 20)
        params = urllib.parse.parse_qs(self.rfile.read(length).decode("utf-8", "replace"))
        if urllib.parse.urlsplit(self.path).path != "/echo":
            return self._send(405, b"only /echo accepts POST\n", "text/plain")
        self._send(200, render_echo(params, "POST").encode(), _TYPES[".html"])

    def _file(self, roots: list[Path], rel: str) -> None:
        for root in roots:
            target = (root / rel).resolve()
            if target.is_dir():
                target = target / "index.html"
            # Symlinks into /usr/share/javascript are fine; escapes via ".." are not.
            if ".." in Path(rel).parts or not target.is_file():
                continue
            ctype = _TYPES.get(target.suffix, "application/octet-stream")
            return self._send(200, target.read_bytes(), ctype)
        self._send(404, b"<h1>Not found</h1>\n", _TYPES[".html"])

    def _send(self, status: int, body: bytes, ctype: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


def serve(root: Path, index_path: Path, sites: list[Path], host: str, port: int) -> None:
    """Load (or build) the index and serve until killed."""
    t0 = time.monotonic()
    if index_path.is_file():
        data = json.loads(index_path.read_text(encoding="utf-8"))
    else:
        data = build_index(root)
    handler = type("Handler", (_Handler,), {"root": root, "sites": sites, "index": Index(data)})
    httpd = ThreadingHTTPServer((host, port), handler)
    httpd.daemon_threads = True
    sys.stderr.write(
        f"corpus: {len(data['docs'])} sections ready in {time.monotonic() - t0:.2f}s "
        f"on {host}:{port}\n"
    )
    httpd.serve_forever()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="corpus_server", description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    pi = sub.add_parser("index", help="build the search index")
    pi.add_argument("--root", type=Path, required=True)
    pi.add_argument("--out", type=Path, required=True)
    ps = sub.add_parser("serve", help="serve the site and the search page")
    ps.add_argument("--root", type=Path, required=True)
    ps.add_argument("--index", type=Path, required=True)
    ps.add_argument("--site", type=Path, action="append", default=[])
    ps.add_argument("--host", default="0.0.0.0")
    ps.add_argument("--port", type=int, default=int(os.environ.get("CORPUS_PORT", "8080")))
    args = p.parse_args(argv)
    if args.cmd == "index":
        data = build_index(args.root)
        args.out.write_text(json.dumps(data, separators=(",", ":")), encoding="utf-8")
        print(f"indexed {len(data['docs'])} sections into {args.out}")  # type: ignore[arg-type]
        return 0
    serve(args.root, args.index, args.site, args.host, args.port)
    return 0


if __name__ == "__main__":
    sys.exit(main())
