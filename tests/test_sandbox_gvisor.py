"""Boxes under gVisor keep the promises boxes under runc keep.

One coding box under gVisor takes the hostile workloads one after another (a 4 GiB
allocation, a growing memory hog, 5,000 forks, 8 GiB written to ``/tmp``): each is
refused inside the box, which lives on. A box whose programs together pass its
memory ends, reported as ``oom-killed``. On a run network a gVisor box reaches its
proxy's port and nothing else of the run; a browser box renders a page over CDP; a
member runs through the CLI with a job tool and an MCP server in its gVisor box; and
runsc processes with no container behind them are ended, never another's.

The engine must have Fleet's gVisor runtimes (``fleet setup --gvisor``, which
``make test`` runs): their absence skips these tests, or fails them under CI.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import anyio
import pytest
from conftest import missing_dependency
from network_support import CONNECT, run_proxy, service_box
from scripted_calls import tool_results

from coordinator.rundir.runs import RunDir
from sandbox.docker import gvisor
from sandbox.docker.backend import DockerBackend, DockerSandbox
from sandbox.docker.firewall import PROXY_PORT, SERVICE_PORT
from sandbox.errors import SandboxCrashed, SandboxUnavailable
from sandbox.spec import NetworkPolicy, SandboxSpec
from subagents.fake_api import tool_use
from subagents.trace import read_trace

pytestmark = [pytest.mark.docker, pytest.mark.anyio]

GVISOR_KERNEL = "Linux version 4.4.0"
"""What gVisor's Sentry says it is in ``/proc/version`` (the host runs a newer kernel)."""
MCP_EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "mcp"


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="module")
def gvisor_engine(docker_client: Any) -> Any:
    missing = gvisor.missing_runtimes(docker_client.info())
    if missing:
        missing_dependency(
            f"the engine lacks Fleet's gVisor runtimes {missing}; run 'fleet setup --gvisor'"
        )
    return docker_client


@pytest.fixture(scope="module")
def backend(gvisor_engine: Any, images: dict[str, str]) -> DockerBackend:
    return DockerBackend(gvisor_engine, images=images)


@pytest.fixture(scope="module")
def module_run(gvisor_engine: Any) -> Iterator[str]:
    from conftest import remove_run

    from sandbox.docker.reaper import mark_done, mark_live

    rid = f"test-gvisor-{os.getpid()}"
    mark_live(rid)
    try:
        yield rid
    finally:
        remove_run(gvisor_engine, rid)
        mark_done(rid)


@pytest.fixture(scope="module")
async def box(backend: DockerBackend, module_run: str) -> AsyncIterator[DockerSandbox]:
    """One hardened coding box under gVisor, reused by every probe of this module."""
    spec = SandboxSpec(runtime="gvisor", memory="512m", pids=128)
    async with await backend.create(spec, run=module_run, member="gv") as made:
        yield made


async def alive(box: DockerSandbox) -> None:
    with anyio.fail_after(20):
        res = await box.exec("echo alive", timeout=10)
    assert res.stdout == "alive\n", res


async def test_the_box_runs_on_gvisors_kernel_and_coreutils_work(box: DockerSandbox) -> None:
    res = await box.exec("cat /proc/version; echo x > f; ls -la f; stat -c %s f", timeout=30)
    assert res.ok, res
    assert res.stdout.startswith(GVISOR_KERNEL), res.stdout
    assert " f\n" in res.stdout and res.stdout.endswith("2\n"), res.stdout


async def test_an_allocation_past_memory_fails_and_the_box_lives(box: DockerSandbox) -> None:
    big = await box.exec(["python3", "-c", "bytearray(4 * 2**30)"], timeout=60)
    assert big.exit_code == 1 and "MemoryError" in big.stderr, big
    hog = "chunks = []\nwhile True: chunks.append(bytearray(8 << 20))"
    grown = await box.exec(["python3", "-c", hog], timeout=60)
    assert grown.exit_code == 1 and "MemoryError" in grown.stderr, grown
    await alive(box)


async def test_forks_past_pids_fail_and_the_box_lives(box: DockerSandbox) -> None:
    forks = (
        "import os, time\nn = 0\ntry:\n    for _ in range(5000):\n"
        "        if os.fork() == 0:\n            time.sleep(30); os._exit(0)\n"
        "        n += 1\nexcept OSError as e:\n    print(e.errno, n)\n"
    )
    res = await box.exec(["python3", "-c", forks], timeout=120)
    errno, started = res.stdout.split()
    assert errno == "11" and int(started) < 128, res  # EAGAIN, within the box's pids
    assert res.leftovers >= int(started), res  # the agent ended them with the command
    await alive(box)


async def test_a_command_past_its_timeout_ends_with_what_it_started(box: DockerSandbox) -> None:
    res = await box.exec("echo started; sleep 60 & sleep 60", timeout=1)
    assert res.timed_out and res.stdout == "started\n" and res.duration_s < 15, res
    left = await box.exec("ps -eo args | grep -c '^sleep 60' || true")
    assert left.stdout.strip() == "0", left


async def test_a_full_tmp_is_enospc_and_the_box_lives(box: DockerSandbox) -> None:
    res = await box.exec("head -c 8G /dev/zero > /tmp/fill; echo $?; rm /tmp/fill", timeout=120)
    assert res.stdout.startswith("1\n") and "No space left on device" in res.stderr, res
    await alive(box)


async def test_programs_that_together_pass_memory_end_the_box_as_oom_killed(
    backend: DockerBackend, module_run: str
) -> None:
    # Small disks: the host limit is memory + disks + the Sentry's room.
    spec = SandboxSpec(runtime="gvisor", memory="128m", tmpfs_size="8m", workspace_size="8m")
    async with await backend.create(spec, run=module_run, member="gv-oom") as small:
        each = "import time; b = bytearray(100 << 20); time.sleep(60)"
        with pytest.raises(SandboxCrashed) as ended:
            await small.exec(
                f"for i in 1 2 3 4 5 6 7 8; do python3 -c '{each}' & done; wait", timeout=60
            )
    assert ended.value.reason == "oom-killed", ended.value


async def test_a_box_on_a_run_network_reaches_its_proxy_only(
    backend: DockerBackend, module_run: str, gvisor_engine: Any
) -> None:
    service = await service_box(backend, module_run, SERVICE_PORT, 9000)
    await service.write_file("page.html", "<h1>through the proxy</h1>")
    allow = (f"docs:{SERVICE_PORT}",)
    spec = SandboxSpec(runtime="gvisor", network=NetworkPolicy(egress="allowlist", allow=allow))
    async with await backend.create(spec, run=module_run, member="gv-net") as member:
        proxy = run_proxy(gvisor_engine, module_run)
        proxy_ip = proxy["NetworkSettings"]["Networks"][f"fleet-run-{module_run}"]["IPAddress"]
        targets = [f"{proxy_ip}:{PROXY_PORT}", f"{service.ip}:{SERVICE_PORT}", f"{proxy_ip}:22"]
        seen = json.loads((await member.exec(["python3", "-c", CONNECT, *targets])).stdout)
        assert seen[targets[0]] == "connected", seen
        assert seen[targets[1]] != "connected" and seen[targets[2]] != "connected", seen
        fetch = "import urllib.request as u; print(u.urlopen('http://docs:%d/page.html').read())"
        got = await member.exec(["python3", "-c", fetch % SERVICE_PORT], timeout=60)
        assert "through the proxy" in got.stdout, got
        refused = await member.exec(["python3", "-c", fetch % 9000], timeout=60)
        assert "403" in refused.stderr, refused


async def test_a_browser_box_renders_a_page_over_cdp(
    backend: DockerBackend, module_run: str
) -> None:
    from playwright.async_api import async_playwright

    spec = SandboxSpec(kind="browser", runtime="gvisor", network=NetworkPolicy(egress="allowlist"))
    async with await backend.create(spec, run=module_run, member="gv-browser") as browser:
        async with async_playwright() as pw:
            chromium = await pw.chromium.connect_over_cdp(await browser.cdp_endpoint())
            page = await (chromium.contexts or [await chromium.new_context()])[0].new_page()
            await page.set_content("<h1>rendered under gVisor</h1>")
            assert await page.inner_text("h1") == "rendered under gVisor"
            await chromium.close()
        version = await browser.exec("cat /proc/version")
        assert version.stdout.startswith(GVISOR_KERNEL), version


JOB = """
name = "gvisor-member"
output_dir = "{out}"
[sandbox]
runtime = "gvisor"
[model]
name = "claude-sonnet-5"
[fanout]
retry = {{ attempts = 1 }}
[[members]]
id = "coder"
kind = "coding"
task = "Look around."
limits = {{ max_turns = 6, deadline_s = 120 }}
[[members.tools]]
name = "kernel"
description = "Say which kernel runs the box."
command = "cat /proc/version"
[[members.mcp]]
name = "echo"
command = "python3 echo_server.py"
files = "{mcp}"
"""


def test_a_member_runs_its_job_tool_mcp_server_and_shell_under_gvisor(
    tmp_path: Path, gvisor_engine: Any, images: dict[str, str], fake_api: Any, cleanup: Any
) -> None:
    calls = [
        ("kernel", {}),
        ("mcp__echo__echo", {"text": "hello from gVisor"}),
        ("shell", {"command": "ls -la /workspace && cat /proc/version"}),
    ]

    def policy(body: dict[str, Any]) -> Any:
        step = len(tool_results(body))
        if step < len(calls):
            return tool_use(*calls[step])
        return tool_use("submit_result", {"summary": "looked", "tests_run": [], "notes": []})

    fake_api(policy)
    out = tmp_path / "runs"
    cleanup.append(out)
    job = tmp_path / "job.toml"
    job.write_text(JOB.format(out=out, mcp=MCP_EXAMPLE))
    # Its own process, as a user runs it (this module's event loop is running here).
    fleet = [sys.executable, "-c", "import sys; from coordinator.cli import main; sys.exit(main())"]
    ran = subprocess.run([*fleet, "run", str(job), "--plain"], capture_output=True, text=True)
    assert ran.returncode == 0, ran.stderr
    (run,) = RunDir.list(out)
    assert run.outcome("coder").status == "ok"
    trace = list(read_trace(run.member_dir("coder") / "trace.jsonl"))
    names = {e.call_id: e.tool for e in trace if e.type == "tool_call"}
    results = {names[e.call_id]: e for e in trace if e.type == "tool_result"}
    assert GVISOR_KERNEL in results["kernel"].output, results["kernel"].output
    assert "hello from gVisor" in results["mcp__echo__echo"].output
    shell = results["shell"]
    assert not shell.is_error and GVISOR_KERNEL in shell.output, shell.output


def _stand_in(container_id: str, root: str = "/var/run/docker/runtime-runc/moby") -> Any:
    """A process that looks, to the host, like runsc's sandbox process for a container."""
    argv = ["runsc-sandbox", "-c", "import time; time.sleep(60)", f"--root={root}", container_id]
    return subprocess.Popen(argv, executable=sys.executable)


async def test_runsc_processes_without_a_container_are_ended_and_no_others(
    gvisor_engine: Any, box: DockerSandbox
) -> None:
    if os.geteuid() != 0:
        missing_dependency("ending another user's runsc processes needs root")
    orphan = _stand_in("ab" * 32)
    stopped = _stand_in("cd" * 32)
    os.kill(stopped.pid, signal.SIGSTOP)  # as a ptrace-stopped one would be
    live = _stand_in(box.id)  # a container the engine has
    elsewhere = _stand_in("ef" * 32, root="/srv/other-engine/runtime-runc/moby")
    try:
        found = gvisor.runsc_processes()
        assert found[orphan.pid] == "ab" * 32 and box.id in found.values()
        assert elsewhere.pid not in found
        assert gvisor.end_orphans(gvisor_engine) >= 2
        for ended in (orphan, stopped):
            assert ended.wait(timeout=10) == -signal.SIGKILL
        assert live.poll() is None and elsewhere.poll() is None
    finally:
        for proc in (orphan, stopped, live, elsewhere):
            proc.kill()
            proc.wait()


def test_registration_merges_fleets_runtimes_and_keeps_everything_else() -> None:
    mine = {"log-level": "warn", "runtimes": {"kata": {"path": "/usr/bin/kata"}}}
    merged = gvisor.merged_config(json.dumps(mine))
    assert merged["log-level"] == "warn" and merged["runtimes"]["kata"] == {"path": "/usr/bin/kata"}
    assert not gvisor.missing_runtimes({"Runtimes": merged["runtimes"]})
    assert gvisor.merged_config(json.dumps(merged)) == merged  # a second run changes nothing
    assert set(gvisor.merged_config(None)["runtimes"]) == set(gvisor.RUNTIMES)
    for broken in ("{not json", "[1, 2]", '{"runtimes": []}'):
        with pytest.raises(SandboxUnavailable, match=r"daemon\.json"):
            gvisor.merged_config(broken)


def test_without_root_registration_says_what_to_run(monkeypatch: pytest.MonkeyPatch) -> None:
    class Engine:
        def info(self) -> dict[str, Any]:
            return {"Runtimes": {"runc": {"path": "runc"}}}

    monkeypatch.delenv("DOCKER_HOST", raising=False)
    monkeypatch.setattr(gvisor, "is_root", lambda: False)
    with pytest.raises(SandboxUnavailable, match="sudo fleet setup --gvisor"):
        gvisor.ensure_registered(Engine())  # type: ignore[arg-type]


def test_the_jobs_runtime_reaches_every_members_box_unless_a_member_names_its_own(
    tmp_path: Path,
) -> None:
    from coordinator.fanout.fanout import to_member_spec
    from coordinator.job.jobfile import JobError, load_job
    from coordinator.nodes.prewarm import _first_wave

    text = """
name = "rt"
[sandbox]
runtime = "gvisor"
[[members]]
id = "a"
kind = "coding"
task = "t"
[[members]]
id = "b"
kind = "coding"
task = "t"
sandbox = { runtime = "runc" }
"""
    path = tmp_path / "job.toml"
    path.write_text(text)
    job, _ = load_job(path)
    specs = {
        m.id: to_member_spec(
            m,
            model="offline",
            max_tokens=1024,
            egress=job.egress,
            memory_root=tmp_path,
            runtime=job.sandbox.runtime,
        ).sandbox.runtime
        for m in job.members
    }
    assert specs == {"a": "gvisor", "b": "runc"}
    import tomllib

    _, _, early = _first_wave(tomllib.loads(text))  # boxes started before validation
    assert [e.spec.runtime for e in early] == ["gvisor", "runc"]
    path.write_text(text.replace('runtime = "gvisor"', 'runtime = "gvisr"'))
    with pytest.raises(JobError) as err:
        load_job(path)
    assert "sandbox.runtime" in str(err.value) and "'runc' or 'gvisor'" in str(err.value)


def test_a_job_asking_for_gvisor_where_it_is_not_registered_is_refused_before_any_box(
    tmp_path: Path, gvisor_engine: Any, monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    from coordinator.cli import main

    # The real engine, asked for one more runtime than it has.
    absent = {**gvisor.RUNTIMES, "fleet-gvisor-absent": ["--platform=ptrace"]}
    monkeypatch.setattr(gvisor, "RUNTIMES", absent)
    job = tmp_path / "job.toml"
    job.write_text(
        f'name = "gv"\noutput_dir = "{tmp_path / "runs"}"\n[model]\nname = "offline"\n'
        '[[members]]\nkind = "coding"\ntask = "t"\nsandbox = { runtime = "gvisor" }\n'
    )
    # On a thread of its own: this module's event loop may be running on this one.
    with ThreadPoolExecutor(1) as worker:
        assert worker.submit(main, ["run", str(job), "--plain"]).result() == 2
    err = capsys.readouterr().err
    assert "fleet-gvisor-absent" in err and "fleet setup --gvisor" in err, err
    assert not (tmp_path / "runs").exists()


def test_doctor_says_whether_gvisor_is_available(
    gvisor_engine: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from sandbox.cli.doctor import _gvisor

    info = gvisor_engine.info()
    assert _gvisor(info).status == "ok"
    monkeypatch.setattr(gvisor, "RUNTIMES", {**gvisor.RUNTIMES, "fleet-gvisor-absent": []})
    absent = _gvisor(info)
    assert absent.status == "warn" and "fleet-gvisor-absent" in absent.seen
    assert "fleet setup --gvisor" in absent.fix


async def test_an_image_without_prlimit_is_refused_with_what_to_do(
    backend: DockerBackend, module_run: str, gvisor_engine: Any, images: dict[str, str]
) -> None:
    import io

    tag = f"fleet-test-noprlimit:{os.getpid()}"
    dockerfile = f"FROM {images['coding']}\nUSER root\nRUN rm /usr/bin/prlimit\nUSER agent\n"
    gvisor_engine.images.build(fileobj=io.BytesIO(dockerfile.encode()), tag=tag, rm=True)
    try:
        spec = SandboxSpec(runtime="gvisor", image=tag)
        with pytest.raises(SandboxUnavailable, match="has no 'prlimit'"):
            await backend.create(spec, run=module_run, member="gv-noprlimit")
    finally:
        gvisor_engine.images.remove(tag, force=True)


@pytest.fixture
def failing_runtime(gvisor_engine: Any) -> Iterator[str]:
    """A runsc runtime without a network mode, registered for one test: a box on the
    host's network cannot start under it ("cannot run with network enabled in root
    network namespace"), and such a failed start is what leaves runsc processes behind."""
    if os.geteuid() != 0 or gvisor.engine_host() != gvisor.DEFAULT_HOST:
        missing_dependency("registering a runtime needs root on the local engine")
    name = f"fleet-gvisor-test-{os.getpid()}"

    def reload(present: bool) -> None:
        for pid in gvisor._dockerd_pids():
            os.kill(pid, signal.SIGHUP)
        deadline = time.monotonic() + 15
        while (name in (gvisor_engine.info().get("Runtimes") or {})) != present:
            assert time.monotonic() < deadline, f"the engine did not reload {gvisor.DAEMON_JSON}"
            time.sleep(0.2)

    def change(update: Callable[[dict[str, Any]], None]) -> None:
        config = json.loads(gvisor.DAEMON_JSON.read_text())
        update(config["runtimes"])
        gvisor._write_config(config)

    change(lambda r: r.update({name: {"path": gvisor.RUNSC, "runtimeArgs": ["--platform=ptrace"]}}))
    try:
        reload(True)
        yield name
    finally:
        change(lambda r: r.pop(name, None))
        reload(False)


def test_a_box_whose_start_fails_leaves_no_runsc_process(
    gvisor_engine: Any,
    images: dict[str, str],
    module_run: str,
    failing_runtime: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from sandbox.docker.container import create_container
    from sandbox.docker.reaper import box_labels

    monkeypatch.setattr(gvisor, "runtime_name", lambda spec, network: failing_runtime)
    spec = SandboxSpec(runtime="gvisor")
    before = set(gvisor.runsc_processes())
    labels = box_labels(spec, module_run, "gv-fail")
    with pytest.raises(SandboxUnavailable, match="could not start"):
        create_container(
            gvisor_engine,
            spec,
            images["coding"],
            labels,
            {},
            "host",
            [],
            None,
            module_run,
            "gv-fail",
        )
    # Only orphans count: the other test workers may be running gVisor boxes of their
    # own, whose runsc processes belong to containers the engine still has - or had a
    # moment ago (a removed box's processes take a moment to end). So the processes are
    # listed before the containers (a box made in between is known), and a process must
    # still be there after a few seconds: one the failed start left never ends by itself.
    deadline = time.monotonic() + 5.0
    while True:
        found = gvisor.runsc_processes().items()
        boxes = {c["Id"] for c in gvisor_engine.api.containers(all=True, quiet=True)}
        left = {pid: cid for pid, cid in found if pid not in before and cid not in boxes}
        if not left or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert not left, f"runsc processes left by the failed start: {left}"
