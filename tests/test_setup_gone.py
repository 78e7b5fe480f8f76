"""A setup's snapshot removed while its run still needs it (``fleet sandbox prepared gc``
or a person, between the run finding it and a member's box starting from it): the box
fails as ``SnapshotGone``, named as such, and the member's retry sets the setup up again
- real engine, real boxes, the offline coder."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pytest
from test_setup_boxes import EDIT, _setup_events
from test_setup_boxes import out as out  # the fixtures
from test_setup_boxes import project as project

from coordinator.cli import main
from coordinator.rundir.runs import RunDir
from sandbox.docker import prepared as store
from sandbox.docker.backend import DockerBackend
from sandbox.errors import SandboxUnavailable, SnapshotGone
from sandbox.spec import SandboxSpec

pytestmark = pytest.mark.docker


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.mark.anyio
async def test_a_box_from_a_snapshot_the_engine_has_no_more_fails_as_snapshot_gone(
    docker_client: Any, images: dict, run_id: str
) -> None:
    backend = DockerBackend(docker_client, images=images)
    gone = "sha256:" + "0" * 64
    with pytest.raises(SnapshotGone) as caught:
        await backend.create(SandboxSpec(prepared=gone), run=run_id, member="m")
    assert caught.value.ref == gone
    assert "no longer on this engine" in str(caught.value)
    assert "retry sets the setup up again" in str(caught.value)
    # The image of a box that names none is still refused as before, not as a snapshot.
    with pytest.raises(SandboxUnavailable) as plain:
        await backend.create(SandboxSpec(image=gone), run=run_id, member="n")
    assert not isinstance(plain.value, SnapshotGone)


def test_a_snapshot_removed_before_a_members_box_starts_is_set_up_again_by_its_retry(
    tmp_path: Path,
    project: tuple[Path, Path],
    images: dict,
    out: Path,
    docker_client: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Two members of one setup, one at a time, boxes made when asked (no warm pool):
    # m0 makes the snapshot; just before m1's box starts from it, it is removed. The
    # setup writes a file the members' test needs (a key of this test's own).
    repo, _ = project
    mark = uuid.uuid4().hex[:12]
    setup = json.dumps(f"echo made > made.txt # {mark}")
    job = tmp_path / "job.toml"
    lines = ['name = "gone"', "[model]", 'name = "offline"', "[fanout]", "max_parallel = 1"]
    lines += ["warm_pool = false"]
    for m in ("m0", "m1"):
        lines += ["[[members]]", f'id = "{m}"', 'kind = "coding"', f'task = "{EDIT}"']
        lines += [f"repo = {json.dumps(str(repo))}", 'test = "grep -q made made.txt"']
        lines += [f"setup = {{ run = {setup} }}"]
    job.write_text("\n".join(lines) + "\n")
    removed: list[str] = []
    real_create = DockerBackend.create

    async def create(self: DockerBackend, spec: SandboxSpec, **kw: Any) -> Any:
        if spec.prepared and kw.get("member") == "m1" and not removed:
            removed.append(spec.prepared)
            docker_client.images.remove(spec.prepared, force=True)
        return await real_create(self, spec, **kw)

    monkeypatch.setattr(DockerBackend, "create", create)
    try:
        assert main(["run", str(job), "--output-dir", str(out), "--plain"]) == 0
    finally:
        for info in store.list_all(docker_client):
            if mark in info.setup:
                store.remove(docker_client, info)
    (run,) = RunDir.list(out)
    assert removed, "m1's box never started from the snapshot"
    outcomes = run.outcomes()
    assert {m: o.status for m, o in outcomes.items()} == {"m0": "ok", "m1": "ok"}
    assert outcomes["m1"].result.verified.passed  # the new snapshot's file at work
    # m1's first attempt met the gone snapshot, named as such; its retry set it up again.
    (retry,) = [e for e in run.journal.read() if e.event == "member_retry"]
    assert retry.member == "m1" and "no longer on this engine" in retry.reason, retry
    setups = [(e["detail"]["ok"], e["detail"].get("reused")) for e in _setup_events(run, "m1")]
    assert setups == [(True, True), (True, False)], setups
    assert len(list(run.path.glob("members/*/setup.log"))) == 2  # m0's, and m1's again
    assert run.state().status == "succeeded"
