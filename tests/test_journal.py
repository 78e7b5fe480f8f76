"""The journal's typed entries: every kind round-trips through its model, a journal
as today's Fleet writes it reads back, and a damaged line is kept aside, not fatal.

No Docker here: the run directories are made by hand, as a run (or a disk) leaves
them; ``fleet runs`` and ``fleet trace`` are the real commands.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import coordinator as fleet
from coordinator.job.jobfile import parse_job
from coordinator.journal.entries import (
    KINDS,
    LeadSpawnEntry,
    MemberFinishedEntry,
    MemberStartedEntry,
    MemorySavedEntry,
    RunFinishedEntry,
    UnknownEntry,
    entry,
    parse,
    parse_line,
)
from coordinator.rundir.runs import RunDir
from coordinator.traceview import load_run, rollup_run

FLEET = str(Path(sys.executable).with_name("fleet"))

# One entry of every kind, every field set away from its default.
SAMPLES: dict[str, dict[str, Any]] = {
    "run_created": {"name": "n", "members": 2, "pid": 7},
    "run_started": {"pid": 7, "resume": True},
    "run_finished": {"status": "failed", "ok": 1, "members": 2, "error": "engine gone"},
    "run_interrupted": {"status": "interrupted"},
    "plan": {"planner": "offline", "sub_questions": ["a?", "b?"], "lead": True},
    "boxes_kept": {"boxes": ["fleet-x-a"]},
    "merge": {"verdict": "passed", "applied": ["a", "b"], "conflicts": ["c"], "error": "x"},
    "reaped": {"boxes": 3},
    "report_written": {"analyst": "offline", "claims": 4},
    "analyst_failed": {"reason": "no submit_report"},
    "member_queued": {"member": "a", "wave": 2},
    "member_started": {"member": "a", "attempt": 2, "node": "10.0.0.7-a1b2"},
    "member_retry": {
        "member": "a",
        "attempt": 1,
        "status": "crashed",
        "reason": "oom",
        "delay_s": 1.5,
    },
    "member_finished": {
        "member": "a",
        "status": "ok",
        "reason": "r",
        "attempts": 2,
        "turns": 5,
        "input_tokens": 10,
        "output_tokens": 20,
    },
    "fail_fast": {"member": "b", "reason": "raised"},
    "memory_saved": {
        "member": "a",
        "attempt": 1,
        "profile": "/p",
        "key": "run/a/k",
        "files": [{"path": "notes.md", "action": "conflict", "detail": "d", "merged_with": ["b"]}],
        "conflicts": 1,
        "already_saved": True,
        "error": "locked",
    },
    "policy_decision": {
        "member": "a",
        "attempt": 1,
        "call_id": "c1",
        "tool": "shell",
        "input": {"command": "ls"},
        "action": "ask",
        "rule": "r1",
        "allowed": True,
        "by": "terminal",
        "always": True,
        "waited_s": 2.5,
    },
    "approval_requested": {"id": "q1", "member": "a", "tool": "shell", "rule": "r", "sha256": "s"},
    "approval_answered": {
        "id": "q1",
        "member": "a",
        "tool": "shell",
        "rule": "r",
        "allowed": True,
        "always": True,
        "by": "fleet approve",
        "who": "ann",
        "answered_at": "2026-12-01T10:00:00",
        "sha256": "s",
    },
    "approval_abandoned": {"id": "q1", "member": "a", "tool": "t", "rule": "r", "reason": "x"},
    "budget": {
        "usd": 1.0,
        "tokens": 1000,
        "soft": 0.5,
        "spent_usd": 0.25,
        "spent_tokens": 100.0,
        "resume": True,
    },
    "budget_spent": {
        "member": "a",
        "usd": 0.1,
        "tokens": 50.0,
        "spent_usd": 0.35,
        "spent_tokens": 150.0,
    },
    "budget_soft": {"member": "a", "soft": 0.5, "detail": "$0.5 of $1"},
    "budget_hard": {"member": "a", "detail": "$1 of $1"},
    "lead_started": {"model": "offline", "resumed": True},
    "lead_spawn": {
        "call_id": "toolu_1",
        "wave": 1,
        "members": [{"id": "w1-1", "kind": "coding", "task": "t", "checks_claim": {"id": "c"}}],
        "answer": "Wave 1 started",
    },
    "lead_retry": {"attempt": 1, "status": "failed", "reason": "500", "delay_s": 2.0},
    "lead_finished": {
        "status": "ok",
        "reason": "r",
        "turns": 3,
        "tokens": 99,
        "cancelled": ["w2-1"],
    },
}


def test_the_samples_cover_every_kind() -> None:
    assert set(SAMPLES) == set(KINDS)


@pytest.mark.parametrize("kind", sorted(SAMPLES))
def test_every_kind_round_trips_through_its_model_and_its_json_line(kind: str) -> None:
    written = entry(kind, **SAMPLES[kind])
    assert type(written) is KINDS[kind]
    line = written.to_json()
    assert json.loads(line) == {"ts": written.ts, "event": kind, **SAMPLES[kind]}
    read = parse_line(line)
    assert read == written and type(read) is KINDS[kind]


def test_a_writer_naming_a_wrong_kind_or_field_fails_where_it_writes(tmp_path: Path) -> None:
    run = RunDir.create(parse_job(_JOB), _JOB, root=tmp_path)
    with pytest.raises(ValueError, match="no journal entry of kind 'member_finsihed'"):
        run.journal.note("member_finsihed", member="a", status="ok")
    with pytest.raises(ValueError, match="has no field"):
        run.journal.note("member_finished", member="a", status="ok", statsu="ok")
    with pytest.raises(ValueError):  # pydantic's ValidationError: a wrong type
        run.journal.note("member_started", member="a", attempt="first")
    assert [e.event for e in run.journal.read()] == ["run_created"]  # nothing half-written


_JOB = 'name = "old"\n[[members]]\nid = "a"\nkind = "coding"\ntask = "t"\n'
_JOB += '[[members]]\nid = "b"\nkind = "coding"\ntask = "u"\n'

# A journal as Fleet wrote it before its entries had models, line for line (member b
# retried on a cluster node, its memory saved, a lead's spawn, the run's budget).
TODAYS_JOURNAL = """\
{"ts": 1796143698.1, "event": "run_created", "name": "old", "members": 2, "pid": 10261}
{"ts": 1796143698.828, "event": "run_started", "pid": 10261, "resume": false}
{"ts": 1796143698.9, "event": "budget", "usd": 1.0, "tokens": null, "soft": 0.8, \
"spent_usd": 0.0, "spent_tokens": 0, "resume": false}
{"ts": 1796143699.0, "event": "member_queued", "member": "a"}
{"ts": 1796143699.0, "event": "member_queued", "member": "b"}
{"ts": 1796143699.5, "event": "member_started", "member": "a", "attempt": 1}
{"ts": 1796143699.6, "event": "member_started", "member": "b", "attempt": 1, \
"node": "10.0.0.7-a1b2c3"}
{"ts": 1796143700.1, "event": "budget_spent", "member": "a", "usd": 0.01, "tokens": 300, \
"spent_usd": 0.01, "spent_tokens": 300}
{"ts": 1796143711.5025828, "event": "member_retry", "member": "b", "attempt": 1, \
"status": "crashed", "reason": "sandbox crashed: oom-killed", "delay_s": 1.0}
{"ts": 1796143712.6, "event": "member_started", "member": "b", "attempt": 2}
{"ts": 1796143720.0, "event": "memory_saved", "member": "a", "attempt": 1, "profile": "/p", \
"key": "old/a/347e", "files": [{"path": "notes.md", "action": "written"}], "conflicts": 0}
{"ts": 1796143721.0, "event": "member_finished", "member": "a", "status": "ok", "reason": "", \
"attempts": 1, "turns": 52, "input_tokens": 0, "output_tokens": 346}
{"ts": 1796143722.0, "event": "lead_spawn", "call_id": "toolu_offline_0001", "wave": 1, \
"members": [{"id": "a", "kind": "coding", "task": "t"}], "answer": "Wave 1 started: a (coding)."}
{"ts": 1796143730.0, "event": "member_finished", "member": "b", "status": "failed", \
"reason": "test failed", "attempts": 2, "turns": 3, "input_tokens": 10, "output_tokens": 20}
{"ts": 1796143785.75, "event": "report_written", "analyst": "offline", "claims": 0}
{"ts": 1796143785.762, "event": "run_finished", "status": "failed", "ok": 1, "members": 2}
"""


def _old_run(root: Path, journal: str) -> RunDir:
    run = RunDir.create(parse_job(_JOB), _JOB, root=root)
    run.save_members(run.job().members)
    run.journal.path.write_text(journal, encoding="utf-8")
    return run


def test_a_journal_in_todays_format_reads_back_typed_for_runs_resume_and_trace(
    tmp_path: Path,
) -> None:
    run = _old_run(tmp_path, TODAYS_JOURNAL)
    entries = run.journal.read()
    assert not [e for e in entries if isinstance(e, UnknownEntry)]
    assert [json.loads(e.to_json()) for e in entries] == [
        {k: v for k, v in json.loads(line).items() if v is not None}
        for line in TODAYS_JOURNAL.splitlines()
    ]  # the same line written back, but for a null
    started = [e for e in entries if isinstance(e, MemberStartedEntry)]
    assert [(e.member, e.attempt, e.node) for e in started] == [
        ("a", 1, None),
        ("b", 1, "10.0.0.7-a1b2c3"),
        ("b", 2, None),
    ]
    (save,) = [e for e in entries if isinstance(e, MemorySavedEntry)]
    assert save.files[0].action == "written"
    (spawn,) = [e for e in entries if isinstance(e, LeadSpawnEntry)]
    assert spawn.members[0].id == "a" and spawn.members[0].checks_claim is None

    st = run.state()
    assert (st.status, st.members, st.starts) == ("failed", {"a": "ok", "b": "failed"}, {
        "a": 1,
        "b": 2,
    })  # fmt: skip
    assert [m.id for m in run.pending_members(run.job().members, retry_failed=True)] == ["b"]
    traced = load_run(run.path)
    b = traced.member_journals()["b"]
    assert (b.outcome, b.attempts, b.nodes) == (
        ("failed", "test failed"),
        2,
        {1: "10.0.0.7-a1b2c3"},
    )
    assert b.retried == {1: ("crashed", "sandbox crashed: oom-killed")}
    assert traced.waves() == {"a": 1}
    roll = rollup_run(traced)
    assert roll.start == 1796143698.1 and roll.finished

    listed = _fleet(["runs", "--json", "--output-dir", str(tmp_path)])
    assert listed.returncode == 0, listed.stderr
    (row,) = json.loads(listed.stdout)
    assert (row["status"], row["ok"], row["members"]) == ("failed", 1, 2)


DAMAGED = """\
{"ts": 1796143698.828, "event": "run_started", "pid": 10261, "resume": false}
{"ts": 1796143699.0, "event": "member_queued", "member": "a"}
{"event": "member_started", "member": "a", "attempt": 1}
[1, 2, 3]
"not an entry"
{"ts": 1796143700.0, "event": "member_finished", "member": "a"}
{"ts": 1796143700.5, "event": "member_teleported", "member": "a", "to": "mars"}
{"ts": 1796143701.0, "event": "member_finished", "member": "b", "status": "ok", "reason": ""}
{"ts": 1796143702.0, "event": "run_finished", "status": "succeeded", "ok": 1, "members": 2}
{"ts": 17961437
"""


def test_a_damaged_journal_keeps_its_bad_lines_aside_and_fleet_runs_still_lists_it(
    tmp_path: Path,
) -> None:
    created = (
        '{"ts": 1796143698.1, "event": "run_created", "name": "old", "members": 2, "pid": 1}\n'
    )
    run = _old_run(tmp_path, created + DAMAGED)
    entries = run.journal.read()
    unknown = [e for e in entries if isinstance(e, UnknownEntry)]
    assert [(e.event, e.problem) for e in unknown] == [
        ("member_finished", "status: Field required"),
        ("member_teleported", "no entry of kind 'member_teleported'"),
    ]
    assert unknown[1].raw["to"] == "mars"  # kept as it was, for whoever looks
    assert json.loads(unknown[1].to_json()) == unknown[1].raw
    (timeless,) = [e for e in entries if isinstance(e, MemberStartedEntry)]
    assert timeless.ts == 0.0  # no time, not the time it was read
    assert len(entries) == 8  # two lines that are no JSON object, and the torn last one, skipped
    assert isinstance(entries[-1], RunFinishedEntry)

    st = run.state()
    assert (st.status, st.members) == ("succeeded", {"a": "running", "b": "ok"})
    listed = _fleet(["runs", "--json", "--output-dir", str(tmp_path)])
    assert listed.returncode == 0 and listed.stderr == "", listed.stderr
    (row,) = json.loads(listed.stdout)
    assert (row["status"], row["ok"]) == ("succeeded", 1)
    table = _fleet(["runs", "--output-dir", str(tmp_path)])
    assert table.returncode == 0 and run.id in table.stdout, table.stderr
    traced = _fleet(["trace", run.id, "--output-dir", str(tmp_path)])
    assert traced.returncode == 0 and "Traceback" not in traced.stderr, traced.stderr


def test_parse_reads_every_line_a_damaged_file_can_hold() -> None:
    text = "\n\n" + '{"ts": 1, "event": "reaped", "boxes": "many"}\n' + "\x00\x00\n"
    (only,) = parse(text)
    assert isinstance(only, UnknownEntry) and only.problem.startswith("boxes:")


def test_the_entry_models_are_the_apis_names() -> None:
    assert fleet.MemberFinishedEntry is MemberFinishedEntry
    assert fleet.UnknownEntry is UnknownEntry
    names = {cls.__name__ for cls in KINDS.values()}
    assert names <= set(fleet.__all__) and names <= set(dir(fleet))


def _fleet(args: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([FLEET, *args], capture_output=True, text=True, timeout=120)
