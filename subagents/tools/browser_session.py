"""One browser member's session: Playwright on the host, Chromium in the member's box.

The harness connects with ``connect_over_cdp`` to the CDP endpoint the browser box
hands out, so Playwright, its driver and the API key stay on the host and the box
holds nothing but Chromium. Each member has its own box, hence its own Chromium and
profile: nothing (cookies, storage, cache) is shared between members.

Every action runs under two clocks: Playwright's own timeout (the action or
navigation timeout of :class:`~subagents.browser.config.BrowserConfig`) and an outer
``anyio.fail_after`` a little longer, because a browser that stops answering (box
frozen or killed, CDP socket half-open) never trips Playwright's clock. Failures
come back to the model as :class:`~subagents.tools.base.ToolError` with what to do;
when the browser is gone the box is checked first, so a dead box surfaces as
:class:`~sandbox.errors.SandboxCrashed` (the member ends ``crashed``) and a live box
with a lost connection gets one reconnect.

One Playwright driver process serves every session in a process (reference-counted
per event loop): starting it costs a Node process and about half a second, and
sessions share nothing through it but the pipe.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any, TypeVar

import anyio
from playwright.async_api import Browser, CDPSession, Page, Playwright, async_playwright
from playwright.async_api import Error as PlaywrightError
from playwright.async_api import TimeoutError as PlaywrightTimeout

from sandbox.base import Sandbox

from ..browser.ax import ax_nodes, merge
from ..browser.config import BrowserConfig
from ..browser.dom import SNAPSHOT_JS, PageView
from .base import ToolError

T = TypeVar("T")
_GRACE_S = 5.0
_GONE = ("has been closed", "Target closed", "Browser closed", "Connection closed", "crashed")


class BrowserGone(ToolError):
    """The browser cannot be reached any more (and the box itself is still up)."""


class _Driver:
    """The process-wide Playwright driver, shared by reference count per event loop."""

    _by_loop: dict[int, tuple[Playwright, int]] = {}  # noqa: RUF012 - process-wide by design
    _lock: dict[int, asyncio.Lock] = {}  # noqa: RUF012

    @classmethod
    async def acquire(cls) -> Playwright:
        key = id(asyncio.get_running_loop())
        async with cls._lock.setdefault(key, asyncio.Lock()):
            pw, n = cls._by_loop.get(key, (None, 0))
            if pw is None:
                pw = await async_playwright().start()
            cls._by_loop[key] = (pw, n + 1)
            return pw

    @classmethod
    async def release(cls) -> None:
        key = id(asyncio.get_running_loop())
        async with cls._lock.setdefault(key, asyncio.Lock()):
            pw, n = cls._by_loop.get(key, (None, 0))
            if pw is None:
                return
            if n <= 1:
                del cls._by_loop[key]
                await pw.stop()
            else:
                cls._by_loop[key] = (pw, n - 1)


class BrowserSession:
    """Drives the Chromium of one browser box; create with :meth:`open`."""

    def __init__(self, sandbox: Sandbox | None, endpoint: str, config: BrowserConfig) -> None:
        self.sandbox = sandbox
        self.endpoint = endpoint
        self.config = config
        self._pw: Playwright | None = None
        self._browser: Browser | None = None
        self._page: Page | None = None
        self._cdp: tuple[Page, CDPSession] | None = None
        self.page_crashed = False

    @classmethod
    async def open(
        cls, sandbox: Sandbox | None, config: BrowserConfig, *, endpoint: str | None = None
    ) -> BrowserSession:
        """Connect to the box's Chromium (``endpoint`` overrides the box's own)."""
        if endpoint is None:
            if sandbox is None:
                raise ToolError("this member has no browser box; browser tools cannot run")
            endpoint = await sandbox.cdp_endpoint()
        session = cls(sandbox, endpoint, config)
        session._pw = await _Driver.acquire()
        try:
            await session._connect()
        except BaseException:
            await session.close()
            raise
        return session

    async def _connect(self) -> None:
        assert self._pw is not None
        deadline = self.config.connect_timeout_s
        try:
            with anyio.fail_after(deadline + _GRACE_S):
                self._browser = await self._pw.chromium.connect_over_cdp(
                    self.endpoint, timeout=deadline * 1000
                )
        except (TimeoutError, PlaywrightError) as exc:
            await self._check_box()
            raise BrowserGone(
                f"could not connect to the browser at {self.endpoint} within {deadline:g}s "
                f"({_first_line(exc)})"
            ) from None
        contexts = self._browser.contexts
        context = contexts[0] if contexts else await self._browser.new_context()
        pages = [p for p in context.pages if not p.is_closed()]
        self._page = pages[0] if pages else await context.new_page()
        await self._prepare(self._page)

    async def _prepare(self, page: Page) -> None:
        page.set_default_timeout(self.config.action_timeout_s * 1000)
        page.set_default_navigation_timeout(self.config.navigation_timeout_s * 1000)
        w, h = self.config.viewport
        await page.set_viewport_size({"width": w, "height": h})
        page.on("crash", lambda _p: setattr(self, "page_crashed", True))

    async def close(self) -> None:
        """Drop the CDP connection (the box and its Chromium are the backend's to remove)."""
        browser, self._browser, self._page, self._cdp = self._browser, None, None, None
        if browser is not None:
            with anyio.move_on_after(5), anyio.CancelScope(shield=True):
                try:
                    await browser.close()
                except PlaywrightError:
                    pass
        if self._pw is not None:
            self._pw = None
            with anyio.CancelScope(shield=True):
                await _Driver.release()

    @property
    def connected(self) -> bool:
        return self._browser is not None and self._browser.is_connected()

    @property
    def current_url(self) -> str:
        """The open page's URL ("" when no page is open); no reconnect is tried."""
        page = self._page
        return "" if page is None or page.is_closed() else page.url

    async def page(self) -> Page:
        """The live page, reconnecting or reopening a crashed tab once if needed."""
        if not self.connected:
            await self._check_box()
            await self._reconnect()
        assert self._page is not None and self._browser is not None
        if self.page_crashed or self._page.is_closed():
            self.page_crashed = False
            context = self._page.context
            self._page = await context.new_page()
            await self._prepare(self._page)
            raise ToolError(
                "the tab crashed or was closed; a fresh blank tab is open - navigate again"
            )
        return self._page

    async def _reconnect(self) -> None:
        self._browser, self._cdp = None, None
        try:
            await self._connect()
        except BrowserGone as exc:
            raise BrowserGone(f"the browser is gone and reconnecting failed: {exc}") from None

    async def _check_box(self) -> None:
        """Raise ``SandboxCrashed`` if the box died (the member then ends ``crashed``)."""
        if self.sandbox is not None:
            await self.sandbox.check()

    async def run(
        self, what: str, action: Callable[[Page], Awaitable[T]], *, navigation: bool = False
    ) -> T:
        """Run ``action`` on the page under the per-action timeouts (see module doc)."""
        page = await self.page()
        limit = self.config.navigation_timeout_s if navigation else self.config.action_timeout_s
        try:
            with anyio.fail_after(limit + _GRACE_S):
                return await action(page)
        except TimeoutError:
            await self._check_box()
            raise ToolError(
                f"{what} did not finish within {limit:g}s and was abandoned; the page may "
                "be slow or stuck - try snapshot, or navigate elsewhere"
            ) from None
        except PlaywrightTimeout as exc:
            raise ToolError(f"{what} timed out after {limit:g}s: {_first_line(exc)}") from None
        except PlaywrightError as exc:
            msg = _first_line(exc)
            if any(s in msg for s in _GONE) or not self.connected:
                await self._check_box()
                if self.page_crashed:
                    await self.page()  # reopens the tab and raises a ToolError saying so
                raise BrowserGone(
                    f"{what} failed because the browser connection was lost ({msg}); "
                    "the next call reconnects - try again once"
                ) from None
            raise ToolError(f"{what} failed: {msg}") from None

    async def _cdp_for(self, page: Page) -> CDPSession:
        """A CDP session attached to ``page`` (one per tab, made on first use)."""
        if self._cdp is None or self._cdp[0] is not page:
            self._cdp = (page, await page.context.new_cdp_session(page))
        return self._cdp[1]

    async def view(self, *, elements: bool = True) -> PageView:
        """The current page: text and refs from :data:`SNAPSHOT_JS`, roles and names
        from the accessibility tree (:mod:`subagents.browser.ax`); with
        ``elements=False`` the text only (refs of the last snapshot stay valid)."""
        max_el = self.config.max_elements

        async def _read(page: Page) -> dict[str, Any]:
            data = await page.evaluate(SNAPSHOT_JS, [max_el, elements])
            listed = data["elements"]
            if not listed:
                return data
            named = merge(listed, await ax_nodes(await self._cdp_for(page), len(listed)))
            data["total_elements"] -= len(listed) - len(named)
            data["elements"] = named
            return data

        return PageView.model_validate(await self.run("snapshot", _read))


@asynccontextmanager
async def browser_session(
    sandbox: Sandbox | None, config: BrowserConfig, *, endpoint: str | None = None
) -> AsyncIterator[BrowserSession]:
    """A session closed on exit, whatever happened."""
    session = await BrowserSession.open(sandbox, config, endpoint=endpoint)
    try:
        yield session
    finally:
        await session.close()


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[0][:300]
