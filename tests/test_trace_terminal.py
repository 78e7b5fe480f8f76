"""``fleet trace`` on a terminal: what a model, a page or a box wrote is printed with
nothing that the terminal would act on - no escape sequence that clears the screen,
sets the window title or rewrites a line, no bidi control that reorders what follows."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import tracegen

from coordinator.cli import main
from coordinator.traceview.follow import follow
from subagents.trace import MemberEnd, MemberStart, ModelCall, ToolCall, ToolResult, TraceWriter

ATTACK = "ok\x1b[2J\x1b]0;pwned\x07\x1b[1A\rall tests passed \u202egnp.exe\u202c \x9b31m"


def _hostile_member(run_dir: Path, mid: str = "m-hostile") -> None:
    ts = tracegen.BASE_TS + 5
    w = TraceWriter(run_dir / "members" / mid / "trace.jsonl", run=run_dir.name, member=mid)
    for ev in [
        MemberStart(ts=ts, kind="coding", task=ATTACK, model="claude-sonnet-5"),
        ModelCall(ts=ts + 1, turn=1, model="claude-sonnet-5", stop_reason="tool_use",
                  content=[{"type": "text", "text": ATTACK}]),
        ToolCall(ts=ts + 1, turn=1, call_id="c1", tool="shell", input={"command": ATTACK}),
        ToolResult(ts=ts + 2, turn=1, call_id="c1", tool="shell", output=ATTACK),
        MemberEnd(ts=ts + 3, status="failed", reason=ATTACK),
    ]:  # fmt: skip
        w.emit(ev)
    w.close()
    outcome = {"member": mid, "status": "failed", "reason": ATTACK, "result": {"summary": ATTACK}}
    (run_dir / "members" / mid / "result.json").write_text(json.dumps(outcome))
    with (run_dir / "journal.jsonl").open("a", encoding="utf-8") as fh:
        for rec in (
            {"ts": ts, "event": "member_started", "member": mid, "attempt": 1},
            {"ts": ts + 3, "event": "member_finished", "member": mid, "status": "failed",
             "reason": ATTACK, "attempts": 1},
        ):  # fmt: skip
            fh.write(json.dumps(rec) + "\n")


def _safe(out: str) -> None:
    assert "\x1b" not in out and "\x07" not in out and "\x9b" not in out and "\r" not in out
    assert "\u202e" not in out and "\u202c" not in out
    assert "\\u001b" in out and "\\u202e" in out  # shown, as escapes


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    made = tracegen.make_run(tmp_path, members=1, turns=1)
    _hostile_member(made.run_dir)
    return made.run_dir


def test_fleet_trace_prints_no_escape_a_member_wrote(
    run_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["trace", str(run_dir)]) == 0
    _safe(capsys.readouterr().out)
    assert main(["trace", str(run_dir), "m-hostile"]) == 0
    out = capsys.readouterr().out
    _safe(out)
    assert "all tests passed" in out  # the text itself is all there


def test_fleet_trace_follow_prints_no_escape_a_member_wrote(run_dir: Path) -> None:
    lines: list[str] = []

    class Out:
        def write(self, text: str) -> int:
            lines.append(text)
            return len(text)

        def flush(self) -> None:
            pass

    assert follow(run_dir, Out(), interval=0.05) == 0  # type: ignore[arg-type]
    _safe("".join(lines))
