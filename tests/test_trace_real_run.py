"""`fleet trace` on a real run: `fleet research` through the coordinator, real boxes, the
offline research model, then the rollup, the page in Chromium and the OTel export of it.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import missing_dependency, remove_run
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from otlp_collector import Collector

from coordinator.journal.entries import MemberFinishedEntry
from coordinator.rundir.runs import RunDir
from coordinator.traceview import load_run, member_detail, otel, rollup_run
from coordinator.traceview.html import write_page
from subagents.trace import ErrorEvent, ModelCall, ToolCall, ToolResult, read_trace

pytestmark = [pytest.mark.docker, pytest.mark.chromium, pytest.mark.slow]
FLEET = str(Path(sys.executable).parent / "fleet")
CHROMIUM = "/usr/bin/chromium"
ARTIFACTS = Path(__file__).parent / "artifacts"


@pytest.fixture(scope="module")
def collector() -> Iterator[Collector]:
    server = Collector()
    yield server
    server.close()


@pytest.fixture(scope="module")
def real_run(
    docker_client: Any,
    images: dict[str, str],
    collector: Collector,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Path]:
    """A finished offline research run, exported live to ``collector`` while it ran."""
    root = tmp_path_factory.mktemp("realruns")
    env = {
        k: v for k, v in os.environ.items() if k not in ("ANTHROPIC_API_KEY", "ANTHROPIC_BASE_URL")
    }
    env["OTEL_EXPORTER_OTLP_ENDPOINT"] = collector.url
    try:
        proc = subprocess.Popen(
            [FLEET, "research", "How do Python asyncio tasks get cancelled?", "--members", "2",
             "--output-dir", str(root), "--plain"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
        )  # fmt: skip
        # `fleet trace --follow` on the run while it is running: it must exit by itself.
        head = proc.stderr.readline() if proc.stderr else ""
        match = re.search(r" in (\S+)$", head.strip())
        assert match, head
        follower = subprocess.Popen(
            [FLEET, "trace", match.group(1), "--follow", "--interval", "0.2"],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )  # fmt: skip
        out, err = proc.communicate(timeout=600)
        assert proc.returncode == 0, head + out + err
        followed, _ = follower.communicate(timeout=60)
        FOLLOWED.append((follower.returncode, followed))
        (run,) = RunDir.list(root)
        yield run.path
    finally:
        for run in RunDir.list(root):
            remove_run(docker_client, run.id)


FOLLOWED: list[tuple[int, str]] = []
"""Exit code and output of `fleet trace --follow` run alongside the real run."""


def test_follow_tails_a_real_run_and_exits_when_it_ends(real_run: Path) -> None:
    (code, out), roll = FOLLOWED[0], rollup_run(load_run(real_run))
    assert code == 0, out
    table, followed = out.split("(Ctrl-C to stop)")
    for r in roll.members:
        calls = len(re.findall(rf"{r.member}\s+t\d+\s+-> ", followed))
        assert re.search(rf"{r.member}\s+t0\s+END ok", followed), out
        if re.search(rf"{r.member}\s+t0\s+START browser", followed):
            assert re.search(rf"{r.member}\s+t0\s+box create\b", followed), out
            assert calls == r.tool_calls, out
        else:  # it started before the follower attached: its first table shows it
            assert re.search(rf"{r.member}\s+browser\s+running", table), out
            assert calls <= r.tool_calls, out
    # It ends with the finished run's table.
    assert re.search(rf"run {real_run.name}\s+finished", followed)


def test_rollup_of_a_real_run_matches_its_traces_and_journal(real_run: Path) -> None:
    roll = rollup_run(load_run(real_run))
    assert roll.finished and roll.run == real_run.name
    journal = {
        e.member: e for e in RunDir(real_run).journal.read() if isinstance(e, MemberFinishedEntry)
    }
    assert [r.member for r in roll.members] == sorted(journal)
    for row in roll.members:
        events = list(read_trace(real_run / "members" / row.member / "trace.jsonl"))
        calls = [e for e in events if isinstance(e, ModelCall)]
        assert row.status == journal[row.member].status == "ok"
        assert row.turns == len(calls) == journal[row.member].turns
        assert row.total_input == sum(
            c.input_tokens + c.cache_read_tokens + c.cache_write_tokens for c in calls
        )
        assert (
            row.output_tokens
            == sum(c.output_tokens for c in calls)
            == journal[row.member].output_tokens
        )
        assert row.tool_calls == sum(isinstance(e, ToolCall) for e in events)
        errors = sum(isinstance(e, ToolResult) and e.is_error for e in events)
        assert row.errors == errors + sum(isinstance(e, ErrorEvent) for e in events)
        assert row.cost_usd == 0 and not row.cost_estimated  # offline models bill nothing
        detail = member_detail(next(m for m in load_run(real_run).members if m.id == row.member))
        assert detail.turns[-1].tools[-1].tool == "submit_result"
        assert detail.result is not None and detail.result["claims"]


def test_page_of_a_real_run_in_chromium(real_run: Path, tmp_path: Path) -> None:
    if not Path(CHROMIUM).exists():
        missing_dependency(f"Chromium not found at {CHROMIUM}")
    from playwright.sync_api import sync_playwright

    out = tmp_path / "real.html"
    write_page(load_run(real_run), out)
    roll = rollup_run(load_run(real_run))
    problems: list[str] = []
    with sync_playwright() as pw:
        browser = pw.chromium.launch(
            executable_path=CHROMIUM,
            args=[
                "--no-sandbox",
                "--disable-background-networking",
                "--disable-features=WebUIOmniboxPopup,WebUIOmniboxAimPopup",
            ],
        )
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        page.on("console", lambda m: m.type == "error" and problems.append(m.text))
        page.on("pageerror", lambda e: problems.append(str(e)))
        page.on("requestfailed", lambda r: problems.append(r.url))
        page.goto(out.as_uri())
        assert page.locator(".lane").count() == len(roll.members) == 2
        first = roll.members[0]
        page.click(f'#members tr[data-member="{first.member}"]')
        assert page.locator("#member-view details.turn").count() == first.turns
        page.locator("#member-view details.turn").last.locator("summary").click()
        assert "submit_result" in page.locator("#member-view details.turn").last.inner_text()
        # The pages the browser member fetched are listed and their texts linked.
        index = (real_run / "members" / first.member / "pages" / "index.jsonl").read_text()
        fetched = [json.loads(line) for line in index.splitlines()]
        rows = page.locator("#pages .page-row")
        assert fetched and rows.count() == len(fetched)
        assert fetched[0]["url"] in rows.first.inner_text()
        href = rows.first.locator("a").get_attribute("href") or ""
        assert (out.parent / href).resolve().read_text() == (
            real_run / "members" / first.member / "pages" / fetched[0]["path"]
        ).read_text()
        ARTIFACTS.mkdir(exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / "trace_real_run.png"), full_page=True)
        browser.close()
    assert problems == []


def test_otel_export_of_a_real_run(real_run: Path) -> None:
    exporter = InMemorySpanExporter()
    run = load_run(real_run)
    otel.export_run(run, exporter=exporter)
    spans = exporter.get_finished_spans()
    roll = rollup_run(run)
    chats = [s for s in spans if s.attributes["gen_ai.operation.name"] == "chat"]
    assert len(chats) == roll.totals["turns"]
    assert {s.attributes["gen_ai.request.model"] for s in chats} == {"offline:research"}
    assert {s.attributes["gen_ai.provider.name"] for s in chats} == {"fleet.offline"}
    agents = [s for s in spans if s.attributes["gen_ai.operation.name"] == "invoke_agent"]
    assert sorted(s.attributes["gen_ai.agent.name"] for s in agents) == [
        r.member for r in roll.members
    ]


def test_live_otlp_export_during_the_run(real_run: Path, collector: Collector) -> None:
    spans = collector.spans()
    roll = rollup_run(load_run(real_run))
    names = [s.name for s in spans]
    assert names.count("invoke_workflow research") == 1  # the job's name, not the run id
    assert sorted(n for n in names if n.startswith("invoke_agent ")) == [
        f"invoke_agent {r.member}" for r in roll.members
    ]
    assert sum(n.startswith("chat ") for n in names) == roll.totals["turns"]
    assert sum(n.startswith("execute_tool ") for n in names) == roll.totals["tool_calls"]
    # No content unless asked for.
    keys = {kv.key for s in spans for kv in s.attributes}
    assert "gen_ai.tool.call.arguments" not in keys and "gen_ai.usage.input_tokens" in keys
