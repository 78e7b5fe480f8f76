"""What one MCP server flooding its stdout costs the coordinator and a sibling member.

Two coding boxes of one run, each with a stdio MCP server started in it by the same
code a run uses (``subagents.tools.mcp.serve_servers``): the sibling's server answers
``echo`` at once, and the sibling calls it back to back the whole time; the flooder's
server answers ``flood`` with one line of ``--mb`` MB and no newline until its end.
Printed: the sibling's call latency before the flood (median) and during it (max,
and its excess over that median: the delay), and this process's (the coordinator's)
resident memory at its peak during the flood above what it held before. A flood that
is still being read after ``--give-up-s`` seconds is stopped (the old code reads a
200 MB line for many minutes); the figures then cover that much of it.

Run: ``.venv/bin/python bench/mcp_flood.py [--mb 200]``. With ``PYTHONPATH`` set to
another checkout, the same script measures that checkout's code. Every box belongs to
one run (``bench-<hex>``), removed at the end.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

# Run as a script, this file's folder comes first on sys.path and its name would
# shadow the ``sandbox`` package.
_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _HERE]

import anyio  # noqa: E402

from sandbox.docker.backend import DockerBackend  # noqa: E402
from sandbox.spec import SandboxSpec  # noqa: E402
from subagents.tools.base import ToolContext  # noqa: E402
from subagents.tools.mcp import McpServerSpec, serve_servers  # noqa: E402
from subagents.trace import TraceWriter  # noqa: E402

SERVER = r"""
import json, sys
for line in sys.stdin:
    msg = json.loads(line)
    if "id" not in msg:
        continue
    method, params = msg["method"], msg.get("params") or {}
    result = {}
    if method == "initialize":
        result = {"protocolVersion": params.get("protocolVersion"), "capabilities": {"tools": {}},
                  "serverInfo": {"name": "bench", "version": "1"}}
    elif method == "tools/list":
        result = {"tools": [{"name": n, "inputSchema": {"type": "object"}} for n in ("echo", "flood")]}
    elif method == "tools/call" and params["name"] == "flood":
        for _ in range(int(sys.argv[1])):
            sys.stdout.buffer.write(b"x" * 1000000)
        sys.stdout.buffer.write(b"\n")
        sys.stdout.flush()
        continue
    elif method == "tools/call":
        result = {"content": [{"type": "text", "text": "tick"}]}
    sys.stdout.write(json.dumps({"jsonrpc": "2.0", "id": msg["id"], "result": result}) + "\n")
    sys.stdout.flush()
"""


class Rss:
    """This process's resident memory, sampled every 10 ms on a thread of its own."""

    def __init__(self) -> None:
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()

    @staticmethod
    def now() -> int:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

    def reset(self) -> int:
        self.peak = self.now()
        return self.peak

    def _watch(self) -> None:
        while not self._stop.wait(0.01):
            self.peak = max(self.peak, self.now())

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


async def serve(
    tg: Any, backend: DockerBackend, run: str, member: str, mb: int, root: Path
) -> tuple[dict[str, Any], ToolContext]:
    box = await backend.create(SandboxSpec(), run=run, member=member)
    spec = McpServerSpec(name=member, command=f"python3 server.py {mb}", files=str(root))
    stop = anyio.Event()
    tools = await tg.start(serve_servers, [spec], box, stop)
    if isinstance(tools, Exception):
        raise SystemExit(f"{member}'s server did not start: {tools}")
    trace = TraceWriter(root / f"{member}.jsonl", run=run, member=member)
    ctx = ToolContext(sandbox=box, run_dir=root, trace=trace, member=member)
    return {t.name.rsplit("__", 1)[-1]: t for t in tools} | {"stop": stop, "box": box}, ctx


async def call(tool: Any, ctx: ToolContext) -> tuple[float, bool]:
    start = time.perf_counter()
    try:
        out = await tool.run(tool.Input(), ctx)
        failed = out.is_error
    except Exception:
        failed = True
    return time.perf_counter() - start, failed


async def bench(mb: int, give_up_s: float) -> None:
    backend = DockerBackend()
    run = f"bench-{uuid.uuid4().hex[:10]}"
    rss = Rss()
    try:
        with tempfile.TemporaryDirectory() as tmp:
            root = Path(tmp)
            (root / "server.py").write_text(SERVER)
            async with anyio.create_task_group() as tg:
                sib, sib_ctx = await serve(tg, backend, run, "sibling", 0, root)
                fl, fl_ctx = await serve(tg, backend, run, "flooder", mb, root)
                before = [(await call(sib["echo"], sib_ctx))[0] for _ in range(50)]
                base = rss.reset()
                flood: dict[str, Any] = {}

                async def flooding() -> None:
                    flood["took"], flood["failed"] = await call(fl["flood"], fl_ctx)

                during: list[float] = []
                started = 0.0
                with anyio.move_on_after(give_up_s) as scope:
                    async with anyio.create_task_group() as inner:
                        inner.start_soon(flooding)
                        await anyio.sleep(0.05)
                        while "took" not in flood:
                            started = time.perf_counter()
                            during.append((await call(sib["echo"], sib_ctx))[0])
                if scope.cancelled_caught:  # the call cut off took at least this long
                    during.append(time.perf_counter() - started)
                peak = rss.peak
                for side in (sib, fl):
                    side["stop"].set()
        median = statistics.median(before)
        print(f"flood: one line of {mb} MB from the flooder's server")
        if scope.cancelled_caught:
            print(f"  the flood was still being read after {give_up_s:g} s: stopped there")
        else:
            ended = "an error result" if flood["failed"] else "a result"
            print(f"  the flooder's call ended after {flood['took']:.2f} s, as {ended}")
        print(f"  sibling calls: median {median * 1000:.1f} ms before the flood")
        if during:
            worst = max(during)
            print(
                f"  sibling calls during the flood: {len(during)}, slowest {worst * 1000:.0f} ms "
                f"(delay {max(worst - median, 0) * 1000:.0f} ms; goal < 1000 ms)"
            )
        print(
            f"  coordinator RSS: {base / 2**20:.0f} MiB before, peak {peak / 2**20:.0f} MiB "
            f"(+{(peak - base) / 2**20:.0f} MiB; goal < 64 MiB)"
        )
    finally:
        rss.stop()
        with anyio.CancelScope(shield=True):
            await backend.remove_run(run)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mb", type=int, default=200, help="the line's size in MB")
    parser.add_argument("--give-up-s", type=float, default=120.0)
    args = parser.parse_args()
    anyio.run(bench, args.mb, args.give_up_s)


if __name__ == "__main__":
    main()
