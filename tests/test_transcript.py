"""A durable conversation's file: appended to in place, read back to its last whole
message after a write cut short, rewritten whole when the context replaced an older
message. The real :class:`~subagents.loop.conversation.Conversation` on real files."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from loop_support import NoopContext, ScriptedModel, writer

from subagents.durable import Checkpoints
from subagents.loop.conversation import Conversation
from subagents.member import run_member
from subagents.spec import Limits, MemberSpec


def _conversation(tmp_path: Path) -> Conversation:
    return Conversation(
        member="m",
        model=ScriptedModel(lambda request, n: []),  # type: ignore[arg-type]
        context=NoopContext(),  # type: ignore[arg-type]
        trace=writer(tmp_path, "m"),
        system="s",
        tools=[],
        max_output_tokens=1000,
        save_to=tmp_path / "conversation.json",
    )


def _turn(conv: Conversation, n: int) -> None:
    call = {"type": "tool_use", "id": f"t{n}", "name": "shell", "input": {"command": f"ls {n}"}}
    conv.append({"role": "assistant", "content": [call]})
    result = {"type": "tool_result", "tool_use_id": f"t{n}", "content": f"out {n} \u2028 \ud800"}
    conv.append({"role": "user", "content": [result]})


def _two_turns(tmp_path: Path) -> tuple[Conversation, Path]:
    conv = _conversation(tmp_path)
    conv.append({"role": "user", "content": [{"type": "text", "text": "task"}]})
    _turn(conv, 1)
    _turn(conv, 2)
    return conv, tmp_path / "conversation.json"


def _saved(path: Path) -> list[Any]:
    messages = json.loads(path.read_text(encoding="utf-8", errors="surrogatepass"))["messages"]
    assert isinstance(messages, list)
    return messages


def test_a_turn_appends_its_messages_in_place(tmp_path: Path) -> None:
    conv = _conversation(tmp_path)
    path = tmp_path / "conversation.json"
    conv.append({"role": "user", "content": [{"type": "text", "text": "task"}]})
    _turn(conv, 1)
    before = path.read_bytes()
    os.link(path, tmp_path / "seen")  # a file replaced by a rename would leave this one
    _turn(conv, 2)
    after = path.read_bytes()
    # The same file, its bytes kept up to where the closing line was: only the new
    # messages were written.
    assert (tmp_path / "seen").read_bytes() == after
    closing = before.rindex(b"]")
    assert after[:closing] == before[:closing]
    assert _saved(path) == json.loads(json.dumps(conv.messages)) and len(conv.messages) == 5


def test_a_write_cut_short_reads_back_as_the_last_whole_message(tmp_path: Path) -> None:
    conv, path = _two_turns(tmp_path)
    whole = path.read_bytes()
    last_line = whole.rindex(b"\n,", 0, len(whole) - 4) + 1
    for cut, messages in (
        (last_line + 10, 4),  # half of turn 2's results
        (last_line, 4),  # the closing line overwritten, nothing more
        (len(whole) - 2, 5),  # the results whole, the closing line half
    ):
        path.write_bytes(whole[:cut])
        again = _conversation(tmp_path)
        assert again.restore(), cut
        assert len(again.messages) == messages, cut
        assert again.messages == conv.messages[:messages]
        assert again.turn == 2 and again.completed_turn == (2 if messages == 5 else 1)
        # Going on never appends to the torn tail: the file is whole JSON again.
        _turn(again, 3)
        assert _saved(path) == json.loads(json.dumps(again.messages))
    path.write_bytes(b"")
    assert not _conversation(tmp_path).restore()


def test_a_replaced_older_message_rewrites_the_file(tmp_path: Path) -> None:
    conv, path = _two_turns(tmp_path)
    # What a compaction does: an older message replaced by a new one, the list shorter.
    conv.messages[1:3] = [{"role": "assistant", "content": [{"type": "text", "text": "gist"}]}]
    _turn(conv, 3)
    assert _saved(path) == json.loads(json.dumps(conv.messages))
    # A block added to a kept message's content: seen too.
    conv.messages[-1]["content"].append({"type": "text", "text": "a reminder"})
    conv.save()
    assert _saved(path) == json.loads(json.dumps(conv.messages))
    assert "gist" in path.read_text(encoding="utf-8", errors="surrogatepass")
    os.remove(path)  # a forgotten transcript: the next message starts it again
    _turn(conv, 4)
    assert _saved(path) == json.loads(json.dumps(conv.messages))


def _fsyncs(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Record each fsync of a transcript (the file's size when it ran), and run it."""
    sizes: list[int] = []
    real = os.fsync

    def fsync(fd: int) -> None:
        sizes.append(os.fstat(fd).st_size)
        real(fd)

    monkeypatch.setattr("subagents.loop.transcript.os.fsync", fsync)
    return sizes


def test_appends_are_written_at_once_and_fsynced_together(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    conv = _conversation(tmp_path)
    path = tmp_path / "conversation.json"
    conv.append({"role": "user", "content": [{"type": "text", "text": "task"}]})  # a rewrite
    sizes = _fsyncs(monkeypatch)
    _turn(conv, 1)
    _turn(conv, 2)
    # Readable at once (another reader, a resume after SIGKILL), not yet fsynced.
    assert _saved(path) == json.loads(json.dumps(conv.messages)) and sizes == []
    conv.sync()
    conv.sync()  # nothing new: no second fsync
    assert sizes == [path.stat().st_size]
    _turn(conv, 3)
    conv.sync()
    assert sizes == [sizes[0], path.stat().st_size] and sizes[1] > sizes[0]


_WRITER = """
import os, signal, sys
from pathlib import Path
sys.path[:0] = [{tests!r}, {root!r}]
from test_transcript import _conversation, _turn
conv = _conversation(Path({dir!r}))
conv.append({{"role": "user", "content": [{{"type": "text", "text": "task"}}]}})
conv.sync()
for n in range(1, 21):
    _turn(conv, n)
os.kill(os.getpid(), signal.SIGKILL)  # never synced again
"""


def test_a_group_committed_transcript_is_whole_after_sigkill_of_the_writer(
    tmp_path: Path,
) -> None:
    tests = Path(__file__).resolve().parent
    code = _WRITER.format(tests=str(tests), root=str(tests.parent), dir=str(tmp_path))
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=60)
    assert done.returncode == -signal.SIGKILL, done.stderr.decode()[-2000:]
    again = _conversation(tmp_path)
    assert again.restore()
    # Every message written before the kill is there: the page cache outlives the process.
    assert len(again.messages) == 41 and again.turn == 20 and again.completed_turn == 20
    assert again.messages[-1]["content"][0]["tool_use_id"] == "t20"


@pytest.mark.anyio
async def test_the_transcript_is_fsynced_before_each_model_call_and_at_the_members_end(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sizes = _fsyncs(monkeypatch)
    seen: list[list[int]] = []

    def policy(request: Any, n: int) -> list[dict[str, Any]]:
        seen.append(list(sizes))
        if n < 4:
            return [{"type": "tool_use", "id": f"c{n}", "name": "add", "input": {"a": n, "b": 1}}]
        answer = {"answer": "done", "sources": []}
        return [{"type": "tool_use", "id": f"c{n}", "name": "submit_result", "input": answer}]

    path = tmp_path / "conversation.json"
    outcome = await run_member(
        MemberSpec(id="m1", kind="probe", task="Count.", limits=Limits(max_turns=10)),
        sandbox=None,
        model=ScriptedModel(policy),
        run_dir=tmp_path,
        trace=writer(tmp_path),
        conversation_file=path,
    )
    assert outcome.status == "ok"
    # One fsync a call, covering the turn before (its answer and its results), not
    # one an append; the last covers the member's last messages, before it ends.
    assert [len(s) for s in seen] == [1, 2, 3, 4]
    assert sizes[-1] == path.stat().st_size and len(sizes) == 5
    assert len(_saved(path)) == 9


def test_checkpoints_go_only_after_the_transcript_is_durable(tmp_path: Path) -> None:
    for turn in (1, 2):
        (tmp_path / f"checkpoint-{turn}.bin").write_bytes(b"x")
    store = Checkpoints(tmp_path, None, writer(tmp_path), save=None, restore=None)  # type: ignore[arg-type]
    present: list[list[str]] = []

    def durable() -> None:
        present.append(sorted(p.name for p in tmp_path.glob("checkpoint-*")))

    store.committed(2, durable=durable)
    assert present == [["checkpoint-1.bin", "checkpoint-2.bin"]]
    assert sorted(p.name for p in tmp_path.glob("checkpoint-*")) == ["checkpoint-2.bin"]
    store.committed(2, durable=durable)  # nothing older to remove: no fsync asked
    assert len(present) == 1
