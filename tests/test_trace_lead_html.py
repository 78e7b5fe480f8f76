"""The trace page of a lead run in real Chromium: the question and the report on the
landing view, the lead as a lane of its own with its decisions, members grouped by
wave, a run-wide search and a status filter, each member's system prompt and first
message, rows reachable by keyboard, and a layout that reads at 390 px.

The run is a real one: ``fleet run`` of a lead job whose lead and members talk to the
fake Messages API (members in real boxes).
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import test_trace_html
from fleet_policies import coding_policy, tool_results, with_lead
from test_trace_html import Watched

from coordinator.rundir.runs import RunDir
from coordinator.traceview import load_run
from coordinator.traceview.html import write_page
from subagents.fake_api import FakeMessagesAPI, tool_use

pytestmark = [pytest.mark.chromium, pytest.mark.docker]
QUESTION = "What do A and B do?"
FLEET = str(Path(sys.executable).with_name("fleet"))
browser = test_trace_html.browser  # the same Chromium fixture


def _lead(body: dict[str, Any]) -> Any:
    seen = "\n".join(t for t, _ in tool_results(body))
    if "Wave 1 started" not in seen:
        first = [
            {"kind": "coding", "task": "Task A"},
            {"kind": "coding", "task": "Task B [bad-request]"},
        ]
        return tool_use("spawn", {"members": first})
    if "member w1-1" not in seen or "member w1-2" not in seen:
        return tool_use("wait", {"until": "all"})
    if "may not be spawned" not in seen:  # one refused spawn: a decision on the lane too
        return tool_use("spawn", {"members": [{"kind": "browser", "task": "Read the docs"}]})
    if "Wave 2 started" not in seen:
        check = {
            "kind": "coding",
            "task": "Task B, asked plainly: run the example",
            "files": {"example.txt": ">>> 1 + 1\n2\n"},
            "check": "python3 -m doctest example.txt",
            "checks_claim": {"member": "w1-1", "claim": 0},
        }
        return tool_use("spawn", {"members": [check]})
    if "member w2-1" not in seen:
        return tool_use("wait", {"until": "all"})
    claims = [{"text": "A is done", "cites": [{"member": "w1-1"}]}]
    return tool_use(
        "finish", {"summary": "A is done; B needed asking twice.", "claims": claims,
                   "open_questions": ["Is C needed?"]},
    )  # fmt: skip


@pytest.fixture(scope="module")
def lead_run(tmp_path_factory: pytest.TempPathFactory, images: Any) -> Iterator[RunDir]:
    root = tmp_path_factory.mktemp("lead-runs")
    api = FakeMessagesAPI(with_lead(_lead, coding_policy(turns=2))).start()
    env = {**os.environ, "ANTHROPIC_API_KEY": "test-key", "ANTHROPIC_BASE_URL": api.url}
    job = root / "job.toml"
    job.write_text(
        f'name = "page"\noutput_dir = "{root / "runs"}"\n[model]\nname = "claude-sonnet-5"\n'
        f'[lead]\nquestion = "{QUESTION}"\nkinds = ["coding"]\nmembers = 2\n'
    )
    try:
        # Its own process: Playwright's sync API holds this thread's event loop.
        done = subprocess.run(
            [FLEET, "run", str(job), "--plain"],
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert done.returncode == 0, done.stderr
        (run,) = RunDir.list(root / "runs")
        yield run
    finally:
        api.stop()


def _page(browser: Any, run: RunDir, tmp_path: Path, width: int = 1400) -> Watched:
    out = tmp_path / "page.html"
    write_page(load_run(run.path), out)
    w = Watched(browser)
    w.page.set_viewport_size({"width": width, "height": 900})
    w.page.goto(out.as_uri())
    w.page.wait_for_selector("#timeline-svg")
    return w


def test_the_landing_view_shows_the_question_and_the_report(
    browser: Any, lead_run: RunDir, tmp_path: Path
) -> None:
    w = _page(browser, lead_run, tmp_path)
    landing = w.page.locator("#landing")
    assert landing.locator(".question .q").inner_text() == QUESTION
    report = landing.locator("#report")
    assert "A is done; B needed asking twice." in report.locator(".summary").inner_text()
    assert "Written by the lead: claude-sonnet-5" in report.inner_text()
    finding = report.locator("ol.findings li").first
    assert finding.locator(".claim-text").inner_text() == "A is done"
    assert finding.locator("button.cite").inner_text() == "w1-1 · wave 1"
    check = report.locator(".checks .check")
    assert check.get_attribute("data-verdict") == "verified"
    assert "`python3 -m doctest example.txt` exit 0" in check.inner_text()
    assert report.locator(".open-questions li").all_inner_texts() == ["Is C needed?"]
    assert "w1-2" in report.inner_text() and "prompt is too long" in report.inner_text()
    # A citation opens the member it names.
    finding.locator("button.cite").click()
    w.page.locator("#member-view").wait_for(state="visible")
    assert w.page.locator("#member-view").get_attribute("data-member") == "w1-1"
    assert w.problems == []
    w.page.close()


def test_the_lead_is_a_lane_with_its_decisions_and_members_are_grouped_by_wave(
    browser: Any, lead_run: RunDir, tmp_path: Path
) -> None:
    w = _page(browser, lead_run, tmp_path)
    lanes = w.page.locator(".lane").evaluate_all(
        "ls => ls.map(l => [l.dataset.member, l.dataset.wave])"
    )
    assert lanes == [["lead", ""], ["w1-1", "1"], ["w1-2", "1"], ["w2-1", "2"]]
    heads = w.page.locator("#timeline-svg .wave-head").evaluate_all(
        "ts => ts.map(t => t.textContent)"
    )
    assert heads == ["wave 1", "wave 2"]
    lead = w.page.locator('.lane.lead[data-member="lead"]')
    tools = lead.locator(".decision").evaluate_all("ds => ds.map(d => d.dataset.tool)")
    assert tools == ["spawn", "wait", "spawn", "spawn", "wait", "finish"]
    assert lead.locator(".decision.refused").count() == 1
    tip = lead.locator(".decision.d-spawn title").first.text_content()
    assert "Wave 1 started: w1-1 (coding), w1-2 (coding)" in (tip or "")
    assert w.page.locator("#members tbody tr").evaluate_all(
        "rs => rs.map(r => r.dataset.member)"
    ) == ["lead", "w1-1", "w1-2", "w2-1"]
    assert w.problems == []
    w.page.close()


def test_a_run_wide_search_finds_turns_and_results_and_a_status_filter_narrows_it(
    browser: Any, lead_run: RunDir, tmp_path: Path
) -> None:
    w = _page(browser, lead_run, tmp_path)
    w.page.fill("#run-search", "python3 -m doctest")
    w.page.wait_for_selector("button.hit")
    found = w.page.locator("button.hit").evaluate_all(
        "hs => hs.map(h => [h.dataset.member, h.dataset.where])"
    )
    assert ["w2-1", "result"] in found and any(m == "lead" for m, _ in found)
    # A hit in a turn opens that member at that turn.
    hit = w.page.locator('button.hit[data-member="lead"][data-where^="turn"]').first
    turn = (hit.get_attribute("data-where") or "").split()[-1]
    hit.click()
    view = w.page.locator("#member-view")
    view.wait_for(state="visible")
    opened = view.locator(f'details.turn.found[data-turn="{turn}"]')
    assert opened.get_attribute("open") is not None
    assert "python3 -m doctest" in opened.inner_text()
    w.page.go_back()
    w.page.locator("#overview").wait_for(state="visible")
    # The status filter narrows the table, the lanes and the search alike.
    w.page.select_option("#status-filter", "failed")
    rows = w.page.locator("#members tbody tr").evaluate_all("rs => rs.map(r => r.dataset.member)")
    assert rows == ["w1-2"]
    assert w.page.locator(".lane").evaluate_all("ls => ls.map(l => l.dataset.member)") == ["w1-2"]
    w.page.fill("#run-search", "prompt is too long")
    w.page.locator("#hit-count", has_text="in 1 member").wait_for()
    assert set(
        w.page.locator("button.hit").evaluate_all("hs => hs.map(h => h.dataset.member)")
    ) == {"w1-2"}
    assert w.problems == []
    w.page.close()


def test_every_member_shows_its_system_prompt_and_first_message(
    browser: Any, lead_run: RunDir, tmp_path: Path
) -> None:
    w = _page(browser, lead_run, tmp_path)
    for member, system, first in (
        ("lead", "You lead a research team", f"delegating research to members: {QUESTION}"),
        ("w1-1", "careful software engineer", "Task A"),
        ("w2-1", "careful software engineer", "The job's check command - "),
    ):
        w.page.evaluate(f"location.hash = 'member={member}'")
        panel = w.page.locator("#prompt")
        panel.wait_for()
        panel.locator("summary").click()
        assert system in panel.locator("pre.system-prompt").inner_text()
        assert first in panel.locator("pre.first-message").inner_text()
        assert "finish" in panel.inner_text() if member == "lead" else "shell" in panel.inner_text()
    assert w.problems == []
    w.page.close()


def test_rows_and_lanes_are_reachable_and_open_by_keyboard(
    browser: Any, lead_run: RunDir, tmp_path: Path
) -> None:
    w = _page(browser, lead_run, tmp_path)
    active = "document.activeElement.dataset ? document.activeElement.dataset.member : null"
    seen: list[str | None] = []
    for _ in range(80):  # Tab through the page until the w1-2 table row has the focus
        w.page.keyboard.press("Tab")
        seen.append(w.page.evaluate(active))
        tag = w.page.evaluate("document.activeElement.tagName")
        if seen[-1] == "w1-2" and tag == "TR":
            break
    else:
        raise AssertionError(f"Tab never reached the w1-2 row: {seen}")
    assert "lead" in seen  # the lead's lane was reached on the way
    w.page.keyboard.press("Enter")
    w.page.locator("#member-view").wait_for(state="visible")
    assert w.page.locator("#member-view").get_attribute("data-member") == "w1-2"
    # And back, then a lane by keyboard.
    w.page.go_back()
    w.page.locator('.lane[data-member="w2-1"]').focus()
    w.page.keyboard.press(" ")
    w.page.locator("#member-view").wait_for(state="visible")
    assert w.page.locator("#member-view").get_attribute("data-member") == "w2-1"
    assert w.problems == []
    w.page.close()


def test_the_page_reads_at_390_pixels(browser: Any, lead_run: RunDir, tmp_path: Path) -> None:
    w = _page(browser, lead_run, tmp_path, width=390)
    wide = "document.documentElement.scrollWidth"
    assert w.page.evaluate(wide) <= 390  # only tables scroll sideways, inside their box
    assert w.page.locator(".question .q").is_visible()
    box = w.page.locator("#timeline-svg").bounding_box()
    assert box is not None and box["x"] >= 0 and box["x"] + box["width"] <= 390
    # Lane labels stay legible: drawn at 11px or more after the SVG is scaled down.
    label = w.page.locator(".lane-label").first
    assert label.evaluate("t => t.getBoundingClientRect().height") >= 10
    w.page.locator('.lane[data-member="lead"]').click()
    w.page.locator("#member-view").wait_for(state="visible")
    assert w.page.evaluate(wide) <= 390
    assert w.problems == []
    w.page.screenshot(path=str(Path(__file__).parent / "artifacts" / "trace_lead_390.png"))
    w.page.close()


def test_fleet_trace_shows_each_members_wave(lead_run: RunDir) -> None:
    fleet = str(Path(sys.executable).parent / "fleet")
    shown = subprocess.run([fleet, "trace", str(lead_run.path)], capture_output=True, text=True)
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.splitlines()
    header = next(line for line in lines if line.startswith("MEMBER"))
    assert header.split()[:3] == ["MEMBER", "WAVE", "KIND"]
    # The table runs from its header to the first blank line; later sections (waits,
    # timings) may start their lines with a member's id too.
    rows = lines[lines.index(header) + 1 :]
    table = rows[: rows.index("")] if "" in rows else rows
    waves = {line.split()[0]: line.split()[1] for line in table
             if line.split() and line.split()[0] in ("lead", "w1-1", "w1-2", "w2-1")}  # fmt: skip
    assert waves == {"lead": "lead", "w1-1": "1", "w1-2": "1", "w2-1": "2"}
    assert "WAVE = the lead's spawn call" in shown.stdout
