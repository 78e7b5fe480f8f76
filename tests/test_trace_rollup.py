"""`fleet trace RUN [MEMBER] [--json]`: rollup and member detail against what was written."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import tracegen

from coordinator.cli import main
from coordinator.traceview import load_run, member_detail, rollup_run
from subagents.trace import MemberEnd, ModelCall, TraceWriter

FLEET = str(Path(sys.executable).parent / "fleet")


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory: pytest.TempPathFactory) -> tracegen.Expected:
    return tracegen.make_run(tmp_path_factory.mktemp("runs"), members=5, turns=10, seed=3)


def test_rollup_numbers_match_the_events_written(synthetic: tracegen.Expected) -> None:
    roll = rollup_run(load_run(synthetic.run_dir))
    assert [r.member for r in roll.members] == sorted(synthetic.members)
    for row in roll.members:
        exp = synthetic.members[row.member]
        assert (row.status, row.reason) == (exp.status, exp.reason)
        assert row.turns == exp.turns
        assert row.input_tokens == exp.input_tokens
        assert row.output_tokens == exp.output_tokens
        assert row.cache_read_tokens == exp.cache_read_tokens
        assert row.cache_write_tokens == exp.cache_write_tokens
        assert row.tool_calls == exp.tool_calls
        assert row.errors == exp.errors
        assert row.offloads == exp.offloads >= 1
        assert row.compactions == exp.compactions >= 1
        assert row.screenshots == exp.screenshots
        assert row.duration_s == pytest.approx(exp.end - exp.start, abs=0.01)
        assert row.cost_usd > 0 and not row.cost_estimated
    assert roll.finished
    assert roll.statuses == {"ok": 4, "failed": 1}
    assert roll.totals["tool_calls"] == sum(m.tool_calls for m in synthetic.members.values())


def test_member_detail_marks_offloads_and_compactions(synthetic: tracegen.Expected) -> None:
    run = load_run(synthetic.run_dir)
    member = run.members[0]
    detail = member_detail(member, limit=200)
    marks = [m for t in detail.turns for m in t.marks]
    offloads = [m for m in marks if m.kind == "offload"]
    compactions = [m for m in marks if m.kind == "compaction"]
    exp = synthetic.members[member.id]
    assert len(offloads) == exp.offloads and len(compactions) == exp.compactions
    # The trace records box paths (/tmp/fleet/offloads/...); views point at the run copy.
    assert all(m.path.startswith(f"{detail.dir}/") for m in offloads + compactions)
    assert all((synthetic.run_dir / m.path).is_file() for m in offloads + compactions)
    assert all(
        "Session intent" in c.summary and c.tokens_after < c.tokens_before for c in compactions
    )
    assert [t.turn for t in detail.turns] == list(range(1, exp.turns + 1))
    tools = [x for t in detail.turns for x in t.tools]
    assert len(tools) == exp.tool_calls and all(len(x.output) <= 200 for x in tools)
    # A result cut in the view names the file with the full text.
    cut = [x for x in tools if x.truncated]
    assert cut and all(x.ref.startswith(f"members/{member.id}/") for x in cut)
    offloaded = [x for x in tools if x.offloaded]
    assert offloaded and all(
        x.ref == f"members/{member.id}/offloads/{(x.offloaded or '-').rsplit('/', 1)[-1]}"
        and (synthetic.run_dir / x.ref).is_file()
        for x in offloaded
    )
    assert detail.result is not None and "summary" in detail.result


def test_cli_table_and_member_detail(
    synthetic: tracegen.Expected, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["trace", str(synthetic.run_dir)]) == 0
    table = capsys.readouterr().out
    for mid, exp in synthetic.members.items():
        line = next(ln for ln in table.splitlines() if ln.startswith(mid))
        assert exp.status in line
    assert "ModelError: overloaded_error" in table
    failed = next(mid for mid, e in synthetic.members.items() if e.status == "failed")
    assert main(["trace", str(synthetic.run_dir), failed]) == 0
    text = capsys.readouterr().out
    assert "[OFFLOAD]" in text and "[COMPACTION]" in text and "result: none" in text
    assert text.count("\nturn ") == synthetic.members[failed].turns


def test_json_is_valid_and_stable(synthetic: tracegen.Expected) -> None:
    cmd = [FLEET, "trace", str(synthetic.run_dir), "--json"]
    first = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    second = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    assert first == second
    data = json.loads(first)
    assert list(data) == [
        "run",
        "finished",
        "start",
        "end",
        "duration_s",
        "members",
        "totals",
        "statuses",
        "memory",
        "setups",
    ]
    assert [m["member"] for m in data["members"]] == sorted(synthetic.members)
    detail = json.loads(
        subprocess.run(
            [*cmd[:-1], "m01", "--json"], capture_output=True, text=True, check=True
        ).stdout
    )
    assert detail["rollup"]["member"] == "m01"
    assert len(detail["turns"]) == synthetic.members["m01"].turns


def test_bad_run_or_member_is_a_usage_error(synthetic: tracegen.Expected, tmp_path: Path) -> None:
    cmd = [FLEET, "trace"]
    missing = subprocess.run([*cmd, str(tmp_path / "nope")], capture_output=True, text=True)
    assert missing.returncode == 2 and "Traceback" not in missing.stderr
    assert "no run directory" in missing.stderr
    member = subprocess.run([*cmd, str(synthetic.run_dir), "zz"], capture_output=True, text=True)
    assert member.returncode == 2 and "m01" in member.stderr


def test_running_member_and_journal_fallback(tmp_path: Path) -> None:
    exp = tracegen.make_run(tmp_path, members=3, turns=4, running=True)
    roll = rollup_run(load_run(exp.run_dir))
    assert not roll.finished
    assert [r.status for r in roll.members][-1] == "running"
    # A member whose box died before it wrote anything: the journal's word stands.
    with (exp.run_dir / "journal.jsonl").open("a") as fh:
        fh.write(json.dumps({"event": "member_finished", "member": "m09", "status": "crashed",
                             "reason": "SandboxCrashed: OOM-killed"}) + "\n")  # fmt: skip
        fh.write(json.dumps({"event": "run_finished", "status": "failed"}) + "\n")
    roll = rollup_run(load_run(exp.run_dir))
    assert roll.finished
    ghost = roll.members[-1]
    assert (ghost.member, ghost.status, ghost.reason) == (
        "m09",
        "crashed",
        "SandboxCrashed: OOM-killed",
    )
    assert roll.members[-2].status == "incomplete"


def test_torn_last_line_is_skipped(tmp_path: Path) -> None:
    writer = TraceWriter(tmp_path / "r" / "members" / "a" / "trace.jsonl", run="r", member="a")
    writer.emit(ModelCall(ts=10.0, turn=1, model="m", input_tokens=5, output_tokens=7, latency_s=1))
    writer.emit(MemberEnd(ts=11.0, status="ok"))
    writer.close()
    with (tmp_path / "r" / "members" / "a" / "trace.jsonl").open("a") as fh:
        fh.write('{"type": "model_call", "model": "m", "input_tok')
    row = rollup_run(load_run(tmp_path / "r")).members[0]
    assert (row.turns, row.input_tokens, row.output_tokens, row.status) == (1, 5, 7, "ok")
    assert row.cost_estimated


@pytest.fixture(scope="module")
def retried(tmp_path_factory: pytest.TempPathFactory) -> tracegen.Expected:
    """m02's first attempt crashes and is retried; every box takes 2.5 s (m01's 5 s)."""
    root = tmp_path_factory.mktemp("runs")
    return tracegen.make_run(root, members=3, turns=5, seed=4, failed=0, retried=1, box_s=2.5)


def test_times_include_box_start_up_and_run_wall_comes_from_the_journal(
    retried: tracegen.Expected,
) -> None:
    roll = rollup_run(load_run(retried.run_dir))
    for row in roll.members:
        exp = retried.members[row.member]
        assert row.start == pytest.approx(exp.start, abs=0.01)
        assert row.duration_s == pytest.approx(exp.end - exp.start, abs=0.01)
        assert row.box_s == pytest.approx(exp.box_s) and row.box_s >= 2.5
        assert row.per_attempt[0].ready == pytest.approx(exp.start + (row.box_s / row.attempts))
    # The run's wall time spans planning and synthesis too (journal), not just members.
    assert roll.start == pytest.approx(retried.run_start)
    assert roll.duration_s == pytest.approx(retried.run_end - retried.run_start, abs=0.01)
    assert roll.duration_s > max(r.end for r in roll.members) - min(r.start for r in roll.members)


def test_retried_member_shows_each_attempt(retried: tracegen.Expected) -> None:
    run = load_run(retried.run_dir)
    roll = rollup_run(run)
    row = next(r for r in roll.members if r.member == "m02")
    exp = retried.members["m02"]
    assert (row.status, row.attempts, row.turns) == ("ok", 2, exp.turns)
    assert [(a.status, a.reason) for a in row.per_attempt] == [
        ("crashed", tracegen.CRASH),
        ("ok", ""),
    ]
    for got, (_, _, start, end) in zip(row.per_attempt, exp.attempts, strict=True):
        assert (got.start, got.end) == (pytest.approx(start), pytest.approx(end))
    assert [a.turns for a in row.per_attempt] == [2, exp.turns - 2]
    # The total covers both attempts and the back-off between them.
    assert row.duration_s == pytest.approx(exp.end - exp.start, abs=0.01)
    assert row.duration_s > sum(a.duration_s for a in row.per_attempt)
    assert roll.totals["attempts"] == 4
    # The member's turns are kept apart per attempt (each attempt counts from turn 1).
    detail = member_detail(run.members[1], rollup=row)
    assert [(t.attempt, t.turn) for t in detail.turns] == [(1, 1), (1, 2)] + [
        (2, n) for n in range(1, exp.turns - 1)
    ]


def test_cli_shows_attempts_and_what_time_measures(
    retried: tracegen.Expected, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["trace", str(retried.run_dir)]) == 0
    out = capsys.readouterr().out
    header = out.splitlines()[2].split()
    assert header[:6] == ["MEMBER", "KIND", "STATUS", "ATT", "WALL", "BOX"]
    m02 = next(ln.split() for ln in out.splitlines() if ln.startswith("m02"))
    assert m02[2:4] == ["ok", "2"]
    assert "WALL = from the member's first box starting to its last event" in out
    assert main(["trace", str(retried.run_dir), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    row = next(r for r in data["members"] if r["member"] == "m02")
    assert row["attempts"] == 2 and [a["status"] for a in row["per_attempt"]] == ["crashed", "ok"]
    assert main(["trace", str(retried.run_dir), "m02"]) == 0
    out = capsys.readouterr().out
    assert f"attempt 1  crashed: {tracegen.CRASH}" in out
    assert out.index("-- attempt 1 --") < out.index("-- attempt 2 --")


def test_a_box_made_instead_of_one_that_waited_for_the_setup_is_the_same_attempt() -> None:
    from coordinator.traceview.rollup import split_attempts
    from subagents.trace import MemberStart, SandboxEvent

    def box(action: str, name: str, **detail: str) -> SandboxEvent:
        return SandboxEvent(action=action, box=name, detail=detail)

    start = MemberStart(kind="coding", task="t", model="m")
    end = MemberEnd(status="ok")
    # The box that waited was let go (its tree did not lay); another was made instead.
    waited = [
        box("setup_start", ""),
        box("create", "b1", waits_for="setup"),
        box("setup", "snap"),
        start,
        box("lay", "b1", ok="false"),
        box("create", "b2", replaces="b1"),
        end,
        box("close", "b2"),
    ]
    assert split_attempts(waited) == [0]
    # A retry after it is an attempt of its own, as before.
    assert split_attempts([*waited, box("create", "b3"), start, end]) == [0, 8]
    # Without the mark, a second create in one attempt still begins another.
    plain = [box("create", "b1"), start, box("create", "b2"), end]
    assert split_attempts(plain) == [0, 2]
