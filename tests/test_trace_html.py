"""The trace page in real Chromium: loads clean, one lane per member, members open their turns."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import tracegen
from conftest import missing_dependency
from process_support import popen

from coordinator.traceview import load_run, member_detail
from coordinator.traceview.html import write_page
from coordinator.traceview.serve import make_server
from subagents.trace import MemoryFileSave, MemorySave, TraceWriter

CHROMIUM = "/usr/bin/chromium"
FLEET = str(Path(sys.executable).parent / "fleet")
ARTIFACTS = Path(__file__).parent / "artifacts"
pytestmark = pytest.mark.chromium


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    if not Path(CHROMIUM).exists() and shutil.which("chromium") is None:
        missing_dependency(f"Chromium not found at {CHROMIUM}")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(
            executable_path=CHROMIUM,
            args=["--no-sandbox", "--disable-background-networking", "--disable-gpu",
                  "--disable-component-update", "--no-first-run",
                  "--disable-features=WebUIOmniboxPopup,WebUIOmniboxAimPopup"],
        )  # fmt: skip
        yield browser
        browser.close()


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> tracegen.Expected:
    return tracegen.make_run(tmp_path_factory.mktemp("runs"), members=6, turns=14, seed=11)


class Watched:
    """A page plus every console error, page error, failed request and URL it asked for."""

    def __init__(self, browser: Any) -> None:
        self.page = browser.new_page(viewport={"width": 1400, "height": 1000})
        self.problems: list[str] = []
        self.requests: list[str] = []
        self.page.on("console", lambda m: m.type == "error" and self.problems.append(m.text))
        self.page.on("pageerror", lambda e: self.problems.append(f"page error: {e}"))
        self.page.on("requestfailed", lambda r: self.problems.append(f"failed: {r.url}"))
        self.page.on("request", lambda r: self.requests.append(r.url))


def test_page_loads_clean_with_one_lane_per_member(
    browser: Any, run: tracegen.Expected, tmp_path: Path
) -> None:
    out = tmp_path / "page.html"
    size = write_page(load_run(run.run_dir), out)
    assert size == out.stat().st_size
    w = Watched(browser)
    w.page.goto(out.as_uri())
    w.page.wait_for_selector("#timeline-svg")
    assert w.problems == []
    # Self-contained: the page itself, then only inline data (embedded screenshots).
    assert [u for u in w.requests if not u.startswith("data:")] == [out.as_uri()]
    lanes = w.page.locator(".lane")
    assert lanes.count() == len(run.members)
    failed = [mid for mid, e in run.members.items() if e.status == "failed"]
    assert (
        w.page.locator(".lane.failed").evaluate_all("ls => ls.map(l => l.dataset.member)") == failed
    )
    assert w.page.locator(".lane.failed .fail-mark").count() == 1
    assert w.page.locator("#members tbody tr").count() == len(run.members)
    ARTIFACTS.mkdir(exist_ok=True)
    w.page.screenshot(path=str(ARTIFACTS / "trace_overview.png"), full_page=True)
    w.page.close()


def test_clicking_a_member_opens_its_turns(
    browser: Any, run: tracegen.Expected, tmp_path: Path
) -> None:
    out = tmp_path / "page.html"
    write_page(load_run(run.run_dir), out)
    w = Watched(browser)
    w.page.goto(out.as_uri())
    member = sorted(run.members)[0]
    exp = run.members[member]
    w.page.click(f'.lane[data-member="{member}"]')
    view = w.page.locator("#member-view")
    view.wait_for(state="visible")
    assert not w.page.locator("#overview").is_visible()
    turns = view.locator("details.turn")
    assert turns.count() == exp.turns
    # Markers in the context chart match the member's offloads and compactions.
    assert view.locator(".ctx-chart .mk-compaction").count() == exp.compactions
    assert view.locator(".ctx-chart .mk-offload").count() == exp.offloads
    # Open a turn with a compaction: its summary is shown.
    compacted = view.locator("details.turn:has(.b-compaction)").first
    compacted.locator("summary").first.click()
    assert "Session intent" in compacted.locator(".block.compaction pre").inner_text()
    # Open an offloaded tool result: it says where the full text is.
    offloaded = view.locator("details.turn:has(.b-offload)").first
    offloaded.locator("summary").first.click()
    call = offloaded.locator(".tool-call", has_text="offloaded").first
    call.locator("summary").click()
    assert f"members/{member}/offloads/" in call.locator(".cut").inner_text()
    assert "Task.cancel()" in view.locator("#final-result").inner_text()
    # Screenshots are embedded and actually decode.
    shot_turn = view.locator("details.turn:has(.b-screenshot)").first
    if exp.screenshots:
        shot_turn.locator("summary").first.click()
        img = shot_turn.locator("img.shot").first
        img.wait_for()
        assert img.evaluate("i => i.decode().then(() => i.naturalWidth)") == 320
    assert w.problems == []
    ARTIFACTS.mkdir(exist_ok=True)
    w.page.screenshot(path=str(ARTIFACTS / "trace_member.png"), full_page=True)
    # Back to the overview through history.
    w.page.go_back()
    w.page.locator("#overview").wait_for(state="visible")
    w.page.close()


def test_view_serves_the_page_and_run_files_on_loopback(
    browser: Any, run: tracegen.Expected
) -> None:
    server = make_server(run.run_dir, 0)
    host, port = server.server_address[:2]
    assert host == "127.0.0.1"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        w = Watched(browser)
        w.page.goto(f"http://127.0.0.1:{port}/#member=m02")
        w.page.locator("#member-view").wait_for(state="visible")
        assert w.page.locator("details.turn").count() == run.members["m02"].turns
        shot = w.page.request.get(f"http://127.0.0.1:{port}/files/members/m01/trace.jsonl")
        assert shot.ok and b'"member_start"' in shot.body()
        escape = w.page.request.get(f"http://127.0.0.1:{port}/files/../../../etc/passwd")
        assert escape.status == 404
        assert (
            w.page.request.get(f"http://127.0.0.1:{port}/files/%2e%2e/%2e%2e/etc/passwd").status
            == 404
        )
        assert w.problems == []
        w.page.close()
    finally:
        server.shutdown()
        server.server_close()


@contextmanager
def fleet_view(*args: str | Path) -> Iterator[str]:
    """A real ``fleet view ARGS`` process (a run directory, or ``--output-dir DIR`` for
    every run) serving on a free port; its base URL."""
    proc = popen(
        [FLEET, "view", *map(str, args), "--port", "0"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        line = proc.stderr.readline() if proc.stderr else ""
        match = re.search(r"http://127\.0\.0\.1:(\d+)/", line)
        assert match, f"no URL in {line!r}"
        yield match.group(0)
    finally:
        proc.terminate()
        assert proc.wait(timeout=10) in (0, 130, -15)


def test_fleet_view_command_loads_cut_texts_in_full(
    browser: Any, run: tracegen.Expected, tmp_path: Path
) -> None:
    """The real `fleet view` process: loopback only, cut texts load in full on demand."""
    with fleet_view(run.run_dir) as base:
        member = sorted(run.members)[0]
        w = Watched(browser)
        w.page.goto(f"{base}#member={member}")
        view = w.page.locator("#member-view")
        view.wait_for(state="visible")
        assert view.locator("details.turn").count() == run.members[member].turns
        # The first tool result the page shows cut (not offloaded): load it in full.
        detail = member_detail(load_run(run.run_dir).members[0], limit=1_200)
        tool = next(x for t in detail.turns for x in t.tools if x.truncated and not x.offloaded)
        turn = view.locator(f'details.turn[data-turn="{tool_turn(detail, tool)}"]')
        turn.locator("summary").first.click()
        call = turn.locator(".tool-call").nth(tool_index(detail, tool))
        call.locator("summary").click()
        out = call.locator("pre.tool-output")
        assert len(out.inner_text()) == 1_200
        call.locator("button.load-full").click()
        w.page.wait_for_function("el => el.classList.contains('full')", arg=out.element_handle())
        line_no = int(tool.ref.rsplit(":", 1)[1])
        raw = (run.run_dir / tool.ref.rsplit(":", 1)[0]).read_text().splitlines()[line_no - 1]
        assert out.text_content() == json.loads(raw)["output"]
        # An offloaded result loads from its run-directory copy.
        off = next(x for t in detail.turns for x in t.tools if x.offloaded)
        body = w.page.request.get(base + "full/" + off.ref)
        assert body.ok and body.text() == (run.run_dir / off.ref).read_text()
        assert w.page.request.get(base + "full/../../etc/passwd:1").status == 404
        assert w.problems == []
        w.page.close()


def tool_turn(detail: Any, tool: Any) -> int:
    return next(t.turn for t in detail.turns if tool in t.tools)


def tool_index(detail: Any, tool: Any) -> int:
    return next(t.tools.index(tool) for t in detail.turns if tool in t.tools)


@pytest.fixture(scope="module")
def retried(tmp_path_factory: pytest.TempPathFactory) -> tracegen.Expected:
    """m02's first attempt crashes and is retried; boxes take 2.5 s to start (m01's 5 s)."""
    root = tmp_path_factory.mktemp("runs")
    return tracegen.make_run(root, members=4, turns=6, seed=9, failed=2, retried=1, box_s=2.5)


def js_dur(s: float) -> str:
    """The page's duration format (under an hour)."""
    return f"{int(s // 60)}m{int(s % 60):02d}s" if s >= 60 else f"{s:.1f}s"


def test_lanes_show_box_start_up_and_each_attempt(
    browser: Any, retried: tracegen.Expected, tmp_path: Path
) -> None:
    out = tmp_path / "page.html"
    write_page(load_run(retried.run_dir), out)
    w = Watched(browser)
    w.page.goto(out.as_uri())
    w.page.wait_for_selector("#timeline-svg")
    # One box bar per attempt, each ending before that lane's first model call starts.
    assert w.page.locator(".lane .box-bar").count() == 5
    for mid in retried.members:
        lane = w.page.locator(f'.lane[data-member="{mid}"]')
        box_x = float(lane.locator(".box-bar").first.get_attribute("x") or "nan")
        box_w = float(lane.locator(".box-bar").first.get_attribute("width") or "nan")
        first_call = float(lane.locator('rect[fill="var(--model)"]').first.get_attribute("x") or 0)
        assert box_w > 5 and box_x + box_w <= first_call + 0.5
    # The retried attempt is marked on its lane (and is not a failed member).
    assert w.page.locator('.lane[data-member="m02"] .attempt-fail').count() == 1
    assert w.page.locator(".attempt-fail").count() == 1
    assert w.page.locator('.lane[data-member="m02"]').get_attribute("data-status") == "ok"
    # Wall time is the journal's run start to end, not the members' span.
    wall = w.page.locator(".card", has_text="wall time").locator(".v").inner_text()
    assert wall == js_dur(retried.run_end - retried.run_start)
    heads = w.page.locator("#members th").all_inner_texts()
    assert "attempts" in heads and "wall" in heads and "box" in heads
    row = w.page.locator('#members tr[data-member="m02"] td')
    assert row.nth(heads.index("attempts")).inner_text() == "2"
    exp = retried.members["m02"]
    assert row.nth(heads.index("wall")).inner_text() == js_dur(exp.end - exp.start)
    assert w.problems == []
    ARTIFACTS.mkdir(exist_ok=True)
    w.page.screenshot(path=str(ARTIFACTS / "trace_attempts_overview.png"), full_page=True)
    # The member: each attempt with its status and reason, turns grouped per attempt.
    w.page.click('#members tr[data-member="m02"]')
    view = w.page.locator("#member-view")
    view.wait_for(state="visible")
    rows = view.locator("#attempts tr.attempt-row")
    assert rows.count() == 2
    assert "crashed" in rows.nth(0).inner_text() and tracegen.CRASH in rows.nth(0).inner_text()
    assert "ok" in rows.nth(1).inner_text()
    assert view.locator(".attempt-head").count() == 2
    assert view.locator('details.turn[data-attempt="1"]').count() == 2
    assert view.locator("details.turn").count() == exp.turns
    last = exp.attempts[-1]
    card = view.locator(".card", has_text="last attempt").locator(".v").inner_text()
    assert card == js_dur(last[3] - last[2])
    assert w.problems == []
    w.page.close()


def test_nested_result_fields_read_as_a_tree(
    browser: Any, retried: tracegen.Expected, tmp_path: Path
) -> None:
    out = tmp_path / "page.html"
    write_page(load_run(retried.run_dir), out)
    w = Watched(browser)
    w.page.goto(out.as_uri() + "#member=m01")
    result = w.page.locator("#final-result")
    result.wait_for()
    tail = result.locator('li[data-path="verified.output_tail"] pre.tree-text')
    text = tail.inner_text()
    assert text.startswith("test_000 PASSED\ntest_001 PASSED\n")
    assert len(text) == 4_000 and "\\n" not in result.inner_text()
    note = result.locator('li[data-path="verified.output_tail"] .cut').inner_text()
    assert "members/m01/result.json" in note and "result.verified.output_tail" in note
    assert "4000 of 6399 chars shown" in note
    # Short nested scalars are inline, each under its own key; claims are a list of objects.
    checked = result.locator('li[data-path="verified.quotes_checked"] .tv').inner_text()
    assert checked == "1"
    quote = result.locator('li[data-path="claims.0.quote"] .tv').inner_text()
    assert quote == "Request the Task to be cancelled."
    assert w.problems == []
    ARTIFACTS.mkdir(exist_ok=True)
    w.page.screenshot(path=str(ARTIFACTS / "trace_result_tree.png"), full_page=True)
    w.page.close()


def test_a_members_memory_saves_and_conflicts_are_on_its_page(browser: Any, tmp_path: Path) -> None:
    made = tracegen.make_run(tmp_path / "runs", members=2, turns=2, seed=3, failed=None)
    trace = TraceWriter(
        made.run_dir / "members" / "m01" / "trace.jsonl", run="synthetic", member="m01"
    )
    conflict = MemoryFileSave(
        path="notes.md", action="conflict", detail="1 place(s) changed differently",
        merged_with=["m00 (run synthetic)"],
    )  # fmt: skip
    trace.emit(MemorySave(profile="/p/shared", key="k", files=[conflict]))
    trace.close()
    out = tmp_path / "page.html"
    write_page(load_run(made.run_dir), out)
    w = Watched(browser)
    w.page.goto(out.as_uri() + "#member=m01")
    panel = w.page.locator("#memory")
    panel.wait_for()
    text = panel.inner_text()
    assert "saved to /p/shared" in text
    assert "notes.md conflict with m00 (run synthetic): 1 place(s) changed differently" in text
    assert w.problems == []
    w.page.close()


def test_a_cluster_runs_lanes_and_member_pages_name_the_node(browser: Any, tmp_path: Path) -> None:
    made = tracegen.make_run(tmp_path / "runs", members=2, turns=2, seed=5, failed=None)
    journal = made.run_dir / "journal.jsonl"
    records = [json.loads(line) for line in journal.read_text().splitlines()]
    for rec in records:  # m01 ran on a cluster node; m02, as on one machine, names none
        if rec.get("event") == "member_started" and rec.get("member") == "m01":
            rec["node"] = "10.0.0.7-a1b2c3"
    journal.write_text("".join(json.dumps(r) + "\n" for r in records))
    out = tmp_path / "page.html"
    write_page(load_run(made.run_dir), out)
    w = Watched(browser)
    w.page.goto(out.as_uri())
    w.page.wait_for_selector("#timeline-svg")
    titles = w.page.locator(".lane > title").evaluate_all("ts => ts.map(t => t.textContent)")
    assert [t for t in titles if "ran on node" in t] == ["m01 ran on node 10.0.0.7-a1b2c3"]
    w.page.click('.lane[data-member="m01"]')
    w.page.locator("#member-view").wait_for(state="visible")
    assert "node 10.0.0.7-a1b2c3" in w.page.locator(".member-head .meta").inner_text()
    assert w.problems == []
    w.page.close()


def _with_setups(run: tracegen.Expected, tmp_path: Path) -> Path:
    """A copy of ``run`` whose members waited on two setups: one made here by the first
    member for three, one that failed for the fourth (its reason hostile text)."""
    copy = tmp_path / "run"
    shutil.copytree(run.run_dir, copy)
    ids = sorted(run.members)
    for i, mid in enumerate(ids[:4]):
        trace = copy / "members" / mid / "trace.jsonl"
        first = json.loads(trace.read_text().splitlines()[0])
        t0 = first["ts"] - 5
        if i < 3:
            detail = {"ok": True, "key": "a1b2c3d4e5f60718", "reused": i > 0}
        else:
            detail = {"ok": False, "ran": True, "key": "ffee000011112222",
                      "reason": "setup failed (exit 1): <img src=x onerror=alert(1)>"}  # fmt: skip
        lines = [
            {**first, "ts": t0, "type": "sandbox", "action": "setup_start", "box": "", "detail": {},
             "duration_s": 0.0},
            {**first, "ts": t0 + 4, "type": "sandbox", "action": "setup", "box": "", "detail": detail,
             "duration_s": 4.0},
        ]  # fmt: skip
        for line in lines:
            for k in list(line):
                if k not in ("ts", "run", "member", "span", "parent", "turn", "type", "action",
                             "box", "detail", "duration_s"):  # fmt: skip
                    del line[k]
        body = "".join(json.dumps(line) + "\n" for line in lines) + trace.read_text()
        trace.write_text(body)
        if i in (0, 3):
            (trace.parent / "setup.log").write_text("installing tinydep\n")
    return copy


def test_each_setup_has_a_lane_of_its_own_that_opens_its_log(
    browser: Any, run: tracegen.Expected, tmp_path: Path
) -> None:
    copy = _with_setups(run, tmp_path)
    out = tmp_path / "page.html"
    write_page(load_run(copy), out)  # links relative to the page
    w = Watched(browser)
    w.page.goto(out.as_uri())
    w.page.wait_for_selector("#timeline-svg")
    assert w.problems == []
    lanes = w.page.locator(".setup-lane")
    assert lanes.evaluate_all("ls => ls.map(l => [l.dataset.key, l.dataset.status])") == [
        ["a1b2c3d4e5f60718", "made"],
        ["ffee000011112222", "failed"],
    ]
    ids = sorted(run.members)
    made = lanes.nth(0).locator("title").text_content() or ""
    assert f"for {ids[0]}" in made and ", ".join(ids[:3]) in made
    failed = lanes.nth(1).locator("title").text_content() or ""
    assert "<img src=x onerror=alert(1)>" in failed  # shown as text, never markup
    assert w.page.locator("#timeline img").count() == 0
    # Members keep their own lanes, their setup wait a bar on each.
    assert w.page.locator(".lane").count() == len(run.members)
    assert w.page.locator(".lane .setup-bar").count() == 4
    ARTIFACTS.mkdir(exist_ok=True)
    w.page.locator("#timeline").screenshot(path=str(ARTIFACTS / "trace_setups.png"))
    with w.page.expect_popup() as popup:
        lanes.nth(0).click()
    assert popup.value.url == (copy / "members" / ids[0] / "setup.log").as_uri()
    w.page.close()


def test_fleet_trace_lists_each_setup_with_its_log(run: tracegen.Expected, tmp_path: Path) -> None:
    copy = _with_setups(run, tmp_path)
    shown = subprocess.run([FLEET, "trace", str(copy)], capture_output=True, text=True, timeout=60)
    assert shown.returncode == 0, shown.stderr
    ids = sorted(run.members)
    text = shown.stdout
    assert "repository setups (one per key; members waited on them):" in text
    assert (
        f"a1b2c3d4e5f60718  ran in 4.0s (by {ids[0]})  for {', '.join(ids[:3])}  "
        f"log members/{ids[0]}/setup.log" in text
    )
    assert "ffee000011112222  FAILED after 4.0s: setup failed (exit 1): " in text
    assert f"for {ids[3]}  log members/{ids[3]}/setup.log" in text
