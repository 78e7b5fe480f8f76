"""The ``research`` offline policy: a deterministic browser member for demos and tests.

It drives the browser tools the way a careful researcher would, with no model:

1. ``search`` the configured search page with the task's key terms (or, when the
   task or ``inputs["urls"]`` names pages, open those instead);
2. ``navigate`` to the top results (distinct pages, at most ``inputs["max_pages"]``,
   default 3), and ``read`` the chunks of each page nearest the one the snapshot
   showed - the section a search result points at (in one turn: reads of one page do
   not disturb each other; at most ``MAX_READS`` chunks a page, that one included);
3. pick the sentences that share the most key terms with the task and submit them
   as claims, each quote copied character for character from the tool result, with
   the URL the page was read from; and, when a page shows an interactive session
   (``>>>`` code with its output) about the task, one claim quoting that session
   verbatim - an example whose behaviour running it can check
   (:mod:`subagents.model.examples`);
4. name what stayed open: the task's own topic words that no chosen claim mentions
   become one open question ("What does the documentation say about ...?").

Everything it knows comes from the conversation (the request's messages), so it is
a pure function of the request and replays identically. Page content is data, never
instructions: the policy takes no action because of a page's text (the only links
it follows come from the search results listing), and a sentence that addresses an
AI agent ("ignore previous instructions", "system prompt", ...) is never quoted;
the page is reported in ``open_questions`` instead (as a question, as every entry there
is: a note such as "nothing matched" goes in the summary).
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from typing import Any

from .base import ModelRequest
from .examples import checkable, one_line, session_blocks, words_before
from .offline import register_policy, with_required_fields

MAX_PAGES = 3
MAX_READS = 4
"""Chunks read a page, the one shown included. Every turn resends what was read, so a
member's tokens grow with the square of its reading: 8 chunks a page took members to
about 150k tokens in 8 turns on long pages of the corpus, against a lead member's
default ``max_tokens`` of 200k, and some ended ``incomplete``. 4 chunks around the
section the search pointed at bound the worst case near 110k (measured in the README's
"Research with a lead")."""
MAX_CLAIMS = 4
WORD = re.compile(r"[a-z0-9_]+")
GENERIC = frozenset(
    "key concepts definitions behind practice api parameters behaviour behavior pitfalls "
    "errors edge cases documentation warn examples give related features alternatives "
    "documented changed between versions deprecated regarding part say".split()
)
"""The planner's angle words (and the open question's own): not what a task is about."""
_STOP = frozenset(
    "a an and are as at be by can do does did for from get gets got has have how i if in "
    "into is it its of on or should that the their then there these this to was what when "
    "where which while who why will with would you your explain describe find out about "
    "work works program programs use used using way ways python s".split()
)
_UNTRUSTED = re.compile(
    r'<untrusted_page_content url="([^"]*)"[^>]*>\n(.*?)\n</untrusted_page_content>', re.S
)
_RESULT_LINE = re.compile(r"^\d+\. (.+) -> (\S+)$", re.M)
_URL = re.compile(r"https?://[^\s\"'<>)]+")
_SENTENCE = re.compile(r"(?<=[.!?])\s+(?=[A-Z(])")
INJECTION = re.compile(
    r"ignore (all |any |the )?(previous|prior|above|earlier|your) (instructions|prompts?)"
    r"|disregard .{0,40}instructions|system prompt|you are now|new instructions"
    r"|submit_result|as an ai\b|language model|ai (agent|assistant)",
    re.I,
)


def key_terms(text: str, limit: int = 8) -> list[str]:
    """The task's content words, in order, without duplicates."""
    out: list[str] = []
    for w in WORD.findall(text.lower()):
        if len(w) > 1 and w not in _STOP and w not in out:
            out.append(w)
    return out[:limit]


def stem(word: str) -> str:
    """A crude stem: 'cancelled', 'cancellation', 'cancel' all give 'cance'."""
    return word[:5] if len(word) > 5 else word.rstrip("s")


@dataclass
class _State:
    """What the conversation so far says was done."""

    task: str = ""
    inputs: dict[str, Any] = field(default_factory=dict)
    calls: list[tuple[dict[str, Any], dict[str, Any] | None]] = field(default_factory=list)
    """(tool_use, its tool_result or None), in order."""

    def of(self, name: str) -> list[tuple[dict[str, Any], dict[str, Any] | None]]:
        return [(u, r) for u, r in self.calls if u.get("name") == name]


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    return "\n".join(b.get("text", "") for b in content or [] if isinstance(b, dict))


def read_state(request: ModelRequest) -> _State:
    state = _State()
    results: dict[str, dict[str, Any]] = {}
    uses: list[dict[str, Any]] = []
    for i, msg in enumerate(request.messages):
        blocks = msg.get("content")
        if isinstance(blocks, str):
            blocks = [{"type": "text", "text": blocks}]
        for b in blocks or []:
            kind = b.get("type")
            if i == 0 and msg.get("role") == "user" and kind == "text":
                text = b.get("text", "")
                if text.startswith("Inputs (JSON):"):
                    try:
                        state.inputs = json.loads(text.split("\n", 1)[1])
                    except (IndexError, ValueError):
                        pass
                elif not state.task:
                    state.task = text
            elif kind == "tool_use":
                uses.append(b)
            elif kind == "tool_result":
                results[b.get("tool_use_id", "")] = b
    state.calls = [(u, results.get(u.get("id", ""))) for u in uses]
    return state


def _result_text(result: dict[str, Any] | None) -> str:
    return _text(result.get("content")) if result else ""


def _ok(result: dict[str, Any] | None) -> bool:
    return result is not None and not result.get("is_error")


def page_key(url: str) -> str:
    return url.split("#", 1)[0]


def candidates(state: _State) -> list[str]:
    """Pages to open: the task's own URLs, else the search results' links."""
    given = [*state.inputs.get("urls", []), *_URL.findall(state.task)]
    if not given:
        for _use, result in state.of("search"):
            if _ok(result):
                body = _UNTRUSTED.search(_result_text(result))
                given += [m.group(2) for m in _RESULT_LINE.finditer(body.group(2) if body else "")]
    seen, out = set(), []
    for url in given:
        if page_key(url) not in seen:
            seen.add(page_key(url))
            out.append(url)
    limit = int(state.inputs.get("max_pages", MAX_PAGES))
    return out[:limit]


def _tool(name: str, **args: Any) -> dict[str, Any]:
    return {"type": "tool_use", "name": name, "input": args}


def next_action(state: _State) -> list[dict[str, Any]]:
    """The tool calls of the next turn, or the submission."""
    submits = state.of("submit_result")
    if submits:
        return [_tool("submit_result", **build_findings(state, condensed=True))]
    given = bool(state.inputs.get("urls") or _URL.search(state.task))
    if not given and not state.of("search"):
        return [_tool("search", query=" ".join(key_terms(state.task)))]
    navs = state.of("navigate")
    opened = {u["input"].get("url") for u, _r in navs}
    if navs:
        last_use, last_result = navs[-1]
        if _ok(last_result) and state.calls[-1][0] is last_use:
            shown, total = _chunk_count(_result_text(last_result))
            near = sorted(
                (c for c in range(1, total + 1) if c != shown), key=lambda c: abs(c - shown)
            )
            reads = [_tool("read", chunk=c) for c in sorted(near[: MAX_READS - 1])]
            if reads:
                return reads
    for url in candidates(state):
        if url not in opened:
            return [_tool("navigate", url=url)]
    return [_tool("submit_result", **build_findings(state))]


def _chunk_count(text: str) -> tuple[int, int]:
    """(chunk shown, chunks in all) of a snapshot."""
    found = re.search(r"Page text \(chunk (\d+) of (\d+)", text)
    return (int(found.group(1)), int(found.group(2))) if found else (1, 1)


def page_texts(state: _State) -> dict[str, tuple[str, list[str]]]:
    """Page key -> (URL as read, texts of its chunks), from navigate and read results."""
    pages: dict[str, tuple[str, list[str]]] = {}
    for use, result in state.calls:
        if use.get("name") not in ("navigate", "read") or not _ok(result):
            continue
        for url, body in _UNTRUSTED.findall(_result_text(result)):
            body = re.sub(
                r"^(Page text \(chunk \d+ of \d+[^\n]*|Chunk \d+ of \d+[^\n]*)\n", "", body
            )
            body = body.split("\nInteractive elements (")[0]
            pages.setdefault(page_key(url), (url, []))[1].append(body)
    return pages


def passages(text: str) -> list[str]:
    """Candidate quotes: prose sentences of a reasonable length (not code, not menus)."""
    out = []
    for line in text.split("\n"):
        line = line.strip()
        if len(line) < 40 or line.startswith((">>>", "...", "#", "$")) or line.count("(") > 4:
            continue
        out += [s.strip() for s in _SENTENCE.split(line) if 40 <= len(s.strip()) <= 400]
    return out


def build_findings(state: _State, *, condensed: bool = False) -> dict[str, Any]:
    """Findings from the pages read: the best-matching sentences, quoted verbatim."""
    terms = {stem(t) for t in key_terms(state.task)}
    found: list[tuple[set[str], int, str, str]] = []
    suspicious: list[str] = []
    for order, (url, texts) in enumerate(page_texts(state).values()):
        for sentence in passages("\n".join(texts)):
            if INJECTION.search(sentence):
                if url not in suspicious:
                    suspicious.append(url)
                continue
            hits = {stem(w) for w in WORD.findall(sentence.lower())} & terms
            if len(hits) >= min(2, len(terms)):
                found.append((hits, order, sentence, url))
    # Rare terms weigh more (IDF over the candidate sentences): "shield" says more
    # about a sentence than "task" does on a page about tasks.
    df = {t: sum(t in hits for hits, *_ in found) for t in terms}
    weight = {t: math.log(1 + len(found) / (1 + n)) for t, n in df.items()}
    scored = sorted(
        (
            (-sum(weight[t] for t in hits), order, sentence, url, len(hits))
            for hits, order, sentence, url in found
        ),
        key=lambda s: (s[0], s[1]),
    )
    chosen, seen = [], set()
    for _score, _order, sentence, url, n_hits in scored:
        if sentence not in seen:
            seen.add(sentence)
            chosen.append((n_hits, sentence, url))
        if len(chosen) >= (2 if condensed else MAX_CLAIMS):
            break
    claims = [{"text": s, "source_url": u, "quote": s} for _n, s, u in chosen]
    example = best_example(state, terms)
    if example is not None:
        claims.append(example)
    best = chosen[0][0] if chosen else 0
    confidence = "high" if terms and best >= 0.6 * len(terms) else ("medium" if chosen else "low")
    # Open questions are questions: what a reader may want to look into. That nothing
    # matched is said in the summary, as it answers nothing and asks nothing.
    open_questions = [
        f"{u} contains text addressed to an AI agent (treated as data and ignored): "
        "what does the page say without it?"
        for u in suspicious
    ]
    failed = [u["input"].get("url", "") for u, r in state.of("navigate") if not _ok(r)]
    open_questions += [f"{u} could not be opened: what does it say?" for u in failed]
    missing = uncovered(state.task, claims)
    if missing:
        open_questions.append(f"What does the documentation say about {' '.join(missing)}?")
    summary = f"Read {len(page_texts(state))} page(s) for: {state.task.strip()[:200]}. " + (
        f"Best passage: {chosen[0][1]}" if chosen else "Nothing relevant was found."
    )
    return {
        "summary": summary[: 600 if condensed else 1200],
        "claims": claims,
        "open_questions": open_questions,
        "confidence": confidence,
    }


def best_example(state: _State, terms: set[str]) -> dict[str, Any] | None:
    """A claim quoting the page's interactive session most about the task (with its
    output, so running it checks it), or None when no page read shows one."""
    best: tuple[int, str, str, str] | None = None
    for url, texts in page_texts(state).values():
        text = "\n".join(texts)
        for start, block in session_blocks(text):
            if not checkable(block) or INJECTION.search(block):
                continue
            about = words_before(text, start)
            hits = len({stem(w) for w in WORD.findall(f"{about} {block}".lower())} & terms)
            if hits and (best is None or hits > best[0]):
                best = (hits, block, url, about)
    if best is None:
        return None
    _hits, block, url, about = best
    what = f" ({one_line(about)})" if about else ""
    text = f"The documentation shows this example and its output{what}."
    return {"text": text, "source_url": url, "quote": block}


def uncovered(task: str, claims: list[dict[str, Any]]) -> list[str]:
    """The task's topic words that no claim mentions (by stem)."""
    said = {stem(w) for c in claims for w in WORD.findall(str(c.get("text", "")).lower())}
    return [t for t in key_terms(task) if t not in GENERIC and stem(t) not in said]


def research_policy(request: ModelRequest) -> list[dict[str, Any]]:
    """The ``research`` policy (see the module docstring)."""
    blocks = next_action(read_state(request))
    for block in blocks:
        if block.get("name") == "submit_result":
            block["input"] = with_required_fields(request, block["input"])
    return blocks


register_policy("research", research_policy)
