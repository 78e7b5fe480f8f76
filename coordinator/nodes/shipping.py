"""What travels between the coordinator and a cluster node for one attempt.

To the node (:class:`NodeRequest`): the member's unit as JSON, and - because nodes
share no file system with the coordinator - its repository selection, its memory
directory and its MCP servers' ``files`` as tar archives, and an earlier attempt's
transcript and checkpoint. From the node: batches of trace events while the member
runs, its transcript and checkpoint after each saved turn
(:mod:`coordinator.nodes.node_durable`), then one :class:`NodeReply`: the outcome, the
member's files as a tar archive (pages, offloads, screenshots, patch; not
``trace.jsonl``, whose events already came, nor ``result.json``, which the
coordinator writes last, nor the durable files, which came their own bounded way)
and the memory changes. Everything is plain data (JSON-ready models and bytes): no host-local object
crosses, and the API key never does - a node's model client reads its own environment.

Archives are unpacked with tarfile's ``data`` filter: no absolute paths, no ``..``,
no links leading out, no device files, no set-id bits - a node (or a box that wrote a
member file) cannot place anything outside the member's directory on the coordinator.
"""

from __future__ import annotations

import io
import os
import tarfile
from collections.abc import Callable, Iterable
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from subagents.context.memory_profile import META
from subagents.durable import TRANSCRIPT
from subagents.results.outcome import MemberOutcome
from subagents.spend.budget import CLOSING_TOKENS

from .node_durable import is_durable
from .worker import MemberUnit

COORDINATOR_FILES = frozenset({"trace.jsonl", "result.json"})
"""Member files the coordinator writes itself; never shipped back."""


class NodeRequest(BaseModel):
    """One attempt for a node to run."""

    model_config = ConfigDict(extra="forbid")

    unit: MemberUnit
    repo: bytes | None = None
    """The repository selection (tar), when the member has a ``repo``."""
    not_copied: list[str] = Field(default_factory=list)
    """The repository's paths left out of the selection, with why (for the result)."""
    memory: bytes | None = None
    """The memory profile as the member starts from it (tar), when it has one."""
    memory_seq: int = 0
    """Saves in the profile's ledger when it was shipped (the merge's starting point)."""
    mcp_files: dict[str, bytes] = Field(default_factory=dict)
    """Each stdio MCP server's ``files`` (tar, by server name; see :func:`pack_path`)."""
    budget: bool = False
    """The run has a ``[budget]``: the member's calls reserve from it through the
    stream (:mod:`coordinator.nodes.node_budget`)."""
    closing_tokens: int = Field(default=CLOSING_TOKENS, ge=256, le=16_384)
    """The budget's ``closing_max_tokens``."""
    durable: dict[str, bytes] = Field(default_factory=dict)
    """The member's transcript and checkpoint from an earlier attempt, by file name
    (:mod:`coordinator.nodes.node_durable`): the attempt goes on from its last saved turn."""

    @staticmethod
    def has_files(unit: MemberUnit) -> bool:
        """Whether the attempt has files to pack (a repo, memory, MCP servers' files,
        an earlier attempt's transcript)."""
        return (
            bool(unit.repo)
            or unit.spec.memory_dir is not None
            or shipped_mcp(unit) != []
            or (Path(unit.member_dir) / TRANSCRIPT).exists()
        )

    def has_payload(self) -> bool:
        """Whether files beyond the repository and memory came (written off the loop)."""
        return bool(self.mcp_files or self.durable)


class MemoryChange(BaseModel):
    """One memory file a member changed: as shipped (base) and as it left it (ours)."""

    model_config = ConfigDict(extra="forbid")

    path: str
    base: bytes | None
    ours: bytes | None


class NodeReply(BaseModel):
    """How an attempt ended on the node, with what the coordinator keeps of it."""

    model_config = ConfigDict(extra="forbid")

    outcome: MemberOutcome
    files: bytes = b""
    """The member's files (tar), relative to its directory."""
    memory: list[MemoryChange] = Field(default_factory=list)
    """The member's memory changes, for the coordinator to merge into the profile."""


def not_from_node(name: str) -> bool:
    """Member files the coordinator writes itself or takes only their own bounded way
    (:mod:`coordinator.nodes.node_durable`): left out of a node's archive, whatever the node
    put in it."""
    return name in COORDINATOR_FILES or is_durable(name)


def _no_links(info: tarfile.TarInfo) -> tarfile.TarInfo | None:
    return None if info.issym() or info.islnk() else info


def pack(
    root: Path,
    *,
    skip: Iterable[str] = (),
    links: bool = True,
    skip_if: Callable[[str], bool] | None = None,
) -> bytes:
    """``root``'s files as a tar archive; top-level names in ``skip`` (or for which
    ``skip_if`` is true) are left out. Symlinks are kept as links (never followed), or
    left out with ``links=False``."""
    left_out = set(skip)
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        if root.is_dir():
            for entry in sorted(root.iterdir()):
                if entry.name not in left_out and not (skip_if and skip_if(entry.name)):
                    tar.add(entry, arcname=entry.name, filter=None if links else _no_links)
    return buf.getvalue()


def pack_path(path: Path) -> bytes:
    """A file or directory as a tar archive holding it under its own name (links kept,
    never followed): unpacked into D, it is ``D/<its name>``, a file or a tree as it was."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        tar.add(path, arcname=path.name)
    return buf.getvalue()


def shipped_mcp(unit: MemberUnit) -> list[tuple[str, Path]]:
    """The member's MCP servers whose ``files`` go to the node: (server name, host path).
    A path gone since the job was read is not shipped: the server then fails to start
    on the node, naming it, as it does on this host."""
    return [
        (s.name, Path(s.files))
        for s in unit.spec.mcp
        if s.files is not None and Path(s.files).exists()
    ]


def unpack(
    data: bytes,
    dest: Path,
    *,
    any_links: bool = False,
    drop: Callable[[str], bool] | None = None,
) -> None:
    """Unpack an archive made by :func:`pack` into ``dest``. The ``data`` filter refuses
    anything that would land outside ``dest``; ``any_links`` (for a repository from the
    coordinator, whose links may point anywhere, as the user has them) keeps links as
    they are, still refusing paths outside ``dest`` and set-id bits. Entries whose
    top-level name ``drop`` is true for are left out (files that reach ``dest`` only
    another way)."""
    dest.mkdir(parents=True, exist_ok=True)
    if not data:
        return
    with tarfile.open(fileobj=io.BytesIO(data), mode="r") as tar:
        members = [
            m
            for m in tar.getmembers()
            if drop is None or not drop(os.path.normpath(m.name).lstrip("/").split("/", 1)[0])
        ]
        tar.extractall(dest, members=members, filter="tar" if any_links else "data")


def snapshot(profile: Path) -> dict[str, bytes]:
    """A memory profile's files (relative path -> bytes); symlinks and the profile's
    bookkeeping directory are left out."""
    out: dict[str, bytes] = {}
    if not profile.is_dir():
        return out
    for path in profile.rglob("*"):
        rel = path.relative_to(profile)
        if rel.parts[0] != META and path.is_file() and not path.is_symlink():
            out[str(rel)] = path.read_bytes()
    return out


def memory_changes(before: dict[str, bytes], profile: Path) -> list[MemoryChange]:
    """What the member changed in its shipped profile: files written, created, removed.

    A rename travels as a removal and a creation: should another member have changed
    the old file meanwhile, the merge keeps that file (a conflict, reported), so no
    write is lost."""
    after = snapshot(profile)
    return [
        MemoryChange(path=rel, base=before.get(rel), ours=after.get(rel))
        for rel in sorted(set(before) | set(after))
        if before.get(rel) != after.get(rel)
    ]
