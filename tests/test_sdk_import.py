"""The ``anthropic`` SDK's import runs on a thread beside a run's start
(``subagents/model/sdk_import.py``): it starts before the job is checked, the main
thread joins it without importing twice or seeing half a module, a failing import is
said once before any run exists, a command refused before any model call exits without
waiting for it, and offline models never start it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from coordinator import api
from coordinator.cli import commands as cli_commands
from coordinator.cli import early, main
from coordinator.errors import UsageError
from coordinator.job.jobfile import parse_job
from coordinator.runner import preflight
from coordinator.runner.driver import RunOptions
from subagents.model import sdk_import
from subagents.model.names import calls_the_api

ROOT = Path(__file__).resolve().parent.parent


def _python(code: str, tmp_path: Path, *, path: Sequence[Path] = (), **env: str) -> Any:
    """``code`` in a fresh interpreter (no SDK loaded yet), Fleet's checkout importable."""
    base = {k: v for k, v in os.environ.items() if not k.startswith(("ANTHROPIC_", "FLEET_"))}
    base["PYTHONPATH"] = os.pathsep.join(map(str, [*path, ROOT]))
    return subprocess.run(
        [sys.executable, "-c", code],
        cwd=tmp_path,
        env={**base, **env},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def _fleet(argv: list[str], tmp_path: Path, *, path: Sequence[Path] = (), **env: str) -> Any:
    code = f"import sys; from coordinator.cli import main; sys.exit(main({argv!r}))"
    return _python(code, tmp_path, path=path, **env)


def _sdk_package(tmp_path: Path, body: str) -> Path:
    """A directory holding an ``anthropic`` package whose import runs ``body``."""
    where = tmp_path / "site"
    (where / "anthropic").mkdir(parents=True)
    (where / "anthropic" / "__init__.py").write_text(body)
    return where


# ---------------------------------------------------------------- which models start it


@pytest.mark.parametrize(
    ("name", "key", "calls"),
    [
        ("claude-sonnet-5", None, True),
        ("  claude-opus-4 ", None, True),
        ("auto", "k", True),
        ("auto", None, False),
        ("offline", "k", False),
        ("offline:echo", "k", False),
        ("replay:/runs/r/members/m/trace.jsonl", "k", False),
        ("", "k", False),
        ("   ", "k", False),
    ],
)
def test_only_a_model_the_messages_api_answers_calls_it(
    name: str, key: str | None, calls: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("FLEET_MODEL", raising=False)
    if key is None:
        monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    else:
        monkeypatch.setenv("ANTHROPIC_API_KEY", key)
    assert calls_the_api(name) is calls


def test_the_job_files_model_fields_are_read_where_the_preflight_reads_them() -> None:
    raw = {
        "members": [{"model": "offline"}, {"kind": "coding"}, "not a table", {"model": 7}],
        "synthesis": {"model": "claude-haiku-4"},
        "lead": "not a table",
    }
    assert early.job_models(raw) == ["auto", "offline", "claude-haiku-4"]
    assert early.job_models({"model": {"name": "offline"}}) == ["offline"]
    assert early.job_models(["not", "a", "job"]) == []


def test_offline_jobs_and_commands_never_start_the_import(tmp_path: Path) -> None:
    job = tmp_path / "job.toml"
    job.write_text(
        '[model]\nname = "offline"\n[[members]]\nkind = "coding"\ntask = "t"\n'
        '[[members]]\nkind = "coding"\ntask = "u"\nmodel = "replay:x.jsonl"\n'
    )
    broken = tmp_path / "broken.toml"
    broken.write_text('[model]\nname = "claude-sonnet-5"\n[[members]\n')  # no TOML
    deep = tmp_path / "deep.toml"  # past the TOML parser's recursion limit
    deep.write_text('[model]\nname = "claude-sonnet-5"\n[x]\ny = ' + "[" * 5000 + "]" * 5000)
    code = f"""
import argparse, sys, threading
from coordinator.cli import early
from subagents.model import sdk_import
started = [
    early.sdk_for_job(["run", {str(job)!r}]),
    early.sdk_for_job(["run", {str(broken)!r}]),
    early.sdk_for_job(["run", {str(deep)!r}]),
    early.sdk_for_job(["run", {str(job)!r}, "--help"]),
    early.sdk_for_command(argparse.Namespace(command="code", model="offline:coding")),
    early.sdk_for_command(argparse.Namespace(command="research", model=None)),  # auto, no key
    early.sdk_for_command(argparse.Namespace(command="runs")),
    sdk_import.start_for(["offline", "replay:t.jsonl", "", 5]),
]
print(started, sorted(t.name for t in threading.enumerate()),
      sorted(m for m in sys.modules if m.split('.')[0] == 'anthropic'))
"""
    done = _python(code, tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split("\n")[0] == f"{[False] * 8} ['MainThread'] []"


# ---------------------------------------------------------------- when it starts


@pytest.fixture
def events(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> list[str]:
    """What happens, in order: the SDK's import started, the job read or checked, the
    preflight (which refuses the job here, so nothing runs and nothing is imported)."""
    seen: list[str] = []
    monkeypatch.setenv("ANTHROPIC_API_KEY", "k")
    monkeypatch.delenv("FLEET_MODEL", raising=False)
    monkeypatch.chdir(tmp_path)

    def start() -> bool:  # once per process, as the real one
        if "sdk import" in seen:
            return False
        seen.append("sdk import")
        return True

    monkeypatch.setattr(sdk_import, "start", start)
    monkeypatch.setattr(early, "prewarm", lambda argv: None)  # no boxes in this test
    real_load, real_parse = cli_commands.load_job, cli_commands.parse_job

    def load(*a: Any, **k: Any) -> Any:
        seen.append("job read")
        return real_load(*a, **k)

    def parse(*a: Any, **k: Any) -> Any:
        seen.append("job checked")
        return real_parse(*a, **k)

    def refuse(*a: Any, **k: Any) -> Any:
        seen.append("preflight")
        raise UsageError("refused by the test")

    monkeypatch.setattr(cli_commands, "load_job", load)
    monkeypatch.setattr(cli_commands, "parse_job", parse)
    monkeypatch.setattr(preflight, "preflight", refuse)
    return seen


def test_fleet_run_starts_the_import_before_it_reads_the_job(
    tmp_path: Path, events: list[str]
) -> None:
    job = tmp_path / "job.toml"
    job.write_text('name = "j"\n[[members]]\nkind = "coding"\ntask = "t"\n')  # auto: Claude
    assert main(["run", str(job), "--plain"]) == 2
    assert events == ["sdk import", "job read", "preflight"]


def test_fleet_code_starts_the_import_before_it_checks_the_job(
    tmp_path: Path, events: list[str]
) -> None:
    assert main(["code", str(tmp_path), "task", "--model", "claude-sonnet-5"]) == 2
    assert events == ["sdk import", "job checked", "preflight"]
    events.clear()
    assert main(["code", str(tmp_path), "task", "--mod", "offline"]) == 2  # argparse's reading
    assert events == ["job checked", "preflight"]


def test_the_api_starts_the_import_before_its_preflight(tmp_path: Path, events: list[str]) -> None:
    text = (
        'name = "j"\n[model]\nname = "claude-sonnet-5"\n[[members]]\nkind = "coding"\ntask = "t"\n'
    )
    with pytest.raises(api.RunNotStarted, match="refused by the test"):
        api.check_new(parse_job(text), text, RunOptions(), output_dir=tmp_path)
    assert events == ["sdk import", "preflight"]
    events.clear()
    offline = text.replace("claude-sonnet-5", "offline")
    with pytest.raises(api.RunNotStarted):
        api.check_new(parse_job(offline), offline, RunOptions(), output_dir=tmp_path)
    assert events == ["preflight"]


# ---------------------------------------------------------------- joining it


_JOIN = """
import importlib.abc, json, os, sys, threading, time

entered, release = threading.Event(), threading.Event()
loads, main_waited = [], []

class Seen(importlib.abc.MetaPathFinder):
    # Who looks the SDK up: whoever imports it (a finder must not block: Python calls
    # it under the global import lock).
    def find_spec(self, name, path=None, target=None):
        if name == "anthropic":
            loads.append(threading.current_thread().name)
        return None

TYPES = os.path.join("anthropic", "types", "__init__.py")

def hold(frame, event, arg):
    # Holds the SDK thread as it starts executing `anthropic.types`: `anthropic` is in
    # sys.modules, unfinished, its import lock held, until the main thread waits on it.
    if event == "call" and frame.f_code.co_filename.endswith(TYPES):
        sys.settrace(None)
        entered.set()
        release.wait(90)
    return None

def watch():
    main = threading.main_thread().ident
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        frame = sys._current_frames().get(main)
        while frame is not None:
            code = frame.f_code
            if "importlib._bootstrap" in code.co_filename and code.co_name == "acquire":
                main_waited.append(True)
                release.set()
                return
            frame = frame.f_back
        time.sleep(0.001)
    release.set()

sys.meta_path.insert(0, Seen())
from subagents.model import sdk_import
threading.settrace(hold)  # for the threads started from now on: the SDK's
assert sdk_import.start()
threading.settrace(None)
assert entered.wait(60)
assert "anthropic" in sys.modules and not hasattr(sys.modules["anthropic"], "AsyncAnthropic")
threading.Thread(target=watch, daemon=True).start()
import subagents.model.claude as claude  # the main thread, while the thread imports
import anthropic
model = claude.AnthropicModel("claude-sonnet-5", api_key="k", base_url="http://127.0.0.1:9")
print(json.dumps({
    "loads": loads,
    "main_waited": main_waited,
    "complete": all(hasattr(anthropic, n) for n in ("AsyncAnthropic", "APIStatusError", "types")),
    "message": anthropic.types.Message.__name__,
    "client": type(model.client).__name__,
}))
"""


def test_the_main_thread_joins_the_threads_import_and_gets_the_whole_module(
    tmp_path: Path,
) -> None:
    done = _python(_JOIN, tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["main_waited"] == [True]  # it waited on the thread's import lock
    assert seen["loads"] == ["fleet-sdk-import"]  # and did not import the SDK again
    assert seen["complete"] and seen["message"] == "Message"
    assert seen["client"] == "AsyncAnthropic"


# ---------------------------------------------------------------- failing, ending early


@pytest.mark.docker
def test_an_sdk_that_fails_to_import_is_said_once_before_any_run_exists(
    tmp_path: Path, images: dict[str, str], docker_client: Any, cleanup: list[Path]
) -> None:
    cleanup.append(tmp_path / "runs")
    site = _sdk_package(tmp_path, 'raise ImportError("the SDK is broken (test)")\n')
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "a.txt").write_text("a\n")
    done = _fleet(
        ["code", str(repo), "Edit a.txt.", "--plain", "--output-dir", str(tmp_path / "runs")],
        tmp_path,
        path=[site],
        ANTHROPIC_API_KEY="k",
        ANTHROPIC_BASE_URL="http://127.0.0.1:9",
    )
    assert done.returncode == 1, done.stderr[-3000:]
    lines = done.stderr.strip().splitlines()
    assert lines == [
        "fleet: the Messages API client cannot be loaded: the 'anthropic' package fails to "
        "import (ImportError: the SDK is broken (test)); reinstall Fleet's dependencies "
        "(pip install -e . in its checkout) or choose an offline model (--model offline)"
    ], done.stderr[-3000:]
    assert not (tmp_path / "runs").exists()


def test_a_command_refused_before_any_model_call_does_not_wait_for_the_import(
    tmp_path: Path,
) -> None:
    # An SDK whose import never ends: the command must still end at once, as it would
    # without the thread, saying only what was wrong with the job.
    began = tmp_path / "began"
    site = _sdk_package(
        tmp_path,
        f"import pathlib, threading\npathlib.Path({str(began)!r}).touch()\n"
        "threading.Event().wait()\n",
    )
    job = tmp_path / "job.toml"
    job.write_text('name = "j"\n[model]\nname = "claude-sonnet-5"\n[fanout]\nmin_success = 0\n')
    done = _fleet(["run", str(job), "--plain"], tmp_path, path=[site], ANTHROPIC_API_KEY="k")
    assert done.returncode == 2, done.stderr[-3000:]
    assert began.exists()  # the import had started, and was left behind
    assert done.stderr.startswith("fleet: ") and "Traceback" not in done.stderr
    assert "Exception in thread" not in done.stderr and done.stdout == ""


# ---------------------------------------------------------------- the collector at start


def test_the_collector_is_paused_while_a_run_loads_and_runs_during_the_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    code = f"""
import gc, sys, types
from coordinator import api
from coordinator.cli import main
from coordinator.nodes.capacity import Parallelism
from coordinator.runner import preflight

seen = []
def checked(*a, **k):
    seen.append(("preflight", gc.isenabled()))
    return Parallelism(1, "test")
async def go(self):
    seen.append(("run", gc.isenabled()))
    return types.SimpleNamespace(exit_code=0)
preflight.preflight = checked
api.Ready.go = go
job = {str(tmp_path / "job.toml")!r}
open(job, "w").write('name = "j"\\n[model]\\nname = "offline"\\n[[members]]\\nkind = "coding"\\ntask = "t"\\n')
before = gc.get_freeze_count()
assert main(["run", job, "--plain", "--output-dir", {str(tmp_path / "runs")!r}]) == 0
frozen = gc.get_freeze_count() - before
assert main(["runs", "--output-dir", {str(tmp_path / "runs")!r}]) == 0
assert main(["run", "no-such-job.toml"]) == 2
print(seen, frozen > 10_000, gc.isenabled(), gc.get_freeze_count() - before == frozen)
"""
    done = _python(code, tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    # Paused through the preflight, collecting during the run and after every command;
    # what was loaded frozen once, at the first command only.
    assert done.stdout.splitlines()[-1] == ("[('preflight', False), ('run', True)] True True True")
