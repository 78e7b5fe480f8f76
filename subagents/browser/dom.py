"""What the model sees of a page: readable text, numbered elements, untrusted delimiters.

One script run in the page (:data:`SNAPSHOT_JS`) reads the readable main text and
picks the visible interactive elements (links, buttons, form fields, ARIA widgets),
numbering them ``e1``, ``e2``, ... and marking each live element with a
``data-fleet-ref`` attribute, so ``click{ref}`` and ``type{ref}`` find exactly the
element the model saw. Each listed element's role, accessible name, value and states
then come from Chromium's own accessibility tree (:mod:`subagents.browser.ax`), so
the model reads what a screen reader would; the script's own naming is only the
fallback for an element whose tree node could not be read.

Why not list the whole accessibility tree: on a large documentation page
(``library/stdtypes.html``, 35,000 tree nodes) ``Accessibility.getFullAXTree`` takes
2-9 s and Playwright's ``aria_snapshot`` about 0.6 s, against about 0.05 s for the
script; asking the tree only for the listed elements keeps a snapshot fast.

Everything that came from a page is wrapped in ``<untrusted_page_content>``. Any
look-alike of either delimiter tag inside page text or attributes (any case, spaces
or ``-``/``_`` between the words, invisible characters) has its ``<`` escaped, and
quotes in the URL and title attributes are escaped, so a page can neither close the
delimiter nor forge a new one and talk to the model as the harness.
"""

from __future__ import annotations

import re
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

SNAPSHOT_JS = r"""
([maxElements, withElements]) => {
  const SEL = 'a[href], button, input:not([type=hidden]), select, textarea, summary, ' +
    '[role=button], [role=link], [role=checkbox], [role=radio], [role=tab], ' +
    '[role=menuitem], [role=textbox], [role=searchbox], [role=combobox], [role=switch], ' +
    '[contenteditable=""], [contenteditable=true], [onclick]';
  const visible = (el) => {
    const r = el.getBoundingClientRect();
    const s = getComputedStyle(el);
    return r.width > 0 && r.height > 0 && s.visibility !== 'hidden' && s.display !== 'none';
  };
  const clean = (t) => (t || '').replace(/\s+/g, ' ').trim();
  const role = (el) => {
    const r = el.getAttribute('role');
    if (r) return r;
    const tag = el.tagName.toLowerCase();
    if (tag === 'a') return 'link';
    if (tag === 'select') return 'combobox';
    if (tag === 'textarea') return 'textbox';
    if (tag === 'summary') return 'button';
    if (tag === 'input') {
      const t = (el.getAttribute('type') || 'text').toLowerCase();
      return ({checkbox: 'checkbox', radio: 'radio', submit: 'button', button: 'button',
               reset: 'button', image: 'button', search: 'searchbox', range: 'slider'})[t]
        || 'textbox';
    }
    return tag === 'button' ? 'button' : 'generic';
  };
  const name = (el) => {
    const byAria = el.getAttribute('aria-label');
    if (byAria) return clean(byAria);
    const ids = el.getAttribute('aria-labelledby');
    if (ids) {
      const t = ids.split(/\s+/).map(i => document.getElementById(i))
        .filter(Boolean).map(n => n.innerText).join(' ');
      if (clean(t)) return clean(t);
    }
    if (el.labels && el.labels.length) return clean(el.labels[0].innerText);
    const text = clean(el.innerText || el.textContent);
    if (text) return text.slice(0, 120);
    return clean(el.getAttribute('alt') || el.getAttribute('title') ||
      el.getAttribute('placeholder') || el.value || el.getAttribute('name') || '');
  };
  const elements = [];
  const listed = [];
  let n = 0;
  // Reading text only (read, find) leaves the refs of the last snapshot in place.
  if (withElements) document.querySelectorAll('[data-fleet-ref]')
    .forEach(e => e.removeAttribute('data-fleet-ref'));
  for (const el of withElements ? document.querySelectorAll(SEL) : []) {
    if (!visible(el)) continue;
    const href = el.getAttribute('href') || '';
    const nm = name(el);
    // Sphinx-style permalink marks add hundreds of one-character links; skip them.
    if (href.startsWith('#') && nm.length <= 1) continue;
    n += 1;
    const ref = 'e' + n;
    el.setAttribute('data-fleet-ref', ref);
    if (elements.length < maxElements) {
      const item = {ref, role: role(el), name: nm};
      if (el.tagName === 'A' && el.href) item.href = el.href;
      if ('value' in el && el.tagName !== 'BUTTON' && el.value && role(el) !== 'button')
        item.value = String(el.value).slice(0, 80);
      if (el.type === 'checkbox' || el.type === 'radio') item.checked = !!el.checked;
      elements.push(item);
      listed.push(el);
    }
  }
  // Handed to the accessibility-tree pass (by CDP object id); not enumerable.
  Object.defineProperty(window, '__fleetRefs', {value: listed, configurable: true, writable: true});
  const main = document.querySelector('main, [role=main], article') || document.body;
  // The start of the part a URL fragment points at (a section of a long page).
  let anchor = '';
  if (location.hash.length > 1) {
    let id = location.hash.slice(1);
    try { id = decodeURIComponent(id); } catch (e) {}
    const target = document.getElementById(id) || document.getElementsByName(id)[0];
    if (target) anchor = (target.innerText || '').slice(0, 400);
  }
  return {
    url: location.href, title: document.title,
    text: main ? main.innerText : '', full_text: document.body ? document.body.innerText : '',
    elements, total_elements: n,
    scroll_y: Math.round(window.scrollY),
    scroll_height: Math.round(document.documentElement.scrollHeight),
    viewport_height: window.innerHeight, anchor,
  };
}
"""

LINKS_JS = r"""
([max, mainOnly]) => {
  const out = []; const seen = new Set();
  const root = (mainOnly && document.querySelector('main, [role=main], article')) || document;
  for (const a of root.querySelectorAll('a[href]')) {
    const href = a.href; const text = (a.innerText || a.title || '').replace(/\s+/g, ' ').trim();
    if (!href || href.startsWith('javascript:') || seen.has(href) || text.length <= 1) continue;
    seen.add(href); out.push({text: text.slice(0, 120), href});
    if (out.length >= max) break;
  }
  return {links: out, total: document.querySelectorAll('a[href]').length};
}
"""

OPEN_TAG = "<untrusted_page_content"
CLOSE_TAG = "</untrusted_page_content>"


class Element(BaseModel):
    """One interactive element of a snapshot."""

    model_config = ConfigDict(extra="forbid")

    ref: str
    role: str
    name: str
    href: str | None = None
    value: str | None = None
    checked: bool | None = None
    disabled: bool | None = None


class PageView(BaseModel):
    """A page as read by :data:`SNAPSHOT_JS`."""

    model_config = ConfigDict(extra="forbid")

    url: str
    title: str
    text: str
    """Readable main text (``main``/``article`` if present, else the body)."""
    full_text: str
    """The whole body text: what quotes are verified against."""
    elements: list[Element] = Field(default_factory=list)
    total_elements: int = 0
    scroll_y: int = 0
    scroll_height: int = 0
    viewport_height: int = 0
    anchor: str = ""
    """Opening text of the element the URL's fragment names (empty without one)."""


_TAG_LOOKALIKE = re.compile(
    r"[<\ufe64\uff1c](?=[\s\u200b-\u200f\u2060\ufeff]*/?[\s\u200b-\u200f\u2060\ufeff]*"
    r"untrusted[\s_\-\u200b-\u200f\u2060\ufeff]*page[\s_\-\u200b-\u200f\u2060\ufeff]*content)",
    re.IGNORECASE,
)


def defuse(text: str) -> str:
    """Page text with every look-alike of the delimiter tags made inert (its ``<`` as ``&lt;``)."""
    return _TAG_LOOKALIKE.sub("&lt;", text)


def _attr(value: str) -> str:
    # Only quotes and line breaks: a URL must stay copyable as the model saw it.
    return defuse(value).replace('"', "&quot;").replace("\n", " ")


def untrusted(url: str, body: str, *, title: str = "") -> str:
    """``body`` (page-derived) wrapped in the untrusted-content delimiters."""
    attrs = f' url="{_attr(url)}"' + (f' title="{_attr(title)}"' if title else "")
    return f"{OPEN_TAG}{attrs}>\n{defuse(body).rstrip()}\n{CLOSE_TAG}"


def chunks(text: str, size: int) -> list[str]:
    """``text`` cut into pieces of about ``size`` characters, at line breaks when possible."""
    out: list[str] = []
    rest = text.strip()
    while rest:
        if len(rest) <= size:
            out.append(rest)
            break
        cut = rest.rfind("\n", size // 2, size)
        cut = cut if cut > 0 else size
        out.append(rest[:cut].rstrip())
        rest = rest[cut:].lstrip()
    return out or [""]


def render_element(el: Element) -> str:
    line = f'[{el.ref}] {el.role} "{el.name}"'
    if el.href:
        line += f" -> {el.href}"
    if el.value:
        line += f" value={el.value!r}"
    if el.checked is not None:
        line += " (checked)" if el.checked else " (unchecked)"
    if el.disabled:
        line += " (disabled)"
    return line


def anchor_chunk(parts: list[str], anchor: str) -> int:
    """Index of the chunk where ``anchor`` (a section's opening text) begins, else 0.

    The opening lines are matched up to whitespace and together, so a table of
    contents that repeats only the heading does not count.
    """
    lines = [" ".join(line.split()) for line in anchor.splitlines()]
    lines = [line for line in lines if line]
    if len(lines) < 2:  # a heading alone also matches the table of contents
        return 0
    words = " ".join(lines[:3]).split()[:40]
    pattern = re.compile(r"\s+".join(re.escape(w) for w in words))
    for i, part in enumerate(parts):
        if pattern.search(part):
            return i
    return 0


def render_snapshot(
    view: PageView, *, chunk_chars: int, status: str = "", elements: bool = True
) -> str:
    """The model-facing snapshot: one text chunk plus numbered elements, delimited.

    The chunk is the first, or, when the URL has a fragment, the one where that part
    of the page begins (a search result pointing into a long page lands there).
    """
    parts = chunks(view.text, chunk_chars)
    at = anchor_chunk(parts, view.anchor) if view.anchor else 0
    fragment = view.url.split("#", 1)[1] if "#" in view.url else ""
    head = f"Page text (chunk {at + 1} of {len(parts)}"
    if at:
        head += f", where #{fragment} begins; read other chunks with read chunk=N)"
    elif len(parts) > 1:
        head += "; call read with chunk=2.. for the rest)"
    else:
        head += ")"
    lines = [head + ":", parts[at], ""]
    if elements:
        more = view.total_elements - len(view.elements)
        lines.append(f"Interactive elements ({view.total_elements}; use a ref with click/type):")
        lines += [render_element(e) for e in view.elements]
        if more > 0:
            lines.append(f"... {more} more elements not listed (use links or find).")
    scroll = f"Scroll: {view.scroll_y} of {max(view.scroll_height - view.viewport_height, 0)} px."
    lines.append(scroll)
    text = untrusted(view.url, "\n".join(lines), title=view.title)
    return f"{status}\n{text}" if status else text


def render_links(url: str, data: dict[str, Any]) -> str:
    """The ``links`` tool's answer, delimited."""
    links = data.get("links", [])
    lines = [f"{i}. {link['text']} -> {link['href']}" for i, link in enumerate(links, 1)]
    total = int(data.get("total", len(links)))
    if total > len(links):
        lines.append(f"({total} anchors on the page; duplicates and unnamed ones omitted)")
    return untrusted(url, "\n".join(lines) or "(no links)")
