"""Bad job files and arguments, many at once, through the real ``fleet`` command line.

Every case must end the same way: exit 2, one paragraph on stderr (no blank line, no
traceback), and no run directory. Three sources of cases:

- a hand table of the classes that once escaped (deep nesting, an output directory
  that cannot be made, a replay file that is not a trace, ``repo = "/"``, an image
  that is not a plain reference or not on the engine, sizes past the limits);
- a mutation table made from one complete valid job: every leaf replaced by values
  of the wrong kind, every strict table given an unknown key. Each message must name
  the field that was broken (or the table holding it);
- a few of the hand cases again through the installed ``fleet`` executable, so the
  interpreter's own last-resort handler (where a RecursionError would print) is in
  the loop too.

The valid base job names a replay model whose trace does not exist: if a mutation
were accepted after all, the run stops at that preflight error (which names
``model.name``, not the mutated field) instead of starting members.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Callable, Iterator
from copy import deepcopy
from pathlib import Path
from typing import Any

import pytest

from coordinator.cli import main

FLEET = str(Path(sys.executable).with_name("fleet"))
SAFETY_MODEL = "replay:/nonexistent/fleet-fuzz/trace.jsonl"

BASE: dict[str, Any] = {
    "name": "fuzz",
    "output_dir": "runs",
    "model": {"name": SAFETY_MODEL, "max_tokens": 1024},
    "research": {
        "question": "How are tasks cancelled?",
        "members": 2,
        "limits": {"max_turns": 5, "deadline_s": 60.0, "result_tokens": 500},
    },
    "members": [
        {
            "id": "coder",
            "kind": "coding",
            "task": "Make the greeting warmer.",
            "inputs": {"topic": "greeting", "depth": 2},
            "limits": {"max_turns": 3, "max_tokens": 5000, "deadline_s": 30.0},
            "sandbox": {"cpus": 1.0, "memory": "512m", "pids": 64, "workspace_size": "64m"},
            "memory": {"profile": "greeter"},
            "result_schema": {"type": "object"},
            "context": {"compact_fraction": 0.8},
            "todos": True,
            "test": "python3 test_greet.py",
        }
    ],
    "fanout": {
        "max_parallel": 2,
        "min_success": 1,
        "fail_fast": False,
        "warm_pool": True,
        "retry": {"attempts": 2, "backoff_s": 0.5, "backoff_max_s": 5.0, "on": ["crashed"]},
    },
    "egress": {"allow": ["corpus:8080"], "search_url": "http://corpus:8080/search?q={query}"},
    "synthesis": {"enabled": True, "instructions": "Be brief.", "max_result_chars": 1000},
}
STRICT_TABLES = [
    (),
    ("model",),
    ("research",),
    ("research", "limits"),
    ("members", 0),
    ("members", 0, "limits"),
    ("members", 0, "sandbox"),
    ("members", 0, "memory"),
    ("fanout",),
    ("fanout", "retry"),
    ("egress",),
    ("synthesis",),
]
"""Tables that refuse unknown keys (``inputs``, ``result_schema``: any key is fine)."""


def deep(levels: int) -> Any:
    value: Any = "x"
    for _ in range(levels):
        value = [value]
    return value


WRONG: dict[type, list[Any]] = {
    str: [{"x": 1}, [{"x": 1}], deep(40)],
    int: ["many", {"x": 1}, deep(40), float("nan")],
    float: ["soon", [1.0], deep(40), float("inf")],
    bool: ["maybe", {"x": 1}],
    list: ["crashed", {"x": 1}, deep(40)],
}
"""Values of the wrong kind for a leaf of each type (pydantic coerces none of them)."""


# ---------------------------------------------------------------- TOML out


def toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and value != value:
        return "nan"
    if isinstance(value, float) and value in (float("inf"), float("-inf")):
        return "inf" if value > 0 else "-inf"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)  # a JSON string is a valid TOML basic string
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    return "{ " + ", ".join(f"{json.dumps(k)} = {toml_value(v)}" for k, v in value.items()) + " }"


def toml(job: dict[str, Any]) -> str:
    """One ``key = inline value`` line per top-level key: any nesting, no table headers."""
    return "".join(f"{json.dumps(k)} = {toml_value(v)}\n" for k, v in job.items())


def dotted(loc: tuple[str | int, ...]) -> str:
    return "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in loc).lstrip(".")


def leaves(value: Any, loc: tuple[str | int, ...] = ()) -> Iterator[tuple[tuple, Any]]:
    if isinstance(value, dict):
        for k, v in value.items():
            yield from leaves(v, (*loc, k))
    elif isinstance(value, list) and value and isinstance(value[0], dict):
        for i, v in enumerate(value):
            yield from leaves(v, (*loc, i))
    else:
        yield loc, value


def set_at(job: dict[str, Any], loc: tuple, value: Any) -> dict[str, Any]:
    out = deepcopy(job)
    target: Any = out
    for part in loc[:-1]:
        target = target[part]
    if loc:
        target[loc[-1]] = value
    return out


def mutations() -> Iterator[Any]:
    for loc, value in leaves(BASE):
        if loc == ("model", "name"):
            continue  # the safety net stays
        # An input may be a string, number, flag or list of strings: only a table or
        # deep nesting is the wrong kind there.
        wrongs = [{"x": 1}, deep(40)] if "inputs" in loc else WRONG[type(value)]
        for i, wrong in enumerate(wrongs):
            yield pytest.param(loc, set_at(BASE, loc, wrong), id=f"{dotted(loc)}-{i}")
    for loc in STRICT_TABLES:
        table: Any = BASE
        for part in loc:
            table = table[part]
        job = set_at(BASE, loc, {**table, "colour": "red"}) if loc else {**BASE, "colour": "red"}
        yield pytest.param((*loc, "colour"), job, id=f"{dotted(loc) or 'top'}-unknown-key")


# ---------------------------------------------------------------- running the CLI


def assert_refused(code: int, err: str, where: Path) -> None:
    """Exit 2, one paragraph, no traceback, and no run directory under ``where``."""
    assert code == 2, err
    assert "Traceback" not in err, err
    assert not re.search(r"^\w+(Error|Exception)\b", err, re.MULTILINE), err  # a raw exception
    text = err.strip()
    assert text and "\n\n" not in text and len(text.splitlines()) <= 12, err
    made = [p for p in where.rglob("journal.jsonl")]
    assert not made, f"a run directory was made: {made}"
    assert not (where / "runs").exists(), "the default runs/ directory was made"


def run_main(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    try:
        code = main(argv)
    except SystemExit as exc:  # what the console script would turn into an exit code
        code = exc.code if isinstance(exc.code, int) else 1
    return code, capsys.readouterr().err


@pytest.fixture
def place(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A scratch working directory with no API key in the environment."""
    for key in [k for k in os.environ if k.startswith("ANTHROPIC_")]:
        monkeypatch.delenv(key)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_the_base_job_is_valid_and_stops_only_at_its_missing_replay(place, capsys):
    (place / "job.toml").write_text(toml(BASE))
    code, err = run_main(["run", "job.toml"], capsys)
    assert_refused(code, err, place)
    assert err.startswith("fleet: model.name: replay trace not found"), err


@pytest.mark.parametrize(("loc", "job"), list(mutations()))
def test_every_broken_field_is_named_and_refused(place, capsys, loc, job):
    (place / "job.toml").write_text(toml(job))
    code, err = run_main(["run", "job.toml"], capsys)
    assert_refused(code, err, place)
    assert "replay trace" not in err, f"{dotted(loc)} was accepted: {err}"
    named = [dotted(loc[:n]) for n in range(len(loc), 0, -1)]
    lines = [line.strip() for line in err.splitlines()]
    assert any(line.startswith(n) and line[len(n)] in ":.[" for n in named for line in lines), err


# ---------------------------------------------------------------- the hand table


def job_text(**changes: Any) -> str:
    """A small valid coding job (offline) with ``changes`` applied to its member."""
    member = {"kind": "coding", "task": "t", "model": "offline", **changes}
    return toml({"name": "bad", "members": [member]})


Case = tuple[str, Callable[[Path], list[str]], str]


def _write(path: Path, data: str | bytes) -> Path:
    if isinstance(data, bytes):
        path.write_bytes(data)
    else:
        path.write_text(data)
    return path


def _job(text: str) -> Callable[[Path], list[str]]:
    return lambda d: ["run", str(_write(d / "job.toml", text))]


def _deep_toml(d: Path) -> list[str]:
    nested = "[" * 5000 + "]" * 5000
    text = f'name = "x"\n[[members]]\nkind = "coding"\ntask = "t"\ninputs = {{ a = {nested} }}\n'
    return ["run", str(_write(d / "job.toml", text))]


def _output_under_a_file(d: Path) -> list[str]:
    _write(d / "afile", "x")
    return ["run", str(_write(d / "job.toml", job_text())), "--output-dir", str(d / "afile")]


def _output_dir_is_a_file_in_the_job(d: Path) -> list[str]:
    _write(d / "afile", "x")
    text = f"output_dir = {json.dumps(str(d / 'afile' / 'runs'))}\n" + job_text()
    return ["run", str(_write(d / "job.toml", text))]


def _replay(content: bytes) -> Callable[[Path], list[str]]:
    def build(d: Path) -> list[str]:
        trace = _write(d / "trace.jsonl", content)
        return ["run", str(_write(d / "job.toml", job_text(model=f"replay:{trace}")))]

    return build


def _code_repo(repo: str, task: str = "do it") -> Callable[[Path], list[str]]:
    return lambda d: ["code", repo, task]


def _code_here(task: str) -> Callable[[Path], list[str]]:
    def build(d: Path) -> list[str]:
        (d / "proj").mkdir()
        return ["code", str(d / "proj"), task]

    return build


def _code_attempts(n: str) -> Callable[[Path], list[str]]:
    def build(d: Path) -> list[str]:
        (d / "proj").mkdir()
        return ["code", str(d / "proj"), "t", "--attempts", n]

    return build


def _merge_job(one: str, two: str, merge: str) -> Callable[[Path], list[str]]:
    def build(d: Path) -> list[str]:
        for name in ("a", "b"):
            (d / name).mkdir(exist_ok=True)
        member = '[[members]]\nid = "{}"\nkind = "coding"\ntask = "t"\nmodel = "offline"\n{}\n'
        text = f'name = "m"\n[merge]\n{merge}\n' + member.format("a", one) + member.format("b", two)
        return ["run", str(_write(d / "job.toml", text))]

    return build


def _many_members(n: int) -> Callable[[Path], list[str]]:
    member = '[[members]]\nkind = "coding"\ntask = "t"\n'
    return _job('name = "many"\n' + member * n)


HAND: list[Case] = [
    ("deep nesting", _deep_toml, "nested too deeply"),
    ("nested 40 deep", _job(job_text(inputs={"a": deep(40)})), "nested more than 32"),
    ("output dir under a file", _output_under_a_file, "cannot create run directories"),
    ("output_dir in the job", _output_dir_is_a_file_in_the_job, "is not a directory"),
    ("replay of binary", _replay(b"\xff\xfe\x00garbage"), "cannot be read as a trace"),
    ("replay of json", _replay(b'{"a": 1}\n[1, 2]\n'), "records no model calls"),
    ("replay of deep json", _replay(b"[" * 100_000 + b"]" * 100_000), "records no model calls"),
    ("repo is /", _job(job_text(repo="/")), "members[0].repo: / is the root of the file system"),
    ("code /", _code_repo("/"), "REPO (members[0].repo): / is the root"),
    ("code missing dir", _code_repo("/nonexistent/fleet/proj"), "is not a directory"),
    ("code empty task", _code_here("   "), "TASK (members[0].task)"),
    ("image with spaces", _job(job_text(sandbox={"image": "Foo Bar"})), "plain image reference"),
    ("image as option", _job(job_text(sandbox={"image": "--privileged"})), "plain image"),
    ("image bad tag", _job(job_text(sandbox={"image": "x:-1"})), "is not a tag"),
    ("job is a directory", lambda d: ["run", str(d)], "(file)"),
    ("job is binary", lambda d: ["run", str(_write(d / "j.toml", b"\xff\x00"))], "(file)"),
    ("empty question", lambda d: ["research", "  "], "the question is empty"),
    ("zero members", lambda d: ["research", "q", "--members", "0"], "out of range"),
    ("resume nothing", lambda d: ["resume", "no-such-run"], "no run directory 'no-such-run'"),
    ("task 200k characters", _job(job_text(task="x" * 200_000)), "the task is 200,000 characters"),
    ("inputs 200k", _job(job_text(inputs={"a": "b" * 200_000})), "inputs (as JSON) is 200,"),
    ("job file 9 MB", _job(job_text(task="x" * 9 * 2**20)), "a job file is at most 8 MB"),
    ("10,001 members", _many_members(10_001), "the job has 10,001 members; at most 10,000"),
    ("question 120k", lambda d: ["research", "q" * 120_000], "the question is 120,000 characters"),
    ("code task 120k", _code_here("t" * 120_000), "TASK (members[0].task): the task is 120,000"),
    ("egress metadata", lambda d: ["research", "q", "--allow-domain", "169.254.169.254"], "never"),
    ("egress port", lambda d: ["research", "q", "--allow-domain", "a.org:65536"], "TCP port"),
    ("attempts 9", _job(job_text(attempts=9)), "members[0].attempts"),
    ("attempts 0", _job(job_text(attempts=0)), "members[0].attempts"),
    ("attempts a fraction", _job(job_text(attempts=2.5)), "members[0].attempts"),
    (
        "attempts on a browser member",
        _job(job_text(kind="browser", attempts=2)),
        "'attempts' is only for coding members",
    ),
    ("code --attempts 9", _code_attempts("9"), "--attempts (members[0].attempts)"),
    ("merge of one member", _job(job_text(repo=".") + "[merge]\n"), "at least two coding members"),
    ("merge of two repos", _merge_job('repo = "a"', 'repo = "b"', ""), "different repositories"),
    (
        "merge order unknown",
        _merge_job('repo = "a"', 'repo = "a"', 'order = ["x"]'),
        "merge.order[0]",
    ),
    ("merge order twice", _merge_job('repo = "a"', 'repo = "a"', 'order = ["a", "a"]'), "twice"),
    ("merge blank test", _merge_job('repo = "a"', 'repo = "a"', 'test = " "'), "merge.test"),
    ("merge unknown field", _merge_job('repo = "a"', 'repo = "a"', "tset = 1"), "merge.tset"),
    ("code --attempts x", _code_attempts("x"), "--attempts: invalid int value"),
]


@pytest.mark.parametrize(("what", "build", "words"), HAND, ids=[c[0] for c in HAND])
def test_hand_table_of_bad_input_is_refused_before_any_run(place, capsys, what, build, words):
    code, err = run_main(build(place), capsys)
    assert_refused(code, err, place)
    assert words in err, err


def test_an_image_not_on_the_engine_is_bad_input_before_any_run(place, capsys, docker_client):
    """Once: exit 1 after a run directory was made and the member retried as crashed."""
    (place / "job.toml").write_text(job_text(sandbox={"image": "fleet-no-such-image:1"}))
    code, err = run_main(["run", "job.toml"], capsys)
    assert_refused(code, err, place)
    assert "members[0].sandbox.image: image 'fleet-no-such-image:1' is not on this Docker" in err


THROUGH_THE_EXECUTABLE = [
    "deep nesting",
    "replay of binary",
    "repo is /",
    "output dir under a file",
]


@pytest.mark.parametrize("what", THROUGH_THE_EXECUTABLE)
def test_the_installed_fleet_refuses_them_the_same_way(place, what):
    _, build, words = next(c for c in HAND if c[0] == what)
    proc = subprocess.run([FLEET, *build(place)], capture_output=True, text=True, timeout=120)
    assert_refused(proc.returncode, proc.stderr, place)
    assert words in proc.stderr, proc.stderr
