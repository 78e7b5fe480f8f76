"""Members sharing one memory profile, through the real CLI: real boxes, the real harness,
the real ``anthropic`` client against the fake Messages API on 127.0.0.1.

Every member edits ``notes.md`` of the profile ``shared`` and then waits at a gate in
the fake API before it submits (and so before it saves): the gate opens only when
every member has loaded the profile and made its edit, so each save really lands on
a profile that others changed since its member loaded it. The merge rules themselves
are proven on files in tests/test_memory_merge.py.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from fleet_policies import memory_policy
from test_cli_run import _job, _member

from coordinator.cli import main
from coordinator.rundir.runs import RunDir

pytestmark = pytest.mark.docker
FLEET = [str(Path(sys.executable).with_name("fleet"))]
SHARED = '{ profile = "shared" }'
GATE_S = 180.0
"""How long a member waits at the gate for the others (box start-up on a busy host)."""


def _profile(tmp_path: Path) -> Path:
    profile = tmp_path / "runs" / "memory" / "shared"
    profile.mkdir(parents=True)
    (profile / "notes.md").write_text("# shared notes\nstatus unknown\n")
    return profile


def _gate(members: int) -> tuple[Callable[[str, str], None], threading.Barrier]:
    """A gate that opens when ``members`` members have made their edit."""
    barrier = threading.Barrier(members)
    return (lambda task, memory: barrier.wait(GATE_S)), barrier


def _saves(run: RunDir) -> list[dict[str, Any]]:
    return [e for e in run.journal.read() if e.event == "memory_saved"]


def _wait_for(pred: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + GATE_S
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


@pytest.mark.parametrize("count", [2, 8])
def test_members_in_parallel_each_inserting_a_line_keep_every_line(
    count, tmp_path, images, docker_client, fake_api, cleanup, capsys
):
    profile = _profile(tmp_path)
    before_submit, gate = _gate(count)
    fake_api(memory_policy(before_submit))
    cleanup.append(tmp_path / "runs")
    members = "".join(
        _member(f"m{i}", f"Note what you found [insert:fact from m{i}]", memory=SHARED)
        for i in range(count)
    )
    job = _job(tmp_path, members, fanout=f"max_parallel = {count}\nmin_success = {count}")
    try:
        code = main(["run", str(job), "--plain"])
    finally:
        gate.abort()  # never leave a server thread waiting
    assert code == 0, capsys.readouterr().err
    lines = (profile / "notes.md").read_text().splitlines()
    assert lines[0] == "# shared notes" and lines[-1] == "status unknown"
    assert sorted(lines[1:-1]) == sorted(f"fact from m{i}" for i in range(count))
    (run,) = RunDir.list(tmp_path / "runs")
    saves = _saves(run)
    assert len(saves) == count and all(s.conflicts == 0 for s in saves)
    actions = sorted(s.files[0].action for s in saves)
    # Every save but the first met a profile others had saved into since its load.
    assert actions == ["merged"] * (count - 1) + ["written"], actions
    assert max(len(s.files[0].merged_with) for s in saves) == count - 1


def test_two_members_replacing_one_line_differently_keep_both_and_report_it(
    tmp_path, images, docker_client, fake_api, cleanup, capsys
):
    profile = _profile(tmp_path)
    before_submit, gate = _gate(2)
    fake_api(memory_policy(before_submit))
    cleanup.append(tmp_path / "runs")
    members = _member(
        "green", "Record the status [replace:status unknown:status green]", memory=SHARED
    ) + _member("red", "Record the status [replace:status unknown:status red]", memory=SHARED)
    job = _job(tmp_path, members, fanout="max_parallel = 2")
    try:
        code = main(["run", str(job), "--plain"])
    finally:
        gate.abort()
    err = capsys.readouterr().err
    assert code == 0, err
    text = (profile / "notes.md").read_text()
    assert "status green" in text and "status red" in text
    assert "\n<<<<<<< " in text and "\n||||||| before both changes\nstatus unknown\n" in text
    assert "\n=======\n" in text and "\n>>>>>>> " in text
    (run,) = RunDir.list(tmp_path / "runs")
    saves = _saves(run)
    (second,) = [s for s in saves if s.conflicts]
    loser = second.member
    assert second.files[0].path == "notes.md"
    assert "changed differently" in second.files[0].detail
    # The run's last lines, the report, and fleet trace all say so.
    assert f"memory: conflict in {profile}/notes.md ({loser})" in err
    report = json.loads((run.path / "report.json").read_text())
    assert [(m["kind"], m["member"], m["path"]) for m in report["memory"]] == [
        ("conflict", loser, "notes.md")
    ]
    assert "## Memory" in (run.path / "report.md").read_text()
    assert main(["trace", str(run.path)]) == 0
    table = capsys.readouterr().out
    assert "memory conflicts" in table and f"notes.md ({loser})" in table
    assert main(["trace", str(run.path), loser]) == 0
    detail = capsys.readouterr().out
    assert f"memory saved to {profile}" in detail and "notes.md  CONFLICT with " in detail


def test_a_retried_member_starts_from_the_profile_then_and_saves_nothing_twice(
    tmp_path, images, docker_client, fake_api, cleanup, capsys
):
    """The retried member's first attempt saves its line, then its box is OOM-killed; its
    second attempt loads that line with the profile, and a sibling saves between that
    load and the second attempt's save."""
    profile = _profile(tmp_path)
    notes = profile / "notes.md"
    second_loaded = threading.Event()
    seen: dict[str, str] = {}

    def before_submit(task: str, memory: str) -> None:
        if "[crash-once]" in task:  # only its second attempt gets this far
            seen["retried"] = memory
            second_loaded.set()
            _wait_for(lambda: "sibling notes" in notes.read_text(), "the sibling's save")
        elif not second_loaded.wait(GATE_S):
            raise AssertionError("the retried member never got to its second attempt")

    fake_api(memory_policy(before_submit))
    cleanup.append(tmp_path / "runs")
    members = _member(
        "flaky", "[insert:flaky notes] [crash-once]", memory=SHARED, sandbox='{ memory = "64m" }'
    ) + _member("sibling", "[insert:sibling notes]", memory=SHARED)
    job = _job(
        tmp_path,
        members,
        fanout="max_parallel = 2\nretry = { attempts = 2, backoff_s = 0.2 }",
    )
    try:
        code = main(["run", str(job), "--plain"])
    finally:
        second_loaded.set()
    assert code == 0, capsys.readouterr().err
    (run,) = RunDir.list(tmp_path / "runs")
    assert run.state().starts == {"flaky": 2, "sibling": 1}
    assert "flaky notes" in seen["retried"]  # the first attempt's save, loaded again
    lines = notes.read_text().splitlines()
    assert sorted(lines) == sorted(
        ["# shared notes", "flaky notes", "flaky notes (again)", "sibling notes", "status unknown"]
    )
    flaky = [s for s in _saves(run) if s.member == "flaky"]
    assert [s.attempt for s in flaky] == [1, 2] and flaky[0].key != flaky[1].key
    (last,) = flaky[1].files
    assert last.action == "merged" and any(w.startswith("sibling ") for w in last.merged_with)


def test_two_runs_on_one_profile_at_once_keep_every_line(
    tmp_path, images, docker_client, fake_api, cleanup
):
    profile = _profile(tmp_path)
    before_submit, gate = _gate(4)
    api = fake_api(memory_policy(before_submit))
    cleanup.append(tmp_path / "runs")
    env = {**os.environ, "ANTHROPIC_API_KEY": "test-key", "ANTHROPIC_BASE_URL": api.url}
    procs = []
    try:
        for name in ("one", "two"):
            members = "".join(
                _member(f"{name}-{i}", f"Note it [insert:fact {name}-{i}]", memory=SHARED)
                for i in (1, 2)
            )
            (tmp_path / name).mkdir()
            job = _job(tmp_path / name, members, fanout="max_parallel = 2")
            text = job.read_text().replace(str(tmp_path / name / "runs"), str(tmp_path / "runs"))
            job.write_text(text)
            procs.append(
                subprocess.Popen(
                    [*FLEET, "run", str(job), "--plain"],
                    env=env,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.PIPE,
                    text=True,
                )
            )
        for proc in procs:
            _, err = proc.communicate(timeout=GATE_S + 120)
            assert proc.returncode == 0, err
    finally:
        gate.abort()
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
    lines = (profile / "notes.md").read_text().splitlines()
    facts = [f"fact {n}-{i}" for n in ("one", "two") for i in (1, 2)]
    assert sorted(lines) == sorted(["# shared notes", "status unknown", *facts])
    runs = RunDir.list(tmp_path / "runs")
    assert len(runs) == 2
    saves = {run.id: _saves(run) for run in runs}
    assert all(len(s) == 2 and not any(x.conflicts for x in s) for s in saves.values())
    # Some save merged what the *other* run's process had saved into the profile.
    crossed = [
        w
        for rid, own in saves.items()
        for s in own
        for w in s.files[0].merged_with
        if f"(run {rid})" not in w
    ]
    assert crossed, saves
    ledger = (profile / ".fleet" / "saves.jsonl").read_text().splitlines()
    assert len(ledger) == 4


def test_a_member_rerun_by_resume_after_a_crash_saves_nothing_twice(
    tmp_path, images, docker_client, fake_api, cleanup
):
    """The coordinator is SIGKILLed while a member waits to be retried (its first attempt
    saved its line, then its box died); ``fleet resume`` re-runs it: the re-run loads
    that line with the profile, and a sibling saves between that load and its save."""
    profile = _profile(tmp_path)
    notes = profile / "notes.md"
    rerun_loaded = threading.Event()
    seen: dict[str, str] = {}

    def before_submit(task: str, memory: str) -> None:
        if "[crash-once]" in task:  # only the re-run after the resume gets this far
            seen["rerun"] = memory
            rerun_loaded.set()
            _wait_for(lambda: "sibling notes" in notes.read_text(), "the sibling's save")
        elif not rerun_loaded.wait(GATE_S):  # the first life's sibling waits until killed
            raise AssertionError("the member was never re-run")

    api = fake_api(memory_policy(before_submit))
    cleanup.append(tmp_path / "runs")
    env = {**os.environ, "ANTHROPIC_API_KEY": "test-key", "ANTHROPIC_BASE_URL": api.url}
    members = _member(
        "flaky", "[insert:flaky notes] [crash-once]", memory=SHARED, sandbox='{ memory = "64m" }'
    ) + _member("sibling", "[insert:sibling notes]", memory=SHARED)
    job = _job(
        tmp_path, members, fanout="max_parallel = 2\nretry = { attempts = 2, backoff_s = 120 }"
    )
    proc = subprocess.Popen(
        [*FLEET, "run", str(job), "--plain"], env=env, stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        _wait_for(lambda: bool(RunDir.list(tmp_path / "runs")), "the run directory")
        (run,) = RunDir.list(tmp_path / "runs")
        _wait_for(
            lambda: any(e.event == "member_retry" for e in run.journal.read()),
            "the first attempt's crash",
        )
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert [s.attempt for s in _saves(run) if s.member == "flaky"] == [1]
    assert "flaky notes" in notes.read_text()
    resumed = subprocess.run(
        [*FLEET, "resume", str(run.path), "--plain"],
        env=env, capture_output=True, text=True, timeout=GATE_S + 120,
    )  # fmt: skip
    rerun_loaded.set()
    assert resumed.returncode == 0, resumed.stderr
    assert "flaky notes" in seen["rerun"]  # the first life's save, loaded again
    lines = notes.read_text().splitlines()
    assert sorted(lines) == sorted(
        ["# shared notes", "flaky notes", "flaky notes (again)", "sibling notes", "status unknown"]
    )
    flaky = [s for s in _saves(run) if s.member == "flaky"]
    assert len(flaky) == 2 and flaky[0].key != flaky[1].key
    (last,) = flaky[1].files
    assert last.action == "merged" and any(w.startswith("sibling ") for w in last.merged_with)
