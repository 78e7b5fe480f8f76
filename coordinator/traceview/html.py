"""The self-contained HTML page of a run: one file, inline CSS/JS/data, no network.

The page is a static template (``static/viewer.html``, ``.css``, ``.js``) with the
run's data inlined as one JSON block; the browser renders it. Keeping data and code
apart makes the page fast to generate (one ``json.dumps``, no per-turn HTML built in
Python) and lets the browser build a member's turns only when that member is opened,
so a 16 x 200-turn run opens instantly. Size is bounded by a content budget: each
long text is cut to a per-content limit chosen so the whole page stays near
``budget`` bytes, and every cut text carries the path of its full version.
Screenshots are embedded as data URIs while they fit an image budget, and linked
(relative to the page) beyond it. Served by ``fleet view``, the same page loads any
cut text in full on demand (``/full/<ref>``), so the page stays small and nothing is
out of reach; the written file keeps the cut and links the file holding the rest.

Every string on the page was written by a model, a page or a box, so none may change
the page's structure. The data block is JSON with ``<``, ``>``, ``&``, U+2028/U+2029
and lone surrogates written as ``\\uXXXX`` escapes (:func:`embed_json`): no character
sequence inside it can end or re-enter the ``<script>`` element (``</script>``,
``<!--<script>``), and the page's bytes stay valid UTF-8 whatever a result holds. The
script then puts data into the DOM as text only. As a second wall, the page's Content
Security Policy lets only its own script run, named by its SHA-256 hash: markup that
got in anyway could not run code (the hash, unlike a nonce, suits a file written once).
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
from html import escape
from importlib import resources
from pathlib import Path
from typing import Any

from coordinator.traceview.detail import Mark, MemberDetail, member_detail
from coordinator.traceview.load import LEAD_DIR, RunTrace, read_json
from coordinator.traceview.rollup import MemberRollup, compact_json, rollup_run

TEXT_BUDGET = 3_200_000
"""Bytes of content text the page aims for (the 5 MB page limit minus structure)."""
IMAGE_BUDGET = 900_000
"""Bytes of embedded screenshots (base64) before the rest are linked instead."""
RESULT_TEXT_LIMIT = 4_000
"""Characters kept of each string in a member's final result (one result per member, so
a more generous cut than the per-event one); longer ones name ``result.json``."""
MAX_EMBEDDED_IMAGE = 96_000
"""A screenshot file larger than this is always linked, never embedded."""
_IMAGE_TYPES = {
    ".png": "image/png",
    ".jpg": "image/jpeg",
    ".jpeg": "image/jpeg",
    ".webp": "image/webp",
}


def _content_limit(run: RunTrace, limit: int) -> int:
    """Per-content character limit so the page's texts fit :data:`TEXT_BUDGET`."""
    contents = sum(len(m.events) for m in run.members)
    return max(160, min(limit, TEXT_BUDGET // max(1, contents)))


def _r(x: float, base: float) -> float:
    return round(x - base, 2)


class _Images:
    """Turns screenshot paths into data URIs within a byte budget, else into links."""

    def __init__(self, run_dir: Path, link_base: str) -> None:
        self.run_dir = run_dir
        self.link_base = link_base
        self.left = IMAGE_BUDGET

    def src(self, rel: str) -> str:
        """``rel``: the screenshot's path relative to the run directory (or absolute)."""
        full = Path(rel) if Path(rel).is_absolute() else self.run_dir / rel
        mime = _IMAGE_TYPES.get(full.suffix.lower())
        try:
            size = full.stat().st_size
        except OSError:
            return self.link_base + rel
        if mime and size <= MAX_EMBEDDED_IMAGE and size * 4 // 3 < self.left:
            data = base64.b64encode(full.read_bytes()).decode("ascii")
            self.left -= len(data)
            return f"data:{mime};base64,{data}"
        return self.link_base + rel


def _mark(m: Mark, base: float, images: _Images) -> dict[str, Any]:
    out: dict[str, Any] = {"k": m.kind, "ts": _r(m.ts, base), "x": m.text}
    if m.path:
        out["p"] = m.path
    if m.kind == "compaction":
        out |= {"b": m.tokens_before, "a": m.tokens_after, "sm": m.summary, "tr": m.truncated}
    if m.kind == "screenshot" and m.path:
        out["src"] = images.src(m.path)
    if m.ref:
        out["ref"] = m.ref
    return out


def clip_result(value: Any, limit: int) -> tuple[Any, list[tuple[list[str | int], int]]]:
    """``value`` with every string over ``limit`` characters cut, and the cuts made:
    (path of keys and indexes to the string, its full length)."""
    cuts: list[tuple[list[str | int], int]] = []

    def walk(v: Any, path: list[str | int]) -> Any:
        if isinstance(v, str) and len(v) > limit:
            cuts.append((path, len(v)))
            return v[:limit]
        if isinstance(v, dict):
            return {k: walk(x, [*path, str(k)]) for k, x in v.items()}
        if isinstance(v, list):
            return [walk(x, [*path, i]) for i, x in enumerate(v)]
        return v

    return walk(value, []), cuts


def _attempts(r: MemberRollup, base: float) -> list[dict[str, Any]]:
    return [
        {"n": a.n, "st": a.status, "why": a.reason, "s": _r(a.start, base), "b": _r(a.ready, base),
         "e": _r(a.end, base), "d": a.duration_s, "box": a.box_s, "su": a.setup_s, "turns": a.turns,
         "tools": a.tool_calls}
        for a in r.per_attempt
    ]  # fmt: skip


def _result(d: MemberDetail, run_dir: Path) -> dict[str, Any] | None:
    if d.result is None:
        return None
    value, cuts = clip_result(d.result, RESULT_TEXT_LIMIT)
    file = f"{d.dir}/result.json"
    return {"v": value, "cuts": cuts, "file": file if (run_dir / file).is_file() else "",
            "partial": d.partial}  # fmt: skip


def _member_data(
    d: MemberDetail, base: float, images: _Images, run_dir: Path, wave: int | None
) -> dict[str, Any]:
    r = d.rollup
    turns = []
    for t in d.turns:
        calls = [
            {"s": _r(c.start, base), "e": _r(c.end, base), "ctx": c.context_tokens,
             "i": c.input_tokens, "o": c.output_tokens, "cr": c.cache_read_tokens,
             "cw": c.cache_write_tokens, "stop": c.stop_reason, "x": c.text, "tr": c.truncated,
             "u": c.tool_uses, "ref": c.ref, "rt": c.retries}
            for c in t.model_calls
        ]  # fmt: skip
        tools = [
            {"n": x.tool, "id": x.call_id, "s": _r(x.start, base),
             "e": None if x.end is None else _r(x.end, base), "in": x.input, "out": x.output,
             "oc": x.output_chars, "tr": x.truncated, "err": x.is_error, "off": x.offloaded,
             "ref": x.ref, "iref": x.input_ref, "itr": x.input_truncated}
            for x in t.tools
        ]  # fmt: skip
        marks = [_mark(m, base, images) for m in t.marks if m.kind != "sandbox"]
        turns.append({"n": t.turn, "a": t.attempt, "s": _r(t.start, base), "e": _r(t.end, base),
                      "m": calls, "t": tools, "k": marks, "c": t.closing})  # fmt: skip
    row = r.model_dump(mode="json", exclude={"per_attempt"})
    row["start"], row["end"] = _r(r.start, base) if r.start else 0, _r(r.end, base) if r.end else 0
    return {
        "id": r.member,
        **row,
        "task": d.task,
        "dir": d.dir,
        "per_attempt": _attempts(r, base),
        "result": _result(d, run_dir),
        "pre": [_mark(m, base, images) for m in d.preamble if m.kind != "sandbox"],
        "turns_detail": turns,
        "pages": [{"n": p.n, "u": p.url, "t": p.title, "c": p.chars, "ts": _r(p.ts, base),
                   "p": p.path} for p in d.pages],
        "files": [{"p": f.path, "b": f.bytes} for f in d.files],
        "mem": [s.model_dump(mode="json", exclude={"ts", "ref"}) for s in d.memory_saves],
        "wave": wave, "lead": d.dir == LEAD_DIR,
        "system": d.system, "tools": d.tools, "first": d.first, "first_ref": d.first_ref, "first_tr": d.first_cut,
    }  # fmt: skip


REPORT_CLAIMS = 200
"""Claims of the report shown on the landing view (the rest are in report.md)."""


def _report(run_dir: Path) -> dict[str, Any] | None:
    """The run's report (``report.json``) for the landing view: its strings cut to
    :data:`RESULT_TEXT_LIMIT`, at most :data:`REPORT_CLAIMS` claims."""
    try:
        data = json.loads((run_dir / "report.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict):
        return None
    keep = ("summary", "analyst", "offline", "claims", "open_questions", "checks", "waves",
            "lead", "failed", "code")  # fmt: skip
    shown = {k: data[k] for k in keep if k in data}
    total = len(shown.get("claims") or [])
    shown["claims"] = (shown.get("claims") or [])[:REPORT_CLAIMS]
    value, _cuts = clip_result(shown, RESULT_TEXT_LIMIT)
    value["claims_total"] = total
    value["file"] = "report.md" if (run_dir / "report.md").is_file() else ""
    return value


JOB_TEXT_LIMIT = 20_000
"""Characters of the job file as written shown on the page (the rest is in job.toml)."""


def _job_text(run_dir: Path) -> str:
    """The job file as the person wrote it (``job.toml``), cut to :data:`JOB_TEXT_LIMIT`."""
    try:
        text = (run_dir / "job.toml").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""
    return (
        text
        if len(text) <= JOB_TEXT_LIMIT
        else text[:JOB_TEXT_LIMIT] + "\n[cut; whole in job.toml]"
    )


def page_data(
    run: RunTrace,
    *,
    limit: int = 1_200,
    link_base: str = "",
    served: bool = False,
    live: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Everything the page shows, with times relative to the run's start.

    ``link_base`` prefixes run-relative paths in links; ``served`` tells the page that
    ``fleet view`` answers ``full/<ref>`` (cut texts load in full on demand); ``live``
    (served pages only) holds what the page needs to follow the run and answer its asks:
    ``api`` (the prefix of the run's routes), ``stamp``, ``token`` and ``asks``.
    """
    roll = rollup_run(run)
    base = roll.start
    per_content = _content_limit(run, limit)
    images = _Images(run.dir, link_base)
    waves = run.waves()
    members = [
        _member_data(
            member_detail(m, limit=per_content, rollup=row), base, images, run.dir, waves.get(m.id)
        )
        for m, row in zip(run.members, roll.members, strict=True)
    ]
    job = compact_json(run.job)
    return {
        "run": {
            "id": roll.run, "finished": roll.finished, "start": base,
            "duration": roll.duration_s, "end": _r(roll.end, base), "totals": roll.totals, "statuses": roll.statuses,
            "job": job if len(job) < 4_000 else job[:4_000] + "…",
            "dir": str(run.dir), "limit": per_content, "lb": link_base, "served": served,
            "question": run.question(), "report": _report(run.dir),
            "job_text": _job_text(run.dir), "model_cfg": run.job.get("model"),
            "lead": any(m.is_lead for m in run.members), "merge": _merge(run.dir),
            "setups": [
                {"key": su.key, "st": su.status, "s": _r(su.start, base), "e": _r(su.end, base),
                 "d": su.duration_s, "by": su.ran_by, "log": su.log, "m": su.members,
                 "why": su.reason[:RESULT_TEXT_LIMIT]}
                for su in roll.setups
            ],
        },
        "members": members,
        "live": live,
    }  # fmt: skip


def _merge(run_dir: Path) -> dict[str, Any] | None:
    """``[merge]``'s verdict for the page, from ``merge/merge.json`` (None: no merge)."""
    data = read_json(run_dir / "merge" / "merge.json")
    if not isinstance(data, dict):
        return None
    conflicts = [c.get("member") for c in data.get("conflicts") or [] if isinstance(c, dict)]
    return {
        "verdict": str(data.get("verdict", "")),
        "applied": [str(m) for m in data.get("applied") or []],
        "conflicts": [str(m) for m in conflicts],
        "diff": str(data.get("merged_diff") or ""),
    }


def _asset(name: str) -> str:
    return (
        resources.files("coordinator.traceview")
        .joinpath("static", name)
        .read_text(encoding="utf-8")
    )


_UNSAFE_IN_SCRIPT = re.compile("[<>&\u2028\u2029\ud800-\udfff]")
"""Characters of a JSON text that could mean something to the HTML parser inside a
``<script>`` element (``<``, ``>``, ``&``), end a line in older JavaScript (U+2028,
U+2029), or not be encodable as UTF-8 (a lone surrogate from an ``\\ud800`` escape).
All of them only occur inside JSON strings, where ``\\uXXXX`` means the same."""


def embed_json(value: Any) -> str:
    """``value`` as JSON that is inert inside an HTML ``<script>`` element."""
    text = json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    return _UNSAFE_IN_SCRIPT.sub(lambda m: f"\\u{ord(m.group()):04x}", text)


PAGE_SCRIPTS = ("text.js", "tree.js", "landing.js", "live.js", "viewer.js")
INDEX_SCRIPTS = ("text.js", "runs.js")


def _scripts(names: tuple[str, ...] = PAGE_SCRIPTS) -> str:
    return "\n".join(_asset(name) for name in names)


def script_source(names: tuple[str, ...] = PAGE_SCRIPTS) -> str:
    """The CSP source that allows the page's one inline script and nothing else."""
    digest = hashlib.sha256(_scripts(names).encode("utf-8")).digest()
    return "'sha256-" + base64.b64encode(digest).decode("ascii") + "'"


def render_index(rows: list[dict[str, Any]], root: str) -> str:
    """``fleet view``'s list of runs as one HTML string (same template, its own script)."""
    data = embed_json({"runs": rows, "root": root})
    head, tail = _asset("runs.html").split("{{DATA}}", 1)
    head = head.replace("/*{{CSS}}*/", _asset("viewer.css"))
    head = head.replace("{{SCRIPT_SRC}}", script_source(INDEX_SCRIPTS))
    tail = tail.replace("/*{{JS}}*/", _scripts(INDEX_SCRIPTS))
    return head + data + tail


def render_page(
    run: RunTrace,
    *,
    limit: int = 1_200,
    link_base: str = "",
    served: bool = False,
    live: dict[str, Any] | None = None,
) -> str:
    """The page as one HTML string."""
    data = embed_json(page_data(run, limit=limit, link_base=link_base, served=served, live=live))
    head, tail = _asset("viewer.html").split("{{DATA}}", 1)
    head = head.replace("/*{{CSS}}*/", _asset("viewer.css"))
    head = head.replace("{{SCRIPT_SRC}}", script_source())
    # The title last: a run id that holds a placeholder's text stays text.
    head = head.replace("{{TITLE}}", escape(f"Fleet run {run.id}"))
    tail = tail.replace("/*{{JS}}*/", _scripts())
    return head + data + tail


def write_page(run: RunTrace, out: Path, *, limit: int = 1_200) -> int:
    """Write the page to ``out`` (links to big files made relative to it); return its size."""
    out.parent.mkdir(parents=True, exist_ok=True)
    link_base = os.path.relpath(run.dir.resolve(), out.parent.resolve()).replace(os.sep, "/") + "/"
    text = render_page(run, limit=limit, link_base=link_base)
    data = text.encode("utf-8")
    out.write_bytes(data)
    return len(data)
