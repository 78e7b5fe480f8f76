"""Box lifecycle: labels, gc of orphans and expired boxes, cleanup on cancel, the warm pool."""

from __future__ import annotations

import os
import time
import uuid
from functools import partial
from pathlib import Path
from typing import Any

import anyio
import pytest
from conftest import remove_run

from sandbox.base import BoxInfo
from sandbox.docker import reaper
from sandbox.docker.backend import DockerBackend
from sandbox.pool import SandboxPool
from sandbox.spec import SandboxSpec

pytestmark = [pytest.mark.docker, pytest.mark.anyio]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(autouse=True)
def fleet_home(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("FLEET_HOME", str(tmp_path / "fleet-home"))


@pytest.fixture
def backend(docker_client, images) -> DockerBackend:
    return DockerBackend(docker_client, images=images)


class _AllBut(set):
    """A live-run set holding every run but one: gc in a test touches only that run."""

    def __init__(self, dead: str, live: set[str]) -> None:
        super().__init__(live)
        self.dead = dead

    def __contains__(self, run: object) -> bool:
        return run != self.dead


async def test_boxes_carry_labels_and_show_in_listing(
    backend: DockerBackend, run_id: str, docker_client
) -> None:
    spec = SandboxSpec(ttl_s=120, labels={"team": "x"})
    async with await backend.create(spec, run=run_id, member="lab") as box:
        labels = docker_client.api.inspect_container(box.id)["Config"]["Labels"]
        assert labels["fleet.run"] == run_id and labels["fleet.member"] == "lab"
        assert labels["fleet.kind"] == "coding" and labels["fleet.ttl"] == "120"
        assert labels["fleet.keep"] == "0" and labels["team"] == "x"
        assert abs(float(labels["fleet.created"]) - time.time()) < 60
        listed = await backend.list_boxes(run=run_id)
        assert [(b.member, b.status) for b in listed] == [("lab", "running")]
    assert await backend.list_boxes(run=run_id) == []


async def test_gc_removes_orphans_and_expired_boxes_and_keeps_live_ones(
    backend: DockerBackend, run_id: str, docker_client
) -> None:
    orphan_run = f"test-{uuid.uuid4().hex[:12]}"
    try:
        live_box = await backend.create(SandboxSpec(), run=run_id, member="live")
        expired = await backend.create(SandboxSpec(ttl_s=1), run=run_id, member="old")
        orphan = await backend.create(SandboxSpec(kind="service"), run=orphan_run, member="orphan")
        assert docker_client.api.networks(names=[f"fleet-run-{orphan_run}"])
        # The orphan's owner "died": its marker names a pid that no longer exists.
        reaper.mark_done(orphan_run)
        reaper.mark_live(orphan_run, pid=2**22 + 17)
        live = reaper.live_runs()
        assert run_id in live and orphan_run not in live
        # Every other run on the engine counts as live, including runs created while gc
        # works (a snapshot would miss those and gc would take other work's boxes).
        removed = await backend.gc(live_runs=_AllBut(orphan_run, live), now=time.time() + 5)
        gone = {(b.run, b.member) for b in removed}
        assert gone == {(orphan_run, "orphan"), (run_id, "old")}
        assert [b.member for b in await backend.list_boxes(run=run_id)] == ["live"]
        assert await backend.list_boxes(run=orphan_run) == []
        assert not docker_client.api.networks(names=[f"fleet-run-{orphan_run}"])
        assert (await live_box.exec("echo ok")).stdout == "ok\n"
        for box in (live_box, expired, orphan):
            await box.close()
    finally:
        remove_run(docker_client, orphan_run)


async def test_a_run_that_starts_while_gc_works_keeps_its_box_and_network(
    backend: DockerBackend, docker_client
) -> None:
    """gc lists the engine's boxes and networks first and asks which runs live after
    (``reaper.collect``): a run marks itself live before it makes its network or a box,
    so one that starts between the two is never taken for over. Asked first, the answer
    lacked such a run, and gc removed the box it had just made, and its network."""
    late = f"test-{uuid.uuid4().hex[:12]}"
    made: list[Any] = []

    def live(boxes: list[Any]) -> set[str]:
        told = reaper.live_runs()  # what the markers say now: `late` has not started
        assert late not in told
        create = partial(backend.create, SandboxSpec(kind="service"), run=late, member="late")
        made.append(anyio.from_thread.run(create))  # and now it starts
        return _AllBut(late, told)  # the other runs on the engine: other work's, all live

    try:
        removed = await anyio.to_thread.run_sync(
            lambda: reaper.collect(docker_client, live, now=time.time())
        )
        assert made and late in reaper.live_runs()
        assert late not in {b.run for b in removed.boxes}
        assert f"fleet-run-{late}" not in removed.networks
        assert [(b.member, b.status) for b in await backend.list_boxes(run=late)] == [
            ("late", "running")
        ]
        assert docker_client.api.networks(names=[f"fleet-run-{late}"])
        await made[0].close()
    finally:
        remove_run(docker_client, late)
        reaper.mark_done(late)


async def test_rm_refuses_a_box_whose_run_was_resumed_while_it_looked(
    backend: DockerBackend, run_id: str, monkeypatch, capsys
) -> None:
    """``fleet sandbox rm`` never removes a box of a live run: which runs live is read
    after it has listed the boxes, so a run resumed while it looked (its marker written
    between the two) is seen live. Read first, rm took that run's kept box - and with
    it, when nothing else was left, the run's proxy and networks the resume needed."""
    from coordinator.cli import main

    box = await backend.create(SandboxSpec(keep=True), run=run_id, member="kept")
    reaper.mark_done(run_id)  # the run is over: its kept box waits for rm
    listed = reaper.list_boxes

    def list_as_the_run_resumes(*args: Any, **kwargs: Any) -> list[BoxInfo]:
        boxes = listed(*args, **kwargs)
        reaper.mark_live(run_id)  # `fleet resume` marks the run live now
        return boxes

    monkeypatch.setattr(reaper, "list_boxes", list_as_the_run_resumes)
    code = await anyio.to_thread.run_sync(main, ["sandbox", "rm", box.name])
    assert code == 2
    assert "belong(s) to a run still live" in capsys.readouterr().err
    assert [b.member for b in await backend.list_boxes(run=run_id)] == ["kept"]


async def test_cancelled_owner_still_removes_its_box(backend: DockerBackend, run_id: str) -> None:
    with anyio.move_on_after(1.0):
        async with await backend.create(SandboxSpec(), run=run_id, member="c") as box:
            await box.exec("sleep 30", timeout=60)
    assert await backend.list_boxes(run=run_id) == []


async def test_keep_leaves_the_box_for_debugging(backend: DockerBackend, run_id: str) -> None:
    async with await backend.create(SandboxSpec(keep=True), run=run_id, member="k"):
        pass
    kept = await backend.list_boxes(run=run_id)
    assert [(b.member, b.keep) for b in kept] == [("k", True)]
    assert await backend.remove_run(run_id) == 1
    assert await backend.list_boxes(run=run_id) == []


async def test_pool_hands_out_distinct_prestarted_boxes_and_never_reuses_them(
    backend: DockerBackend, run_id: str
) -> None:
    async with SandboxPool(backend, SandboxSpec(), run=run_id, min_idle=2, max_size=4) as pool:
        with anyio.fail_after(30):
            await pool.wait_idle(2)
        start = time.perf_counter()
        a = await pool.acquire("m1")
        fast = time.perf_counter() - start
        b = await pool.acquire("m2")
        assert a.id != b.id and fast < 0.5
        await a.write_file("secret.txt", "m1 only")
        ids = {a.id, b.id}
        await pool.release(a)
        await pool.release(b)
        with anyio.fail_after(30):
            await pool.wait_idle(2)
        async with pool.box("m3") as c:
            assert c.id not in ids
            assert not (await c.exec("test -e /workspace/secret.txt")).ok
        listed = await backend.list_boxes(run=run_id)
        assert not ids & {x.id for x in listed}
        assert len(listed) <= 4
    assert await backend.list_boxes(run=run_id) == []


async def test_a_box_started_ahead_is_the_box_the_member_gets(
    backend: DockerBackend, run_id: str
) -> None:
    """A box the pool starts for a member on its way (``keep_idle``, a lead's next
    wave) is the one that member gets even while it is still starting: the member waits
    for it instead of making a second box beside it."""
    async with SandboxPool(backend, SandboxSpec(), run=run_id, min_idle=0, max_size=4) as pool:
        pool.keep_idle(1)
        await anyio.sleep(0.1)  # the pool has begun starting it
        box = await pool.acquire("m1")
        pool.keep_idle(0)  # as the run does once the member has its box
        listed = await backend.list_boxes(run=run_id)
        assert [(b.name, b.member) for b in listed] == [(box.name, "pool-1")], listed
        await pool.release(box)
    assert await backend.list_boxes(run=run_id) == []


def test_doomed_rule_is_ttl_or_run_over_unless_kept() -> None:
    now = 1000.0

    def box(run: str, created: float, ttl: float, keep: bool = False) -> BoxInfo:
        return BoxInfo(
            id="x",
            name="n",
            kind="coding",
            run=run,
            member="m",
            status="running",
            created=created,
            ttl_s=ttl,
            keep=keep,
        )

    boxes = [
        box("live", 900, 50),
        box("live", 990, 50),
        box("dead", 990, 50),
        box("dead", 990, 50, keep=True),
        box("dead", 900, 50, keep=True),
    ]
    picked = reaper.doomed(boxes, {"live"}, now, everything=False)
    assert [(b.run, b.created, b.keep) for b in picked] == [
        ("live", 900, False),
        ("dead", 990, False),
        ("dead", 900, True),
    ]
    # --all takes kept boxes too, but a live run's box only once its TTL has passed...
    everything = reaper.doomed(boxes, {"live"}, now, everything=True)
    assert [(b.run, b.created) for b in everything] == [
        ("live", 900),
        ("dead", 990),
        ("dead", 990),
        ("dead", 900),
    ]
    # ...unless the caller asks for live runs' boxes as well.
    assert len(reaper.doomed(boxes, {"live"}, now, everything=True, include_live=True)) == 5
    assert os.getpid()  # the live registry keys on pids; see test above


async def test_cli_lists_boxes_and_gc_dry_run_names_orphans(
    backend: DockerBackend, run_id: str
) -> None:
    import json
    import sys

    async with await backend.create(SandboxSpec(), run=run_id, member="cli"):
        fleet = [sys.executable, "-m", "coordinator.cli"]
        ls = await anyio.run_process(
            [*fleet, "sandbox", "ls", "--run", run_id, "--json"], check=False
        )
        assert ls.returncode == 0, ls.stderr
        rows = [json.loads(line) for line in ls.stdout.decode().splitlines()]
        assert [(r["member"], r["run_live"]) for r in rows] == [("cli", True)]
        reaper.mark_done(run_id)  # the owner is "gone": gc would now take the box
        gc = await anyio.run_process([*fleet, "sandbox", "gc", "--dry-run"], check=False)
        assert gc.returncode == 0, gc.stderr
        assert f"would remove fleet-{run_id}-cli" in gc.stdout.decode()
        assert [b.member for b in await backend.list_boxes(run=run_id)] == ["cli"]


async def test_cli_gc_all_spares_live_runs_unless_told(backend: DockerBackend, run_id: str) -> None:
    import sys

    fleet = [sys.executable, "-m", "coordinator.cli", "sandbox", "gc"]
    async with await backend.create(SandboxSpec(keep=True), run=run_id, member="busy"):
        gc = await anyio.run_process([*fleet, "--all", "--dry-run"], check=False)
        out = gc.stdout.decode()
        assert gc.returncode == 0, gc.stderr
        assert f"fleet-{run_id}-busy" not in out
        assert f"live run(s) {run_id}" in out and "--include-live" in out
        gc = await anyio.run_process([*fleet, "--all", "--include-live", "--dry-run"], check=False)
        assert f"would remove fleet-{run_id}-busy" in gc.stdout.decode()
        bad = await anyio.run_process([*fleet, "--include-live"], check=False)
        assert bad.returncode == 2 and b"only makes sense with --all" in bad.stderr
        assert [b.member for b in await backend.list_boxes(run=run_id)] == ["busy"]


def test_stale_live_markers_are_pruned_and_live_ones_kept() -> None:
    reaper.mark_live("run-alive")
    dead = subprocess_pid_that_exited()
    reaper.mark_live("run-dead", pid=dead)
    assert reaper.live_runs() == {"run-alive"}
    assert reaper.prune_stale_markers() == 1
    assert sorted(p.name for p in (reaper.fleet_home() / "live").iterdir()) == ["run-alive"]


def test_a_marker_being_written_is_neither_a_run_nor_pruned(monkeypatch) -> None:
    """A gc reading the markers while a run writes its own sees no marker or a whole
    one: an empty file named no process, and was pruned as a dead run's (the run's boxes
    then went with the next gc). A marker's remains left by a writer killed mid-way go
    after a minute."""
    seen: list[tuple[bool, int, set[str]]] = []
    replace = os.replace

    def read_then_replace(src: Any, dst: Any) -> None:  # a gc reads between write and rename
        seen.append((Path(dst).exists(), reaper.prune_stale_markers(), reaper.live_runs()))
        replace(src, dst)

    monkeypatch.setattr(reaper.os, "replace", read_then_replace)
    reaper.mark_live("run-new")
    assert seen == [(False, 0, set())]
    assert reaper.live_runs() == {"run-new"}
    folder = reaper.fleet_home() / "live"
    left = folder / ".run-cut.123.part"  # a writer killed between write and rename
    left.write_text("")
    assert reaper.prune_stale_markers() == 0 and left.exists()
    os.utime(left, (time.time() - 120, time.time() - 120))
    assert reaper.prune_stale_markers() == 1 and not left.exists()
    assert sorted(p.name for p in folder.iterdir()) == ["run-new"]


def test_a_link_where_a_marker_is_written_is_replaced_not_followed(tmp_path) -> None:
    """A link left where the marker's side file goes, or where the marker goes, is
    replaced by the marker: the file it points to is never written."""
    outside = tmp_path / "outside.txt"
    outside.write_text("keep\n")
    folder = reaper.fleet_home() / "live"
    folder.mkdir(parents=True)
    (folder / f".run-a.{os.getpid()}.part").symlink_to(outside)
    (folder / "run-b").symlink_to(outside)
    reaper.mark_live("run-a")
    reaper.mark_live("run-b")
    assert outside.read_text() == "keep\n"
    assert reaper.live_runs() == {"run-a", "run-b"}
    assert not any(p.is_symlink() for p in folder.iterdir())


def subprocess_pid_that_exited() -> int:
    import subprocess

    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


async def test_cli_ls_shows_whole_names_and_gc_dry_run_names_the_networks_it_removes(
    backend: DockerBackend, run_id: str, docker_client
) -> None:
    import sys

    fleet = [sys.executable, "-m", "coordinator.cli", "sandbox"]
    run = f"{run_id}-research-20261129-233114-a82a"  # as long as a real run id
    members = ["research-member-with-a-long-id-1", "research-member-with-a-long-id-2"]
    reaper.mark_live(run)
    boxes = [await backend.create(SandboxSpec(), run=run, member=m) for m in members]
    labels = {"fleet.run": run, "fleet.kind": "network"}
    docker_client.api.create_network(f"fleet-run-{run}", internal=True, labels=labels)
    try:
        ls = await anyio.run_process([*fleet, "ls", "--run", run], check=False)
        rows = ls.stdout.decode().splitlines()[1:]
        # Both boxes, each under its whole name and its whole run id.
        assert sorted(row.split()[:3] for row in rows) == [
            [box.name, run, member] for box, member in zip(boxes, members, strict=True)
        ]
        for box in boxes:
            await box.close()
        reaper.mark_done(run)  # the run is over: its network has to go as well
        gc = await anyio.run_process([*fleet, "gc", "--dry-run"], check=False)
        out = gc.stdout.decode()
        assert f"would remove network fleet-run-{run}" in out, out
        assert docker_client.api.networks(names=[f"fleet-run-{run}"])  # a dry run
    finally:
        remove_run(docker_client, run)
