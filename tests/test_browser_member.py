"""Browser members end to end: run_member, real boxes, real Chromium, the corpus.

Models: the offline ``research`` policy, and the real ``anthropic`` client against
the fake Messages API server on 127.0.0.1 (for a model that quotes what is not there).
"""

from __future__ import annotations

import json
from pathlib import Path

import anyio
import pytest
from browser_support import (
    CORPUS,
    INJECTION,
    INJECTION_PAGE,
    browser_spec,
    corpus_box,
    run_browser_member,
)
from loop_support import anthropic_model

from sandbox.docker.backend import DockerBackend
from subagents.fake_api import FakeMessagesAPI, tool_use
from subagents.model.factory import make_model
from subagents.trace import read_trace

pytestmark = [pytest.mark.docker, pytest.mark.chromium, pytest.mark.anyio, pytest.mark.slow]

TASK = "How does asyncio shield protect a task from cancellation?"


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def backend(docker_client, images) -> DockerBackend:
    return DockerBackend(docker_client, images=images)


def tool_calls(trace: Path) -> list[tuple[str, dict]]:
    return [(e.tool, e.input) for e in read_trace(trace) if e.type == "tool_call"]


async def test_research_member_returns_verified_findings(
    backend: DockerBackend, images: dict[str, str], run_id: str, tmp_path: Path
) -> None:
    corpus = await corpus_box(backend, run_id, images)
    box = await backend.create(browser_spec(), run=run_id, member="r1")
    try:
        outcome = await run_browser_member(
            "r1",
            TASK,
            box=box,
            model=make_model("offline", kind="browser"),
            run_root=tmp_path,
            run=run_id,
        )
    finally:
        await box.close()
        await corpus.close()
    assert outcome.status == "ok", outcome.reason
    result = outcome.result
    assert result is not None and result.claims, result
    assert result.unverified == []
    assert all(c.verified for c in result.claims)
    assert any("shield" in c.quote for c in result.claims)
    assert all(c.source_url.startswith(f"{CORPUS}/library/") for c in result.claims)
    member_dir = tmp_path / "members" / "r1"
    calls = tool_calls(member_dir / "trace.jsonl")
    assert calls[0] == ("search", {"query": "asyncio shield protect task cancellation"})
    assert [name for name, _ in calls].count("navigate") >= 1
    pages = (member_dir / "pages" / "index.jsonl").read_text().splitlines()
    assert result.pages_fetched == len(pages) >= 2
    saved = json.loads((member_dir / "result.json").read_text())
    assert saved["status"] == "ok" and saved["result"] == result.model_dump(mode="json")


COOKIE_PAGE = """<!DOCTYPE html><html><head><title>Cookie jar</title></head><body><main>
<h1>Cookie jar</h1><p id="jar">pending</p>
<script>
const set = new URLSearchParams(location.search).get('set');
if (set) document.cookie = 'member=' + set + '; path=/; max-age=3600';
document.getElementById('jar').textContent = 'Cookies in this browser: [' + document.cookie + ']';
</script></main></body></html>"""


async def test_parallel_members_have_separate_boxes_and_profiles(
    backend: DockerBackend, images: dict[str, str], run_id: str, tmp_path: Path
) -> None:
    from playwright.async_api import async_playwright

    corpus = await corpus_box(backend, run_id, images)
    await corpus.write_file("/workspace/site/cookie.html", COOKIE_PAGE)
    names = ["p1", "p2", "p3"]
    boxes = {n: await backend.create(browser_spec(), run=run_id, member=n) for n in names}
    outcomes = {}

    async def one(name: str) -> None:
        urls = [f"{CORPUS}/site/cookie.html?set={name}", f"{CORPUS}/site/cookie.html"]
        outcomes[name] = await run_browser_member(
            name,
            "Which cookies does the cookie jar page show?",
            box=boxes[name],
            model=make_model("offline", kind="browser"),
            run_root=tmp_path,
            run=run_id,
            inputs={"urls": urls},
        )

    try:
        async with anyio.create_task_group() as tg:
            for name in names:
                tg.start_soon(one, name)
        assert len({b.id for b in boxes.values()}) == 3
        async with async_playwright() as pw:
            for name, box in boxes.items():
                browser = await pw.chromium.connect_over_cdp(await box.cdp_endpoint())
                cookies = await browser.contexts[0].cookies()
                assert [(c["name"], c["value"]) for c in cookies] == [("member", name)]
                await browser.close()
    finally:
        for box in boxes.values():
            await box.close()
        await corpus.close()
    for name in names:
        assert outcomes[name].status == "ok", outcomes[name].reason
        texts = "\n".join(
            p.read_text() for p in (tmp_path / "members" / name / "pages").glob("*.txt")
        )
        assert f"Cookies in this browser: [member={name}]" in texts
        others = [n for n in names if n != name]
        assert not any(f"member={o}" in texts for o in others)


async def test_killed_box_crashes_only_its_member(
    backend: DockerBackend, images: dict[str, str], run_id: str, tmp_path: Path, docker_client
) -> None:
    corpus = await corpus_box(backend, run_id, images)
    names = ["k1", "k2", "k3"]
    boxes = {n: await backend.create(browser_spec(), run=run_id, member=n) for n in names}
    outcomes = {}
    victim = "k2"

    def kill_after_first_page(event: object) -> None:
        # Synchronous on purpose: the box is dead before the member's next tool call.
        if getattr(event, "type", "") == "tool_result" and getattr(event, "tool", "") == "search":
            docker_client.containers.get(boxes[victim].id).kill()

    async def one(name: str) -> None:
        from subagents.member import run_member
        from subagents.spec import MemberSpec
        from subagents.trace import TraceWriter

        run_dir = tmp_path / "members" / name
        trace = TraceWriter(run_dir / "trace.jsonl", run=run_id, member=name)
        if name == victim:
            trace.listeners.append(kill_after_first_page)
        spec = MemberSpec(id=name, kind="browser", task=TASK, limits={"deadline_s": 240})
        outcomes[name] = await run_member(
            spec,
            sandbox=boxes[name],
            model=make_model("offline", kind="browser"),
            run_dir=run_dir,
            trace=trace,
        )
        trace.close()

    try:
        async with anyio.create_task_group() as tg:
            for name in names:
                tg.start_soon(one, name)
    finally:
        for box in boxes.values():
            await box.close()
        await corpus.close()
    assert outcomes[victim].status == "crashed"
    assert outcomes[victim].reason.startswith("sandbox crashed: killed"), outcomes[victim].reason
    for name in ("k1", "k3"):
        assert outcomes[name].status == "ok", outcomes[name].reason
        assert outcomes[name].result and outcomes[name].result.claims


async def test_unverifiable_quotes_are_flagged(
    backend: DockerBackend, images: dict[str, str], run_id: str, tmp_path: Path
) -> None:
    """A real-client model cites one true quote, one invented, one from another page."""
    page = f"{CORPUS}/library/asyncio-task.html"
    true_quote = "Protect an awaitable object from being cancelled."
    findings = {
        "summary": "asyncio.shield protects an awaitable from cancellation.",
        "claims": [
            {
                "text": "shield protects awaitables",
                "source_url": page + "#asyncio.shield",
                "quote": true_quote,
            },
            {
                "text": "invented",
                "source_url": page,
                "quote": "shield() makes a task immune to every exception.",
            },
            {
                "text": "wrong source",
                "source_url": f"{CORPUS}/library/asyncio-sync.html",
                "quote": true_quote,
            },
        ],
        "open_questions": [],
        "confidence": "medium",
    }
    script = [
        tool_use("navigate", {"url": page}),
        tool_use("submit_result", findings),
    ]
    corpus = await corpus_box(backend, run_id, images)
    box = await backend.create(browser_spec(), run=run_id, member="q1")
    try:
        with FakeMessagesAPI(script) as api:
            outcome = await run_browser_member(
                "q1",
                TASK,
                box=box,
                model=anthropic_model(api),
                run_root=tmp_path,
                run=run_id,
            )
            sent = api.requests[1]["messages"][-1]["content"][0]["content"]
    finally:
        await box.close()
        await corpus.close()
    assert outcome.status == "ok", outcome.reason
    # The model saw the page delimited as untrusted content.
    sent_text = sent if isinstance(sent, str) else sent[0]["text"]
    assert '<untrusted_page_content url="http://corpus:8080/library/asyncio-task.html"' in sent_text
    claims = outcome.result.claims
    assert [c.verified for c in claims] == [True, False, False]
    assert outcome.result.unverified == [1, 2]
    assert claims[1].note == "quote not found on the fetched page"
    assert claims[2].note.startswith("quote is on http://corpus:8080/library/asyncio-task.html")


async def test_prompt_injection_does_not_change_the_research_policy(
    backend: DockerBackend, images: dict[str, str], run_id: str, tmp_path: Path
) -> None:
    corpus = await corpus_box(backend, run_id, images)
    await corpus.write_file(
        "/workspace/site/notes.html", INJECTION_PAGE.format(injection=INJECTION)
    )
    await corpus.write_file(
        "/workspace/site/clean.html",
        INJECTION_PAGE.format(injection="Cancellation is cooperative in asyncio."),
    )
    results = {}
    for name in ("clean", "notes"):
        box = await backend.create(browser_spec(), run=run_id, member=name)
        try:
            outcome = await run_browser_member(
                name,
                TASK,
                box=box,
                model=make_model("offline", kind="browser"),
                run_root=tmp_path,
                run=run_id,
                inputs={"urls": [f"{CORPUS}/site/{name}.html"]},
            )
        finally:
            await box.close()
        assert outcome.status == "ok", outcome.reason
        results[name] = (outcome.result, tool_calls(tmp_path / "members" / name / "trace.jsonl"))
    await corpus.close()
    (clean, clean_calls), (hit, hit_calls) = results["clean"], results["notes"]
    # Same actions (only the page's own URL differs), same claims, nothing from the page.
    assert [n for n, _ in hit_calls] == [n for n, _ in clean_calls]
    assert not any("exfil" in json.dumps(args) for _, args in hit_calls)
    assert [c.quote for c in hit.claims] == [c.quote for c in clean.claims]
    assert hit.claims and all(c.verified for c in hit.claims)
    assert "PWNED" not in hit.model_dump_json() and hit.confidence == clean.confidence
    assert any("addressed to an AI agent" in q for q in hit.open_questions)
