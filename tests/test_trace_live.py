"""``fleet view`` live, in real Chromium against the real ``fleet view`` process: the
list of runs shows a run started after it opened, the run's page follows it to its
end without a reload, and a pending ask is answered from the page - its hostile text
shown as text - through the same approval queue as ``fleet approve``."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import pytest
import tracegen
from test_trace_html import Watched, browser, fleet_view  # noqa: F401 (a fixture)

from coordinator.oversight.approvals import ApprovalQueue, shown_sha256
from subagents.rules.policy import ApprovalRequest

pytestmark = pytest.mark.chromium
ARTIFACTS = Path(__file__).parent / "artifacts"
HOSTILE = "<img src=x onerror=window.__pwned=1></script><!--<script>\u202etxt.exe"


def _start_running(root: Path, scratch: Path, run_id: str) -> Path:
    """A run under ``root`` whose last member still runs (its owner: this process),
    and its finished version under ``scratch``; returns the running run's directory."""
    made = tracegen.make_run(root, members=3, turns=4, run_id=run_id, running=True, failed=None)
    tracegen.make_run(scratch, members=3, turns=4, run_id=run_id, failed=None)
    (made.run_dir / "live.json").write_text(json.dumps({"pid": os.getpid(), "since": 0}))
    return made.run_dir


def _finish(run_dir: Path, scratch: Path) -> None:
    """The run goes on to its end: its files become the finished run's."""
    shutil.copytree(scratch / run_dir.name, run_dir, dirs_exist_ok=True)
    (run_dir / "live.json").unlink()


def test_a_run_started_after_the_page_opened_shows_its_members_finishing(
    browser: Any,  # noqa: F811
    tmp_path: Path,
) -> None:
    root, scratch = tmp_path / "runs", tmp_path / "scratch"
    root.mkdir()
    with fleet_view("--output-dir", root) as base:
        w = Watched(browser)
        w.page.goto(base)
        w.page.wait_for_selector("#runs thead")
        assert w.page.locator("#runs tbody tr").count() == 0
        run_dir = _start_running(root, scratch, "later-run")
        # (While its files are being written it may show as dead for one poll.)
        row = w.page.locator('#runs tr[data-run="later-run"][data-status="running"]')
        row.wait_for(timeout=10_000)
        assert "asyncio" in row.inner_text()  # the job's question
        row.locator("a.run-link").click()
        w.page.wait_for_selector("#timeline-svg")
        w.page.evaluate("window.__same_page = 1")
        last = w.page.locator('#members tr[data-member="m03"]')
        assert last.get_attribute("data-status") == "running"
        assert "running" in w.page.locator("#run-title").inner_text()
        w.page.locator('.lane[data-member="m03"]').click()
        w.page.locator('#member-view[data-member="m03"]').wait_for()
        assert w.page.locator("#member-view #final-result").count() == 0
        _finish(run_dir, scratch)
        w.page.locator('#member-view .member-head .pill:text-is("ok")').wait_for(timeout=10_000)
        assert w.page.locator("#member-view #final-result").count() == 1
        w.page.locator("#crumbs a").first.click()
        assert w.page.locator('#members tr[data-member="m03"]').get_attribute("data-status") == "ok"
        assert "finished" in w.page.locator("#run-title").inner_text()
        assert w.page.evaluate("window.__same_page") == 1  # no reload happened
        assert w.problems == []


def test_the_run_page_follows_its_run_to_the_end_without_a_reload(
    browser: Any,  # noqa: F811
    tmp_path: Path,
) -> None:
    run_dir = _start_running(tmp_path / "runs", tmp_path / "scratch", "going")
    with fleet_view(run_dir) as base:
        w = Watched(browser)
        w.page.goto(base)
        w.page.wait_for_selector("#timeline-svg")
        w.page.evaluate("window.__same_page = 1")
        assert w.page.locator('.lane[data-status="running"]').count() == 1
        assert w.page.locator("#report .empty").inner_text().startswith("The report is written")
        _finish(run_dir, tmp_path / "scratch")
        w.page.locator('#members tr[data-member="m03"][data-status="ok"]').wait_for(timeout=10_000)
        assert w.page.locator('.lane[data-status="running"]').count() == 0
        assert w.page.locator("#report .empty").inner_text().startswith("No report was written")
        assert w.page.evaluate("window.__same_page") == 1
        assert w.problems == []


ANSWERED_OR_GONE = """rid => {
  const ask = document.querySelector(`.ask[data-ask="${rid}"]`);
  return !ask || ask.querySelector(".ask-status").textContent.startsWith("answered");
}"""


def test_a_pending_ask_is_answered_from_the_page_and_shown_as_text(
    browser: Any,  # noqa: F811
    tmp_path: Path,
) -> None:
    made = tracegen.make_run(tmp_path / "runs", members=2, turns=2, failed=None)
    queue = ApprovalQueue(made.run_dir / "approvals")
    asks = {
        word: queue.request(
            ApprovalRequest(member="m01", call_id=f"c-{word}", tool="shell",
                            input={"command": f"rm -rf {word} {HOSTILE}"}, rule="shell:rm *")
        )
        for word in ("yes", "no")
    }  # fmt: skip
    with fleet_view(made.run_dir) as base:
        w = Watched(browser)
        w.page.goto(base)
        panel = w.page.locator("#asks-panel")
        panel.wait_for()
        assert panel.locator(".ask").count() == 2
        text = panel.locator(f'.ask[data-ask="{asks["yes"]}"] .ask-text').inner_text()
        # As fleet approve shows it: the override made visible, the markup as text.
        assert "rm -rf yes <img src=x onerror=window.__pwned=1>" in text and "\\u202e" in text
        assert panel.locator("img").count() == 0 and w.page.locator("#asks script").count() == 0
        for word, rid in asks.items():
            panel.locator(f'.ask[data-ask="{rid}"] button[data-answer="{word}"]').click()
            # Taken: the ask says so, or - when the page's next poll came first - it has
            # left the panel of pending asks (the queue is checked below either way).
            w.page.wait_for_function(ANSWERED_OR_GONE, arg=rid)
        w.page.locator("#asks-panel").wait_for(state="detached", timeout=10_000)
        if ARTIFACTS.is_dir():
            w.page.screenshot(path=str(ARTIFACTS / "trace-live-asks.png"))
        assert w.page.evaluate("window.__pwned") is None
        assert w.problems == []
    for word, rid in asks.items():
        answer = queue.answer_of(rid)
        assert answer is not None and answer["allowed"] is (word == "yes")
        assert answer["by"] == "fleet view" and answer["who"].startswith("pid ")
        request = json.loads((queue.dir / f"{rid}.request.json").read_text())
        assert answer["sha256"] == shown_sha256(request["input"])
    assert queue.pending() == []


def test_the_list_of_runs_shows_hostile_names_as_text_and_links_only_to_runs(
    browser: Any,  # noqa: F811
    tmp_path: Path,
) -> None:
    root = tmp_path / "runs"
    run_id = "run-" + HOSTILE.replace("/", "")  # a directory name: no slash
    made = tracegen.make_run(root, members=2, turns=2, failed=None, run_id=run_id)
    job = json.loads((made.run_dir / "job.json").read_text())
    (made.run_dir / "job.json").write_text(json.dumps(job | {"question": HOSTILE}))
    with fleet_view("--output-dir", root) as base:
        w = Watched(browser)
        w.page.goto(base)
        row = w.page.locator("#runs tbody tr")
        row.wait_for()
        assert row.get_attribute("data-run") == run_id
        assert HOSTILE.replace("\u202e", "") in row.inner_text().replace("\u202e", "")
        assert w.page.locator("#runs img, #runs script").count() == 0
        # The override is a visible mark of its own, as on the run's page.
        assert row.locator('.bidi[data-cp="U+202E"]').count() >= 2  # the id and the question
        row.locator("a.run-link").click()
        w.page.wait_for_selector("#timeline-svg")
        assert run_id in w.page.locator("#run-title").inner_text()
        assert w.page.locator(".lane").count() == 2
        assert w.page.evaluate("window.__pwned") is None
        assert w.problems == []
