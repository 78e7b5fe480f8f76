"""``fleet view`` on a real run: ``fleet view`` opened on an empty runs directory, then
``fleet run --wait-approval`` started (real boxes, the real harness, the real
``anthropic`` client against the fake Messages API); in Chromium the run appears in
the list, its page shows the asks its members wait on - escapes and a bidi override
made visible - and they are answered there; the members then finish on the page,
without a reload, and the run's journal says who answered."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from test_cli_approve import ESCAPES_SHOWN, TAIL_SHOWN, _asks_job, asking
from test_cli_policy import _journal, _wait_for, waiting_run
from test_trace_html import Watched, browser, fleet_view  # noqa: F401 (a fixture)

from coordinator.rundir.runs import RunDir

pytestmark = [pytest.mark.docker, pytest.mark.chromium]


def test_a_real_runs_asks_are_answered_on_its_live_page_and_it_finishes_there(
    browser: Any,  # noqa: F811
    tmp_path: Path,
    images: dict[str, str],
    fake_api: Any,
    cleanup: list[Path],
) -> None:
    fake_api(asking)
    out = tmp_path / "runs"
    out.mkdir()
    cleanup.append(out)
    with fleet_view("--output-dir", out) as base:
        w = Watched(browser)
        w.page.goto(base)
        w.page.wait_for_selector("#runs thead")
        proc = waiting_run(_asks_job(tmp_path, "[tail]", "[escapes]"))
        try:
            run = _wait_for(lambda: next(iter(RunDir.list(out)), None), 60)
            w.page.locator(f'#runs tr[data-run="{run.id}"] a.run-link').click(timeout=30_000)
            w.page.wait_for_selector("#timeline-svg")
            w.page.evaluate("window.__same_page = 1")
            asks = w.page.locator("#asks-panel .ask")
            _wait_for(lambda: asks.count() == 2, 180)
            texts = {
                asks.nth(i).get_attribute("data-ask"): asks.nth(i).inner_text() for i in range(2)
            }
            by_member = {
                ("tail" if "tail wants" in t else "escapes"): rid for rid, t in texts.items()
            }
            assert TAIL_SHOWN in texts[by_member["tail"]]
            assert ESCAPES_SHOWN in texts[by_member["escapes"]]
            for member, word in (("tail", "yes"), ("escapes", "no")):
                ask = w.page.locator(f'#asks-panel .ask[data-ask="{by_member[member]}"]')
                ask.locator(f'button[data-answer="{word}"]').click()
                ask.locator('.ask-status:has-text("answered")').wait_for()
            _, err = proc.communicate(timeout=180)
        finally:
            proc.kill()
        assert proc.returncode == 0, err
        rows = w.page.locator("#members tbody tr")

        def statuses() -> dict[str | None, str | None]:
            n = rows.count()
            return {
                rows.nth(i).get_attribute("data-member"): rows.nth(i).get_attribute("data-status")
                for i in range(n)
            }

        try:
            _wait_for(lambda: statuses() == {"tail": "ok", "escapes": "ok"}, 20)
        except AssertionError:
            raise AssertionError(f"the page shows {statuses()}") from None
        w.page.locator('#run-title:has-text("finished")').wait_for(timeout=15_000)
        assert w.page.locator("#asks-panel").count() == 0
        assert w.page.evaluate("window.__same_page") == 1
        assert w.problems == []
    answered = {e.member: e for e in _journal(run, "approval_answered")}
    assert answered["tail"].allowed and not answered["escapes"].allowed
    assert answered["tail"].by == "fleet view" and answered["tail"].who.startswith("pid ")
