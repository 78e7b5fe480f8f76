"""Coordinator CPU per turn as a user pays it: the whole process, a real box, measured from outside.

    .venv/bin/python bench/turn_cpu.py [--turns 10,100,200] [--repeats 3] [--latency-ms 0]
        [--sdk-calls 100]
    .venv/bin/python bench/turn_cpu.py --profile FILE [--turns 200]
    .venv/bin/python bench/turn_cpu.py --split [--turns 100] [--repeats 3]

One coding member runs through the Python API (:func:`coordinator.api.run_async`, the
job's defaults, the analyst off) in its own Docker box; each turn the model asks for
``ls /`` and the last turn submits. The model is the fake Messages API in *another
process* (this script with ``--serve``). That process reads the coordinator's CPU
clock (``clock_gettime`` on the coordinator's process CPU clock: every thread, live
or ended, nanoseconds) as each request arrives; the figure is the CPU between the
member's second and last model call, over the turns between them. So the set-up
(preflight, run directory, box start: reported apart, from the API call to the first
model call) is out, and everything a turn costs is in: the
tool call's way to the box and back, the trace and journal writes, the progress, the
model client, and every thread the process keeps busy meanwhile (the Docker SDK's, the
pool's, anyio's workers).

``bench/harness.py`` measures the loop alone (tools in-process, their CPU subtracted);
this script is the same member with its real box and the rest of a run around it.

The column "in the model call" is the part of it spent inside
``AnthropicModel.complete`` (the process's CPU from entering it to its return, wrapped
by this script, for the same calls): building and sending the request, reading the
stream, the governor. The rest of a turn is the column before it minus this one.

**The floor beside it** (issue 43, goal 3: a turn within the client's own cost per
call). After each member, in the same process, against the same fake API process,
the official client as a user of it would call it - ``anthropic.AsyncAnthropic`` with
its defaults (its own httpx transport, its own retries) and ``messages.create`` with a
small body (the task as one user message, ``max_tokens`` 1024, no tools, no system;
the answer is the same ``shell`` tool call a turn gets) - ``--sdk-calls`` times; its
figure is this process's CPU per call (``process_time``: every thread, the clock the
turn figure is read from), median after five warm-up calls. The two alternate member
by member, so each turn figure has a floor taken in the same minute, and the table
gives their ratio: the goal is <= 1.00x. It lives here rather than in
``bench/model_call.py`` because the goal is the whole turn (a real box, the
transcript, the trace), which only this script measures.

``--profile FILE`` runs one member under :mod:`cProfile` on every thread
(``threading.setprofile``) and writes the stats, for ``python -m pstats``; the top
entries by own time are printed.

``--split`` says where a turn's CPU goes without a profiler's weight (cProfile costs
each Python call a few microseconds, so it inflates the many small calls of a turn
several times over and shifts the shares): the process's CPU clock is read on entering
and leaving each part of the turn - the model call, the tool calls (and within them the
box's ``exec``), the transcript's saves and fsync, the trace events written outside the
tool calls, the context's preparation - over the same span as the turn figure, and the
event loop's iterations are counted. "rest" is the turn minus the parts: the loop's own
steps, the event loop, the progress and journal listeners.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import pstats
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import anyio

# bench/sandbox.py would shadow the sandbox package: the script's directory goes.
ROOT = Path(__file__).resolve().parent.parent
sys.path[0] = str(ROOT)

PLAN = re.compile(r"PLAN\[(\d+):(\w+)\]")


def serve(coordinator: int, latency_s: float) -> None:
    """The fake Messages API: ``ls /`` until the plan's turns are done, then submit.
    Each request's arrival is stamped with the coordinator's process CPU time."""
    from subagents.fake_api import FakeMessagesAPI, tool_use

    clock = ((~coordinator) << 3) | 2  # the CPU clock of process `coordinator` (Linux)
    stamps: dict[str, list[float]] = {}
    lock = threading.Lock()

    def policy(body: dict[str, Any]) -> Any:
        cpu = time.clock_gettime(clock)
        found = PLAN.search(json.dumps(body["messages"][0]))
        assert found is not None, "no PLAN[...] in the task"
        turns, nonce = int(found.group(1)), found.group(2)
        with lock:
            stamps.setdefault(nonce, []).append(cpu)
            step = len(stamps[nonce]) - 1
        if step >= turns - 1:
            return tool_use(
                "submit_result",
                {"summary": "done", "tests_run": [], "notes": []},
                latency_s=latency_s,
            )
        return tool_use("shell", {"command": "ls /"}, latency_s=latency_s)

    api = FakeMessagesAPI(policy).start()
    api.record = lambda entry: None  # type: ignore[method-assign]  # keep no bodies
    print(api.url, flush=True)
    for line in sys.stdin:  # "NONCE": answer that member's stamps
        with lock:
            print(json.dumps(stamps.get(line.strip(), [])), flush=True)
    api.stop()


def job(turns: int, nonce: str) -> dict[str, Any]:
    return {
        "name": "turn-cpu",
        "model": {"name": "claude-sonnet-5"},
        "members": [
            {
                "id": "m0",
                "kind": "coding",
                "task": f"List the root directory. PLAN[{turns}:{nonce}]",
                "limits": {"max_turns": turns + 5},
            }
        ],
        "synthesis": {"enabled": False},
    }


async def one_member(turns: int, nonce: str, out: Path) -> None:
    from coordinator.api import run_async

    summary = await run_async(job(turns, nonce), output_dir=out)
    outcome = summary.outcomes["m0"]
    assert outcome.status == "ok" and outcome.turns == turns, outcome


class Server:
    def __init__(self, latency_s: float) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, __file__, "--serve", str(os.getpid()), str(latency_s)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout is not None and self.proc.stdin is not None
        self.url = self.proc.stdout.readline().strip()

    def stamps(self, nonce: str) -> list[float]:
        assert self.proc.stdout is not None and self.proc.stdin is not None
        self.proc.stdin.write(nonce + "\n")
        self.proc.stdin.flush()
        return list(json.loads(self.proc.stdout.readline()))

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.proc.wait(timeout=10)


_NONCE = iter(range(1, 1_000_000))
_CALLS: list[float] = []
"""CPU of each ``AnthropicModel.complete`` call of the member being measured (s)."""


def time_model_calls() -> None:
    """Record the process's CPU inside every ``AnthropicModel.complete`` in :data:`_CALLS`."""
    from subagents.model.claude import AnthropicModel

    complete = AnthropicModel.complete

    async def timed(self: AnthropicModel, request: Any) -> Any:
        started = time.process_time()
        try:
            return await complete(self, request)
        finally:
            _CALLS.append(time.process_time() - started)

    AnthropicModel.complete = timed  # type: ignore[method-assign]


def per_turn_ms(server: Server, turns: int, out: Path) -> tuple[float, float, float]:
    """CPU per turn between the member's second and last model call, CPU from the API
    call to its first model call (preflight, run directory, box start), and the model
    calls' own CPU per turn over the same span (the second call to the one before the
    last), in ms."""
    nonce = f"n{next(_NONCE)}"
    _CALLS.clear()
    start = time.process_time()  # the clock the server reads from outside
    anyio.run(one_member, turns, nonce, out)
    stamps = server.stamps(nonce)
    assert len(stamps) == turns, (len(stamps), turns)
    assert len(_CALLS) == turns, (len(_CALLS), turns)
    in_calls = sum(_CALLS[1:-1]) / (turns - 2) * 1_000
    return (stamps[-1] - stamps[1]) / (turns - 2) * 1_000, (stamps[0] - start) * 1_000, in_calls


async def sdk_call_ms(url: str, calls: int) -> float:
    """The official client's own CPU per ``messages.create`` call with a small body (ms,
    median after five warm-up calls: its connection, its platform look-up)."""
    import anthropic

    nonce = f"s{next(_NONCE)}"  # a plan too long to end: every answer is `ls /`
    client = anthropic.AsyncAnthropic(api_key="bench-key", base_url=url)
    samples: list[float] = []
    try:
        for _ in range(calls + 5):
            started = time.process_time()
            message = await client.messages.create(
                model="claude-sonnet-5",
                max_tokens=1024,
                messages=[{"role": "user", "content": f"List /. PLAN[1000000000:{nonce}]"}],
            )
            samples.append((time.process_time() - started) * 1_000)
            assert message.content[0].type == "tool_use", message
    finally:
        await client.close()
    return statistics.median(samples[5:])


def profile(turns: int, out: Path, dest: Path) -> None:
    """One member under cProfile on every thread; the top entries by own time."""
    profiles: list[cProfile.Profile] = []

    def thread_profile(*_: Any) -> None:
        # Runs at a new thread's first event: give that thread a profiler of its own.
        threading.setprofile(None)  # this thread only from here on
        prof = cProfile.Profile(time.thread_time)
        profiles.append(prof)
        prof.enable()

    main = cProfile.Profile(time.thread_time)
    threading.setprofile(thread_profile)
    main.enable()
    anyio.run(one_member, turns, f"p{next(_NONCE)}", out)
    main.disable()
    threading.setprofile(None)
    stats = pstats.Stats(main)
    for prof in profiles:
        prof.disable()
        stats.add(prof)
    stats.dump_stats(dest)
    stats.sort_stats("tottime").print_stats(25)
    stats.sort_stats("cumulative").print_stats(40)


class Split:
    """CPU of the parts of a turn (see ``--split``), summed between the member's second
    and last model call, the span the turn figure covers."""

    PARTS = (
        ("model call", "subagents.model.claude", "AnthropicModel", "complete"),
        ("  of which the body's encoding", "subagents.model.wire", "BodyEncoder", "encode"),
        (
            "  of which the stream: sent, read, decoded",
            "subagents.model.claude",
            "AnthropicModel",
            "_stream_once",
        ),
        (
            "  of which sent, to the answer's head",
            "subagents.model.sdk_request",
            "DirectRequest",
            "stream",
        ),
        ("tool calls", "subagents.loop.tool_calls", "ToolCalls", "run"),
        ("  of which the box's exec", "sandbox.docker.backend", "DockerSandbox", "exec"),
        ("transcript: save", "subagents.loop.conversation", "Conversation", "save"),
        ("transcript: fsync", "subagents.loop.conversation", "Conversation", "sync"),
        ("trace events (outside the tool calls)", "subagents.trace", "TraceWriter", "emit"),
        ("context: prepare", "subagents.context.manager", "ContextManager", "prepare"),
    )

    def __init__(self) -> None:
        self.cpu: dict[str, float] = dict.fromkeys([p[0] for p in self.PARTS], 0.0)
        self.on = False
        self.calls = 0
        self.turns = 0
        self.iterations = 0
        self._depth = 0

    def install(self, turns: int) -> None:
        import asyncio
        import importlib

        self.turns = turns
        for name, module, cls_name, attr in self.PARTS:
            cls = getattr(importlib.import_module(module), cls_name)
            setattr(cls, attr, self._wrap(name, getattr(cls, attr)))
        loop_cls = asyncio.base_events.BaseEventLoop
        run_once = loop_cls._run_once  # type: ignore[attr-defined]

        def counted(loop: Any) -> None:
            self.iterations += self.on
            run_once(loop)

        loop_cls._run_once = counted  # type: ignore[attr-defined]

    def _wrap(self, name: str, func: Any) -> Any:
        import inspect

        nested = name.startswith("  ")  # inside another part: counted apart, not subtracted
        first = name == "model call"
        outside = name.startswith("trace events")

        def enter() -> tuple[float, bool]:
            if first:  # the member's n-th model call starts: the span is calls 2..last
                self.calls += 1
                self.on = 2 <= self.calls < self.turns
            counts = self.on and (nested or not (outside and self._depth))
            if not nested:
                self._depth += 1
            return time.process_time(), counts

        def leave(started: float, counts: bool) -> None:
            if not nested:
                self._depth -= 1
            if counts:
                self.cpu[name] += time.process_time() - started

        if inspect.iscoroutinefunction(func):

            async def timed_async(*args: Any, **kwargs: Any) -> Any:
                started, counts = enter()
                try:
                    return await func(*args, **kwargs)
                finally:
                    leave(started, counts)

            return timed_async

        def timed(*args: Any, **kwargs: Any) -> Any:
            started, counts = enter()
            try:
                return func(*args, **kwargs)
            finally:
                leave(started, counts)

        return timed

    def reset(self) -> None:
        self.cpu = dict.fromkeys(self.cpu, 0.0)
        self.on, self.calls, self.iterations, self._depth = False, 0, 0, 0


def split(server: Server, turns: int, repeats: int, out: Path) -> None:
    """The parts of a turn, ``repeats`` members of ``turns`` turns (see ``--split``)."""
    parts = Split()
    parts.install(turns)
    per_turn: list[float] = []
    shares: dict[str, list[float]] = {name: [] for name in parts.cpu}
    loops: list[float] = []
    span = turns - 2
    for _ in range(repeats):
        parts.reset()
        whole = per_turn_ms(server, turns, out)[0]
        per_turn.append(whole)
        for name, cpu in parts.cpu.items():
            shares[name].append(cpu / span * 1_000)
        loops.append(parts.iterations / span)
    med = statistics.median
    print(f"Where a turn's CPU goes, {turns} turns, median of {repeats} members\n")
    print("| part | ms per turn | share |\n|---|---:|---:|")
    whole = med(per_turn)
    for name, values in shares.items():
        label = name.strip()
        label = f"- {label}" if name.startswith("  ") else label
        print(f"| {label} | {med(values):.3f} | {med(values) / whole:.0%} |")
    top = sum(med(v) for n, v in shares.items() if not n.startswith("  "))
    print(f"| rest | {whole - top:.3f} | {(whole - top) / whole:.0%} |")
    print(f"| the whole turn | {whole:.3f} | 100% |")
    print(f"\nevent-loop iterations per turn: {med(loops):.1f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--turns", default="10,100,200")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--latency-ms", type=float, default=0.0, help="fake model latency per call")
    ap.add_argument(
        "--sdk-calls", type=int, default=100, help="the client's own calls beside each member"
    )
    ap.add_argument("--profile", type=Path, default=None, help="write cProfile stats here")
    ap.add_argument("--split", action="store_true", help="where a turn's CPU goes, part by part")
    ap.add_argument("--serve", nargs=2, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.serve:
        serve(int(args.serve[0]), float(args.serve[1]))
        return
    server = Server(args.latency_ms / 1000)
    os.environ["ANTHROPIC_BASE_URL"] = server.url
    os.environ["ANTHROPIC_API_KEY"] = "bench-key"
    counts = [int(t) for t in args.turns.split(",")]
    try:
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp)
            print(f"load average: {' '.join(f'{x:.2f}' for x in os.getloadavg())}\n")
            time_model_calls()
            per_turn_ms(server, 10, out)  # warm-up: imports, the image's layers
            if args.profile:
                profile(max(counts), out, args.profile)
                return
            if args.split:
                split(server, max(counts), args.repeats, out)
                return
            anyio.run(sdk_call_ms, server.url, 5)  # warm-up: the client's imports
            rows = [
                "| turns | CPU per turn, median (ms) | min | max | in the model call, "
                "median (ms) | CPU before the first model call, median (ms) | the client's "
                "`messages.create`, median (ms) | turn / client, median (pairs) |",
                "|---:|---:|---:|---:|---:|---:|---:|---:|",
            ]
            for turns in counts:
                runs, floors = [], []
                for _ in range(args.repeats):  # alternating: a member, then the client
                    runs.append(per_turn_ms(server, turns, out))
                    floors.append(anyio.run(sdk_call_ms, server.url, args.sdk_calls))
                per = [r[0] for r in runs]
                ratios = [r[0] / f for r, f in zip(runs, floors, strict=True)]
                rows.append(
                    f"| {turns} | {statistics.median(per):.2f} | {min(per):.2f} | "
                    f"{max(per):.2f} | {statistics.median(r[2] for r in runs):.2f} | "
                    f"{statistics.median(r[1] for r in runs):.1f} | "
                    f"{statistics.median(floors):.2f} | {statistics.median(ratios):.2f}x "
                    f"({', '.join(f'{x:.2f}' for x in ratios)}) |"
                )
            rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
            print(
                "Coordinator CPU per turn, one coding member with its Docker box (`ls /` a "
                f"turn), fake model {args.latency_ms:.0f} ms a call in another process\n"
            )
            print("\n".join(rows))
            print(
                f"\ncoordinator peak RSS {rss:.0f} MiB; load average after: "
                f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}"
            )
    finally:
        server.close()


if __name__ == "__main__":
    main()
