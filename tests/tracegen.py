"""Synthetic run directories built from the real trace events, for tests and benches.

``make_run(root, members=N, turns=T)`` writes what a coordinator run leaves behind:
``job.json``, ``journal.jsonl``, ``report.md`` and, per member, ``trace.jsonl``
(written through :class:`subagents.trace.TraceWriter`), ``result.json``, offloaded
results, compaction transcripts and PNG screenshots. Members run "in parallel" with
staggered starts and different speeds (the last one is slow), one member fails with
a model error, and every member offloads and compacts at least once, so a viewer
has every kind of event to show. Everything is derived from a seeded RNG, so a
given (members, turns, seed) always yields the same bytes.

The generator also returns the expected totals it emitted (:class:`Expected`), so
tests compare a viewer's rollup with what was written rather than with itself.
"""

from __future__ import annotations

import json
import random
import struct
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from subagents.trace import (
    Compaction,
    ErrorEvent,
    MemberEnd,
    MemberStart,
    Messages,
    ModelCall,
    Offload,
    Retry,
    SandboxEvent,
    Screenshot,
    Todos,
    ToolCall,
    ToolResult,
    TraceWriter,
)

BASE_TS = 1_760_000_000.0
BOX_DIR = "/tmp/fleet"
"""Where the harness keeps offloads and transcripts in a box (ContextConfig.box_dir)."""
BROWSER_TOOLS = ("navigate", "snapshot", "click", "find", "read", "screenshot", "search")
CODING_TOOLS = ("shell", "read_file", "write_file", "edit_file", "search")
MODEL = "claude-sonnet-4-5"


@dataclass
class MemberExpected:
    """What the generator emitted for one member (the ground truth for tests)."""

    status: str = "ok"
    reason: str = ""
    turns: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0
    tool_calls: int = 0
    errors: int = 0
    offloads: int = 0
    compactions: int = 0
    screenshots: int = 0
    start: float = 0.0
    """When its first box began being created."""
    end: float = 0.0
    box_s: float = 0.0
    """Seconds of box creation, all attempts."""
    attempts: list[tuple[str, str, float, float]] = field(default_factory=list)
    """(status, reason, start, end) of each attempt."""


@dataclass
class Expected:
    run_id: str
    run_dir: Path
    members: dict[str, MemberExpected] = field(default_factory=dict)
    run_start: float = 0.0
    """The journal's run_created time."""
    run_end: float = 0.0
    """The journal's run_finished time (0 while running)."""


def tiny_png(width: int, height: int, seed: int) -> bytes:
    """A small PNG that looks like a web page (header bar, text lines), stdlib only."""
    rng = random.Random(seed)
    accent = (rng.randrange(40, 200), rng.randrange(40, 200), rng.randrange(120, 230))
    rows = []
    lines = {y for y in range(40, height - 10, 14) if rng.random() < 0.8}
    for y in range(height):
        if y < 24:
            row = bytes(accent) * width
        elif y in lines or y - 1 in lines or y - 2 in lines:
            stop = rng.randrange(width // 2, width - 10) if y in lines else width - 10
            row = (
                b"\xf4\xf4\xf4" * 10
                + b"\x55\x5a\x66" * (stop - 10)
                + b"\xf4\xf4\xf4" * (width - stop)
            )
        else:
            row = b"\xf4\xf4\xf4" * width
        rows.append(b"\x00" + row[: width * 3])

    def chunk(tag: bytes, data: bytes) -> bytes:
        body = tag + data
        return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body))

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(b"".join(rows), 6))
        + chunk(b"IEND", b"")
    )


def _tool_input(tool: str, rng: random.Random, turn: int) -> dict[str, Any]:
    if tool in ("navigate",):
        return {"url": f"http://corpus.local/docs/page-{rng.randrange(1, 400)}.html"}
    if tool in ("search",):
        return {"query": rng.choice(["asyncio cancel scope", "task group", "shield"])}
    if tool in ("click",):
        return {"ref": f"e{rng.randrange(1, 90)}"}
    if tool in ("find",):
        return {"text": "cancel"}
    if tool in ("read",):
        return {"chunk": rng.randrange(0, 6)}
    if tool == "shell":
        return {"command": rng.choice(["pytest -q", "ls -la src", "git diff --stat"])}
    if tool in ("read_file", "write_file", "edit_file"):
        data: dict[str, Any] = {"path": f"src/module_{rng.randrange(1, 12)}.py"}
        if tool == "write_file":
            data["content"] = "def f():\n    return 1\n" * rng.randrange(2, 40)
        if tool == "edit_file":
            data |= {"old": "return 1", "new": f"return {turn}"}
        return data
    return {}


def _tool_output(tool: str, rng: random.Random, n_chars: int) -> str:
    words = ("cancel", "scope", "task", "await", "shield", "group", "deadline", "error")
    head = f"[{tool}] "
    text = " ".join(rng.choice(words) for _ in range(n_chars // 6 + 1))
    return (head + text)[:n_chars]


class _MemberGen:
    """Emits one member's events turn by turn, keeping the expected totals."""

    def __init__(self, run_dir: Path, run_id: str, mid: str, kind: str, seed: int) -> None:
        self.dir = run_dir / "members" / mid
        self.rng = random.Random(seed)
        self.mid = mid
        self.kind = kind
        self.writer = TraceWriter(self.dir / "trace.jsonl", run=run_id, member=mid)
        self.exp = MemberExpected()
        self.context = 3_000
        self.slow = 1.0
        """Multiplies model latency and tool durations (the slow member)."""
        self.attempt_start = 0.0
        self.attempt_box = 0.0

    def emit(self, event: Any) -> None:
        self.writer.emit(event)

    def start(self, ts: float, task: str, box_s: float = 0.3) -> float:
        """An attempt: the box is created from ``ts`` (as the fan-out traces it, before
        the harness's member_start), then the member starts; return when it did."""
        self.exp.start = self.exp.start or ts
        self.exp.box_s += box_s
        self.attempt_start, self.attempt_box = ts, box_s
        ts += box_s
        self.emit(SandboxEvent(ts=ts, action="create", box=f"fleet-{self.mid}", duration_s=box_s))
        self.emit(MemberStart(ts=ts, kind=self.kind, task=task, model=MODEL, offline=True))
        self.emit(Messages(ts=ts, messages=[{"role": "user", "content": task}]))
        return ts

    def turn(self, t: int, ts: float, *, final: bool, compact_at: int) -> float:
        """Emit turn ``t`` starting at ``ts``; return the time it ended."""
        rng, exp = self.rng, self.exp
        span = f"{self.mid}/t{t}"
        latency = rng.uniform(0.6, 3.5) * self.slow
        n_tools = 1 if final else rng.choice((1, 1, 1, 2, 3))
        tools = (
            ["submit_result"]
            if final
            else [
                rng.choice(BROWSER_TOOLS if self.kind == "browser" else CODING_TOOLS)
                for _ in range(n_tools)
            ]
        )
        uses = [
            {
                "type": "tool_use",
                "id": f"toolu_{self.mid}_{t}_{i}",
                "name": name,
                "input": _tool_input(name, rng, t),
            }
            for i, name in enumerate(tools)
        ]
        cache_write = rng.randrange(200, 1_500)
        uncached = rng.randrange(20, 120)
        cache_read = max(0, self.context - cache_write - uncached)
        out = rng.randrange(60, 700)
        ts += latency
        text = (
            f"Turn {t}: checking the next source about cancellation before I answer. "
            * rng.randrange(1, 4)
        )
        self.emit(
            ModelCall(
                ts=ts,
                span=span,
                parent=self.mid,
                turn=t,
                model=MODEL,
                stop_reason="tool_use",
                input_tokens=uncached,
                output_tokens=out,
                cache_read_tokens=cache_read,
                cache_write_tokens=cache_write,
                context_tokens=self.context,
                latency_s=latency,
                offline=True,
                content=[{"type": "text", "text": text}, *uses],
            )
        )
        exp.input_tokens += uncached
        exp.output_tokens += out
        exp.cache_read_tokens += cache_read
        exp.cache_write_tokens += cache_write
        exp.turns += 1  # model calls, all attempts
        self.emit(
            Messages(
                ts=ts,
                span=span,
                parent=self.mid,
                turn=t,
                messages=[
                    {"role": "assistant", "content": [{"type": "text", "text": text}, *uses]}
                ],
            )
        )
        ts = self._tools(t, ts, uses)
        self.context += out + rng.randrange(300, 2_500)
        if self.context > compact_at and not final:
            ts = self._compact(t, ts)
        if t % 7 == 1:
            self.emit(
                Todos(
                    ts=ts,
                    span=span,
                    parent=self.mid,
                    turn=t,
                    recited=True,
                    todos=[
                        {
                            "content": "find the primary source",
                            "status": "completed" if t > 1 else "in_progress",
                        },
                        {"content": "verify quotes", "status": "pending"},
                    ],
                )
            )
        return ts

    def _tools(self, t: int, ts: float, uses: list[dict[str, Any]]) -> float:
        rng, exp = self.rng, self.exp
        end = ts
        results = []
        for use in uses:
            cid, name = use["id"], use["name"]
            span = f"{self.mid}/t{t}/{cid}"
            self.emit(
                ToolCall(
                    ts=ts,
                    span=span,
                    parent=f"{self.mid}/t{t}",
                    turn=t,
                    call_id=cid,
                    tool=name,
                    input=use["input"],
                )
            )
            exp.tool_calls += 1
            dur = rng.uniform(0.05, 2.5) * self.slow
            # Every member offloads at least once (turn 2), then about one large read in eight.
            eligible = name != "submit_result"
            big = eligible and (
                (t == 2 and use is uses[0])
                or (name in ("read", "shell", "read_file", "snapshot") and rng.random() < 0.12)
            )
            error = not big and name != "submit_result" and rng.random() < 0.06
            n_chars = rng.randrange(90_000, 240_000) if big else rng.randrange(80, 3_000)
            full = _tool_output(name, rng, n_chars)
            offloaded = None
            if big:
                rel = f"offloads/{cid}.txt"
                (self.dir / "offloads").mkdir(exist_ok=True)
                (self.dir / rel).write_text(full, encoding="utf-8")
                # The harness records the box copy's path (what the model was told).
                offloaded = f"{BOX_DIR}/{rel}"
                self.emit(
                    Offload(
                        ts=ts + dur,
                        span=span,
                        parent=f"{self.mid}/t{t}",
                        turn=t,
                        call_id=cid,
                        path=offloaded,
                        tokens=n_chars // 4,
                    )
                )
                exp.offloads += 1
                shown = (
                    f"Result offloaded to {rel} ({n_chars // 4} tokens). Preview:\n" + full[:600]
                )
            elif error:
                shown = f"ToolError: {name} failed: element e{rng.randrange(90)} is not visible; take a snapshot first."
                exp.errors += 1
            else:
                shown = full
            self.emit(
                ToolResult(
                    ts=ts + dur,
                    span=span,
                    parent=f"{self.mid}/t{t}",
                    turn=t,
                    call_id=cid,
                    tool=name,
                    is_error=error,
                    duration_s=dur,
                    output=shown[:4_000],
                    output_chars=len(shown),
                    truncated=len(shown) > 4_000,
                    offloaded=offloaded,
                )
            )
            if name == "screenshot":
                self._screenshot(t, ts + dur, cid)
            results.append({"type": "tool_result", "tool_use_id": cid, "content": shown[:300]})
            end = max(end, ts + dur)
        self.emit(
            Messages(
                ts=end,
                span=f"{self.mid}/t{t}",
                parent=self.mid,
                turn=t,
                messages=[{"role": "user", "content": results}],
            )
        )
        return end

    def _screenshot(self, t: int, ts: float, cid: str) -> None:
        rel = f"screenshots/t{t:04d}.png"
        (self.dir / "screenshots").mkdir(exist_ok=True)
        (self.dir / rel).write_bytes(tiny_png(320, 200, zlib.crc32(f"{self.mid}{t}".encode())))
        self.emit(
            Screenshot(
                ts=ts,
                span=f"{self.mid}/t{t}/{cid}",
                parent=f"{self.mid}/t{t}",
                turn=t,
                path=rel,
                url=f"http://corpus.local/docs/page-{t}.html",
            )
        )
        self.exp.screenshots += 1

    def _compact(self, t: int, ts: float) -> float:
        before = self.context
        after = 4_000 + self.rng.randrange(0, 2_000)
        rel = f"transcripts/compaction-{self.exp.compactions + 1:03d}.jsonl"
        (self.dir / "transcripts").mkdir(exist_ok=True)
        (self.dir / rel).write_text(
            json.dumps({"turn": t, "tokens": before}) + "\n", encoding="utf-8"
        )
        summary = (
            "## Session intent\nAnswer how asyncio tasks get cancelled and shielded.\n"
            "## Artifacts created\n- notes on CancelledError, Task.cancel(), asyncio.shield()\n"
            f"## Next steps\n- verify the quote on page {t}\n- submit the findings\n"
        )
        ts += self.rng.uniform(2.0, 6.0)
        self.emit(
            Compaction(
                ts=ts,
                span=f"{self.mid}/t{t}",
                parent=self.mid,
                turn=t,
                tokens_before=before,
                tokens_after=after,
                summary=summary,
                transcript_path=f"{BOX_DIR}/{rel}",
            )
        )
        self.context = after
        self.exp.compactions += 1
        return ts

    def end_attempt(self, ts: float, status: str, reason: str) -> None:
        """An attempt the fan-out retries: its end, its box removed, the retry noted."""
        self.emit(MemberEnd(ts=ts, status=status, reason=reason, turns=self.exp.turns,
                            duration_s=round(ts - self.attempt_start, 3)))  # fmt: skip
        self.emit(SandboxEvent(ts=ts, action="close", box=f"fleet-{self.mid}", duration_s=0.2))
        self.emit(Retry(ts=ts, what="member", attempt=len(self.exp.attempts) + 1, reason=reason))
        self.exp.attempts.append((status, reason, self.attempt_start, ts))

    def end(self, ts: float, status: str, reason: str, result: dict[str, Any] | None) -> None:
        exp = self.exp
        exp.status, exp.reason, exp.end = status, reason, ts
        exp.attempts.append((status, reason, self.attempt_start, ts))
        self.emit(SandboxEvent(ts=ts, action="close", box=f"fleet-{self.mid}", duration_s=0.2))
        cost = (
            exp.input_tokens * 3
            + exp.output_tokens * 15
            + exp.cache_read_tokens * 0.3
            + exp.cache_write_tokens * 3.75
        ) / 1e6
        self.emit(
            MemberEnd(
                ts=ts,
                status=status,
                reason=reason,
                turns=exp.turns,
                input_tokens=exp.input_tokens,
                output_tokens=exp.output_tokens,
                cache_read_tokens=exp.cache_read_tokens,
                cache_write_tokens=exp.cache_write_tokens,
                cost_usd=round(cost, 6),
                # The harness times its own part: box start-up is not in it.
                duration_s=round(ts - self.attempt_start - self.attempt_box, 3),
                result=result,
            )
        )
        self.writer.close()
        outcome = {
            "member": self.mid,
            "status": status,
            "reason": reason,
            "result": result,
            "turns": exp.turns,
            "duration_s": round(ts - exp.start, 3),
        }
        (self.dir / "result.json").write_text(json.dumps(outcome, indent=2), encoding="utf-8")


def _journal(run_dir: Path, records: list[dict[str, Any]]) -> None:
    with (run_dir / "journal.jsonl").open("a", encoding="utf-8") as fh:
        for rec in records:
            fh.write(json.dumps(rec) + "\n")


def make_run(
    root: Path,
    *,
    members: int = 4,
    turns: int = 8,
    seed: int = 7,
    run_id: str = "synthetic",
    failed: int | None = 1,
    running: bool = False,
    retried: int | None = None,
    box_s: float = 0.3,
) -> Expected:
    """Write a synthetic run directory under ``root/run_id`` and return what it holds.

    ``failed`` is the index of the member that dies with a model error (None: none);
    the last member is three times slower than the others. ``running=True`` leaves the
    last member without its end event and the run without its report. ``retried`` is
    the index of a member whose first attempt crashes after two turns and is retried
    (None: none). Each box takes ``box_s`` seconds to create (the first member's
    box twice that). The journal records what the coordinator's does: the run
    created a little before the first member starts, and finished after the last.
    """
    run_dir = Path(root) / run_id
    (run_dir / "members").mkdir(parents=True, exist_ok=True)
    question = "How do Python's asyncio tasks get cancelled, and how is work shielded?"
    job = {"name": "synthetic", "kind": "research", "question": question, "members": members,
           "model": MODEL}  # fmt: skip
    (run_dir / "job.json").write_text(json.dumps(job, indent=2), encoding="utf-8")
    exp = Expected(run_id=run_id, run_dir=run_dir, run_start=BASE_TS - 1.2)
    _journal(run_dir, [
        {"ts": BASE_TS - 1.2, "event": "run_created", "name": "synthetic", "members": members},
        {"ts": BASE_TS - 1.0, "event": "run_started", "pid": 1, "resume": False},
    ])  # fmt: skip
    for i in range(members):
        mid = f"m{i + 1:02d}"
        kind = "browser" if i % 3 != 2 else "coding"
        gen = _MemberGen(run_dir, run_id, mid, kind, seed * 1000 + i)
        ts = BASE_TS + i * 1.7
        task = f"Research angle {i + 1}: {question}"
        _journal(run_dir, [{"ts": ts, "event": "member_started", "member": mid, "attempt": 1}])
        ts = gen.start(ts, task, box_s * 2 if i == 0 else box_s)
        n_turns = turns if i != failed else max(1, turns // 2)
        compact_at = max(8_000, int(1_700 * turns * 0.45))
        gen.slow = 3.0 if i == members - 1 and members > 1 else 1.0
        if i == retried:
            ts = _crashed_attempt(gen, run_dir, ts, task, box_s, compact_at)
        for t in range(1, n_turns + 1):
            final = i != failed and t == n_turns
            ts = gen.turn(t, ts, final=final, compact_at=compact_at)
        if running and i == members - 1:
            gen.writer.close()
            exp.members[mid] = gen.exp
            exp.members[mid].status = "running"
            continue
        if i == failed:
            _model_failure(gen, ts, n_turns)
        else:
            gen.end(ts + 0.5, "ok", "", _findings(i))
        _journal(run_dir, [{"ts": gen.exp.end, "event": "member_finished", "member": mid,
                            "status": gen.exp.status, "reason": gen.exp.reason,
                            "attempts": len(gen.exp.attempts)}])  # fmt: skip
        exp.members[mid] = gen.exp
    if not running:
        exp.run_end = max(m.end for m in exp.members.values()) + 0.9
        _journal(run_dir, [{"ts": exp.run_end, "event": "run_finished", "status": "partial"}])
        (run_dir / "report.md").write_text(
            f"# Report\n\n{question}\n\nSynthetic run.\n", encoding="utf-8"
        )
    return exp


CRASH = "sandbox crashed: oom-killed"


def _crashed_attempt(
    gen: _MemberGen, run_dir: Path, ts: float, task: str, box_s: float, compact_at: int
) -> float:
    """Two turns, then the box dies; the fan-out retries after a 1 s back-off.
    Returns when the second attempt's member started (its turns count from 1 again)."""
    for t in (1, 2):
        ts = gen.turn(t, ts, final=False, compact_at=compact_at)
    gen.end_attempt(ts + 0.1, "crashed", CRASH)
    _journal(run_dir, [{"ts": ts + 0.1, "event": "member_retry", "member": gen.mid,
                        "attempt": 1, "status": "crashed", "reason": CRASH, "delay_s": 1.0}])  # fmt: skip
    ts += 1.1
    _journal(run_dir, [{"ts": ts, "event": "member_started", "member": gen.mid, "attempt": 2}])
    return gen.start(ts, task, box_s)


def _model_failure(gen: _MemberGen, ts: float, turn: int) -> None:
    gen.emit(Retry(ts=ts + 1, turn=turn, what="model", attempt=3, reason="overloaded_error"))
    gen.emit(ErrorEvent(ts=ts + 2, turn=turn, error="ModelError",
                        message="overloaded_error after 3 retries"))  # fmt: skip
    gen.exp.errors += 1
    gen.end(ts + 2, "failed", "ModelError: overloaded_error after 3 retries", None)


def _findings(i: int) -> dict[str, Any]:
    return {
        "summary": f"Angle {i + 1}: tasks are cancelled with Task.cancel().",
        "claims": [
            {
                "text": "cancel() requests cancellation",
                "source_url": "http://corpus.local/docs/page-1.html",
                "quote": "Request the Task to be cancelled.",
            }
        ],
        "open_questions": [],
        "confidence": 0.8,
        "verified": {
            "quotes_checked": 1,
            # The first member's is long, so a view must cut it and say where the rest is.
            "output_tail": "\n".join(f"test_{n:03d} PASSED" for n in range(400 if i == 0 else 3)),
        },
    }
