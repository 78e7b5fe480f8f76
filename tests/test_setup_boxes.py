"""Repository setup on real boxes: once per key, cached on the engine, members offline.

Every run here is the real ``fleet`` process with the offline models, against real
Docker boxes. The wheelhouse is made in the test (a wheel written by hand), so nothing
leaves the machine: the setups install from ``/wheels``, and the one that names a host
is refused by the run's egress proxy before any connection is made.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import anyio
import docker
import pytest

from coordinator.cli import main
from coordinator.nodes import prewarm
from coordinator.rundir.runs import RunDir
from coordinator.traceview import load_run, rollup_run
from sandbox.docker import prepared as store
from sandbox.prepared import waiting

pytestmark = pytest.mark.docker
FLEET = str(Path(sys.executable).with_name("fleet"))
EDIT = "replace `world` with `fleet` in `greet.txt`"
SECRET = "s3cr3t-7d1e0b9a44c2"


def _wheel(directory: Path, name: str, version: str, source: str) -> None:
    """A pure-Python wheel, written as pip expects one (PEP 427), with no build tool."""
    dist = f"{name}-{version}.dist-info"
    files = {
        f"{name}/__init__.py": source.encode(),
        f"{dist}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n".encode(),
        f"{dist}/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = []
    for path, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{path},sha256={digest},{len(data)}")
    record.append(f"{dist}/RECORD,,")
    files[f"{dist}/RECORD"] = ("\n".join(record) + "\n").encode()
    with zipfile.ZipFile(directory / f"{name}-{version}-py3-none-any.whl", "w") as whl:
        for path, data in files.items():
            whl.writestr(path, data)


def make_project(base: Path) -> tuple[Path, Path]:
    """A repository whose test imports a package it does not ship, and a wheelhouse
    that has it (``bench/setup.py`` uses them too)."""
    wheels = base / "wheels"
    wheels.mkdir()
    _wheel(wheels, "tinydep", "1.0", "VALUE = 42\n")
    repo = base / "proj"
    repo.mkdir()
    (repo / "requirements.txt").write_text("tinydep==1.0\n")
    (repo / "greet.txt").write_text("hello world\n")
    (repo / "test_dep.py").write_text(
        "import tinydep\n\ndef test_value():\n    assert tinydep.VALUE == 42\n"
    )
    return repo, wheels


@pytest.fixture
def project(tmp_path: Path) -> tuple[Path, Path]:
    return make_project(tmp_path)


INSTALL = "python3 -m venv --system-site-packages .venv && .venv/bin/pip install --no-index -r requirements.txt"


TEST = "python3 -m pytest -q -p no:cacheprovider test_dep.py"


def job_file(
    path: Path,
    repo: Path,
    members: list[str | None],
    *,
    name: str = "setup",
    model: str = "offline",
    extra: tuple[str, ...] = (),
) -> Path:
    """A job of coding members, each with ``setup = <its inline table>`` (None: none),
    running :data:`TEST` (``bench/setup.py`` writes its jobs with it too)."""
    lines = [f'name = "{name}"', "[model]", f'name = "{model}"', *extra]
    lines += ["[fanout]", f"max_parallel = {len(members)}"]
    for i, setup in enumerate(members):
        lines += ["[[members]]", f'id = "m{i}"', 'kind = "coding"', f'task = "{EDIT}"']
        lines += [f"repo = {json.dumps(str(repo))}", f"test = {json.dumps(TEST)}"]
        lines += [f"setup = {setup}"] if setup is not None else []
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.fixture
def out(tmp_path: Path, cleanup: list[Path]) -> Path:
    """The runs' directory; their boxes are removed at teardown, whatever happened."""
    cleanup.append(tmp_path / "runs")
    return tmp_path / "runs"


def _run(
    job: Path, out: Path, env: dict[str, str] | None = None
) -> tuple[subprocess.CompletedProcess, RunDir]:
    """``fleet run JOB`` and the run it made."""
    before = {r.id for r in RunDir.list(out)} if out.exists() else set()
    done = _fleet("run", str(job), "--output-dir", str(out), env=env)
    (run,) = [r for r in RunDir.list(out) if r.id not in before]
    return done, run


def _fleet(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [FLEET, *args, "--plain"],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, **(env or {})},
    )


def _setup_logs(run: RunDir) -> list[Path]:
    return sorted(run.path.glob("members/*/setup.log"))


def _setup_events(run: RunDir, member: str) -> list[dict]:
    lines = (run.member_dir(member) / "trace.jsonl").read_text().splitlines()
    events = [json.loads(line) for line in lines]
    return [e for e in events if e.get("type") == "sandbox" and e.get("action") == "setup"]


def _box_events(run: RunDir, member: str) -> dict[str, list[dict]]:
    """The member's sandbox events by action."""
    lines = (run.member_dir(member) / "trace.jsonl").read_text().splitlines()
    by: dict[str, list[dict]] = {}
    for e in map(json.loads, lines):
        if e.get("type") == "sandbox":
            by.setdefault(e["action"], []).append(e)
    return by


def _key_of(run: RunDir, member: str) -> str:
    (event,) = _setup_events(run, member)
    return str(event["detail"]["key"])


def _install_job(tmp_path: Path, project: tuple[Path, Path], members: int) -> Path:
    """A job of ``members`` members that share one setup (the venv and tinydep from the
    wheelhouse), of a key no earlier test made: the command names the test's directory
    by its whole path, which no other session's test has (its name alone recurs)."""
    repo, wheels = project
    setup = json.dumps(f"{INSTALL} # {tmp_path}")
    table = f"{{ run = {setup}, wheels = {json.dumps(str(wheels))} }}"
    return job_file(tmp_path / "job.toml", repo, [table] * members)


def _forget(client: docker.DockerClient, key: str) -> None:
    for info in store.list_all(client):
        if info.key.startswith(key):
            store.remove(client, info)


def test_four_members_share_one_setup_run_offline_and_a_second_run_reuses_it(
    tmp_path: Path, project: tuple[Path, Path], images: dict, out: Path, docker_client
) -> None:
    repo, _ = project
    job = _install_job(tmp_path, project, 4)
    done, run = _run(job, out)
    assert done.returncode == 0, done.stdout + done.stderr
    outcomes = run.outcomes()
    assert sorted(outcomes) == ["m0", "m1", "m2", "m3"]
    for member, outcome in outcomes.items():
        assert outcome.status == "ok", (member, outcome.reason)
        result = outcome.result
        assert result is not None and result.verified is not None and result.verified.passed
        # What the setup made (.venv, tinydep) is no part of any member's patch.
        assert result.files_changed == ["greet.txt"], result.files_changed
    logs = _setup_logs(run)
    assert len(logs) == 1, logs  # one setup for four members
    assert "tinydep" in logs[0].read_text()
    # pip keeps no cache in the setup's box (PIP_NO_CACHE_DIR), and says nothing of one.
    assert "cache has been disabled" not in logs[0].read_text()
    # Each member's box started while the setup ran and took its tree once it was made
    # (sandbox/prepared/waiting.py); the test's import of tinydep in it is the snapshot's
    # environment at work. What the run kept of the tree went with the run.
    for m in outcomes:
        events = _box_events(run, m)
        (create,), (made,), (lay,) = events["create"], events["setup"], events["lay"]
        assert create["detail"] == {"waits_for": "setup"} and create["ts"] < made["ts"]
        assert lay["box"] == create["box"] and "ok" not in lay["detail"]
    assert not (waiting.trees_dir() / run.id).exists()
    keys = {_key_of(run, m) for m in outcomes}
    assert len(keys) == 1
    key = keys.pop()
    # The wait is in the rollup, the trace text and OTel (a span per member, one made).
    roll = rollup_run(load_run(run.path))
    assert roll.totals["setup_s"] > 0 and all(r.setup_s > 0 for r in roll.members)
    # Their box start-up is what they waited for after the setup (the tree's lay), not
    # the start that ran during it; the box was up after the setup ended.
    for r in roll.members:
        events = _box_events(run, r.member)
        assert r.box_s == pytest.approx(events["lay"][0]["duration_s"], abs=0.002)
        assert r.per_attempt[0].ready >= events["setup"][0]["ts"]
    spans = _setup_spans(run)
    assert sorted(s.attributes["gen_ai.agent.name"] for s in spans) == ["m0", "m1", "m2", "m3"]
    assert [s.attributes["fleet.setup.reused"] for s in spans].count(False) == 1
    page = tmp_path / "trace.html"
    assert _fleet_plain("trace", str(run.path), "--html", str(page)).returncode == 0
    waits = [float(v) for v in re.findall(r'"su": ?([0-9.]+)', page.read_text())]
    assert len(waits) == 4 and all(w > 0 for w in waits), waits  # a setup bar per lane
    # The setup is a lane of its own (made once, for all four) on the page and in the text.
    lanes = re.findall(r'"setups":\[\{"key":"([0-9a-f]+)","st":"(\w+)"', page.read_text())
    assert lanes == [(key[:16], "made")], lanes
    summary = _fleet_plain("trace", str(run.path)).stdout
    assert re.search(
        rf"{key[:16]}  ran in [0-9.]+s \(by m\d\)  for m0, m1, m2, m3  log members/m\d/setup.log",
        summary,
    ), summary
    for m in outcomes:
        traced = _fleet_plain("trace", str(run.path), m).stdout
        assert re.search(r"waited [0-9.]+s on the repository's setup", traced), traced[:400]
    try:
        # The members' boxes had no network: a coding box's default, setup or not.
        for m in outcomes:
            assert all(e["detail"]["ok"] for e in _setup_events(run, m))
        # Run again, as `fleet run JOB` in this process, to see its early boxes.
        seen: list[Any] = []
        real = prewarm.Prewarm.start.__func__  # type: ignore[attr-defined]
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(
                prewarm.Prewarm,
                "start",
                classmethod(lambda cls, path: seen.append(real(cls, path)) or seen[-1]),
            )
            assert main(["run", str(job), "--output-dir", str(out), "--plain"]) == 0
        (second,) = [r for r in RunDir.list(out) if r.id != run.id]
        assert _setup_logs(second) == []  # nothing set up: the snapshot was reused
        for m in ("m0", "m1", "m2", "m3"):
            (event,) = _setup_events(second, m)
            assert event["detail"]["reused"] is True
            assert second.outcomes()[m].status == "ok"
            assert second.outcomes()[m].result.verified.passed  # tinydep was in its box
        # Its boxes started from the snapshot while the job was read, and were the ones
        # the members got (each member one), as a job with no setup gets them.
        (warm,) = seen
        (ref,) = [i.ref for i in store.list_all(docker_client) if i.key.startswith(key)]
        early = {info["Name"].lstrip("/"): info for _, info in warm._boxes}
        assert len(early) == 4 and {i["Config"]["Image"] for i in early.values()} == {ref}
        used = [
            e["box"]
            for m in ("m0", "m1", "m2", "m3")
            for e in map(
                json.loads, (second.member_dir(m) / "trace.jsonl").read_text().splitlines()
            )
            if e.get("type") == "sandbox" and e.get("action") == "create"
        ]
        assert sorted(used) == sorted(early)
        # A manifest changed since: its key is another, so no box of the old snapshot
        # starts early (the run would set up again); as it was, one does.
        text = job.read_text()
        (repo / "requirements.txt").write_text("tinydep==1.0\n# pinned\n")
        changed = prewarm.Prewarm.from_text(text)
        assert changed is not None
        changed._thread.join()
        assert changed._boxes == []
        changed.close()
        (repo / "requirements.txt").write_text("tinydep==1.0\n")
        same = prewarm.Prewarm.from_text(text)
        assert same is not None
        same._thread.join()
        try:
            assert [i["Config"]["Image"] for _, i in same._boxes] == [ref] * 4
        finally:
            same.close()
        assert (
            docker_client.api.containers(all=True, filters={"label": f"fleet.run={same.run}"}) == []
        )
        listed = _fleet_plain("sandbox", "prepared", "ls", "--json")
        rows = [json.loads(line) for line in listed.stdout.splitlines()]
        assert any(r["key"].startswith(key) and r["size"] > 0 for r in rows), rows
        table = _fleet_plain("sandbox", "prepared", "ls").stdout
        assert key[:16] in table and "LAST-USE" in table
        # gc would take it once unused past a TTL (asked without removing anything)...
        dry = _fleet_plain("sandbox", "prepared", "gc", "--ttl-days", "0.000001", "--dry-run")
        assert f"would remove prepared snapshot {key[:16]}" in dry.stdout, dry.stdout
        assert any(r["key"].startswith(key) for r in map(json.loads, _ls_json()))
        # ...and rm takes it by (the start of) its key.
        gone = _fleet_plain("sandbox", "prepared", "rm", key[:16])
        assert gone.returncode == 0 and f"removed prepared snapshot {key[:16]}" in gone.stdout
        assert not any(r["key"].startswith(key) for r in map(json.loads, _ls_json()))
        bad = _fleet_plain("sandbox", "prepared", "rm", "ffffffffffffffff0000")
        assert bad.returncode == 2 and "no snapshot with key" in bad.stderr
    finally:
        _forget(docker_client, key)


def _setup_spans(run: RunDir) -> list:
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from coordinator.traceview import otel

    exporter = InMemorySpanExporter()
    otel.export_run(load_run(run.path), exporter=exporter)
    return [s for s in exporter.get_finished_spans() if s.name.startswith("setup ")]


def _fleet_plain(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([FLEET, *args], capture_output=True, text=True, timeout=120)


def _ls_json() -> list[str]:
    return _fleet_plain("sandbox", "prepared", "ls", "--json").stdout.splitlines()


def test_a_failing_setup_fails_every_member_that_needs_it_and_is_never_cached(
    tmp_path: Path, project: tuple[Path, Path], images: dict, out: Path, docker_client
) -> None:
    repo, _ = project
    setup = json.dumps(
        f"echo resolving deps; echo 'no matching distribution' >&2; exit 3 # {tmp_path}"
    )
    job = job_file(tmp_path / "job.toml", repo, [f"{{ run = {setup} }}"] * 2)
    before = {p.key for p in store.list_all(docker_client)}
    done, run = _run(job, out)
    assert done.returncode != 0
    for member, outcome in run.outcomes().items():
        assert outcome.status == "failed", member
        assert outcome.reason.startswith("setup failed (exit 3): "), outcome.reason
        assert "no matching distribution" in outcome.reason
    # Run once; the other member met the same failure (each has its log, to read why).
    ran = [e["detail"]["ran"] for m in ("m0", "m1") for e in _setup_events(run, m)]
    assert sorted(ran) == [False, True]
    assert len(_setup_logs(run)) == 2
    spans = _setup_spans(run)
    assert len(spans) == 2 and all(s.status.status_code.name == "ERROR" for s in spans)
    assert {p.key for p in store.list_all(docker_client)} == before
    # The boxes that waited for it went with the members: none is left, nor anything
    # kept for them.
    for m in ("m0", "m1"):
        events = _box_events(run, m)
        assert events["create"][0]["detail"] == {"waits_for": "setup"}
        assert [e["box"] for e in events["create"]] == [e["box"] for e in events["close"]]
        assert "lay" not in events
    assert docker_client.api.containers(all=True, filters={"label": f"fleet.run={run.id}"}) == []
    assert not (waiting.trees_dir() / run.id).exists()


def test_an_endless_setup_is_cut_at_its_limit_and_its_output_bounded(
    tmp_path: Path, project: tuple[Path, Path], images: dict, out: Path
) -> None:
    repo, _ = project
    # Writes without end (hundreds of MB in its 3 s) and never finishes.
    setup = json.dumps(f"echo started; yes 'no end to this line' # {tmp_path}")
    job = job_file(tmp_path / "job.toml", repo, [f"{{ run = {setup}, timeout_s = 3 }}"])
    done, run = _run(job, out)
    assert done.returncode != 0
    reason = run.outcomes()["m0"].reason
    assert reason.startswith("setup failed (timed out after 3 s)"), reason
    assert len(reason) < 2000
    log = run.member_dir("m0") / "setup.log"
    assert log.stat().st_size < 3 * 1024 * 1024  # the box's stream cap, head and tail
    assert log.read_text().startswith("$ echo started")


def test_a_host_the_setup_was_not_allowed_is_refused_by_the_proxy(
    tmp_path: Path, project: tuple[Path, Path], images: dict, out: Path
) -> None:
    repo, _ = project
    # The proxy refuses by name: no address outside the machine is ever looked up.
    fetch = (
        "python3 -c \"import os, urllib.request as u; print('proxy', os.environ['HTTPS_PROXY']); "
        "u.urlopen('http://not-allowed.example/simple/')\""
    )
    setup = json.dumps(f"{fetch} # {tmp_path}")
    job = job_file(tmp_path / "job.toml", repo, [f'{{ run = {setup}, allow = ["pypi.org"] }}'])
    done, run = _run(job, out)
    assert done.returncode != 0
    reason = run.outcomes()["m0"].reason
    assert reason.startswith("setup failed (exit 1)"), reason
    assert "403" in reason or "Forbidden" in reason, reason
    log = (run.member_dir("m0") / "setup.log").read_text()
    assert "proxy http://" in log  # it went through the run's proxy, the only way out


def test_secrets_reach_the_setup_only_and_never_the_snapshot_log_or_image(
    tmp_path: Path, project: tuple[Path, Path], images: dict, out: Path, docker_client
) -> None:
    repo, wheels = project
    env = {"INDEX_TOKEN": SECRET}
    # Uses the secret and says it (the log masks it); keeps it in the home, as a tool's
    # credential store would (the home is writable, and goes with the setup's box);
    # writes a file in the tree, not the secret.
    digest = hashlib.sha256(SECRET.encode()).hexdigest()
    check = f'test "$(printf %s "$INDEX_TOKEN" | sha256sum | cut -d" " -f1)" = {digest}'
    store_it = 'mkdir -p ~/.config/tool && printf %s "$INDEX_TOKEN" > ~/.config/tool/token'
    uses = json.dumps(
        f'{check} && echo "token $INDEX_TOKEN" && {store_it} && {INSTALL} # {tmp_path}'
    )
    # Writes the secret into the tree, as a pip.conf with a token in its URL would be.
    leaks = json.dumps(f'echo "index-url = https://u:$INDEX_TOKEN@idx" > pip.conf # {tmp_path}')
    w = json.dumps(str(wheels))
    job = job_file(
        tmp_path / "job.toml",
        repo,
        [
            f'{{ run = {uses}, wheels = {w}, secrets = ["INDEX_TOKEN"] }}',
            f'{{ run = {leaks}, secrets = ["INDEX_TOKEN"] }}',
        ],
    )
    done, run = _run(job, out, env)
    outcomes = run.outcomes()
    assert outcomes["m0"].status == "ok", outcomes["m0"].reason
    assert outcomes["m1"].status == "failed"
    assert "holds the value of secret INDEX_TOKEN" in outcomes["m1"].reason
    assert SECRET not in done.stdout + done.stderr
    key = _key_of(run, "m0")
    try:
        # Two setups, two keys, in one run.
        assert (run.member_dir("m1") / "trace.jsonl").exists()
        log = (run.member_dir("m0") / "setup.log").read_text()
        assert "token ***" in log and SECRET not in log
        for path in run.path.rglob("*"):
            if path.is_file():
                assert SECRET.encode() not in path.read_bytes(), path
        (info,) = [p for p in store.list_all(docker_client) if p.key.startswith(key)]
        image = docker_client.api.inspect_image(info.ref)
        assert SECRET not in json.dumps(image)
        assert SECRET not in json.dumps(docker_client.api.history(info.ref))
        box = docker_client.api.create_container(info.ref, network_disabled=True)
        try:
            exported = b"".join(docker_client.api.export(box["Id"]))
        finally:
            docker_client.api.remove_container(box["Id"], force=True)
        assert b"tinydep" in exported and SECRET.encode() not in exported
    finally:
        _forget(docker_client, key)


def test_fleet_code_setup_auto_from_a_wheelhouse_runs_the_projects_test_in_its_box(
    tmp_path: Path, project: tuple[Path, Path], images: dict, out: Path, docker_client
) -> None:
    repo, wheels = project
    # "auto" is one command for every project: this one's own key comes from its
    # requirements file (made unique here), as a real project's would.
    (repo / "requirements.txt").write_text(f"tinydep==1.0  # {tmp_path}\n")
    done = subprocess.run(
        [
            FLEET,
            "code",
            str(repo),
            EDIT,
            "--model",
            "offline",
            "--plain",
            "--output-dir",
            str(out),
            "--test",
            TEST,
            "--setup",
            "auto",
            "--wheels",
            str(wheels),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "files changed: greet.txt" in done.stdout
    assert "(passed" in done.stdout
    assert "setup: made the prepared snapshot" in done.stdout and "setup.log" in done.stdout
    (run,) = RunDir.list(out)
    log = (run.member_dir("coder") / "setup.log").read_text()
    assert log.startswith("$ set -e; python3 -m venv") and "tinydep" in log  # what ran
    _forget(docker_client, _key_of(run, "coder"))


@pytest.fixture
def freezegun(tmp_path: Path) -> tuple[Path, Path]:
    """freezegun's published source release (its own tests included), unpacked, and the
    wheelhouse ``make test-deps`` filled with what its tests import."""
    import tarfile

    from sandbox.images.catalog import cache_dir

    here = cache_dir() / "test-projects" / "freezegun"
    if not (here / ".done").exists():
        from conftest import missing_dependency

        missing_dependency(f"{here} is missing; run 'make test-deps' (it downloads it)")
    with tarfile.open(here / "freezegun-1.5.1.tar.gz") as sdist:
        sdist.extractall(tmp_path, filter="data")
    return tmp_path / "freezegun-1.5.1", here


def test_a_real_projects_own_tests_pass_in_its_prepared_box_and_fail_without_it(
    tmp_path: Path, freezegun: tuple[Path, Path], images: dict, out: Path, docker_client
) -> None:
    repo, wheels = freezegun
    install = "python3 -m venv --system-site-packages .venv && .venv/bin/pip install --no-index python-dateutil"
    setup = (
        f"{{ run = {json.dumps(f'{install} # {tmp_path}')}, wheels = {json.dumps(str(wheels))} }}"
    )
    member = [
        'kind = "coding"',
        f'task = "{EDIT}"',
        f"repo = {json.dumps(str(repo))}",
        'test = "python3 -m pytest -q -p no:cacheprovider tests"',
        'files = { "greet.txt" = "hello world\\n" }',
    ]
    job = tmp_path / "job.toml"
    lines = [
        'name = "freezegun"',
        "[model]",
        'name = "offline"',
        "[[members]]",
        'id = "prepared"',
        *member,
        f"setup = {setup}",
    ]
    lines += ["[[members]]", 'id = "bare"', *member, "test_gate = false"]
    job.write_text("\n".join(lines) + "\n")
    done, run = _run(job, out)
    assert done.returncode == 0, done.stdout + done.stderr
    prepared, bare = run.outcomes()["prepared"], run.outcomes()["bare"]
    try:
        assert prepared.status == "ok", prepared.reason
        assert prepared.result.verified.passed, prepared.result.verified.output_tail
        assert " passed" in prepared.result.verified.output_tail
        assert prepared.result.files_changed == ["greet.txt"]
        # The same repository in a plain box: its tests cannot even import.
        assert bare.result.verified.passed is False
        assert "dateutil" in bare.result.verified.output_tail
    finally:
        _forget(docker_client, _key_of(run, "prepared"))


def test_a_commit_helper_left_by_a_killed_process_is_removed_by_gc(
    images: dict, docker_client
) -> None:
    helper = docker_client.api.create_container(
        images["coding"], network_disabled=True, labels={"fleet.kind": "prepare"}
    )
    try:
        mine = {helper["Id"]}  # other tests' commits may be under way meanwhile
        assert store.remove_helpers(docker_client, age_s=3600, only=mine) == 0  # recent: kept
        assert store.remove_helpers(docker_client, age_s=0, only=mine) == 1
        assert not docker_client.api.containers(all=True, filters={"id": helper["Id"]})
    finally:
        with contextlib.suppress(docker.errors.NotFound):
            docker_client.api.remove_container(helper["Id"], force=True)


def _kill_after(proc: subprocess.Popen, base: Path, pattern: str, results: int) -> None:
    """SIGKILL ``proc`` once the member's trace (``base.glob(pattern)``) holds ``results``
    tool results."""
    import signal
    import time

    from subagents.trace import read_trace

    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and proc.poll() is None:
        traces = list(base.glob(pattern))
        if traces and sum(e.type == "tool_result" for e in read_trace(traces[0])) >= results:
            break
        time.sleep(0.05)
    assert proc.poll() is None, proc.stderr.read()[-3000:] if proc.stderr else ""
    proc.send_signal(signal.SIGKILL)
    proc.wait(10)


def test_a_resumed_run_sets_up_again_only_when_its_snapshot_is_gone(
    tmp_path: Path, project: tuple[Path, Path], images: dict, out: Path, docker_client, fake_api
) -> None:
    from conftest import remove_run
    from fleet_policies import appending_policy

    repo, wheels = project
    setup = json.dumps(f"{INSTALL} # {tmp_path}")
    table = f"{{ run = {setup}, wheels = {json.dumps(str(wheels))} }}"
    job = job_file(tmp_path / "job.toml", repo, [table], model="claude-sonnet-5")
    api = fake_api(appending_policy(14, latency_s=0.3))
    env = {"ANTHROPIC_API_KEY": "test-key", "ANTHROPIC_BASE_URL": api.url}
    started: list[subprocess.Popen] = []

    def start(*args: str) -> subprocess.Popen:
        started.append(
            subprocess.Popen(
                [FLEET, *args, "--plain"],
                env={**os.environ, **env},
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
        return started[-1]

    key = ""
    try:
        # Its first life makes the snapshot and is killed mid-member.
        _kill_after(
            start("run", str(job), "--output-dir", str(out)), out, "*/members/m0/trace.jsonl", 3
        )
        (run,) = RunDir.list(out)
        key = _key_of(run, "m0")
        # The second starts from the snapshot (nothing set up) and is killed in turn.
        _kill_after(start("resume", str(run.path)), run.member_dir("m0"), "trace.jsonl", 6)
        # The snapshot goes (the killed run's box first: a snapshot in use is kept), and
        # the third life sets up again, then finishes.
        remove_run(docker_client, run.id)
        _forget(docker_client, key)  # as `fleet sandbox prepared rm` would
        assert not any(p.key.startswith(key) for p in store.list_all(docker_client))
        resumed = _fleet("resume", str(run.path), env=env)
        assert resumed.returncode == 0, resumed.stdout + resumed.stderr
        lives = _setup_events(run, "m0")
        assert [e["detail"]["reused"] for e in lives] == [False, True, False]
        assert all(e["detail"]["ok"] and e["detail"]["key"] == key[:16] for e in lives)
        outcome = run.outcome("m0")
        assert outcome.status == "ok", outcome.reason
        assert outcome.result is not None and outcome.result.verified is not None
        assert outcome.result.verified.passed  # tinydep imported: the tree was laid
    finally:
        for proc in started:
            if proc.poll() is None:
                proc.kill()
        if key:
            _forget(docker_client, key)


def test_a_box_that_waited_but_cannot_take_the_tree_gives_way_to_one_of_the_snapshot(
    tmp_path: Path, project: tuple[Path, Path], images: dict, out: Path, docker_client
) -> None:
    from sandbox.docker.backend import DockerBackend
    from sandbox.errors import SandboxUnavailable

    job = _install_job(tmp_path, project, 2)
    refused: list[str] = []

    async def no_lay(self: DockerBackend, box: Any, *, ref: str) -> None:
        refused.append(box.name)
        await self.remove_container(box.id)  # as a failed lay leaves it
        raise SandboxUnavailable(f"box {box.name}: the prepared tree did not copy (test)")

    from sandbox.prepared.prepare import Preparer

    done = Preparer.done_waiting
    left: list[bool] = []

    async def done_then_look(self: Preparer, tree: Path) -> None:
        await done(self, tree)
        left.append(await anyio.Path(tree).exists())

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(DockerBackend, "lay_tree", no_lay)
        patch.setattr(Preparer, "done_waiting", done_then_look)
        assert main(["run", str(job), "--output-dir", str(out), "--plain"]) == 0
    (run,) = RunDir.list(out)
    key = _key_of(run, "m0")
    try:
        assert len(refused) == 2
        # The kept tree went as soon as both boxes were done with it, within the run.
        assert left == [True, False]
        roll = rollup_run(load_run(run.path))
        for m in ("m0", "m1"):
            outcome = run.outcomes()[m]
            assert outcome.status == "ok" and outcome.result.verified.passed, outcome.reason
            events = _box_events(run, m)
            waited, instead = events["create"]
            assert waited["detail"] == {"waits_for": "setup"} and waited["box"] in refused
            assert instead["detail"] == {"replaces": waited["box"]}
            assert events["lay"][0]["detail"]["ok"] is False
        # One attempt each on the trace, the box made instead part of it.
        assert [r.attempts for r in roll.members] == [1, 1]
        assert (
            docker_client.api.containers(all=True, filters={"label": f"fleet.run={run.id}"}) == []
        )
    finally:
        _forget(docker_client, key)
