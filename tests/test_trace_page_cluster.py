"""The trace page of a cluster run, in real Chromium: members in natural order
(research-2 before research-10), a node column and one group of lanes per node, an
incomplete member's partial result shown as such, and links to a member's turn."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import tracegen
from test_trace_html import Watched, browser, fleet_view  # noqa: F401 (a fixture)

from coordinator.traceview import load_run
from coordinator.traceview.html import write_page
from subagents.trace import MemberEnd, MemberStart, ModelCall, ToolCall, ToolResult, TraceWriter

pytestmark = pytest.mark.chromium
IDS = {"research-10": "node-b", "research-2": "node-a", "research-3": "node-b"}
PARTIAL = "<b>half</b> of the answer: cancellation is cooperative"


def _member(run_dir: Path, mid: str, ts: float, status: str) -> dict[str, Any]:
    w = TraceWriter(run_dir / "members" / mid / "trace.jsonl", run="cluster", member=mid)
    w.emit(MemberStart(ts=ts, kind="research", task=f"task of {mid}", model="offline"))
    for turn in (1, 2):
        t = ts + turn
        w.emit(ModelCall(ts=t, turn=turn, model="offline", stop_reason="tool_use", latency_s=0.2,
                         content=[{"type": "text", "text": f"{mid} turn {turn}"}]))  # fmt: skip
        w.emit(ToolCall(ts=t, turn=turn, call_id=f"c{turn}", tool="read", input={"n": turn}))
        w.emit(ToolResult(ts=t + 0.1, turn=turn, call_id=f"c{turn}", tool="read", output="x"))
    w.emit(MemberEnd(ts=ts + 3, status=status, reason="" if status == "ok" else "max_turns"))
    w.close()
    outcome: dict[str, Any] = {"member": mid, "status": status}
    if status == "ok":
        outcome["result"] = {"summary": f"{mid} done"}
    else:
        outcome |= {"reason": "max_turns", "partial_result": {"summary": PARTIAL}}
    (run_dir / "members" / mid / "result.json").write_text(json.dumps(outcome))
    return outcome


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Path:
    made = tracegen.make_run(
        tmp_path_factory.mktemp("runs"), members=1, failed=None, run_id="cluster"
    )
    with (made.run_dir / "journal.jsonl").open("a", encoding="utf-8") as fh:
        for i, (mid, node) in enumerate(IDS.items()):
            ts = tracegen.BASE_TS + i
            status = "incomplete" if mid == "research-3" else "ok"
            _member(made.run_dir, mid, ts, status)
            for rec in ({"ts": ts, "event": "member_started", "member": mid, "attempt": 1, "node": node},
                        {"ts": ts + 3, "event": "member_finished", "member": mid, "status": status,
                         "reason": "", "attempts": 1}):  # fmt: skip
                fh.write(json.dumps(rec) + "\n")
    return made.run_dir


def test_members_in_natural_order_with_nodes_partial_results_and_turn_links(
    browser: Any,  # noqa: F811
    cluster: Path,
    tmp_path: Path,
) -> None:
    out = tmp_path / "page.html"
    write_page(load_run(cluster), out)
    w = Watched(browser)
    w.page.goto(out.as_uri())
    w.page.wait_for_selector("#timeline-svg")
    rows = w.page.locator("#members tbody tr")
    assert [rows.nth(i).get_attribute("data-member") for i in range(4)] == [
        "m01", "research-2", "research-3", "research-10"]  # fmt: skip
    heads = [h.strip() for h in w.page.locator("#members th").all_inner_texts()]
    node_col = heads.index("node")
    cells = [rows.nth(i).locator("td").nth(node_col).inner_text() for i in range(4)]
    assert cells == ["", "node-a", "node-b", "node-b"]
    groups = w.page.locator("#timeline-svg .wave-head").all_text_contents()
    assert groups == ["no node recorded", "node node-a", "node node-b"]
    lanes = w.page.locator("#timeline-svg .lane")
    assert [lanes.nth(i).get_attribute("data-member") for i in range(4)] == [
        "m01", "research-2", "research-3", "research-10"]  # fmt: skip

    w.page.goto(out.as_uri() + "#member=research-3")
    panel = w.page.locator("#partial-result")
    panel.wait_for()
    assert PARTIAL in panel.inner_text() and "incomplete" in panel.inner_text()
    assert panel.locator("b").count() == 0
    # A turn opened is named in the address; the address opens it again.
    w.page.locator('details.turn[data-turn="2"] summary').click()
    # The page names it on the element's "toggle" event, which the browser fires in a
    # task of its own after the click: waited for (polled: the page's CSP refuses the
    # string predicate wait_for_function evaluates), not read at once.
    named = "#member=research-3&turn=2&attempt=1"
    for _ in range(100):
        if w.page.evaluate("location.hash") == named:
            break
        w.page.wait_for_timeout(50)
    assert w.page.evaluate("location.hash") == named
    fresh = Watched(browser)
    fresh.page.goto(out.as_uri() + "#member=research-10&turn=2")
    opened = fresh.page.locator('#member-view details.turn[data-turn="2"]')
    opened.wait_for()
    assert opened.get_attribute("open") is not None
    assert "research-10 turn 2" in opened.inner_text()
    assert fresh.page.locator('#member-view details.turn[data-turn="1"][open]').count() == 0
    assert w.problems == [] and fresh.problems == []


def test_the_info_panel_shows_the_job_as_written_its_model_and_usage_per_model(
    browser: Any,  # noqa: F811
    cluster: Path,
    tmp_path: Path,
) -> None:
    cluster = Path(shutil.copytree(cluster, tmp_path / "cluster"))  # the fixture stays as made
    written = (
        'name = "c"\n# <img src=x onerror=window.__pwned=1> \u202e\n[model]\nname = "offline"\n'
    )
    (cluster / "job.toml").write_text(written)
    job = json.loads((cluster / "job.json").read_text())
    (cluster / "job.json").write_text(
        json.dumps(job | {"model": {"name": "m", "temperature": 0.3}})
    )
    run = load_run(cluster)
    out = tmp_path / "page.html"
    write_page(run, out)
    w = Watched(browser)
    w.page.goto(out.as_uri())
    w.page.locator("#info-panel summary").click()
    assert w.page.locator("#info-panel .job-text").text_content() == written
    assert w.page.locator("#info-panel img").count() == 0
    assert "temperature" in w.page.locator("#info-panel").inner_text()
    from coordinator.traceview import rollup_run

    members = rollup_run(run).members
    for model in {m.model for m in members}:
        row = w.page.locator(f'#info-panel tr.model-row[data-model="{model}"]')
        cells = row.locator("td").all_inner_texts()
        mine = [m for m in members if m.model == model]
        assert cells[1] == str(len(mine))
        assert cells[5].rstrip("*") == f"${sum(m.cost_usd for m in mine):.3f}"
    assert w.page.evaluate("window.__pwned") is None
    assert w.problems == []


def test_a_check_shows_what_ran_and_its_whole_output_beside_the_claim(
    browser: Any,  # noqa: F811
    cluster: Path,
    tmp_path: Path,
) -> None:
    cluster = Path(shutil.copytree(cluster, tmp_path / "cluster"))
    session = ">>> import asyncio\n>>> asyncio.run(main())\n<script>window.__pwned=1</script>\nCancelledError"
    output = f"{session}\nline 2 of the output\n\u202eevil"
    result = json.loads((cluster / "members" / "research-2" / "result.json").read_text())
    result["result"]["verified"] = {"command": "python3 check.py", "exit_code": 0,
                                    "passed": True, "output_tail": output}  # fmt: skip
    (cluster / "members" / "research-2" / "result.json").write_text(json.dumps(result))
    check = {"member": "research-2", "wave": 1, "claim_member": "research-10", "claim": 0,
             "command": "python3 check.py", "exit_code": 0, "verdict": "verified",
             "detail": "exit 0"}  # fmt: skip
    claim = {"text": "cancellation is cooperative",
             "citations": [{"member": "research-10", "claim": 0}]}  # fmt: skip
    (cluster / "report.json").write_text(json.dumps(
        {"summary": "s", "analyst": "offline", "claims": [claim], "checks": [check]}))  # fmt: skip
    out = tmp_path / "page.html"
    write_page(load_run(cluster), out)
    w = Watched(browser)
    w.page.goto(out.as_uri())
    beside = w.page.locator(".findings li .check-session")
    assert beside.count() == 1
    beside.locator("summary").click()
    shown = beside.locator("pre.session").text_content()
    assert shown == "$ python3 check.py\n" + output
    assert w.page.locator("#report script, #report img").count() == 0
    assert w.page.evaluate("window.__pwned") is None
    assert w.problems == []
