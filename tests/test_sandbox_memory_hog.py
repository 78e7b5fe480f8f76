"""A memory hog in a browser box costs only itself, under runc and under gVisor alike.

Under runc the host kernel's OOM killer picks the hog and Chromium goes on. Under
gVisor the host sees one process, the Sentry, holding every program's memory: left
alone, a hog past the box's memory ends the whole box, Chromium with it. Each test
below starts a hostile program through ``exec`` in a browser box with Chromium up,
then proves that the hog is gone (its ``exec`` reports it killed or refused), that
Chromium still renders a page over CDP and that the box is not reported crashed.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from typing import Any

import anyio
import pytest
from conftest import missing_dependency

from sandbox.base import ExecResult
from sandbox.docker import gvisor
from sandbox.docker.backend import DockerBackend, DockerSandbox
from sandbox.errors import SandboxCrashed
from sandbox.spec import NetworkPolicy, SandboxSpec

pytestmark = [pytest.mark.docker, pytest.mark.anyio]

MEMORY = "512m"
"""The browser box's memory: every hog below tries for more than this."""
DISK = "64m"
"""Its ``/tmp`` and ``/workspace``."""

ONE_HOG = "chunks = []\nwhile True: chunks.append(b'x' * (8 << 20))"
"""One process that allocates and touches memory until it is stopped."""
SEVERAL = (
    "import os, sys, time\n"
    "for _ in range(8):\n"
    "    if os.fork() == 0:\n"
    "        b = b'x' * (160 << 20); time.sleep(5); os._exit(0)\n"
    "codes = [os.wait()[1] for _ in range(8)]\n"
    "sys.exit(0 if not any(codes) else 1)\n"
)
"""Eight processes of 160 MiB each: each under the box's memory, together past all of it
(its programs' share and its disks'); exits 1 when any of them did not finish."""
FORK_BOMB = (
    "import os\n"
    "while True:\n"
    "    try:\n"
    "        os.fork()\n"
    "    except OSError:\n"
    "        pass\n"
    "    chunks = [b'x' * (4 << 20) for _ in range(64)]\n"
)
"""Processes that multiply and each allocate 256 MiB (a fork bomb of allocators)."""
RAISE_AND_MAP = (
    "import mmap, resource\n"
    "soft, hard = resource.getrlimit(resource.RLIMIT_AS)\n"
    "try:\n"
    "    resource.setrlimit(resource.RLIMIT_AS, (resource.RLIM_INFINITY,) * 2)\n"
    "    print('raised', flush=True)\n"
    "except (ValueError, OSError):\n"
    "    print('kept', flush=True)\n"
    "try:\n"
    "    m = mmap.mmap(-1, 64 << 30, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)\n"
    "    print('mapped', flush=True)\n"
    "except OSError:\n"
    "    print('not mapped', flush=True)\n"
    "chunks = []\n"
    "while True: chunks.append(b'x' * (8 << 20))\n"
)
"""Tries to lift its own memory limit and map 64 GiB, then allocates without end."""
HOGS = (
    "import os, time\n"
    "for _ in range(6):\n"
    "    if os.fork() == 0:\n"
    "        b = b'x' * (160 << 20); time.sleep(3); os._exit(0)\n"
    "for _ in range(6):\n"
    "    os.wait()\n"
)
"""Six allocators of 160 MiB: each under the per-process cap, together past the box."""
ESCAPED = (
    f"import os, sys, time\nHOGS = {HOGS!r}\n"
    "if os.fork() == 0:\n"
    "    os.setsid()\n"
    "    if os.fork() == 0:\n"
    "        hog = HOGS\n"
    "        os.execve(sys.executable, [sys.executable, '-c', hog], {})\n"
    "    os._exit(0)\n"
    "os.wait()\n"
    "time.sleep(0.5)\n"
    "def hogs():\n"
    "    for pid in filter(str.isdigit, os.listdir('/proc')):\n"
    "        try:\n"
    "            with open(f'/proc/{pid}/cmdline', 'rb') as f:\n"
    "                args = f.read()\n"
    "            with open(f'/proc/{pid}/stat', 'rb') as f:\n"
    "                state = f.read().rsplit(b')', 1)[1].split()[0]\n"
    "        except (OSError, IndexError):\n"
    "            continue\n"
    "        if b'(160 << 20); time' in args and state != b'Z' and int(pid) != os.getpid():\n"
    "            yield pid\n"
    "for _ in range(1200):\n"
    "    if not list(hogs()):\n"
    "        print('hog gone'); break\n"
    "    time.sleep(0.05)\n"
)
"""Allocators that leave their command's session and drop its environment (the
command's marker with it) while the command waits for them to be gone."""
LEFT = (
    "import os\n"
    "def args(pid):\n"
    "    try:\n"
    "        return open(f'/proc/{pid}/cmdline', 'rb').read()\n"
    "    except OSError:\n"
    "        return b''\n"
    "me = str(os.getpid())\n"
    "print(sum(b'<< 20); time' in args(p) for p in os.listdir('/proc') if p.isdigit() and p != me))\n"
)
"""How many of those allocators still run."""


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    return "asyncio"


class _Boxes:
    """One browser box per runtime for the whole module, made again only when a test
    left it dead: a test here proves the box outlives its hog, so the next test may
    take it (a gVisor browser box takes about 10 s to start)."""

    def __init__(self, backend: DockerBackend, runtime: str, run: str) -> None:
        self.backend, self.runtime, self.run = backend, runtime, run
        self.box: DockerSandbox | None = None
        self.made = 0

    async def get(self) -> DockerSandbox:
        if self.box is not None and self.box.looks_alive():
            try:
                await self.box.check()
                return self.box
            except SandboxCrashed:
                pass
        if self.box is not None:
            await self.box.close()
        self.made += 1
        # Small disks: the box's memory is ``MEMORY`` plus what its tmpfs mounts may hold.
        spec = SandboxSpec(
            kind="browser",
            runtime=self.runtime,
            memory=MEMORY,
            tmpfs_size=DISK,
            workspace_size=DISK,
            network=NetworkPolicy(egress="allowlist"),
        )
        made = await self.backend.create(
            spec, run=self.run, member=f"hog-{self.runtime}-{self.made}"
        )
        assert isinstance(made, DockerSandbox)
        assert await renders(made, "before") == "before"
        self.box = made
        return made


@pytest.fixture(scope="module", params=["runc", "gvisor"])
async def boxes(
    request: pytest.FixtureRequest, docker_client: Any, images: Any
) -> AsyncIterator[_Boxes]:
    from conftest import remove_run

    from sandbox.docker.reaper import mark_done, mark_live

    runtime = request.param
    if runtime == "gvisor" and gvisor.missing_runtimes(docker_client.info()):
        missing_dependency("the engine lacks Fleet's gVisor runtimes; run 'fleet setup --gvisor'")
    run = f"test-hog-{uuid.uuid4().hex[:12]}"
    mark_live(run)
    held = _Boxes(DockerBackend(docker_client, images=images), runtime, run)
    try:
        yield held
    finally:
        if held.box is not None:
            await held.box.close()
        remove_run(docker_client, run)
        mark_done(run)


@pytest.fixture
async def browser(boxes: _Boxes) -> DockerSandbox:
    return await boxes.get()


async def renders(box: DockerSandbox, text: str) -> str:
    """Chromium in ``box`` renders ``text`` over CDP and evaluates JS on it."""
    from playwright.async_api import async_playwright

    with anyio.fail_after(60):
        async with async_playwright() as pw:
            chromium = await pw.chromium.connect_over_cdp(await box.cdp_endpoint())
            try:
                page = await (chromium.contexts or [await chromium.new_context()])[0].new_page()
                await page.set_content(f"<h1>{text}</h1>")
                shown = await page.inner_text("h1")
                assert await page.evaluate("6 * 7") == 42
                await page.close()
                return shown
            finally:
                await chromium.close()


def hog_ended(res: ExecResult) -> bool:
    """The hog's ``exec`` says it did not get its memory: refused or killed."""
    refused = res.exit_code == 1 and "MemoryError" in res.stderr
    killed = res.exit_code == 137 or res.oom_killed
    return refused or killed


async def run_hog(box: DockerSandbox, program: str, *, timeout: float = 120) -> ExecResult:
    """Run ``program`` with ``python3 -c``; then the box must live and Chromium render."""
    res = await box.exec(["python3", "-c", program], timeout=timeout)
    await box.check()
    assert box.looks_alive()
    alive = await box.exec("echo alive", timeout=30)
    assert alive.stdout == "alive\n", (alive, res)
    assert await renders(box, "after the hog") == "after the hog", res
    return res


async def test_one_hog_costs_only_itself(browser: DockerSandbox) -> None:
    res = await run_hog(browser, ONE_HOG)
    assert hog_ended(res), res


async def test_several_processes_that_together_pass_memory_cost_only_themselves(
    browser: DockerSandbox,
) -> None:
    if browser.spec.runtime == "gvisor":
        # The guard looks every 10 ms; eight processes filling their memory at once can
        # pass the host's room for its lag first on a loaded machine, and then the whole
        # box ends (docs/security.md). What must hold either way: the command is ended,
        # and a box that ended says so, by name, to the next call.
        try:
            res = await run_hog(browser, SEVERAL)
        except SandboxCrashed as exc:
            assert exc.reason == "oom-killed", exc
            return
    else:
        res = await run_hog(browser, SEVERAL)
    assert res.exit_code in (1, 137) or res.oom_killed, res  # not all held their memory


async def test_a_fork_bomb_of_allocators_costs_only_itself(browser: DockerSandbox) -> None:
    res = await run_hog(browser, FORK_BOMB, timeout=60)
    assert not res.ok, res


async def test_a_hog_that_lifts_its_limit_and_maps_without_touching_costs_only_itself(
    browser: DockerSandbox,
) -> None:
    res = await run_hog(browser, RAISE_AND_MAP)
    assert hog_ended(res), res
    if browser.spec.runtime == "gvisor":  # a hard cap: it can neither lift it nor map past it
        assert res.stdout.splitlines()[:2] == ["kept", "not mapped"], res


ESCAPE_LIMIT = (
    "known limit under gVisor: allocators that left their command's session are found by "
    "reading the process table, which waits on processes busy faulting pages in; the "
    "host's limit is reached first and its OOM killer takes a stub of Chromium's"
)


# Under gVisor this attack is not claimed (ESCAPE_LIMIT, and docs/security.md): the
# escaped allocators are not found in time, and the box's later commands are ended by
# the guard while they hold the memory. So it runs under runc alone.
@pytest.mark.parametrize("boxes", ["runc"], indirect=True)
async def test_a_hog_that_left_its_session_and_environment_costs_only_itself(
    browser: DockerSandbox,
) -> None:
    res = await run_hog(browser, ESCAPED)
    # runc's OOM killer ends allocators one by one and the command sees them gone.
    assert res.stdout == "hog gone\n", res
    left = await browser.exec(["python3", "-c", LEFT], timeout=30)
    assert left.stdout == "0\n", left


async def test_a_command_within_the_boxs_memory_is_left_alone(browser: DockerSandbox) -> None:
    """The guard ends hogs only: 300 MiB held for two seconds, beside Chromium, is fine."""
    res = await run_hog(
        browser, "import time; b = b'x' * (300 << 20); time.sleep(2); print('kept')"
    )
    assert (res.exit_code, res.stdout, res.oom_killed) == (0, "kept\n", False), res


SCORES = (
    "import os\n"
    "r, w = os.pipe()\n"
    "for _ in range(4):\n"
    "    if os.fork() == 0:\n"
    "        os.write(w, open('/proc/self/oom_score_adj', 'rb').read()); os._exit(0)\n"
    "for _ in range(4):\n"
    "    os.wait()\n"
    "os.close(w)\n"
    "kids = os.read(r, 4096).decode().split()\n"
    "agent = [p for p in os.listdir('/proc') if p.isdigit() and int(p) != os.getpid()\n"
    "         and b'/boxagent' in open(f'/proc/{p}/cmdline', 'rb').read()]\n"
    "print(*sorted(set(kids)), *(open(f'/proc/{p}/oom_score_adj').read().strip() for p in agent))\n"
)
"""Four processes forked as the command's first act report their OOM scores; then the
agent's score."""


async def test_a_command_and_what_it_forks_at_once_are_the_oom_killers_first_choice(
    browser: DockerSandbox,
) -> None:
    """A command's score is set before its first instruction, not a moment after it
    starts: eight allocators forked at once, each smaller than Chromium, must not keep
    the score Chromium has. The agent keeps its own (and stays out of a command's
    reach: ``test_a_command_cannot_attach_to_or_read_the_box_agent``)."""
    seen = []
    for _ in range(25):
        res = await browser.exec(["cat", "/proc/self/oom_score_adj"], timeout=30)
        seen.append(res.stdout.strip())
    assert set(seen) == {"1000"}, seen
    for _ in range(5):
        res = await browser.exec(["python3", "-c", SCORES], timeout=30)
        assert res.stdout.split() == ["1000", "0"], res
