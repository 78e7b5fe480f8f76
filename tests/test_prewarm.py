"""``fleet run JOB`` starts the first wave's boxes while it reads and checks the job, and
the run takes them; a run that does not start leaves none behind."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from coordinator.cli import main
from coordinator.nodes import prewarm as prewarm_module
from subagents.trace import read_trace

pytestmark = pytest.mark.docker


def _job(tmp_path: Path, members: int, extra: str = "") -> Path:
    text = f'name = "warm"\noutput_dir = "{tmp_path / "runs"}"\n[model]\nname = "offline"\n'
    text += "[synthesis]\nenabled = false\n" + extra
    for i in range(members):
        text += f'[[members]]\nid = "c{i}"\nkind = "coding"\ntask = "Look around {i}."\n'
    path = tmp_path / "job.toml"
    path.write_text(text)
    return path


@pytest.fixture
def started(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Every Prewarm the command line starts."""
    seen: list[Any] = []
    real = prewarm_module.Prewarm.start.__func__  # type: ignore[attr-defined]

    def recording(cls: Any, job_file: Any) -> Any:
        warm = real(cls, job_file)
        seen.append(warm)
        return warm

    monkeypatch.setattr(prewarm_module.Prewarm, "start", classmethod(recording))
    return seen


def test_the_first_wave_starts_before_the_run_exists_and_the_run_takes_it(
    tmp_path, images, docker_client, cleanup, monkeypatch, started
):
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    cleanup.append(tmp_path / "runs")
    assert main(["run", str(_job(tmp_path, 3)), "--plain"]) == 0
    (warm,) = started
    made = {info["Name"].lstrip("/"): info for _, info in warm._boxes}
    assert len(made) == 3
    run = tmp_path / "runs" / warm.run  # the run has the id its boxes were given
    created = json.loads((run / "journal.jsonl").read_text().splitlines()[0])["ts"]
    # The first wave's start begins before the run directory exists: its thread was
    # started then. When it reaches the engine is the scheduler's to say - on a loaded
    # machine after the run directory was made (1 ms after, once) - so that is not
    # asserted; that the run took the boxes it made is.
    assert warm.began is not None and warm.began < created, (warm.began, created)
    used = [
        e.box
        for m in ("c0", "c1", "c2")
        for e in read_trace(run / "members" / m / "trace.jsonl")
        if e.type == "sandbox" and e.action == "create"
    ]
    assert sorted(used) == sorted(made)  # each member got one of them
    gone = docker_client.api.containers(all=True, filters={"label": f"fleet.run={warm.run}"})
    assert gone == []


def test_a_run_that_does_not_start_leaves_no_early_box(
    tmp_path, images, docker_client, cleanup, monkeypatch, started
):
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    cleanup.append(tmp_path / "runs")
    bad = _job(tmp_path, 2, extra="[fanout]\nmin_success = 5\n")  # more than the members
    assert main(["run", str(bad), "--plain"]) == 2
    (warm,) = started
    assert not (tmp_path / "runs").exists()
    left = docker_client.api.containers(all=True, filters={"label": f"fleet.run={warm.run}"})
    assert left == []


@pytest.mark.parametrize("boxes", ["none started", "two started"])
def test_a_run_that_does_not_start_leaves_no_live_marker(
    tmp_path, images, docker_client, cleanup, monkeypatch, started, boxes
):
    """The early thread marks the run live before its first box; a job refused after
    that leaves no marker, whether the thread had started boxes or none (stopped first,
    or the engine refused them)."""
    from sandbox.docker import reaper

    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    cleanup.append(tmp_path / "runs")
    marked: list[str] = []
    real_mark = reaper.mark_live

    def mark(run: str, pid: int | None = None) -> None:
        marked.append(run)
        real_mark(run, pid)

    monkeypatch.setattr(reaper, "mark_live", mark)
    if boxes == "none started":
        monkeypatch.setattr(prewarm_module.Prewarm, "_specs", lambda *a: [])
    else:  # the thread goes on to its end before the command stops it
        real_close = prewarm_module.Prewarm.close

        def close_after_the_thread(self: Any) -> None:
            self._thread.join()
            real_close(self)

        monkeypatch.setattr(prewarm_module.Prewarm, "close", close_after_the_thread)
    bad = _job(tmp_path, 2, extra="[fanout]\nmin_success = 5\n")
    assert main(["run", str(bad), "--plain"]) == 2
    (warm,) = started
    assert marked == [warm.run]  # the thread got that far: the marker was written
    assert len(warm._boxes) == (0 if boxes == "none started" else 2)
    assert not reaper._marker(warm.run).exists()
    assert warm.run not in reaper.live_runs()
    left = docker_client.api.containers(all=True, filters={"label": f"fleet.run={warm.run}"})
    assert left == []


def test_a_members_first_model_call_does_not_wait_for_its_box(
    tmp_path, images, docker_client, cleanup, fake_api
):
    """The box starts beside the first model call (sandbox/deferred.py): the call goes
    out before the box is ready, and the box is ready before the first tool runs."""
    from fleet_policies import coding_policy

    fake_api(coding_policy(turns=1, latency_s=1.5))
    cleanup.append(tmp_path / "runs")
    text = _job(tmp_path, 1).read_text().replace('name = "offline"', 'name = "claude-sonnet-5"')
    text += "[fanout]\nwarm_pool = false\n"  # a cold box, started by the member's attempt
    (tmp_path / "job.toml").write_text(text)
    assert main(["run", str(tmp_path / "job.toml"), "--plain"]) == 0
    (run,) = (tmp_path / "runs").iterdir()
    events = list(read_trace(run / "members" / "c0" / "trace.jsonl"))
    (create,) = [e for e in events if e.type == "sandbox" and e.action == "create"]
    first_call = next(e for e in events if e.type == "model_call")
    first_tool = next(e for e in events if e.type == "tool_call")
    started_at = first_call.ts - first_call.latency_s
    assert started_at < create.ts - create.duration_s / 2, (first_call, create)
    assert create.ts <= first_tool.ts
    assert first_call.ts - started_at >= 1.5  # the call's own wait, not the box's


def test_a_member_that_ends_before_its_box_is_ready_is_one_attempt(
    tmp_path, images, docker_client, cleanup, fake_api
):
    """The model refuses the first call at once, while the box is still starting: the
    box is removed, and the member's trace shows one attempt and no box it never had."""
    from fleet_policies import coding_policy

    from coordinator.traceview import load_run, rollup_run

    fake_api(coding_policy())
    cleanup.append(tmp_path / "runs")
    text = _job(tmp_path, 1).read_text().replace('name = "offline"', 'name = "claude-sonnet-5"')
    text = text.replace("Look around 0.", "Look around 0. [bad-request]")
    text += "[fanout]\nwarm_pool = false\nretry = { attempts = 1 }\n"
    (tmp_path / "job.toml").write_text(text)
    assert main(["run", str(tmp_path / "job.toml"), "--plain"]) == 1
    (run,) = (tmp_path / "runs").iterdir()
    events = list(read_trace(run / "members" / "c0" / "trace.jsonl"))
    assert [e.type for e in events if e.type in ("member_start", "member_end")] == [
        "member_start",
        "member_end",
    ]
    assert not [e for e in events if e.type == "sandbox" and e.action == "create"]
    (member,) = rollup_run(load_run(run)).members
    assert member.attempts == 1 and [a.status for a in member.per_attempt] == ["failed"]
    assert docker_client.api.containers(all=True, filters={"label": f"fleet.run={run.name}"}) == []


def test_a_setup_the_early_thread_cannot_read_starts_nothing_and_raises_nothing(
    tmp_path: Path,
) -> None:
    """The early thread keys setups from the job file's raw text, before the job is
    checked: whatever a member's ``setup`` or ``repo`` says, it finds no snapshot rather
    than fail, and asks the engine only for a setup that reads as one."""
    from types import SimpleNamespace

    from sandbox.spec import SandboxSpec

    asked: list[dict] = []

    def images(filters: dict) -> list:
        asked.append(filters)
        return []

    engine = SimpleNamespace(api=SimpleNamespace(images=images))
    spec = SandboxSpec()
    broken = [
        12,
        ["pip", "install"],
        {"run": 5},
        {"run": "x", "allow": "not a list"},
        {"run": "x", "timeout_s": -1},
        {"run": "x", "unknown": True},
        "",
    ]
    for setup in broken:
        early = prewarm_module.Early(spec, setup, None)
        assert prewarm_module.snapshot(engine, early, "sha256:" + "a" * 64, tmp_path, {}) is None
    assert asked == []
    # One that reads, with a wheelhouse and a repository that are not there: keyed
    # (nothing to hash), looked up, not found.
    early = prewarm_module.Early(spec, {"run": "x", "wheels": "no/such"}, "../no-such-repo")
    assert prewarm_module.snapshot(engine, early, "sha256:" + "a" * 64, tmp_path, {}) is None
    assert len(asked) == 1 and list(asked[0]) == ["label"]
    # The raw job's members: a repo of another type is no repo, a setup is kept as written.
    raw = {
        "name": "j",
        "members": [
            {"kind": "coding", "task": "t", "repo": 7, "setup": {"run": "x"}},
            {"kind": "coding", "task": "t", "repo": "r", "setup": "auto"},
        ],
    }
    _, _, first = prewarm_module._first_wave(raw)
    assert [(e.repo, e.setup) for e in first] == [(None, {"run": "x"}), ("r", "auto")]


def test_one_box_whose_member_calls_the_api_starts_beside_that_call_not_before(
    tmp_path, images, docker_client, cleanup, fake_api, started, monkeypatch
):
    """A run of one coding member on Claude: nothing is started while the job is read
    and no pool starts the box at the run's start; the member starts it beside its first
    model call, which hides it (bench/first_call.py: 0.97x a bare SDK import with this,
    1.06x with the early box and its pool). Two such members, or one on the offline
    model (whose first call is instant), still get their boxes early."""
    from fleet_policies import coding_policy

    from sandbox.docker import attached

    fake_api(coding_policy(turns=1, latency_s=0.5))
    cleanup.append(tmp_path / "runs")
    text = _job(tmp_path, 1).read_text().replace('name = "offline"', 'name = "claude-sonnet-5"')
    (tmp_path / "job.toml").write_text(text)
    assert main(["run", str(tmp_path / "job.toml"), "--plain"]) == 0
    assert started == [None]  # the command line asked; nothing was started
    (run,) = (tmp_path / "runs").iterdir()
    events = list(read_trace(run / "members" / "c0" / "trace.jsonl"))
    (create,) = [e for e in events if e.type == "sandbox" and e.action == "create"]
    assert "-pool-" not in create.box and "-c0-" in create.box, create.box
    first_call = next(e for e in events if e.type == "model_call")
    assert first_call.ts - first_call.latency_s < create.ts  # the call went out first
    assert attached.held() == 0

    monkeypatch.setenv("ANTHROPIC_API_KEY", "k")  # `auto` is Claude with a key
    two = _job(tmp_path, 2).read_text().replace('name = "offline"', 'name = "auto"')
    one_offline = _job(tmp_path, 1).read_text()
    for text, early in ((two, 2), (one_offline, 1)):
        warm = prewarm_module.Prewarm.from_text(text)
        assert warm is not None
        try:
            warm._thread.join()
            assert len(warm._boxes) == early
        finally:
            warm.close()  # no run took them: all removed
        assert (
            docker_client.api.containers(all=True, filters={"label": f"fleet.run={warm.run}"}) == []
        )


@pytest.mark.parametrize(
    "model_part",
    [
        'model = "claude-sonnet-5"',  # the job's [model] as a string: not a table
        "[model]\nname = 5",  # a name that is no string
        '[model]\nname = "' + "c" * 100_000 + '"',  # huge
        '[model]\nname = "claude\u2010sonnet-5"',  # a look-alike hyphen
    ],
)
def test_a_model_the_early_thread_cannot_read_starts_nothing_and_raises_nothing(
    model_part: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The single-box rule reads the member's model from the raw file before the job is
    validated: whatever it finds there, one box of a member on (or maybe on) the API
    starts nothing early and nothing raises; the job's validation says what is wrong."""
    monkeypatch.setenv("ANTHROPIC_API_KEY", "k")  # a name that falls back to auto is Claude
    text = (
        f'name = "odd"\n{model_part}\n[[members]]\nid = "c0"\nkind = "coding"\ntask = "t"\n'
        if model_part.startswith("model")
        else f'name = "odd"\n[[members]]\nid = "c0"\nkind = "coding"\ntask = "t"\n{model_part}\n'
    )
    assert prewarm_module.Prewarm.from_text(text) is None
