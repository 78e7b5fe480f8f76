"""`fleet trace RUN --follow` sees events appended while it runs, and exits with the run."""

from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import threading
import time
from pathlib import Path

import tracegen

from subagents.trace import (
    MemberEnd,
    MemoryFileSave,
    MemorySave,
    ModelCall,
    ToolCall,
    ToolResult,
    TraceWriter,
)

FLEET = str(Path(sys.executable).parent / "fleet")


def _reader(proc: subprocess.Popen[str]) -> queue.Queue[str]:
    lines: queue.Queue[str] = queue.Queue()

    def pump() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.put(line)

    threading.Thread(target=pump, daemon=True).start()
    return lines


def _wait_for(lines: queue.Queue[str], needle: str, seen: list[str], timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            seen.append(lines.get(timeout=0.2))
        except queue.Empty:
            continue
        if needle in seen[-1]:
            return
    raise AssertionError(f"{needle!r} not printed within {timeout}s; got:\n{''.join(seen)}")


def test_follow_prints_appended_events_and_exits_at_run_end(tmp_path: Path) -> None:
    exp = tracegen.make_run(tmp_path, members=2, turns=3, running=True)
    live = sorted(exp.members)[-1]
    proc = subprocess.Popen(
        [FLEET, "trace", str(exp.run_dir), "--follow", "--interval", "0.1"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        lines, seen = _reader(proc), []
        _wait_for(lines, "following", seen)
        assert "RUNNING" in "".join(seen)
        writer = TraceWriter(
            exp.run_dir / "members" / live / "trace.jsonl", run=exp.run_id, member=live
        )
        now = time.time()
        writer.emit(
            ModelCall(ts=now, turn=41, model="claude-sonnet-4-5", output_tokens=321, latency_s=1.0)
        )
        writer.emit(ToolCall(ts=now, turn=41, call_id="c41", tool="navigate",
                             input={"url": "http://corpus.local/needle-41"}))  # fmt: skip
        _wait_for(lines, "needle-41", seen)
        assert proc.poll() is None, "follow must keep running while the run is not over"
        writer.emit(ToolResult(ts=now + 1, turn=41, call_id="c41", tool="navigate", output="x" * 77,
                               output_chars=77, duration_s=1.0))  # fmt: skip
        conflict = MemoryFileSave(path="notes.md", action="conflict")
        writer.emit(MemorySave(ts=now + 2, profile="/p/shared", key="k", files=[conflict]))
        writer.emit(MemberEnd(ts=now + 2, status="ok", turns=41, duration_s=9.0))
        writer.close()
        _wait_for(lines, "END ok", seen)
        assert any("MEMORY saved 1 file(s), 1 CONFLICT(s) -> /p/shared" in ln for ln in seen)
        assert any("<- navigate ok 77 chars" in ln for ln in seen)
        with (exp.run_dir / "journal.jsonl").open("a") as fh:
            fh.write(json.dumps({"event": "run_finished", "status": "partial"}) + "\n")
        assert proc.wait(timeout=30) == 0
        _wait_for(lines, "finished", seen, timeout=5)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_follow_on_a_finished_run_prints_it_and_returns(tmp_path: Path) -> None:
    exp = tracegen.make_run(tmp_path, members=2, turns=2)
    done = subprocess.run([FLEET, "trace", str(exp.run_dir), "-f", "--interval", "0.05"],
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert done.returncode == 0
    assert done.stdout.count("finished") >= 2 and "m02" in done.stdout


def _run_without_events(tmp_path: Path, owner_pid: int) -> Path:
    """A run the journal says started (owned by ``owner_pid``) with one member queued
    and no member event yet - the moment before a box comes up, or a killed run."""
    from coordinator.job.jobfile import parse_job
    from coordinator.rundir.runs import RunDir

    text = 'name = "waiting"\n[[members]]\nid = "a"\nkind = "coding"\ntask = "t"\n'
    run = RunDir.create(parse_job(text), text, root=tmp_path)
    run.save_members(run.job().members)
    run.journal.note("run_started", pid=owner_pid, resume=False)
    (run.path / "live.json").write_text(json.dumps({"pid": owner_pid, "since": time.time()}))
    run.journal.note("member_queued", member="a")
    return run.path


def test_a_running_run_with_no_member_event_yet_has_a_sane_wall_time_and_a_queued_member(
    tmp_path: Path,
) -> None:
    path = _run_without_events(tmp_path, owner_pid=os.getpid())
    time.sleep(0.3)
    done = subprocess.run([FLEET, "trace", str(path), "--json"], capture_output=True, text=True)
    roll = json.loads(done.stdout)
    assert not roll["finished"] and 0.3 <= roll["duration_s"] < 60
    (member,) = roll["members"]
    assert (member["member"], member["kind"], member["status"]) == ("a", "coding", "queued")


def test_a_member_that_never_started_in_a_killed_run_is_not_started(tmp_path: Path) -> None:
    gone = subprocess.Popen(["true"])
    gone.wait()
    path = _run_without_events(tmp_path, owner_pid=gone.pid)
    done = subprocess.run([FLEET, "trace", str(path)], capture_output=True, text=True)
    row = next(line for line in done.stdout.splitlines() if line.startswith("a "))
    assert row.split()[2] == "not_started" and "incomplete" not in row, done.stdout
