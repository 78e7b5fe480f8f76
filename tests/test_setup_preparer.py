"""The preparer's promises, on a backend that keeps snapshots in a dict: one setup per
key however many members ask at once, a failure met by every member without running
again, nothing failed kept, a cached key set up by nobody, the time limit and the
secrets handled as documented. The same paths on real boxes: tests/test_setup_boxes.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest
from context_fakes import MemoryBox, NoBoxes

from sandbox.base import ExecResult, Sandbox
from sandbox.prepared.capture import CaptureRefused
from sandbox.prepared.prepare import Preparer, SetupFailed
from sandbox.prepared.spec import SetupSpec
from sandbox.spec import SandboxSpec


class SetupBox(MemoryBox):
    """Runs a setup command by its script: ``ok``, ``fail``, ``slow``, ``echo-secret``."""

    def __init__(self, backend: SnapshotBackend, spec: SandboxSpec) -> None:
        super().__init__()
        self.backend, self.spec = backend, spec
        self.env: dict[str, str] = {}

    async def exec(self, cmd: Any, **kw: Any) -> ExecResult:
        self.backend.runs.append(cmd)
        self.env = dict(kw.get("env") or {})
        await anyio.sleep(0.05)  # long enough for every other member to ask meanwhile
        if cmd.startswith("fail"):
            return ExecResult(exit_code=3, stdout="resolving\n", stderr="no matching dist\n")
        if cmd.startswith("slow"):
            return ExecResult(exit_code=124, stdout="started\n", stderr="", timed_out=True)
        if cmd.startswith("echo-secret"):
            return ExecResult(exit_code=0, stdout=f"token {self.env['TOKEN']}\n", stderr="")
        return ExecResult(exit_code=0, stdout="installed\n", stderr="")


class SnapshotBackend(NoBoxes):
    """Snapshots in a dict; setup boxes are :class:`SetupBox` es."""

    def __init__(self) -> None:
        super().__init__()
        self.snapshots: dict[str, str] = {}
        self.runs: list[str] = []
        self.boxes: list[SetupBox] = []
        self.closed = 0
        self.refuse: str | None = None
        self.kept: list[Path | None] = []

    async def setup_image(self, spec: SandboxSpec) -> str:
        return "sha256:" + "b" * 64

    async def find_prepared(self, key: str) -> str | None:
        return self.snapshots.get(key)

    async def save_prepared(self, box: Sandbox, *, key: str, **kw: Any) -> str:
        self.kept.append(kw.get("keep"))
        if self.refuse:
            raise CaptureRefused(self.refuse)
        self.snapshots[key] = f"prepared-{key[:8]}"
        return self.snapshots[key]

    async def create(self, spec: SandboxSpec, *, run: str, member: str) -> Sandbox:
        box = SetupBox(self, spec)
        self.boxes.append(box)
        return box


@pytest.fixture(autouse=True)
def own_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLEET_CACHE_DIR", str(tmp_path / "cache"))  # the host locks' place


def _many(
    preparer: Preparer,
    setup: SetupSpec,
    n: int,
    repo: Path | None = None,
    *,
    within: float | None = None,
) -> list[Any]:
    got: list[Any] = [None] * n

    async def one(i: int) -> None:
        try:
            got[i] = await preparer.prepare(setup, SandboxSpec(), repo, secrets={})
        except SetupFailed as exc:
            got[i] = exc

    async def main() -> None:
        with anyio.fail_after(within):
            async with anyio.create_task_group() as tg:
                for i in range(n):
                    tg.start_soon(one, i)

    anyio.run(main)
    return got


def test_eight_members_asking_at_once_share_one_setup_and_one_snapshot() -> None:
    backend = SnapshotBackend()
    got = _many(Preparer(backend, "r1"), SetupSpec(run="ok"), 8)
    assert backend.runs == ["ok"]
    assert len({p.ref for p in got}) == 1
    assert [p.reused for p in got].count(False) == 1  # the one that ran it
    assert "installed" in next(p.log for p in got if not p.reused)
    # The setup box had the setup's network (none: no hosts) and was removed.
    (box,) = backend.boxes
    assert box.spec.network.egress == "none" and box.spec.prepared is None


def test_a_failed_setup_fails_every_member_runs_once_and_is_not_kept() -> None:
    backend = SnapshotBackend()
    preparer = Preparer(backend, "r1")
    got = _many(preparer, SetupSpec(run="fail now"), 4)
    assert backend.runs == ["fail now"] and backend.snapshots == {}
    assert all(isinstance(e, SetupFailed) for e in got)
    assert all(str(e).startswith("setup failed (exit 3): ") for e in got)
    assert "no matching dist" in str(got[0])
    assert sorted(e.again for e in got) == [False, True, True, True]
    # The next run tries again: nothing of the failure was kept.
    _many(Preparer(backend, "r2"), SetupSpec(run="fail now"), 1)
    assert backend.runs == ["fail now", "fail now"]


def test_a_key_the_engine_has_is_set_up_by_nobody_and_a_source_edit_keeps_the_key(
    tmp_path: Path,
) -> None:
    backend = SnapshotBackend()
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "requirements.txt").write_text("tinydep\n")
    (repo / "app.py").write_text("x = 1\n")
    _many(Preparer(backend, "r1"), SetupSpec(run="ok"), 1, repo)
    (repo / "app.py").write_text("x = 2\n")
    (again,) = _many(Preparer(backend, "r2"), SetupSpec(run="ok"), 1, repo)
    assert backend.runs == ["ok"] and again.reused
    (repo / "requirements.txt").write_text("tinydep\nother\n")
    _many(Preparer(backend, "r3"), SetupSpec(run="ok"), 1, repo)
    assert backend.runs == ["ok", "ok"]


def test_a_snapshot_the_run_found_at_its_start_is_every_members_without_a_wait(
    tmp_path: Path,
) -> None:
    """What the run's start found (its warm pools ask first) is the members' at once: no
    engine call, no image asked twice, no line at the host lock another run holds."""
    import fcntl
    import os

    backend = SnapshotBackend()
    asked: list[str] = []
    found, image = backend.find_prepared, backend.setup_image

    async def counting_find(key: str) -> str | None:
        asked.append("find")
        return await found(key)

    async def counting_image(spec: SandboxSpec) -> str:
        asked.append("image")
        return await image(spec)

    backend.find_prepared = counting_find  # type: ignore[method-assign]
    backend.setup_image = counting_image  # type: ignore[method-assign]
    _many(Preparer(backend, "r1"), SetupSpec(run="ok"), 1)
    preparer = Preparer(backend, "r2")
    asked.clear()
    ref = anyio.run(preparer.cached, SetupSpec(run="ok"), SandboxSpec(), None)
    assert ref is not None and asked == ["image", "find"]
    assert anyio.run(preparer.cached, SetupSpec(run="ok"), SandboxSpec(), None) == ref
    assert asked == ["image", "find"]  # the run's second member's pool: nothing asked
    (key,) = backend.snapshots
    lock = tmp_path / "cache" / "prepared-locks" / key
    fd = os.open(lock, os.O_RDWR)
    fcntl.flock(fd, fcntl.LOCK_EX)  # another run on this host sets the key up meanwhile
    try:
        got = _many(preparer, SetupSpec(run="ok"), 8, within=5)  # it is held for good here
    finally:
        os.close(fd)
    assert {p.ref for p in got} == {ref} and all(p.reused for p in got)
    assert asked == ["image", "find"] and backend.runs == ["ok"]
    # A key this run did not find is looked up (and set up) as before, under the lock.
    (other,) = _many(preparer, SetupSpec(run="ok again"), 1)
    assert not other.reused and asked == ["image", "find", "find"]


def test_a_setup_past_its_limit_and_a_refused_capture_are_failures_named_as_such() -> None:
    backend = SnapshotBackend()
    (slow,) = _many(Preparer(backend, "r1"), SetupSpec(run="slow", timeout_s=2), 1)
    assert str(slow).startswith("setup failed (timed out after 2 s): ")
    backend.refuse = "the file 'pip.conf' holds the value of secret TOKEN"
    (refused,) = _many(Preparer(backend, "r1"), SetupSpec(run="ok again"), 1)
    assert str(refused) == f"setup failed: {backend.refuse}" and backend.snapshots == {}


def test_secrets_go_to_the_command_alone_and_are_masked_in_its_log() -> None:
    backend = SnapshotBackend()

    async def main() -> Any:
        return await Preparer(backend, "r1").prepare(
            SetupSpec(run="echo-secret", secrets=("TOKEN",)),
            SandboxSpec(),
            None,
            secrets={"TOKEN": "tok-123456789"},
        )

    made = anyio.run(main)
    (box,) = backend.boxes
    assert box.env == {"TOKEN": "tok-123456789"}  # the command's environment...
    assert "TOKEN" not in box.spec.env  # ...never the box's (a snapshot would keep it)
    assert "token ***" in made.log and "tok-123456789" not in made.log


def test_two_processes_on_one_host_set_a_key_up_once(tmp_path: Path) -> None:
    # Two preparers (two runs) sharing an engine and a host: the second waits on the
    # first's file lock, then finds its snapshot.
    backend = SnapshotBackend()

    async def main() -> list[Any]:
        out: list[Any] = []

        async def one(run: str) -> None:
            out.append(
                await Preparer(backend, run).prepare(
                    SetupSpec(run="ok"), SandboxSpec(), None, secrets={}
                )
            )

        async with anyio.create_task_group() as tg:
            tg.start_soon(one, "r1")
            tg.start_soon(one, "r2")
        return out

    got = anyio.run(main)
    assert backend.runs == ["ok"] and sorted(p.reused for p in got) == [False, True]


def test_a_tree_is_kept_only_for_a_key_some_box_waits_for_and_only_while_it_is_to_run() -> None:
    backend = SnapshotBackend()
    preparer = Preparer(backend, "r1")
    waited, alone = SetupSpec(run="ok one"), SetupSpec(run="ok two")

    async def main() -> tuple[Any, ...]:
        where = await preparer.waiting_dir(waited, SandboxSpec(), None)
        made = await preparer.prepare(waited, SandboxSpec(), None, secrets={})
        again = await preparer.prepare(waited, SandboxSpec(), None, secrets={})
        later = await preparer.waiting_dir(waited, SandboxSpec(), None)  # made: none
        other = await preparer.prepare(alone, SandboxSpec(), None, secrets={})
        return where, made, again, later, other

    where, made, again, later, other = anyio.run(main)
    # The waited-for key's tree goes to its own directory, made for it (0755: the box's
    # user reads it through a read-only mount); the other key keeps none.
    assert backend.kept == [where, None]
    assert where.is_dir() and where.stat().st_mode & 0o777 == 0o755
    assert where.name == made.key[:64] and where.parent.name == "r1"
    assert made.tree and again.tree and not other.tree
    assert later is None
    # A key the engine has already needs no waiting box either.
    fresh = Preparer(backend, "r2")
    assert anyio.run(fresh.waiting_dir, alone, SandboxSpec(), None) is None


def test_the_kept_trees_directory_takes_no_name_that_leaves_it_and_drops_dead_runs(
    tmp_path: Path,
) -> None:
    from sandbox.prepared import waiting

    for run, key in (("../x", "ab"), ("r1", "../ab"), ("a/b", "ab"), ("..", "ab"), ("r", "a.b")):
        with pytest.raises(ValueError):
            waiting.key_dir(run, key)
    live = waiting.key_dir("r1@node-a", "ab" * 32)
    dead = waiting.key_dir("r2", "cd" * 32)
    (dead / "tree.tar").write_bytes(b"x")
    assert waiting.drop_stale(lambda: {"r1@node-a"}) == 1
    assert live.is_dir() and not dead.parent.exists()
    waiting.drop_trees("..")  # not a run: nothing happens
    assert waiting.trees_dir().is_dir()
    waiting.drop_trees("r1@node-a")
    assert not live.parent.exists()


def test_a_run_that_keeps_a_tree_while_gc_asks_who_lives_keeps_it(tmp_path: Path) -> None:
    """gc lists the kept trees first and asks which runs live after: a run is live
    before it keeps a tree, so one that starts between the two is never taken for dead.
    Asked first, the answer lacked such a run and its new tree was removed."""
    from sandbox.prepared import waiting

    old = waiting.key_dir("r-old", "ab" * 32)
    started: list[Path] = []

    def live() -> set[str]:
        owners = {"r-gone-by-now"}  # what the markers said: r-new had not started
        started.append(waiting.key_dir("r-new", "cd" * 32))  # then it starts
        return owners

    assert waiting.drop_stale(live) == 1
    assert not old.parent.exists()
    assert started and started[0].is_dir()
    # A link among the kept trees, named like a dead run: what it points to stays.
    outside = tmp_path / "outside"
    (outside / "k").mkdir(parents=True)
    (waiting.trees_dir() / "r-link").symlink_to(outside, target_is_directory=True)
    assert waiting.drop_stale(lambda: set()) == 2  # r-new's tree, and the link
    assert (outside / "k").is_dir() and not (waiting.trees_dir() / "r-link").is_symlink()


def test_a_kept_tree_goes_once_the_last_box_of_its_key_is_done_with_it() -> None:
    backend = SnapshotBackend()
    preparer = Preparer(backend, "r1")
    setup = SetupSpec(run="ok")

    async def main() -> list[bool]:
        seen = []
        first = await preparer.waiting_dir(setup, SandboxSpec(), None)
        second = await preparer.waiting_dir(setup, SandboxSpec(), None)
        assert first == second and first is not None
        await preparer.done_waiting(first)  # before the setup ended: it stays
        seen.append(first.is_dir())
        third = await preparer.waiting_dir(setup, SandboxSpec(), None)
        assert third == first
        await preparer.prepare(setup, SandboxSpec(), None, secrets={})
        await preparer.done_waiting(first)
        seen.append(first.is_dir())  # one box may still lay it
        await preparer.done_waiting(first)
        seen.append(first.is_dir())  # the last one is done: gone
        await preparer.done_waiting(first)  # once too often: nothing happens
        return seen

    assert anyio.run(main) == [True, True, False]


def test_a_snapshot_gone_after_the_run_found_it_is_set_up_again_once_forgotten() -> None:
    """The run trusts what it found (no engine call per member) until a box could not
    start from it: forget() withdraws that, and the next ask sets the key up again."""
    backend = SnapshotBackend()
    preparer = Preparer(backend, "r1")
    (first,) = _many(preparer, SetupSpec(run="ok"), 1)
    backend.snapshots.clear()  # gc removed it after the run made it
    (trusted,) = _many(preparer, SetupSpec(run="ok"), 1)
    assert trusted.ref == first.ref and backend.runs == ["ok"]
    preparer.forget("some other ref")  # not this key's: nothing changes
    assert _many(preparer, SetupSpec(run="ok"), 1)[0].ref == first.ref
    preparer.forget(first.ref)
    got = _many(preparer, SetupSpec(run="ok"), 4)  # members asking at once: one setup
    assert backend.runs == ["ok", "ok"]
    assert [p.reused for p in got].count(False) == 1
    assert {p.ref for p in got} == {backend.snapshots[first.key]}


FOUND, UNUSED = "f" * 64, "0" * 64
"""Two snapshots' keys (SHA-256 in hex, as Fleet makes them)."""


def test_gc_leaves_a_snapshot_used_since_it_was_listed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Unused for 20 days when gc looked, then found by a run before gc removed it: it
    stays (gc looks at its last use again just before); one not used since goes."""
    import time

    from sandbox.docker import prepared as store
    from sandbox.prepared.spec import PreparedInfo

    now = time.time()
    old = now - 20 * 24 * 3600
    infos = [
        PreparedInfo(
            key=k, ref=f"sha256:{k}", size=1, created=old, last_used=old, setup="s", base="b"
        )
        for k in (FOUND, UNUSED)
    ]
    removed: list[str] = []

    def listing(client: Any) -> list[PreparedInfo]:
        store.touch(FOUND)  # a run finds it just after gc listed
        return list(infos)

    monkeypatch.setattr(store, "list_all", listing)
    monkeypatch.setattr(store, "remove_helpers", lambda client, now: None)
    monkeypatch.setattr(store, "remove", lambda client, info: removed.append(info.key) or True)
    gone = store.gc(None, now=now)  # type: ignore[arg-type]
    assert [i.key for i in gone] == [UNUSED] and removed == [UNUSED]


def test_a_foreign_snapshots_key_names_no_file_outside_the_uses_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A listed snapshot's key is its image's label: one that walks out of the uses
    folder is read as never used, and its removal unlinks nothing there."""
    from sandbox.docker import prepared as store
    from sandbox.prepared.spec import PreparedInfo

    victim = tmp_path / "cache" / "victim"
    victim.parent.mkdir(parents=True, exist_ok=True)
    victim.write_text("keep me")  # written now: a use "now" were it read as one
    key = "../victim"
    assert store.last_used(key, 5.0) == 5.0  # not the victim's time
    store.touch(key)  # nothing made or touched

    class Api:
        def remove_image(self, ref: str, force: bool) -> None:
            pass

    class Client:
        api = Api()

    info = PreparedInfo(
        key=key, ref="sha256:x", size=1, created=5.0, last_used=5.0, setup="", base=""
    )
    assert store.remove(Client(), info)  # type: ignore[arg-type]
    assert victim.read_text() == "keep me"
    good = "a" * 64
    store.touch(good)
    assert store.last_used(good, 5.0) > 5.0
