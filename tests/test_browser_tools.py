"""Browser tools against real Chromium in a browser box, on the real corpus service box."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import docker.errors
import pytest
from browser_support import CORPUS, Toolbox, browser_spec, corpus_box, tool_context

from sandbox.docker.backend import DockerBackend
from subagents.tools.browser import close_session
from subagents.trace import read_trace

pytestmark = [pytest.mark.docker, pytest.mark.chromium, pytest.mark.anyio, pytest.mark.slow]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def backend(docker_client, images) -> DockerBackend:
    return DockerBackend(docker_client, images=images)


async def test_corpus_pages_search_form_and_screenshot(
    backend: DockerBackend, images: dict[str, str], run_id: str, tmp_path: Path
) -> None:
    corpus = await corpus_box(backend, run_id, images)
    box = await backend.create(browser_spec(), run=run_id, member="b1")
    ctx = tool_context(box, tmp_path, run_id, "b1")
    call = Toolbox(ctx)
    try:
        # search: ranked result links from the corpus's own search page.
        out = await call("search", query="shield task from cancellation")
        assert not out.is_error, out.text
        first = out.text.split("\n1. ", 1)[1].splitlines()[0]
        assert first.endswith("/library/asyncio-task.html#shielding-from-cancellation")

        # Opening that result shows the section it points at, not the page's top.
        out = await call("navigate", url=first.split(" -> ")[-1])
        assert not out.is_error, out.text
        assert "where #shielding-from-cancellation begins" in out.text, out.text[:600]
        assert "Protect an awaitable object from being cancelled." in out.text

        # navigate + snapshot: readable text and numbered elements, delimited as untrusted.
        out = await call("navigate", url=f"{CORPUS}/library/asyncio-task.html")
        assert not out.is_error, out.text
        assert out.text.startswith("HTTP 200 ")
        assert '<untrusted_page_content url="http://corpus:8080/library/asyncio-task.html"' in (
            out.text
        )
        assert "Coroutines and Tasks" in out.text and "[e1] " in out.text
        chunk_total = int(out.text.split("(chunk 1 of ", 1)[1].split(";", 1)[0])
        assert chunk_total > 2  # a big page is chunked, not dumped

        out = await call("read", chunk=chunk_total)
        assert "(last)" in out.text
        out = await call("find", text="asyncio.shield")
        assert "match(es)" in out.text and "Protect an awaitable object" in out.text
        out = await call("links")
        assert "http://corpus:8080/library/asyncio-task.html#asyncio.shield" in out.text
        out = await call("scroll", direction="down")
        assert out.text.startswith("Scrolled down: at ") and " 0 of" not in out.text

        # The page text the member read is kept for quote verification.
        index = (tmp_path / "pages" / "index.jsonl").read_text()
        assert "asyncio-task.html" in index

        # A screenshot is a file in the run dir and a trace event, not context.
        out = await call("screenshot")
        assert not out.is_error and not out.attachments
        shots = list((tmp_path / "screenshots").glob("*.png"))
        assert len(shots) == 1 and shots[0].read_bytes()[:4] == b"\x89PNG"
        ctx.trace.close()
        events = [e for e in read_trace(tmp_path / "trace.jsonl") if e.type == "screenshot"]
        assert [e.path for e in events] == [f"screenshots/{shots[0].name}"]
        assert events[0].url.endswith("/library/asyncio-task.html")

        # type + click on a fixture form; the echo page shows what was submitted.
        out = await call("navigate", url=f"{CORPUS}/site/form.html")
        assert '[e1] textbox "Your name"' in out.text
        assert '[e2] combobox "Topic"' in out.text
        await call("type", ref="e1", text="Ada Lovelace")
        await call("type", ref="e2", text="typing")
        out = await call("click", ref="e3")
        assert "e3" in out.text and "(checked)" in out.text
        out = await call("click", ref="e4")
        assert "Received a GET submission." in out.text
        assert "name = Ada Lovelace" in out.text and "topic = typing" in out.text
        assert "subscribe = yes" in out.text

        # type with submit presses Enter in the field and follows the navigation.
        out = await call("back")
        assert "Sample form" in out.text
        out = await call("type", ref="e1", text="Grace", submit=True)
        assert "name = Grace" in out.text

        # Stale or malformed refs are errors the model can act on.
        out = await call("click", ref="e999")
        assert out.is_error and "call snapshot" in out.text
        out = await call("click", ref="button")
        assert out.is_error
    finally:
        await close_session(ctx)
        await box.close()
        await corpus.close()


async def test_blocked_egress_is_an_error_result(
    backend: DockerBackend, images: dict[str, str], run_id: str, tmp_path: Path
) -> None:
    corpus = await corpus_box(backend, run_id, images)
    box = await backend.create(browser_spec(), run=run_id, member="b1")
    ctx = tool_context(box, tmp_path, run_id, "b1")
    call = Toolbox(ctx)
    try:
        # Not on the allowlist: the proxy refuses before any connection is made.
        out = await call("navigate", url="http://blocked.example/secret")
        assert out.is_error
        assert out.text.startswith("blocked: http://blocked.example/secret")
        assert "not on this run's allowlist" in out.text
        out = await call("navigate", url="https://blocked.example/")
        assert out.is_error and "ERR_TUNNEL_CONNECTION_FAILED" in out.text
        out = await call("navigate", url="file:///etc/passwd")
        assert out.is_error and "not an http(s) URL" in out.text
        # The session still works after the errors.
        out = await call("navigate", url=f"{CORPUS}/site/")
        assert not out.is_error and "Fleet research corpus" in out.text
        out = await call("navigate", url=f"{CORPUS}/no/such/page.html")
        assert out.is_error and "HTTP 404" in out.text
    finally:
        await close_session(ctx)
        await box.close()
        await corpus.close()


_KILL_RENDERERS = (
    "import os, signal\n"
    "for p in filter(str.isdigit, os.listdir('/proc')):\n"
    "    if int(p) == os.getpid():\n"
    "        continue\n"
    "    try:\n"
    "        if b'--type=renderer' in open(f'/proc/{p}/cmdline', 'rb').read():\n"
    "            os.kill(int(p), signal.SIGKILL)\n"
    "    except OSError:\n"
    "        pass\n"
)


async def test_crashed_tab_is_an_error_then_recovers(
    backend: DockerBackend, images: dict[str, str], run_id: str, tmp_path: Path
) -> None:
    """The page's renderer dies: the model gets a clear error promptly, not a hang."""

    corpus = await corpus_box(backend, run_id, images)
    box = await backend.create(browser_spec(), run=run_id, member="b1")
    ctx = tool_context(box, tmp_path, run_id, "b1")
    call = Toolbox(ctx)
    try:
        assert not (await call("navigate", url=f"{CORPUS}/site/")).is_error
        killed = await box.exec(["python3", "-c", _KILL_RENDERERS], timeout=10)
        assert killed.ok, killed.stderr
        started = time.monotonic()
        out = await call("snapshot")
        assert time.monotonic() - started < 20
        assert out.is_error and "crashed" in out.text, out.text
        out = await call("navigate", url=f"{CORPUS}/site/form.html")
        assert not out.is_error and "Sample form" in out.text
    finally:
        await close_session(ctx)
        await box.close()
        await corpus.close()


WIDGETS_PAGE = """<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">
<title>Widgets</title></head><body><main><h1>Widgets</h1>
<a href="/site/"><img src="/site/none.png" alt="Home page" width="20" height="20"></a>
<button><span aria-hidden="true">&times;</span> Close</button>
<input type="submit">
<label for="qty">Quantity</label><input id="qty" type="number" value="3">
<a href="/site/form.html" aria-hidden="true" tabindex="-1">Hidden duplicate</a>
<span id="lbl">Search the docs</span><input aria-labelledby="lbl" type="text">
<button disabled>Later</button>
<select aria-label="Pick"><option value="a">Alpha</option><option value="b" selected>Beta</option>
</select></main></body></html>
"""


async def test_snapshot_roles_and_names_come_from_the_accessibility_tree(
    backend: DockerBackend, images: dict[str, str], run_id: str, tmp_path: Path
) -> None:
    """Names a screen reader would read (alt text, hidden parts skipped, implicit
    button labels), roles such as spinbutton, aria-hidden elements left out."""
    corpus = await corpus_box(backend, run_id, images)
    await corpus.write_file("/workspace/site/widgets.html", WIDGETS_PAGE)
    box = await backend.create(browser_spec(), run=run_id, member="b1")
    ctx = tool_context(box, tmp_path, run_id, "b1")
    call = Toolbox(ctx)
    try:
        out = await call("navigate", url=f"{CORPUS}/site/widgets.html")
        assert not out.is_error, out.text
        listing = out.text.split("Interactive elements (", 1)[1]
        assert listing.startswith("7;"), listing
        assert '[e1] link "Home page" -> http://corpus:8080/site/' in listing
        assert '[e2] button "Close"' in listing
        assert '[e3] button "Submit"' in listing
        assert "[e4] spinbutton \"Quantity\" value='3'" in listing
        assert "Hidden duplicate" not in listing and "[e5]" not in listing
        assert '[e6] textbox "Search the docs"' in listing
        assert '[e7] button "Later" (disabled)' in listing
        assert "[e8] combobox \"Pick\" value='Beta'" in listing
        # The refs the tree named still resolve for type and click.
        out = await call("type", ref="e4", text="5")
        assert "[e4] spinbutton \"Quantity\" value='5'" in out.text, out.text
        out = await call("click", ref="e1")
        assert not out.is_error and "Fleet research corpus" in out.text
    finally:
        await close_session(ctx)
        await box.close()
        await corpus.close()


def _pause(container: Any) -> None:
    """``docker pause``, asked again when the engine's freezer gave up on a box whose
    processes were busy ("unable to freeze": it happened once on a loaded machine)."""
    for attempt in range(5):
        try:
            container.pause()
            return
        except docker.errors.APIError as exc:
            if "unable to freeze" not in str(exc) or attempt == 4:
                raise
            time.sleep(0.5)


def _signal_chromium(sig: str) -> str:
    return (
        "import os, signal\n"
        "for p in filter(str.isdigit, os.listdir('/proc')):\n"
        "    try:\n"
        "        if b'chromium' in open(f'/proc/{p}/cmdline', 'rb').read().split(b'\\0')[0]:\n"
        f"            os.kill(int(p), signal.{sig})\n"
        "    except OSError:\n"
        "        pass\n"
    )


async def test_frozen_browser_or_box_errors_within_the_action_timeout(
    backend: DockerBackend, images: dict[str, str], run_id: str, tmp_path: Path, docker_client
) -> None:
    """A browser that stops answering is a prompt tool error, never a hang; a frozen
    (paused) box ends the member as crashed, also promptly."""

    from sandbox.errors import SandboxCrashed
    from subagents.browser.config import BrowserConfig
    from subagents.tools.browser_session import _GRACE_S

    config = BrowserConfig(action_timeout_s=2, navigation_timeout_s=3, connect_timeout_s=3)
    bound = config.navigation_timeout_s + _GRACE_S + 3  # the outer clock, plus slack
    corpus = await corpus_box(backend, run_id, images)
    box = await backend.create(browser_spec(), run=run_id, member="b1")
    container = docker_client.containers.get(box.id)
    ctx = tool_context(box, tmp_path, run_id, "b1")
    call = Toolbox(ctx, config)
    try:
        # Chromium frozen before the lazy first connection: the connect gives up.
        assert (await box.exec(["python3", "-c", _signal_chromium("SIGSTOP")])).ok
        started = time.monotonic()
        out = await call("navigate", url=f"{CORPUS}/site/")
        assert time.monotonic() - started < bound
        assert out.is_error and "could not connect to the browser" in out.text, out.text
        assert (await box.exec(["python3", "-c", _signal_chromium("SIGCONT")])).ok
        assert not (await call("navigate", url=f"{CORPUS}/site/")).is_error

        # Frozen while connected: the action is abandoned with a clear error.
        assert (await box.exec(["python3", "-c", _signal_chromium("SIGSTOP")])).ok
        started = time.monotonic()
        out = await call("snapshot")
        assert time.monotonic() - started < bound
        assert out.is_error and "did not finish within 2s" in out.text, out.text
        assert (await box.exec(["python3", "-c", _signal_chromium("SIGCONT")])).ok
        out = await call("snapshot")
        assert not out.is_error and "Fleet research corpus" in out.text, out.text

        # The whole box frozen: the member's box is reported gone, not waited on.
        _pause(container)
        started = time.monotonic()
        with pytest.raises(SandboxCrashed, match="paused"):
            await call("snapshot")
        assert time.monotonic() - started < bound
    finally:
        container.reload()
        if container.status == "paused":
            container.unpause()
        await close_session(ctx)
        await box.close()
        await corpus.close()
