"""The trace page against hostile strings, in real Chromium: written (``fleet trace
--html``) and served (``fleet view``), a run whose every model-, page- and job-written
field holds markup, script, ``<!--<script>``, line and paragraph separators, NUL,
right-to-left overrides, ``javascript:`` URLs and very long text still shows every
member, runs none of it, and shows each string verbatim as text."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import test_trace_html
import tracegen
from test_trace_html import Watched

from coordinator.traceview import load_run
from coordinator.traceview.html import write_page
from coordinator.traceview.rollup import compact_json
from coordinator.traceview.serve import make_server
from subagents.trace import (
    Compaction,
    ErrorEvent,
    MemberEnd,
    MemberStart,
    MemoryFileSave,
    MemorySave,
    MemoryWrite,
    Messages,
    ModelCall,
    Offload,
    Prompt,
    Retry,
    SandboxEvent,
    Screenshot,
    Todos,
    ToolCall,
    ToolResult,
    TraceWriter,
)

pytestmark = pytest.mark.chromium
browser = test_trace_html.browser  # the same Chromium fixture

HOSTILE = (
    "<!--<script> </script><script>window.__pwned='script'</script> "
    "<img src=x onerror=\"window.__pwned='img'\"> <svg onload=\"window.__pwned='svg'\"> "
    "]]> \u2028 \u2029 \x00 & &amp; \u202eevil.exe\u202c {{DATA}} /*{{JS}}*/ {{TITLE}}"
)
JS_URL = "javascript:window.__pwned='link'"
MEMBER_IDS = [
    "<img src=x onerror=\"window.__pwned='id'\">",
    "<!--<script>",
    "\u202eright-to-left \u2028",
    JS_URL,
]
LONG = "A" * 200_000 + HOSTILE
"""A tool result far over the page's cut, the hostile text at its very end."""
RUN_ID = "run-<!--<script>-&amp;"
REASON = HOSTILE * 40
"""Why each hostile member failed: long, and unbroken by the page's cuts."""


def _member(run_dir: Path, mid: str, ts: float) -> None:
    """A member whose every field a model, a page or a box writes is hostile."""
    mdir = run_dir / "members" / mid
    w = TraceWriter(mdir / "trace.jsonl", run=RUN_ID, member=mid)
    use = {"type": "tool_use", "id": "c1", "name": HOSTILE, "input": {"url": JS_URL}}
    shot = f"screenshots/shot{MEMBER_IDS[0]}.png"
    (mdir / "screenshots").mkdir(parents=True)
    (mdir / shot).write_bytes(tracegen.tiny_png(40, 30, 1))
    saved = MemoryFileSave(path=HOSTILE, action="conflict", detail=HOSTILE, merged_with=[HOSTILE])
    for ev in [
        SandboxEvent(ts=ts, action="create", box=HOSTILE, duration_s=0.2),
        MemberStart(ts=ts + 0.2, kind="browser", task=HOSTILE, model=HOSTILE),
        Prompt(ts=ts + 0.2, system=HOSTILE, tools=[{"name": HOSTILE}]),
        Messages(ts=ts + 0.2, messages=[{"role": "user", "content": HOSTILE}]),
        ModelCall(ts=ts + 1, turn=1, model=HOSTILE, stop_reason=HOSTILE, latency_s=0.5,
                  content=[{"type": "text", "text": HOSTILE}, use]),
        ToolCall(ts=ts + 1, turn=1, call_id="c1", tool=HOSTILE, input={"url": JS_URL, "n": HOSTILE}),
        ToolResult(ts=ts + 1.2, turn=1, call_id="c1", tool=HOSTILE, output=HOSTILE, is_error=True),
        ToolCall(ts=ts + 1.2, turn=1, call_id="c2", tool="read", input={}),
        ToolResult(ts=ts + 1.4, turn=1, call_id="c2", tool="read", output=LONG),
        Screenshot(ts=ts + 1.5, turn=1, path=shot, url=JS_URL),
        Compaction(ts=ts + 1.6, turn=1, tokens_before=9_000, tokens_after=900, summary=HOSTILE,
                   transcript_path=JS_URL),
        Offload(ts=ts + 1.6, turn=1, path=JS_URL, tokens=10),
        Retry(ts=ts + 1.7, turn=1, what=HOSTILE, attempt=1, reason=HOSTILE),
        ErrorEvent(ts=ts + 1.7, turn=1, error=HOSTILE, message=HOSTILE),
        MemoryWrite(ts=ts + 1.8, turn=1, command=HOSTILE, path=JS_URL),
        Todos(ts=ts + 1.8, turn=1, todos=[{"content": HOSTILE, "status": "pending"}]),
        MemorySave(ts=ts + 1.9, profile=HOSTILE, key="k", files=[saved], error=HOSTILE),
        MemberEnd(ts=ts + 2, status="failed", reason=HOSTILE),
    ]:  # fmt: skip
        w.emit(ev)
    w.close()
    # A result a model wrote: json.dumps keeps its lone surrogate as a "\ud800" escape.
    result = {"summary": HOSTILE, "lone": "a\ud800b", JS_URL: HOSTILE,
              "claims": [{"text": HOSTILE, "quote": HOSTILE, "source_url": JS_URL}]}  # fmt: skip
    outcome = {"member": mid, "status": "failed", "reason": REASON, "result": result}
    (mdir / "result.json").write_text(json.dumps(outcome), encoding="utf-8")
    page = {"n": 1, "url": JS_URL, "title": HOSTILE, "chars": 9, "ts": ts + 1.3, "path": "p1.txt"}
    (mdir / "pages").mkdir()
    (mdir / "pages" / "index.jsonl").write_text(json.dumps(page) + "\n", encoding="utf-8")
    (mdir / "pages" / "p1.txt").write_text(HOSTILE, encoding="utf-8")
    # A file a box could leave behind, named to be served as a web page.
    (mdir / "notes.html").write_text("<script>window.__pwned='file'</script>", encoding="utf-8")


@pytest.fixture(scope="module")
def hostile(tmp_path_factory: pytest.TempPathFactory) -> Path:
    made = tracegen.make_run(
        tmp_path_factory.mktemp("runs"), members=2, turns=2, seed=4, failed=None, run_id=RUN_ID
    )
    run_dir = made.run_dir
    (run_dir / "job.json").write_text(
        json.dumps({"name": HOSTILE, "lead": {"question": HOSTILE}}), encoding="utf-8"
    )
    with (run_dir / "journal.jsonl").open("a", encoding="utf-8") as fh:
        for i, mid in enumerate(MEMBER_IDS):
            ts = tracegen.BASE_TS + 2 + i
            _member(run_dir, mid, ts)
            for rec in ({"ts": ts, "event": "member_started", "member": mid, "attempt": 1,
                         "node": HOSTILE},
                        {"ts": ts + 2, "event": "member_finished", "member": mid,
                         "status": "failed", "reason": REASON, "attempts": 1}):  # fmt: skip
                fh.write(json.dumps(rec) + "\n")
    check = {"verdict": HOSTILE, "member": MEMBER_IDS[1], "wave": 1, "command": HOSTILE,
             "exit_code": 1, "detail": HOSTILE, "claim_member": MEMBER_IDS[0], "claim": 0}  # fmt: skip
    report = {
        "summary": HOSTILE, "analyst": HOSTILE, "lead": HOSTILE, "open_questions": [HOSTILE],
        "claims": [{"text": HOSTILE, "citations": [{"member": MEMBER_IDS[0], "claim": 0,
                                                    "url": JS_URL, "wave": 1}]}],
        "checks": [check], "failed": [{"member": MEMBER_IDS[2], "status": HOSTILE, "reason": HOSTILE}],
    }  # fmt: skip
    (run_dir / "report.json").write_text(json.dumps(report), encoding="utf-8")
    return run_dir


def _watch(browser: Any) -> Watched:
    w = Watched(browser)
    w.page.on("dialog", lambda d: (w.problems.append(f"dialog: {d.message}"), d.dismiss()))
    return w


def _texts(w: Watched, selector: str) -> list[str]:
    return w.page.locator(selector).evaluate_all("els => els.map(e => e.textContent)")


def _no_attack(w: Watched) -> None:
    """Nothing of the attacker ran, and no link leads anywhere but to a run file."""
    assert w.page.evaluate("() => window.__pwned") is None
    assert w.problems == []
    hrefs = w.page.evaluate("() => [...document.querySelectorAll('a[href]')].map(a => a.href)")
    assert hrefs and all(h.split(":", 1)[0] in ("http", "file") for h in hrefs), hrefs
    srcs = w.page.evaluate("() => [...document.querySelectorAll('img')].map(i => i.src)")
    assert all(s.startswith(("data:image/png;base64,", "http:", "file:")) for s in srcs), srcs


# In the text node holding "evil.exe": does its first letter lie left of its last one?
READS_LEFT_TO_RIGHT = """root => {
  const walk = document.createTreeWalker(root, NodeFilter.SHOW_TEXT);
  for (let n = walk.nextNode(); n; n = walk.nextNode()) {
    const at = n.data.indexOf("evil.exe");
    if (at < 0) continue;
    const x = (i) => { const r = document.createRange(); r.setStart(n, i); r.setEnd(n, i + 1);
                       return r.getBoundingClientRect().left; };
    return x(at) < x(at + 7);
  }
  return null;
}"""


def _check_overview(w: Watched) -> None:
    w.page.wait_for_selector("#timeline-svg")
    every = sorted(["m01", "m02", *MEMBER_IDS])
    lanes = w.page.locator(".lane").evaluate_all("ls => ls.map(l => l.dataset.member)")
    assert sorted(lanes) == every
    rows = w.page.locator("#members tbody tr").evaluate_all("rs => rs.map(r => r.dataset.member)")
    assert sorted(rows) == every
    assert w.page.title() == f"Fleet run {RUN_ID}"
    assert RUN_ID in w.page.locator("#run-title").text_content()
    assert _texts(w, ".question .q") == [HOSTILE]
    assert _texts(w, "#report .summary") == [HOSTILE]
    assert _texts(w, ".claim-text") == [HOSTILE]
    assert _texts(w, ".open-questions li") == [HOSTILE]
    assert HOSTILE in "".join(_texts(w, "#report .check"))
    assert w.page.locator("#report .cite").first.get_attribute("title") == JS_URL
    assert sorted(_texts(w, "#members td.reason")) == ["", ""] + [REASON] * 4
    assert w.page.locator("#report .summary").evaluate(READS_LEFT_TO_RIGHT) is True
    # The run-wide search shows snippets of the hostile texts as text.
    w.page.fill("#run-search", "onerror")
    w.page.wait_for_selector("#hit-count")
    assert "onerror=\"window.__pwned='img'\"" in "".join(_texts(w, "button.hit"))
    _no_attack(w)


def _check_member(w: Watched, mid: str) -> None:
    w.page.evaluate(
        "id => [...document.querySelectorAll('#members tbody tr')].find(r => r.dataset.member === id).click()",
        mid,
    )
    view = w.page.locator("#member-view")
    view.wait_for(state="visible")
    assert _texts(w, ".member-head h2") == [mid]
    view.locator("button", has_text="expand all").click()
    w.page.wait_for_selector("details.turn .turn-body")
    w.page.evaluate(
        "() => document.querySelectorAll('#member-view details').forEach(d => d.open = true)"
    )
    assert _texts(w, "#member-view .task") == [HOSTILE]
    assert view.locator(".task").evaluate(READS_LEFT_TO_RIGHT) is True
    assert _texts(w, "#member-view > .reason-box") == [REASON]
    assert _texts(w, "pre.system-prompt") == [HOSTILE]
    assert _texts(w, "pre.first-message") == [HOSTILE]
    assert _texts(w, ".block.model pre") == [HOSTILE]
    assert _texts(w, "pre.tool-input")[0] == compact_json({"url": JS_URL, "n": HOSTILE})
    outputs = _texts(w, "pre.tool-output")
    assert outputs[0] == HOSTILE and LONG.startswith(outputs[1]) and len(outputs[1]) < len(LONG)
    assert _texts(w, ".block.compaction pre") == [HOSTILE]
    marks = "".join(_texts(w, ".turn-body .block"))
    for text in (f"{HOSTILE}: {HOSTILE}", f"{HOSTILE} attempt 1: {HOSTILE}", JS_URL, HOSTILE):
        assert text in marks
    assert HOSTILE in _texts(w, ".tools-sum")[0]
    memory = _texts(w, "#memory")[0]
    assert f"NOT saved to {HOSTILE}: {HOSTILE}" in memory
    assert f"{HOSTILE} conflict with {HOSTILE}: {HOSTILE}" in memory
    assert _texts(w, "#pages .page-row td:nth-child(3) div") == [HOSTILE, JS_URL]
    result = _texts(w, "#final-result")[0]
    assert HOSTILE in result and JS_URL in result
    assert w.page.evaluate(
        "() => document.querySelector('#final-result').textContent.includes('a\\ud800b')"
    )
    _no_attack(w)


def test_hostile_strings_in_a_written_page_stay_text(
    browser: Any, hostile: Path, tmp_path: Path
) -> None:
    out = tmp_path / "page.html"
    write_page(load_run(hostile), out)
    w = _watch(browser)
    w.page.goto(out.as_uri())
    _check_overview(w)
    for mid in MEMBER_IDS:
        _check_member(w, mid)
    test_trace_html.ARTIFACTS.mkdir(exist_ok=True)
    w.page.screenshot(path=str(test_trace_html.ARTIFACTS / "trace_hostile_member.png"))
    w.page.close()


@pytest.fixture(scope="module")
def served(hostile: Path) -> Iterator[str]:
    server = make_server(hostile, 0)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()


def test_hostile_strings_in_the_served_page_stay_text(browser: Any, served: str) -> None:
    w = _watch(browser)
    w.page.goto(served)
    _check_overview(w)
    for mid in MEMBER_IDS:
        _check_member(w, mid)
    # The long result, loaded in full from the server, is text to its hostile end.
    long_out = w.page.locator("pre.tool-output").nth(1)
    long_out.locator("xpath=..").locator("button.load-full").last.click()
    w.page.wait_for_function("el => el.classList.contains('full')", arg=long_out.element_handle())
    assert long_out.text_content() == LONG
    _no_attack(w)
    w.page.close()


def test_a_run_file_a_box_wrote_never_runs_as_the_page(browser: Any, served: str) -> None:
    """An ``.html`` (or ``.svg``) file in the run directory is shown as text, sandboxed."""
    w = _watch(browser)
    target = f"{served}files/members/{MEMBER_IDS[1]}/notes.html".replace("<", "%3C").replace(
        ">", "%3E"
    )
    answer = w.page.goto(target)
    assert answer is not None and answer.status == 200
    assert answer.headers["content-type"].startswith("text/plain")
    assert "sandbox" in answer.headers["content-security-policy"]
    assert w.page.evaluate("() => window.__pwned") is None
    assert "<script>window.__pwned='file'</script>" in w.page.locator("body").inner_text()
    w.page.close()


INJECT = """() => {
  const s = document.createElement("script");
  s.textContent = "window.__pwned = 'inline'";
  document.body.append(s);
  return window.__pwned === undefined;
}"""
"""Markup that got into the page anyway: an inline script other than the page's own."""


def test_only_the_pages_own_script_runs(browser: Any, tmp_path: Path) -> None:
    made = tracegen.make_run(tmp_path / "runs", members=2, turns=2, failed=None)
    out = tmp_path / "page.html"
    write_page(load_run(made.run_dir), out)
    server = make_server(made.run_dir, 0)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        for url in (out.as_uri(), f"http://127.0.0.1:{server.server_address[1]}/"):
            w = _watch(browser)
            w.page.goto(url)
            w.page.wait_for_selector("#timeline-svg")  # the page's own script ran
            assert w.page.evaluate(INJECT) is True, url
            assert any("Content Security Policy" in p for p in w.problems), w.problems
            w.page.close()
    finally:
        server.shutdown()
        server.server_close()
