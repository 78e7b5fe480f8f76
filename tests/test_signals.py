"""Fleet leaves a process's signal handlers as it found them.

A script that runs Fleet from its own code (``fleet.run``, ``run_async``, ``stream``,
or a run that receives signals itself) is interrupted by Ctrl-C, then runs again in
the same process: the second run is interrupted by Ctrl-C too, a child it starts
afterwards dies of SIGINT, and the handlers before and after are the same objects.
A process started with SIGINT ignored (a background job) keeps it ignored.

Each script is started with SIGINT, SIGTERM and SIGQUIT at their defaults
(``process_support.popen``), whatever the suite's own shell left them at; the first
test shows why that is needed.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import anyio
import pytest
from fleet_policies import coding_policy
from process_support import Child, ignored, ignoring, popen

from subagents.fake_api import FakeMessagesAPI

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def test_a_child_started_to_be_signalled_takes_signals_its_parent_ignores() -> None:
    # Each says it is up once Python has started: a Ctrl-C that arrives during the
    # interpreter's own start ends it with status 1, not by the signal.
    probe = [sys.executable, "-c", "import time; print('up', flush=True); time.sleep(30)"]
    with ignoring(signal.SIGINT, signal.SIGQUIT):
        plain = subprocess.Popen(probe, stdout=subprocess.PIPE, text=True)
        child = popen(probe, stdout=subprocess.PIPE, text=True)
    try:
        for proc in (plain, child):
            assert proc.stdout is not None and proc.stdout.readline() == "up\n"
        assert {signal.SIGINT, signal.SIGQUIT} <= ignored(plain.pid)
        assert not {signal.SIGINT, signal.SIGTERM, signal.SIGQUIT} & ignored(child.pid)
        child.send_signal(signal.SIGINT)
        assert child.wait(30) == -signal.SIGINT  # Python re-raises an unhandled Ctrl-C
    finally:
        for proc in (plain, child):
            proc.kill()
            proc.wait()


def test_signalling_a_child_that_ignores_the_signal_fails_at_once_by_name() -> None:
    child = Child(["env", "--ignore-signal=INT", "sleep", "30"])
    try:
        end = time.monotonic() + 30  # until env has set it ignored (and exec'd sleep)
        while signal.SIGINT not in ignored(child.pid) and time.monotonic() < end:
            time.sleep(0.05)
        with pytest.raises(AssertionError, match="ignores SIGINT; start it with"):
            child.send_signal(signal.SIGINT)
    finally:
        child.kill()
        child.wait()


SCRIPT = """
import json, signal, subprocess, sys

import anyio

import coordinator as fleet
from coordinator.runner.driver import RunOptions

WATCHED = (signal.SIGINT, signal.SIGTERM, signal.SIGQUIT, signal.SIGHUP)
way, job = sys.argv[1], json.loads(sys.argv[2])


def handlers():
    return [signal.getsignal(s) for s in WATCHED]


def started(entry):
    if entry.event == "member_started":
        print("started", flush=True)


def one_run():
    options = RunOptions(handle_signals=True, tty=False) if way == "watched" else None
    try:
        if way in ("run", "watched"):
            return fleet.run(job, on_journal=started, options=options).status
        if way == "run_async":
            return anyio.run(lambda: fleet.run_async(job, on_journal=started)).status

        async def consume():
            async for event in fleet.stream(job):
                if getattr(event, "event", None) == "member_started":
                    print("started", flush=True)
                if event.type == "run_ended":
                    return event.status

        return anyio.run(consume)
    except KeyboardInterrupt:
        return "KeyboardInterrupt"


before = handlers()
for n in (1, 2):
    ended = one_run()
    same = all(a is b for a, b in zip(before, handlers(), strict=True))
    print(json.dumps({"run": n, "ended": ended, "same": same, "now": repr(handlers())}), flush=True)
child = subprocess.Popen(["sleep", "60"])
print("child", flush=True)
print(json.dumps({"child": child.wait(60)}), flush=True)
"""


def _job(tmp_path: Path) -> dict[str, Any]:
    repo = tmp_path / "repo"
    if not repo.exists():
        shutil.copytree(EXAMPLES / "sample-repo", repo)
    member = {"id": "coder", "kind": "coding", "task": "[hang] wait", "repo": str(repo)}
    return {
        "name": "signals",
        "output_dir": str(tmp_path / "runs"),
        "model": {"name": "claude-sonnet-5"},
        "members": [member],
    }


def _script(prefix: list[str], script: str, args: list[str], api_url: str) -> Child:
    """``script`` run by this Python (after ``prefix``, a wrapper), against the fake API
    at ``api_url``, its output piped."""
    env = os.environ | {"ANTHROPIC_API_KEY": "k", "ANTHROPIC_BASE_URL": api_url}
    env["PYTHONPATH"] = os.pathsep.join(sys.path)
    argv = [*prefix, sys.executable, "-c", script, *args]
    return popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _line(proc: subprocess.Popen[str], deadline: float) -> str:
    """The script's next line of output, or the test fails naming what it said."""
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line:
        proc.kill()
        _, err = proc.communicate()
        pytest.fail(f"the script ended early (exit {proc.returncode}):\n{err[-3000:]}")
    assert time.monotonic() < deadline, "the script took too long"
    return line.strip()


@pytest.mark.docker
@pytest.mark.parametrize("way", ["run", "run_async", "stream", "watched"])
def test_after_an_interrupted_run_the_process_is_as_it_was(
    tmp_path: Path, images: dict[str, str], cleanup: list[Path], way: str
) -> None:
    """Two runs in one script, each interrupted by Ctrl-C; then a child it starts is
    ended by SIGINT. ``watched``: the run receives signals itself (the command line's
    way) and ends ``interrupted`` instead of raising."""
    cleanup.append(tmp_path / "runs")
    with FakeMessagesAPI(coding_policy()) as api:
        proc = _script([], SCRIPT, [way, json.dumps(_job(tmp_path))], api.url)
        try:
            deadline = time.monotonic() + 240
            ended = "interrupted" if way == "watched" else "KeyboardInterrupt"
            for n in (1, 2):
                assert _line(proc, deadline) == "started"  # its model call hangs
                proc.send_signal(signal.SIGINT)
                said = json.loads(_line(proc, deadline))
                assert (said["run"], said["ended"]) == (n, ended), said
                assert said["same"], f"handlers changed: {said['now']}"
            assert _line(proc, deadline) == "child"
            os.kill(_child_named("sleep", proc.pid, deadline), signal.SIGINT)
            assert json.loads(_line(proc, deadline)) == {"child": -signal.SIGINT}
            assert proc.wait(30) == 0
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    runs = sorted(p.name for p in (tmp_path / "runs").iterdir())
    assert len(runs) == 2


def _child_named(name: str, parent: int, deadline: float) -> int:
    """The pid of ``parent``'s child running ``name`` (once it has exec'd it)."""
    while time.monotonic() < deadline:
        for pid in Path(f"/proc/{parent}/task/{parent}/children").read_text().split():
            if Path(f"/proc/{pid}/comm").read_text().strip() == name:
                return int(pid)
        time.sleep(0.05)
    pytest.fail(f"process {parent} started no {name}")


IGNORING_SCRIPT = """
import json, signal, sys

import coordinator as fleet
from coordinator.runner.driver import RunOptions

job = json.loads(sys.argv[1])


def started(entry):
    if entry.event == "member_started":
        print("started", flush=True)


before = signal.getsignal(signal.SIGINT)
result = fleet.run(job, on_journal=started, options=RunOptions(handle_signals=True, tty=False))
print(json.dumps({"ended": result.status, "sigint": repr(signal.getsignal(signal.SIGINT)),
                  "same": signal.getsignal(signal.SIGINT) is before}), flush=True)
"""


@pytest.mark.docker
def test_a_run_that_handles_signals_leaves_an_ignored_sigint_ignored(
    tmp_path: Path, images: dict[str, str], cleanup: list[Path]
) -> None:
    """Started with SIGINT ignored (a background job): Ctrl-C does not interrupt the run,
    SIGTERM does, and SIGINT is still ignored afterwards."""
    cleanup.append(tmp_path / "runs")
    with FakeMessagesAPI(coding_policy()) as api:
        started_ignoring = ["env", "--ignore-signal=INT"]
        proc = _script(started_ignoring, IGNORING_SCRIPT, [json.dumps(_job(tmp_path))], api.url)
        try:
            deadline = time.monotonic() + 180
            assert _line(proc, deadline) == "started"
            assert signal.SIGINT in ignored(proc.pid)
            os.kill(proc.pid, signal.SIGINT)  # Child.send_signal would refuse: it is ignored
            time.sleep(1.0)
            assert proc.poll() is None
            (run,) = (tmp_path / "runs").iterdir()
            assert '"run_interrupted"' not in (run / "journal.jsonl").read_text()
            proc.send_signal(signal.SIGTERM)
            said = json.loads(_line(proc, deadline))
            assert said == {"ended": "interrupted", "sigint": "<Handlers.SIG_IGN: 1>", "same": True}
            assert proc.wait(30) == 0
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def _offline_job(tmp_path: Path) -> dict[str, Any]:
    job = _job(tmp_path)
    job["model"] = {"name": "offline"}
    job["members"][0]["task"] = "Say hello."
    return job


def _handlers() -> list[Any]:
    return [signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGQUIT)]


@pytest.mark.docker
def test_a_run_that_handles_signals_puts_the_handlers_back_when_it_finishes(
    tmp_path: Path, images: dict[str, str], cleanup: list[Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """In this process (the worker's main thread): a run that ends by itself."""
    import coordinator as fleet
    from coordinator.runner.driver import RunOptions

    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    cleanup.append(tmp_path / "runs")
    before = _handlers()
    result = fleet.run(_offline_job(tmp_path), options=RunOptions(handle_signals=True, tty=False))
    assert result.status == "succeeded"
    assert all(a is b for a, b in zip(before, _handlers(), strict=True)), _handlers()


@pytest.mark.docker
def test_a_run_that_handles_signals_puts_the_handlers_back_when_cancelled_from_outside(
    tmp_path: Path, images: dict[str, str], cleanup: list[Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    import coordinator as fleet
    from coordinator.runner.driver import RunOptions

    cleanup.append(tmp_path / "runs")
    before = _handlers()
    seen: list[Any] = []

    async def cancel_once_started() -> None:
        with anyio.CancelScope() as scope:

            def started(entry: Any) -> None:
                if entry.event == "member_started":
                    seen.append(_handlers())  # the run's own, while it runs
                    scope.cancel()

            options = RunOptions(handle_signals=True, tty=False)
            await fleet.run_async(_job(tmp_path), on_journal=started, options=options)

    with FakeMessagesAPI(coding_policy()) as api:
        monkeypatch.setenv("ANTHROPIC_API_KEY", "k")
        monkeypatch.setenv("ANTHROPIC_BASE_URL", api.url)
        anyio.run(cancel_once_started)
    # Meanwhile it received each signal itself, but one this process ignores (SIGINT
    # when the suite runs as a background job), which it leaves ignored.
    assert seen
    for during, was in zip(seen[0][:2], before[:2], strict=True):
        assert during is was if was is signal.SIG_IGN else during is not was, (seen, before)
    assert all(a is b for a, b in zip(before, _handlers(), strict=True)), _handlers()
    (run,) = (tmp_path / "runs").iterdir()
    assert '"run_interrupted"' in (run / "journal.jsonl").read_text()
