"""Shared memory profiles: the three-way merge, deletes and renames, the ledger, the lock.

These drive the real memory tool and store on real files (the box is the in-test
fake); the same saves through the real CLI, with real boxes and parallel members,
are in tests/test_memory_shared.py.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from context_fakes import MemoryBox, SummaryModel

from subagents.context import ContextConfig, ContextManager
from subagents.context import memory_profile as mp
from subagents.context.memory_tool import MemoryInput
from subagents.context.merge3 import merge3
from subagents.trace import MemorySave, TraceWriter, read_trace

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


class Member:
    """One member's memory (store + tool) on ``profile``, with its own trace."""

    def __init__(self, tmp_path: Path, profile: Path, name: str, run: str = "r1") -> None:
        self.trace = TraceWriter(tmp_path / name / "trace.jsonl", run=run, member=name)
        model = SummaryModel()
        self.manager = ContextManager(
            ContextConfig(),
            profile=model.profile,
            model=model,
            sandbox=MemoryBox(),
            run_dir=tmp_path / name,
            trace=self.trace,
            task="t",
            memory_dir=profile,
            todos_enabled=False,
        )

    async def start(self) -> str:
        return await self.manager.start()

    async def do(self, **kw: object) -> str:
        (tool,) = self.manager.tools()
        return await tool.run(MemoryInput(**kw), None)  # type: ignore[arg-type]

    async def finish(self) -> MemorySave:
        await self.manager.finish()
        self.trace.close()
        (save,) = [e for e in read_trace(self.trace.path) if e.type == "memory_save"]
        return save


def profile_with(tmp_path: Path, **files: str) -> Path:
    profile = tmp_path / "profile"
    profile.mkdir()
    for name, text in files.items():
        (profile / name.replace("__", ".")).write_text(text)
    return profile


def merged(base: str, ours: str, theirs: str) -> tuple[str, int]:
    out = merge3(base, ours, theirs, ours_label="OURS", theirs_label="THEIRS")
    return out.text, out.conflicts


# -- the text merge -----------------------------------------------------------------------


def test_insertions_at_one_place_are_all_kept_and_a_change_already_there_is_not_doubled() -> None:
    base = "# notes\nold fact\n"
    assert merged(base, base + "from a\n", base + "from b\n") == (base + "from b\nfrom a\n", 0)
    top = "# notes\nfrom a\nold fact\n"
    assert merged(base, top, "# notes\nfrom b\nold fact\n")[0] == (
        "# notes\nfrom b\nfrom a\nold fact\n"
    )
    # The same save applied to a file that already holds it changes nothing.
    assert merged(base, base + "from a\n", base + "from a\n") == (base + "from a\n", 0)
    assert merged(base, base + "from a\n", base + "from b\nfrom a\n") == (
        base + "from b\nfrom a\n",
        0,
    )


def test_an_edit_beside_an_insertion_merges_but_two_edits_of_one_line_conflict() -> None:
    base = "# notes\nport: 80\nhost: a\n"
    assert merged(base, "# notes\nport: 8080\nhost: a\n", "# notes\nport: 80\nnew\nhost: a\n") == (
        "# notes\nport: 8080\nnew\nhost: a\n",
        0,
    )
    text, conflicts = merged(base, "# notes\nport: 1\nhost: a\n", "# notes\nport: 2\nhost: a\n")
    assert conflicts == 1
    assert text == (
        "# notes\n<<<<<<< THEIRS\nport: 2\n||||||| before both changes\nport: 80\n"
        "=======\nport: 1\n>>>>>>> OURS\nhost: a\n"
    )


def test_eight_saves_from_one_base_keep_every_line() -> None:
    base = "# notes\n"
    profile = base
    for n in range(8):
        profile, conflicts = merged(base, f"{base}fact {n}\n", profile)
        assert conflicts == 0
    assert profile.splitlines() == ["# notes"] + [f"fact {n}" for n in range(8)]


# -- saves through the memory store ----------------------------------------------------


async def test_two_members_inserting_into_one_file_both_keep_their_line(tmp_path: Path) -> None:
    profile = profile_with(tmp_path, notes__md="# notes\n")
    a, b = Member(tmp_path, profile, "a"), Member(tmp_path, profile, "b")
    await a.start()
    await b.start()  # both loaded before either saves
    await a.do(command="insert", path="/memories/notes.md", insert_line=1, insert_text="from a")
    await b.do(command="insert", path="/memories/notes.md", insert_line=1, insert_text="from b")
    saved_b = await b.finish()
    saved_a = await a.finish()
    assert (profile / "notes.md").read_text() == "# notes\nfrom b\nfrom a\n"
    assert [(f.path, f.action) for f in saved_b.files] == [("notes.md", "written")]
    assert [(f.path, f.action, f.merged_with) for f in saved_a.files] == [
        ("notes.md", "merged", ["b (run r1)"])
    ]


async def test_same_line_changed_twice_keeps_both_between_markers_and_says_so(
    tmp_path: Path,
) -> None:
    profile = profile_with(tmp_path, notes__md="# notes\nstatus: unknown\n")
    a, b = Member(tmp_path, profile, "a"), Member(tmp_path, profile, "b")
    await a.start()
    await b.start()
    await a.do(command="str_replace", path="notes.md", old_str="unknown", new_str="green")
    await b.do(command="str_replace", path="notes.md", old_str="unknown", new_str="red")
    await a.finish()
    saved = await b.finish()
    text = (profile / "notes.md").read_text()
    assert "status: green" in text and "status: red" in text and "status: unknown" in text
    assert text.startswith("# notes\n<<<<<<< the profile as saved since by a (run r1)\n")
    assert ">>>>>>> b (run r1)\n" in text
    (conflict,) = saved.conflicts
    assert conflict.path == "notes.md" and "1 place(s) changed differently" in conflict.detail
    # The next member to load the profile is told what the markers mean.
    loaded = await Member(tmp_path, profile, "c").start()
    assert "status: green" in loaded and "status: red" in loaded
    assert "[Between <<<<<<< and >>>>>>> lines your memory holds two versions" in loaded


async def test_a_delete_against_an_edit_keeps_the_edit_either_way(tmp_path: Path) -> None:
    profile = profile_with(tmp_path, one__md="one\n", two__md="two\n")
    a, b = Member(tmp_path, profile, "a"), Member(tmp_path, profile, "b")
    await a.start()
    await b.start()
    await a.do(command="str_replace", path="one.md", old_str="one", new_str="one, edited")
    await a.do(command="delete", path="two.md")
    await b.do(command="delete", path="one.md")
    await b.do(command="str_replace", path="two.md", old_str="two", new_str="two, edited")
    await a.finish()
    saved = await b.finish()
    assert (profile / "one.md").read_text() == "one, edited\n"  # b's delete lost to a's edit
    assert (profile / "two.md").read_text() == "two, edited\n"  # b's edit of what a deleted
    details = {f.path: f.detail for f in saved.conflicts}
    assert "deleted by this member but changed in the profile" in details["one.md"]
    assert "deleted from the profile since it was loaded" in details["two.md"]


async def test_a_rename_carries_an_edit_saved_meanwhile_to_the_new_name(tmp_path: Path) -> None:
    profile = profile_with(tmp_path, notes__md="# notes\nfirst\n", old__md="gone\n")
    a, b = Member(tmp_path, profile, "a"), Member(tmp_path, profile, "b")
    await a.start()
    await b.start()
    await a.do(command="insert", path="notes.md", insert_line=2, insert_text="added by a")
    await b.do(command="rename", old_path="notes.md", new_path="/memories/topics/facts.md")
    await b.do(command="delete", path="old.md")
    await a.finish()
    saved = await b.finish()
    assert not (profile / "notes.md").exists() and not (profile / "old.md").exists()
    assert (profile / "topics" / "facts.md").read_text() == "# notes\nfirst\nadded by a\n"
    actions = {f.path: f.action for f in saved.files}
    assert actions == {"notes.md": "renamed", "old.md": "deleted", "topics/facts.md": "merged"}
    assert saved.conflicts == []


async def test_a_file_that_is_not_text_changed_on_both_sides_keeps_both(tmp_path: Path) -> None:
    profile = profile_with(tmp_path)
    (profile / "blob.bin").write_bytes(b"\xff\x00base")
    b = Member(tmp_path, profile, "b")
    await b.start()
    (profile / "blob.bin").write_bytes(b"\xff\x00theirs")  # saved by someone else meanwhile
    store = b.manager.memory
    assert store is not None
    (store.root / "blob.bin").write_bytes(b"\xff\x00ours")  # the tool writes text only
    store.record(store.root.resolve() / "blob.bin")
    saved = await b.finish()
    assert (profile / "blob.bin").read_bytes() == b"\xff\x00theirs"
    assert (profile / "blob.bin.b-conflict").read_bytes() == b"\xff\x00ours"
    (conflict,) = saved.conflicts
    assert "kept as blob.bin.b-conflict" in conflict.detail


# -- the ledger, the pending save, the lock ----------------------------------------------


def _change(profile: Path, text: str) -> list[mp.FileChange]:
    base = (profile / "notes.md").read_bytes()
    return [mp.FileChange("notes.md", base, base + text.encode())]


def test_a_save_applied_twice_with_one_key_is_applied_once(tmp_path: Path) -> None:
    profile = profile_with(tmp_path, notes__md="# notes\n")
    loaded = mp.load_profile(profile, tmp_path / "copy")
    changes = _change(profile, "once\n")
    kw = {"key": "r1/m/abc", "run": "r1", "member": "m", "loaded_seq": loaded.seq}
    files, again = mp.save_profile(profile, changes, **kw)
    assert not again and [f.action for f in files] == ["written"]
    # The same changeset once more (a retried transfer, a replayed save): nothing happens,
    # and it is said - although "once" inserted at the end again would be a clean merge.
    files, again = mp.save_profile(profile, changes, **kw)
    assert again and (profile / "notes.md").read_text() == "# notes\nonce\n"
    ledger = (profile / ".fleet" / "saves.jsonl").read_text().splitlines()
    assert len(ledger) == 1 and '"key": "r1/m/abc"' in ledger[0]


def test_a_save_killed_halfway_is_finished_by_the_next_load(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    profile = profile_with(tmp_path, a__md="a\n", b__md="b\n")
    loaded = mp.load_profile(profile, tmp_path / "copy")
    changes = [
        mp.FileChange("a.md", b"a\n", b"a\nA\n"),
        mp.FileChange("b.md", b"b\n", b"b\nB\n"),
    ]
    real = os.replace
    calls = []

    def dies_on_the_second_file(src: object, dst: object) -> None:
        calls.append(dst)
        if str(dst).endswith("b.md"):
            raise KeyboardInterrupt("killed")  # stands for SIGKILL between two files
        real(src, dst)  # type: ignore[arg-type]

    monkeypatch.setattr(mp.os, "replace", dies_on_the_second_file)
    with pytest.raises(KeyboardInterrupt):
        mp.save_profile(profile, changes, key="k", run="r", member="m", loaded_seq=loaded.seq)
    monkeypatch.setattr(mp.os, "replace", real)
    assert (profile / "a.md").read_text() == "a\nA\n" and (profile / "b.md").read_text() == "b\n"
    assert (profile / ".fleet" / "pending.json").exists()
    # The next member to load the profile gets the whole save, entered once in the ledger.
    again = mp.load_profile(profile, tmp_path / "copy2")
    assert again.base == {"a.md": b"a\nA\n", "b.md": b"b\nB\n"}
    assert again.seq == 1 and not (profile / ".fleet" / "pending.json").exists()
    _, repeated = mp.save_profile(
        profile, changes, key="k", run="r", member="m", loaded_seq=loaded.seq
    )
    assert repeated and (profile / "b.md").read_text() == "b\nB\n"


def _hold_lock(profile: str, ready: multiprocessing.Event, release: multiprocessing.Event) -> None:
    with mp.locked(Path(profile)):
        ready.set()
        release.wait(30)


@contextlib.contextmanager
def lock_held_by_another_process(profile: Path) -> Iterator[None]:
    ctx = multiprocessing.get_context("spawn")
    ready, release = ctx.Event(), ctx.Event()
    holder = ctx.Process(target=_hold_lock, args=(str(profile), ready, release))
    holder.start()
    try:
        assert ready.wait(30)
        yield
    finally:
        release.set()
        holder.join(30)


def test_the_lock_holds_across_processes(tmp_path: Path) -> None:
    profile = profile_with(tmp_path, notes__md="# notes\n")
    loaded = mp.load_profile(profile, tmp_path / "copy")
    with lock_held_by_another_process(profile):
        with pytest.raises(mp.ProfileBusy, match=r"stayed locked for 0\.3s"):
            mp.save_profile(
                profile,
                _change(profile, "x\n"),
                key="k",
                run="r",
                member="m",
                loaded_seq=loaded.seq,
                timeout_s=0.3,
            )
        assert (profile / "notes.md").read_text() == "# notes\n"
    files, _ = mp.save_profile(
        profile, _change(profile, "x\n"), key="k", run="r", member="m", loaded_seq=loaded.seq
    )
    assert [f.action for f in files] == ["written"]


async def test_fleet_bookkeeping_is_neither_loaded_nor_writable(tmp_path: Path) -> None:
    profile = profile_with(tmp_path, notes__md="# notes\n")
    a = Member(tmp_path, profile, "a")
    await a.start()
    await a.do(command="insert", path="notes.md", insert_line=1, insert_text="x")
    await a.finish()
    b = Member(tmp_path, profile, "b")
    text = await b.start()
    assert ".fleet" not in text and "saves.jsonl" not in text
    from subagents.tools.base import ToolError

    with pytest.raises(ToolError, match="reserved"):
        await b.do(command="create", path="/memories/.fleet/saves.jsonl", file_text="{}")


async def test_a_save_that_cannot_get_the_lock_says_so_and_keeps_the_edits(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    profile = profile_with(tmp_path, notes__md="# notes\n")
    a = Member(tmp_path, profile, "a")
    await a.start()
    await a.do(command="insert", path="notes.md", insert_line=1, insert_text="kept")
    monkeypatch.setattr(mp, "LOCK_TIMEOUT_S", 0.2)
    with lock_held_by_another_process(profile), pytest.raises(mp.ProfileBusy):
        await a.manager.finish()
    a.trace.close()
    (save,) = [e for e in read_trace(a.trace.path) if e.type == "memory_save"]
    assert "stayed locked for 0.2s" in save.error and "1 changed file(s) not saved" in save.error
    assert (profile / "notes.md").read_text() == "# notes\n"
    assert (tmp_path / "a" / "memory" / "notes.md").read_text() == "# notes\nkept\n"
