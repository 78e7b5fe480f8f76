"""A durable conversation's file: appended to in place, read back to its last whole
message after a write cut short, rewritten whole when the context replaced an older
message. The real :class:`~subagents.conversation.Conversation` on real files."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from loop_support import NoopContext, ScriptedModel, writer

from subagents.conversation import Conversation


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
