"""A node's transcript and checkpoint updates are bounded and stay in the member's
directory on the coordinator (``coordinator/nodes/node_durable.py``): a node is less
trusted than the coordinator, so every update is checked before anything of it is
written, and a node's final archive cannot bring durable files in past those checks."""

from __future__ import annotations

import io
import tarfile
from typing import Any

import pytest

from coordinator.nodes.node_durable import (
    MARK_BYTES,
    MAX_NAMES,
    DurableRefused,
    Mirror,
    keep,
    load,
    place,
)
from coordinator.nodes.shipping import not_from_node, unpack
from coordinator.nodes.stream import Durable, receive


def _update(names: list[str], files: dict[str, bytes]) -> dict[str, Any]:
    return {"names": names, "files": files}


@pytest.mark.parametrize(
    ("names", "files", "said"),
    [
        (["../conversation.json"], {"../conversation.json": b"{}"}, "not a durable file"),
        (["sub/checkpoint-1.bin"], {"sub/checkpoint-1.bin": b""}, "not a durable file"),
        (["trace.jsonl"], {"trace.jsonl": b""}, "not a durable file"),
        (["checkpoint-1.bin"], {"conversation.json": b"{}"}, "sent but not named"),
        (["checkpoint-1.over"], {"checkpoint-1.over": b"x" * (MARK_BYTES + 1)}, "over"),
        ([f"checkpoint-{i}.bin" for i in range(MAX_NAMES + 1)], {}, "not a durable update"),
        ("conversation.json", {}, "not a durable update"),
    ],
)
def test_an_update_breaking_a_bound_is_refused_whole(tmp_path, names, files, said):
    member = tmp_path / "runs" / "m"
    member.mkdir(parents=True)
    (member / "conversation.json").write_bytes(b"kept")
    with pytest.raises(DurableRefused, match=said):
        keep(member, _update(names, files))
    # Nothing of it was applied: not even the removal of what it did not name.
    assert (member / "conversation.json").read_bytes() == b"kept"
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["conversation.json", "m", "runs"]


def test_a_link_in_the_member_directory_is_replaced_not_followed(tmp_path):
    member, outside = tmp_path / "m", tmp_path / "outside"
    member.mkdir()
    outside.write_bytes(b"the user's file")
    (member / "conversation.json").symlink_to(outside)
    (member / ".checkpoint-2.bin.node-tmp").symlink_to(outside)
    (member / "checkpoint-1.bin").symlink_to(outside)
    assert load(member) == {}  # a link is not read back either
    keep(member, _update(["conversation.json", "checkpoint-2.bin"], {
        "conversation.json": b"{}", "checkpoint-2.bin": b"diff"}))  # fmt: skip
    assert outside.read_bytes() == b"the user's file"
    assert not (member / "conversation.json").is_symlink()
    assert load(member) == {"conversation.json": b"{}", "checkpoint-2.bin": b"diff"}
    assert not (member / "checkpoint-1.bin").exists()  # the node no longer has it


def test_the_mirror_sends_each_checkpoint_once_and_what_the_node_dropped(tmp_path):
    node, coord = tmp_path / "node", tmp_path / "coord"
    node.mkdir()
    sent: list[Any] = []
    mirror = Mirror(node, lambda update: sent.append(receive(Durable(update=update).wire())))
    (node / "checkpoint-1.bin").write_bytes(b"one")
    (node / "conversation.json").write_bytes(b"turn 1")
    mirror()
    (node / "checkpoint-2.bin").write_bytes(b"two")
    (node / "conversation.json").write_bytes(b"turn 2, longer")
    (node / "checkpoint-1.bin").unlink()
    mirror()
    mirror()  # nothing changed: nothing sent
    assert [msg.kind for msg in sent] == ["durable", "durable"]  # as the coordinator reads it
    assert set(sent[1].update.files) == {"checkpoint-2.bin", "conversation.json"}
    for msg in sent:
        keep(coord, msg.update)
    assert load(coord) == {"checkpoint-2.bin": b"two", "conversation.json": b"turn 2, longer"}
    again = tmp_path / "next-node"
    again.mkdir()
    place(again, {**load(coord), "../escape": b"x"})
    assert sorted(p.name for p in again.iterdir()) == ["checkpoint-2.bin", "conversation.json"]


def test_a_nodes_archive_brings_no_durable_or_coordinator_file(tmp_path):
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name in ("conversation.json", "./checkpoint-3.bin", "trace.jsonl", "page-1.md"):
            info = tarfile.TarInfo(name)
            info.size = 4
            tar.addfile(info, io.BytesIO(b"evil"))
    unpack(buf.getvalue(), tmp_path / "m", drop=not_from_node)
    assert [p.name for p in (tmp_path / "m").iterdir()] == ["page-1.md"]


def test_a_checkpoint_too_large_to_resume_from_is_not_sent(tmp_path, monkeypatch):
    import coordinator.nodes.node_durable as nd

    monkeypatch.setattr(nd, "CHECKPOINT_BYTES", 8)
    sent: list[Any] = []
    (tmp_path / "checkpoint-1.bin").write_bytes(b"123456789")
    (tmp_path / "conversation.json").write_bytes(b"{}")
    Mirror(tmp_path, sent.append)()
    (update,) = sent
    assert update.names == ["conversation.json"]  # the coordinator drops its copy
