"""Live progress: plain lines off a terminal, an in-place ANSI table on one."""

from __future__ import annotations

import io

from coordinator.journal.entries import entry
from coordinator.oversight.progress import Progress
from subagents.trace import MemberStart, ModelCall, SandboxEvent, ToolCall


class FakeTTY(io.StringIO):
    def isatty(self) -> bool:
        return True


def _feed(p: Progress) -> None:
    p.on_journal(entry("member_queued", member="a"))
    p.on_journal(entry("member_started", member="a", attempt=1))
    p.on_event(MemberStart(member="a", kind="coding", task="t", model="m"))
    p.on_event(
        ModelCall(
            member="a",
            turn=2,
            model="m",
            input_tokens=1500,
            output_tokens=40,
            cache_read_tokens=500,
        )
    )
    p.on_event(ToolCall(member="a", call_id="1", tool="shell", input={"command": "make test"}))
    p.on_journal(
        entry(
            "member_retry",
            member="b",
            attempt=1,
            status="crashed",
            reason="sandbox crashed: killed",
        )
    )
    p.on_journal(entry("member_finished", member="a", status="ok"))
    p.on_journal(
        entry("member_finished", member="b", status="crashed", reason="sandbox crashed: oom-killed")
    )


def test_plain_output_is_one_line_per_state_change():
    out = io.StringIO()
    p = Progress(["a", "b"], out=out)
    assert p.tty is False
    _feed(p)
    lines = out.getvalue().splitlines()
    assert len(lines) == 4
    assert lines[0].endswith("a: running")
    assert "b: retrying" in lines[1] and "sandbox crashed: killed" in lines[1]
    assert "a: ok" in lines[2] and "2 turns, 2.0k in / 40 out" in lines[2]
    assert "b: crashed" in lines[3] and "oom-killed" in lines[3]
    assert "\x1b[" not in out.getvalue()
    summary = p.summary("runs/x", "succeeded: 1 of 2 members ok")
    assert "run directory: runs/x" in summary and "oom-killed" in summary


def test_terminal_output_redraws_the_table_in_place():
    out = FakeTTY()
    p = Progress(["a", "b"], out=out)
    assert p.tty is True
    p.on_journal(entry("member_started", member="a", attempt=1))
    p.draw()
    first = out.getvalue()
    assert first.count("\x1b[2K") == 3  # header + two rows, each line cleared
    assert "\x1b[3F" not in first  # nothing to move over yet
    p.on_event(ToolCall(member="a", call_id="1", tool="shell", input={"command": "ls"}))
    p.draw()
    second = out.getvalue()[len(first) :]
    assert second.startswith("\x1b[3F")  # cursor back up over the old table
    assert "shell(ls)" in second and "\x1b[36mrunning" in second
    p.draw()  # nothing changed: nothing written
    assert out.getvalue()[len(first) + len(second) :] == ""


def test_a_kept_box_is_named_whole_in_the_last_action_column():
    name = "fleet-research-20260101-120000-abcd-research-12-0a1b2c"
    p = Progress(["kept", "gone"], out=io.StringIO())
    for member, action in (("kept", "keep"), ("gone", "close")):
        p.on_journal(entry("member_started", member=member, attempt=1))
        p.on_event(SandboxEvent(member=member, action="create", box=f"{name}-{member}"))
        p.on_event(SandboxEvent(member=member, action=action, box=f"{name}-{member}"))
        p.on_journal(entry("member_finished", member=member, status="ok"))
    rows = {ln.split()[0]: ln for ln in p.table()[1:]}
    assert rows["kept"].endswith(f"box kept: {name}-kept")  # longer than the column's 60
    assert rows["gone"].endswith("box removed")


def test_a_resume_shows_members_finished_before_it_with_their_recorded_figures(tmp_path):
    """After a SIGKILL and ``fleet resume``, a member that had finished keeps its turns,
    tokens and time (from its result.json) in the table, not ``ok 0 0 0 0.0s``."""
    from coordinator.job.jobfile import parse_job
    from coordinator.rundir.runs import RunDir
    from coordinator.runner.driver import RunOptions, _progress

    text = 'name = "r"\n' + "".join(
        f'[[members]]\nid = "{m}"\nkind = "coding"\ntask = "t"\n' for m in ("done", "todo")
    )
    job = parse_job(text)
    run = RunDir.create(job, text, root=tmp_path)
    run.journal.note("member_finished", member="done", status="ok")
    outcome = {
        "member": "done",
        "status": "ok",
        "turns": 3,
        "input_tokens": 1200,
        "cache_read_tokens": 300,
        "output_tokens": 45,
        "duration_s": 4.25,
    }
    run.write_result("done", outcome)
    out = io.StringIO()
    members = job.members
    rows = [m.id or "" for m in members]
    p = _progress(run, rows, members, [members[1]], RunOptions(out=out, tty=False))
    shown = {ln.split()[0]: ln.split() for ln in p.table()[1:]}
    assert shown["done"][1:6] == ["ok", "3", "1.5k", "45", "4.2s"], shown["done"]
    assert shown["todo"][1:6] == ["queued", "0", "0", "0", "0.0s"]
    line = out.getvalue().strip()
    assert "done: ok after 4.2s, 3 turns, 1.5k in / 45 out" in line
    assert "before the resume" in line


def test_a_lead_runs_table_shows_the_wave_each_member_came_in():
    p = Progress(["lead"], out=io.StringIO())
    p.on_journal(entry("member_queued", member="w1-1", wave=1))
    p.on_journal(entry("member_queued", member="w2-1", wave=2))
    p.on_journal(entry("member_started", member="w2-1", attempt=1))
    head, *rows = p.table()
    assert head.split()[:3] == ["member", "wave", "status"]
    by_member = {line.split()[0]: line.split() for line in rows}
    assert by_member["w1-1"][1:3] == ["1", "queued"]
    assert by_member["w2-1"][1:3] == ["2", "running"]
    assert by_member["lead"][1] == "queued"  # the lead came in no wave
    plain = Progress(["a"], out=io.StringIO())
    plain.on_journal(entry("member_queued", member="a"))
    assert "wave" not in plain.table()[0]  # no column off a lead run


def test_a_member_waiting_for_the_budget_says_so_then_its_skip(tmp_path):
    from coordinator.job.jobfile import parse_job
    from coordinator.rundir.runs import RunDir

    out = io.StringIO()
    p = Progress(["a"], out=out)
    p.on_journal(entry("member_queued", member="a"))
    p.on_journal(entry("member_queued", member="a", waiting="budget"))
    assert "a: waiting (budget)" in out.getvalue()
    assert any("waiting (budget)" in line for line in p.table())
    why = "skipped: the run's budget cannot carry it (9,000 of 10,000 tokens spent)"
    p.on_journal(entry("member_finished", member="a", status="skipped", reason=why))
    assert "a: skipped after" in out.getvalue() and why in out.getvalue()
    # The run's recorded state (fleet runs, the API) says the same.
    text = 'name = "r"\n[[members]]\nid = "a"\nkind = "coding"\ntask = "t"\n'
    run = RunDir.create(parse_job(text), text, root=tmp_path)
    run.journal.append(entry("member_queued", member="a"))
    run.journal.append(entry("member_queued", member="a", waiting="budget"))
    assert run.state().members["a"] == "waiting (budget)"
