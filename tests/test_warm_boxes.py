"""Boxes kept ready across runs (``fleet.WarmBoxes``): a run takes them, never a used
one, never one of another spec or loop; they are found by gc only once their owner is
gone, and nothing of them is left when it closes."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import anyio
import docker
import pytest

import coordinator as fleet
from sandbox.docker import reaper
from sandbox.errors import SandboxSpecError
from sandbox.spec import SandboxSpec
from sandbox.warm import WarmBoxes
from subagents.trace import read_trace

pytestmark = pytest.mark.docker


def _job(members: int, **sandbox: Any) -> dict[str, Any]:
    return {
        "name": "warm",
        "model": {"name": "offline"},
        "synthesis": {"enabled": False},
        "members": [
            {"id": f"c{i}", "kind": "coding", "task": f"Look around {i}.", "sandbox": sandbox}
            for i in range(members)
        ],
    }


def _boxes_used(run: Path) -> set[str]:
    names = set()
    for trace in run.glob("members/*/trace.jsonl"):
        for event in read_trace(trace):
            if getattr(event, "type", "") == "sandbox" and event.action == "create":
                names.add(event.box)
    return names


def _names(client: docker.DockerClient, owner: str) -> set[str]:
    # One listing call (no inspect of each box: one being removed would be a 404).
    found = client.api.containers(all=True, filters={"label": f"{reaper.LABEL}={owner}"})
    return {c["Names"][0].lstrip("/") for c in found}


def test_runs_take_warm_boxes_never_a_used_one_and_close_leaves_none(
    tmp_path, images, docker_client, cleanup, monkeypatch
):
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    cleanup.append(tmp_path / "runs")
    seen: list[set[str]] = []
    used: list[set[str]] = []

    async def main() -> str:
        async with fleet.WarmBoxes(count=2) as warm:
            for _ in range(2):
                assert await warm.wait_ready() == 2
                ready = _names(docker_client, warm.run)
                assert len(ready) == 2
                # while the process lives, gc counts its boxes as a live run's
                assert warm.run in reaper.live_runs()
                made = warm.made
                during: list[tuple[int, int]] = []

                def note(entry: Any, warm: WarmBoxes = warm, during: list = during) -> None:
                    if getattr(entry, "member", None):  # while its members run
                        during.append((warm.made, warm._making))

                summary = await fleet.run_async(
                    _job(2), output_dir=tmp_path / "runs", warm=warm, on_journal=note
                )
                # no box made while the run used the pool: it refills between runs
                assert during and set(during) == {(made, 0)}, during
                assert {o.status for o in summary.outcomes.values()} == {"ok"}
                seen.append(ready)
                used.append(_boxes_used(summary.run.path))
                # the run removed the boxes its members used; none came back to the pool
                assert not (used[-1] & _names(docker_client, warm.run))
            assert warm.taken == 4
            owner = warm.run
        return owner

    owner = anyio.run(main)
    assert used[0] == seen[0] and used[1] == seen[1]  # each run took the boxes ready for it
    assert not used[0] & used[1]  # and never a box another run's member had
    assert not _names(docker_client, owner)  # closing removed the idle ones
    assert owner not in reaper.live_runs()


def test_a_member_of_another_box_spec_takes_none_and_the_run_makes_its_own(
    tmp_path, images, docker_client, cleanup, monkeypatch
):
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    cleanup.append(tmp_path / "runs")

    async def main() -> None:
        async with WarmBoxes(count=1) as warm:
            await warm.wait_ready()
            idle = _names(docker_client, warm.run)
            summary = await fleet.run_async(
                _job(1, memory="768m"), output_dir=tmp_path / "runs", warm=warm
            )
            assert summary.outcomes["c0"].status == "ok"
            assert warm.taken == 0
            assert _names(docker_client, warm.run) == idle  # still there, still idle
            assert not _boxes_used(summary.run.path) & idle

    anyio.run(main)


@pytest.mark.parametrize(
    "noticed", [True, False], ids=["its-record-knows", "only-the-engine-knows"]
)
def test_a_box_that_died_while_idle_is_not_handed_out(
    tmp_path, images, docker_client, cleanup, monkeypatch, noticed
):
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    cleanup.append(tmp_path / "runs")

    async def main() -> None:
        async with WarmBoxes(count=1) as warm:
            await warm.wait_ready()
            (dead,) = _names(docker_client, warm.run)
            if not noticed:  # the box's own record still says alive: the run asks it
                box = warm._idle[0][1]
                monkeypatch.setattr(box, "looks_alive", lambda: True)
            docker_client.containers.get(dead).kill()
            summary = await fleet.run_async(_job(1), output_dir=tmp_path / "runs", warm=warm)
            assert summary.outcomes["c0"].status == "ok"
            assert dead not in _boxes_used(summary.run.path)

    anyio.run(main)


def test_another_event_loop_takes_nothing(images, docker_client):
    got: list[Any] = []

    async def main() -> None:
        async with WarmBoxes(count=1) as warm:
            await warm.wait_ready()
            # fleet.run and anything else with a loop of its own: the boxes' agent
            # connections belong to this one
            other = threading.Thread(
                target=lambda: got.append(anyio.run(_take, warm)), name="other-loop"
            )
            other.start()
            await anyio.to_thread.run_sync(other.join)
            assert warm.idle == 1
            assert warm.take(warm.key, 1)  # this loop may
            assert warm.take(warm.key, 1) == []  # and only once

    anyio.run(main)
    assert got == [[]]


async def _take(warm: WarmBoxes) -> list[Any]:
    return warm.take(warm.key, 1)


@pytest.mark.parametrize(
    ("kwargs", "says"),
    [
        ({"count": 0}, "count=0 is invalid"),
        ({"count": 65}, "from 1 to 64"),
        ({"count": True}, "count=True"),
        ({"count": "8"}, "count='8'"),
        ({"sandbox": {"kind": "browser", "network": {"egress": "allowlist"}}}, "kind='browser'"),
        (
            {"sandbox": {"network": {"egress": "allowlist", "allow": ["pypi.org"]}}},
            "egress='allowlist'",
        ),
        ({"sandbox": SandboxSpec(keep=True)}, "keep=True"),
    ],
)
def test_what_cannot_be_kept_warm_is_refused_at_once(kwargs, says):
    with pytest.raises(SandboxSpecError, match=says.replace("(", r"\(").replace("[", r"\[")):
        WarmBoxes(**kwargs)


def test_an_unknown_box_setting_is_refused():
    with pytest.raises(ValueError, match="memroy"):
        WarmBoxes(sandbox={"memroy": "2g"})


def test_boxes_of_a_killed_owner_are_taken_by_gc(images, docker_client):
    import subprocess
    import sys

    script = (
        "import os, anyio\n"
        "from sandbox.warm import WarmBoxes\n"
        "async def main():\n"
        "    async with WarmBoxes(count=2) as warm:\n"
        "        await warm.wait_ready()\n"
        "        print(warm.run, flush=True)\n"
        "        os.kill(os.getpid(), 9)\n"
        "anyio.run(main)\n"
    )
    root = Path(__file__).resolve().parent.parent
    proc = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, cwd=root, timeout=120
    )
    assert proc.returncode == -9, proc.stderr
    owner = proc.stdout.strip()
    assert owner.startswith("warm-") and len(_names(docker_client, owner)) == 2
    assert owner not in reaper.live_runs()  # its marker names a dead process
    from sandbox.docker.backend import DockerBackend

    removed = anyio.run(lambda: DockerBackend(docker_client).gc())
    assert len(_names_before(removed, owner)) == 2
    assert not _names(docker_client, owner)


def _names_before(removed: list[Any], owner: str) -> set[str]:
    return {b.name for b in removed if b.owner == owner}


def test_a_started_or_streamed_run_takes_from_the_pool_too(
    tmp_path, images, docker_client, cleanup, monkeypatch
):
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    cleanup.append(tmp_path / "runs")
    runs = tmp_path / "runs"

    async def main() -> None:
        async with WarmBoxes(count=1) as warm:
            await warm.wait_ready()
            async with fleet.start(_job(1), output_dir=runs, warm=warm) as run:
                summary = await run.wait()
            assert warm.taken == 1 and _boxes_used(summary.run.path)
            await warm.wait_ready()
            ended = [
                event.status
                async for event in fleet.stream(_job(1), output_dir=runs, warm=warm)
                if event.type == "run_ended"
            ]
            assert ended == ["succeeded"] and warm.taken == 2

    anyio.run(main)
