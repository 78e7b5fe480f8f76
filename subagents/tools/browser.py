"""Browser tools: the model's hands on its own box's Chromium.

Names are fixed (the offline research policy and recorded traces depend on them):
``navigate``, ``back``, ``snapshot``, ``click``, ``type``, ``scroll``, ``find``,
``read``, ``links``, ``screenshot``, ``search``. Every tool that shows page content
wraps it in ``<untrusted_page_content>`` (see :mod:`subagents.browser.dom`), and every
page text a tool reads is kept in the member's ``pages/`` directory, which is what
the browser kind verifies quotes against.

Actions that change the page (navigate, back, click, type, search) answer with a
fresh snapshot, because the model's next step almost always needs one and a separate
call would cost a turn. A snapshot shows one chunk of text; ``read`` pages through
the rest, so a 150 KB documentation page never lands in the context at once (and
anything still too big goes through the harness's offloading).
"""

from __future__ import annotations

import base64
import re
import time
import urllib.parse
from typing import Any, ClassVar, Literal

import anyio
from pydantic import BaseModel, ConfigDict, Field

from ..browser.config import BrowserConfig
from ..browser.dom import LINKS_JS, PageView, chunks, render_links, render_snapshot, untrusted
from ..browser.pages import PageStore
from ..trace import Screenshot
from .base import Blocked, Tool, ToolContext, ToolError, ToolOutput
from .browser_session import BrowserSession

_REF = re.compile(r"^e\d{1,5}$")
_NET_HINTS = {
    "ERR_TUNNEL_CONNECTION_FAILED": "the egress proxy refused the connection: the host is "
    "not on this member's allowlist, or it cannot be reached",
    "ERR_PROXY_CONNECTION_FAILED": "the egress proxy cannot be reached",
    "ERR_NAME_NOT_RESOLVED": "the host name does not resolve",
    "ERR_CONNECTION_REFUSED": "nothing listens on that host and port",
    "ERR_CONNECTION_TIMED_OUT": "the host did not answer",
    "ERR_ABORTED": "the navigation was aborted (a download, or a newer navigation)",
}


class _In(BaseModel):
    model_config = ConfigDict(extra="forbid")


async def session(ctx: ToolContext, config: BrowserConfig) -> BrowserSession:
    """The member's browser session, opened on first use (once, even under concurrency)."""
    lock: anyio.Lock = ctx.state.setdefault("browser_lock", anyio.Lock())
    async with lock:
        current = ctx.state.get("browser")
        if current is None:
            current = await BrowserSession.open(ctx.sandbox, config)
            ctx.state["browser"] = current
        return current


def page_store(ctx: ToolContext) -> PageStore:
    store = ctx.state.get("browser_pages")
    if store is None:
        store = ctx.state["browser_pages"] = PageStore(ctx.run_dir)
    return store


async def close_session(ctx: ToolContext) -> None:
    """Close the member's browser session if one was opened."""
    current = ctx.state.pop("browser", None)
    if current is not None:
        await current.close()


class BrowserTool(Tool):
    """Shared plumbing: the session, page reading and recording."""

    def __init__(self, config: BrowserConfig) -> None:
        self.config = config

    async def view(self, ctx: ToolContext, *, elements: bool = True) -> PageView:
        """Read the page (``elements=False``: its text only) and keep its text in ``pages/``."""
        view = await (await session(ctx, self.config)).view(elements=elements)
        if view.url.startswith(("http://", "https://")):
            page_store(ctx).record(view.url, view.title, view.full_text)
        return view

    async def snapshot_text(
        self, ctx: ToolContext, status: str = "", *, elements: bool = True
    ) -> str:
        view = await self.view(ctx, elements=elements)
        return render_snapshot(
            view, chunk_chars=self.config.chunk_chars, status=status, elements=elements
        )

    async def goto(self, ctx: ToolContext, url: str) -> str:
        """Navigate; errors (blocked egress, HTTP errors, network) raise ToolError."""
        parsed = urllib.parse.urlsplit(url)
        if parsed.scheme not in ("http", "https") or not parsed.netloc:
            raise ToolError(f"{url!r} is not an http(s) URL; give e.g. 'http://corpus:8080/'")
        s = await session(ctx, self.config)

        async def _go(page: Any) -> tuple[int, str]:
            for attempt in range(3):
                try:
                    resp = await page.goto(url, wait_until="domcontentloaded")
                    break
                except Exception as exc:
                    # After a failed load Chromium commits its own error page a moment
                    # later, which can interrupt the next navigation: try that one again.
                    if attempt < 2 and "interrupted by another navigation" in str(exc):
                        await anyio.sleep(0.2)
                        continue
                    message = _net_error(url, exc)
                    with anyio.move_on_after(2):  # let the error page commit first
                        await page.wait_for_load_state("load")
                    # A CONNECT the proxy refused (an https host off the allowlist).
                    refused = "ERR_TUNNEL_CONNECTION_FAILED" in message
                    raise (Blocked if refused else ToolError)(message) from None
            if resp is None:
                return 200, ""
            body = (await resp.text())[:500] if resp.status >= 400 else ""
            return resp.status, body

        status, body = await s.run(f"navigate to {url}", _go, navigation=True)
        if status == 403 and body.startswith("fleet egress proxy:"):
            raise Blocked(
                f"blocked: {url} cannot be reached from this browser - {body.strip()}. "
                "Only the hosts on this member's allowlist can be visited."
            )
        if status >= 400:
            snippet = await self.snapshot_text(ctx)
            raise ToolError(f"{url} answered HTTP {status}.\n{snippet}")
        return f"HTTP {status} {url}"


def _net_error(url: str, exc: BaseException) -> str:
    msg = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    for code, hint in _NET_HINTS.items():
        if code in msg:
            return f"cannot open {url}: net::{code} - {hint}"
    found = re.search(r"net::(ERR_[A-Z_]+)", msg)
    if found:
        return f"cannot open {url}: net::{found.group(1)}"
    if "Timeout" in type(exc).__name__:
        return f"cannot open {url}: the page did not load in time ({msg})"
    raise exc  # not a navigation error: let the session classify it (browser gone, ...)


class NavigateInput(_In):
    url: str = Field(description="Absolute http(s) URL to open.")


class Navigate(BrowserTool):
    name: ClassVar[str] = "navigate"
    description: ClassVar[str] = "Open a URL in the browser; returns a snapshot of the page."
    Input: ClassVar[type[BaseModel]] = NavigateInput

    async def run(self, args: NavigateInput, ctx: ToolContext) -> str:
        status = await self.goto(ctx, args.url)
        return await self.snapshot_text(ctx, status)


class Back(BrowserTool):
    name: ClassVar[str] = "back"
    description: ClassVar[str] = "Go back to the previous page; returns a snapshot."
    Input: ClassVar[type[BaseModel]] = _In

    async def run(self, args: _In, ctx: ToolContext) -> str:
        s = await session(ctx, self.config)

        async def _back(page: Any) -> bool:
            # "commit": a page restored from the back-forward cache fires no load events.
            before = page.url
            await page.go_back(wait_until="commit")
            return page.url != before

        if not await s.run("back", _back, navigation=True):
            raise ToolError("there is no previous page in this tab's history")
        return await self.snapshot_text(ctx)


class Snapshot(BrowserTool):
    name: ClassVar[str] = "snapshot"
    description: ClassVar[str] = (
        "The current page: readable text (first chunk) and numbered interactive "
        "elements (refs e1, e2, ... for click and type)."
    )
    Input: ClassVar[type[BaseModel]] = _In

    async def run(self, args: _In, ctx: ToolContext) -> str:
        return await self.snapshot_text(ctx)


class ClickInput(_In):
    ref: str = Field(description="Element ref from the latest snapshot, e.g. 'e12'.")


async def _locate(s: BrowserSession, ref: str) -> Any:
    if not _REF.match(ref):
        raise ToolError(f"{ref!r} is not an element ref; refs look like 'e12' (see snapshot)")
    page = await s.page()
    loc = page.locator(f'[data-fleet-ref="{ref}"]')
    if await s.run("locate", lambda _p: loc.count()) == 0:
        raise ToolError(
            f"no element {ref} on the current page; refs change when the page changes - "
            "call snapshot and use a ref from it"
        )
    return loc.first


class Click(BrowserTool):
    name: ClassVar[str] = "click"
    description: ClassVar[str] = "Click an element by ref; returns a snapshot of the result."
    Input: ClassVar[type[BaseModel]] = ClickInput

    async def run(self, args: ClickInput, ctx: ToolContext) -> str:
        s = await session(ctx, self.config)
        loc = await _locate(s, args.ref)

        async def _click(page: Any) -> None:
            await loc.click()
            await page.wait_for_load_state("domcontentloaded")

        await s.run(f"click {args.ref}", _click, navigation=True)
        return await self.snapshot_text(ctx, f"Clicked {args.ref}.")


class TypeInput(_In):
    ref: str = Field(description="Ref of a text field, text area or select, e.g. 'e3'.")
    text: str = Field(description="Text to put in the field (replaces what is there).")
    submit: bool = Field(default=False, description="Press Enter afterwards (submit the form).")


class Type(BrowserTool):
    name: ClassVar[str] = "type"
    description: ClassVar[str] = (
        "Fill a text field (or choose a select option) by ref, optionally pressing Enter; "
        "returns a snapshot."
    )
    Input: ClassVar[type[BaseModel]] = TypeInput

    async def run(self, args: TypeInput, ctx: ToolContext) -> str:
        s = await session(ctx, self.config)
        loc = await _locate(s, args.ref)

        async def _type(page: Any) -> None:
            tag = str(await loc.evaluate("e => e.tagName + ':' + (e.type || '')")).lower()
            if tag.startswith("select"):
                await loc.select_option(label=args.text)
            elif tag.split(":")[1] in ("checkbox", "radio", "submit", "button"):
                raise ToolError(f"{args.ref} is a {tag.split(':')[1]}; use click on it instead")
            else:
                await loc.fill(args.text)
            if args.submit:
                await loc.press("Enter")
                await page.wait_for_load_state("domcontentloaded")

        await s.run(f"type into {args.ref}", _type, navigation=args.submit)
        done = f"Typed into {args.ref}" + (" and pressed Enter." if args.submit else ".")
        return await self.snapshot_text(ctx, done)


class ScrollInput(_In):
    direction: Literal["down", "up", "top", "bottom"] = Field(description="Where to scroll.")


class Scroll(BrowserTool):
    name: ClassVar[str] = "scroll"
    description: ClassVar[str] = "Scroll the page by about one screen (or to top/bottom)."
    Input: ClassVar[type[BaseModel]] = ScrollInput

    async def run(self, args: ScrollInput, ctx: ToolContext) -> str:
        s = await session(ctx, self.config)
        js = {
            "down": "window.scrollBy(0, window.innerHeight * 0.9)",
            "up": "window.scrollBy(0, -window.innerHeight * 0.9)",
            "top": "window.scrollTo(0, 0)",
            "bottom": "window.scrollTo(0, document.documentElement.scrollHeight)",
        }[args.direction]
        pos = await s.run(
            "scroll",
            lambda p: p.evaluate(
                f"() => {{ {js}; return [Math.round(scrollY), "
                "document.documentElement.scrollHeight - innerHeight]; }"
            ),
        )
        y, end = int(pos[0]), max(int(pos[1]), 0)
        share = f"{100 * y // end}%" if end else "100%"
        return f"Scrolled {args.direction}: at {y} of {end} px ({share}). Use read for the text."


class FindInput(_In):
    text: str = Field(min_length=1, description="Text to look for (case-insensitive).")


class Find(BrowserTool):
    name: ClassVar[str] = "find"
    description: ClassVar[str] = "Find text on the current page; returns matches with context."
    Input: ClassVar[type[BaseModel]] = FindInput
    max_matches: ClassVar[int] = 10

    async def run(self, args: FindInput, ctx: ToolContext) -> str:
        view = await self.view(ctx, elements=False)
        parts = chunks(view.text, self.config.chunk_chars)
        needle = args.text.lower()
        lines: list[str] = []
        total = 0
        for i, part in enumerate(parts, 1):
            low = part.lower()
            at = low.find(needle)
            while at >= 0:
                total += 1
                if len(lines) < self.max_matches:
                    ctx_text = " ".join(part[max(0, at - 160) : at + len(needle) + 160].split())
                    lines.append(f"- chunk {i}: ...{ctx_text}...")
                at = low.find(needle, at + len(needle))
        if not total:
            return untrusted(view.url, f"No match for {args.text!r} on this page.")
        head = f"{total} match(es) for {args.text!r}" + (
            f" (first {self.max_matches} shown)" if total > self.max_matches else ""
        )
        return untrusted(view.url, head + ":\n" + "\n".join(lines), title=view.title)


class ReadInput(_In):
    chunk: int = Field(default=1, ge=1, description="Chunk number, from 1.")


class Read(BrowserTool):
    name: ClassVar[str] = "read"
    description: ClassVar[str] = "Read the current page's text in chunks (chunk 1, 2, ...)."
    Input: ClassVar[type[BaseModel]] = ReadInput

    async def run(self, args: ReadInput, ctx: ToolContext) -> str:
        view = await self.view(ctx, elements=False)
        parts = chunks(view.text, self.config.chunk_chars)
        if args.chunk > len(parts):
            raise ToolError(f"the page has {len(parts)} chunk(s); ask for chunk 1..{len(parts)}")
        more = f"; read chunk {args.chunk + 1} next" if args.chunk < len(parts) else " (last)"
        body = f"Chunk {args.chunk} of {len(parts)}{more}:\n{parts[args.chunk - 1]}"
        return untrusted(view.url, body, title=view.title)


class Links(BrowserTool):
    name: ClassVar[str] = "links"
    description: ClassVar[str] = "List the links of the current page (text -> URL)."
    Input: ClassVar[type[BaseModel]] = _In

    async def run(self, args: _In, ctx: ToolContext) -> str:
        s = await session(ctx, self.config)
        page = await s.page()
        limit = self.config.max_links
        data = await s.run("links", lambda p: p.evaluate(LINKS_JS, [limit, False]))
        return render_links(page.url, data)


class ScreenshotInput(_In):
    full_page: bool = Field(default=False, description="Capture the whole page, not the viewport.")
    attach: bool = Field(
        default=False, description="Also show the image to you (costs context; default off)."
    )


class TakeScreenshot(BrowserTool):
    name: ClassVar[str] = "screenshot"
    description: ClassVar[str] = (
        "Save a PNG screenshot to the run's screenshots/ directory (not shown to you "
        "unless attach=true)."
    )
    Input: ClassVar[type[BaseModel]] = ScreenshotInput

    async def run(self, args: ScreenshotInput, ctx: ToolContext) -> ToolOutput:
        s = await session(ctx, self.config)
        shots = ctx.run_dir / "screenshots"
        shots.mkdir(parents=True, exist_ok=True)
        n = len(list(shots.glob("*.png"))) + 1
        path = shots / f"{n:04d}-{int(time.time())}.png"
        data: bytes = await s.run(
            "screenshot", lambda p: p.screenshot(path=str(path), full_page=args.full_page)
        )
        url = (await s.page()).url
        rel = path.relative_to(ctx.run_dir).as_posix()
        ctx.trace.emit(Screenshot(span=ctx.member, path=rel, url=url))
        out = ToolOutput(f"Saved screenshot {rel} ({len(data)} bytes) of {url}.")
        if args.attach:
            b64 = base64.b64encode(data).decode()
            out.attachments.append(
                {
                    "type": "image",
                    "source": {"type": "base64", "media_type": "image/png", "data": b64},
                }
            )
        return out


class SearchInput(_In):
    query: str = Field(min_length=1, max_length=500, description="What to search for.")


class Search(BrowserTool):
    name: ClassVar[str] = "search"
    description: ClassVar[str] = (
        "Search the configured search site; returns the ranked result links (title -> URL) "
        "and the results page."
    )
    Input: ClassVar[type[BaseModel]] = SearchInput

    async def run(self, args: SearchInput, ctx: ToolContext) -> str:
        url = self.config.search_url.replace("{query}", urllib.parse.quote_plus(args.query))
        await self.goto(ctx, url)
        s = await session(ctx, self.config)
        page = await s.page()
        data = await s.run("links", lambda p: p.evaluate(LINKS_JS, [20, True]))
        search_path = urllib.parse.urlsplit(url).path
        results = [
            link
            for link in data.get("links", [])
            if urllib.parse.urlsplit(link["href"]).path != search_path
        ]
        listing = render_links(page.url, {"links": results, "total": len(results)})
        page_text = await self.snapshot_text(ctx, elements=False)
        return (
            f"Search results for {args.query!r} (open one with navigate):\n{listing}\n{page_text}"
        )


def browser_tools(config: BrowserConfig | None = None) -> list[Tool]:
    """The eleven browser tools, sharing one config."""
    cfg = config or BrowserConfig()
    classes: list[type[BrowserTool]] = [
        Navigate,
        Back,
        Snapshot,
        Click,
        Type,
        Scroll,
        Find,
        Read,
        Links,
        TakeScreenshot,
        Search,
    ]
    return [cls(cfg) for cls in classes]
