"""Durable runs: the run directory, its fsync'd journal, and what a resume must redo.

Layout (``runs/<run-id>/``)::

    job.toml        the job exactly as given
    job.json        the validated job
    members.json    the member list after planning (resume never re-plans)
    journal.jsonl   state changes, one JSON object a line, fsync'd each
    live.json       pid of the coordinator while it runs
    report.md, report.json
    members/<id>/   trace.jsonl, result.json, transcripts/, offloads/, screenshots/, pages/

Why a journal and not a state file rewritten in place: an append of one line plus
``fsync`` is atomic enough that a SIGKILL at any instant leaves every earlier state
change readable (a torn last line is skipped), and the history - which member
started when, how often it was retried - is exactly what a person debugging a run
wants. ``result.json`` is written by rename, so it is either whole or absent: a
member "has a result" exactly when that file exists, which is what resume checks.
"""

from __future__ import annotations

import builtins
import contextlib
import json
import os
import shlex
import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sandbox.docker.reaper import pid_alive
from subagents.results.outcome import MemberOutcome

from ..job.run_names import run_name
from ..job.spec import Job, MemberJob, split_attempt
from ..journal.entries import (
    AnyEntry,
    JournalEntryModel,
    MemberFinishedEntry,
    MemberQueuedEntry,
    MemberRetryEntry,
    MemberStartedEntry,
    MergeEntry,
    RunCreatedEntry,
    RunFinishedEntry,
    RunInterruptedEntry,
    RunStartedEntry,
    entry,
    parse,
)
from .run_lookup import RunNotFound as RunNotFound
from .run_lookup import created_at, find_run, run_dirs, runs_root

FINISHED = {"ok", "failed", "timed_out", "crashed", "incomplete"}
"""Member statuses that are final: resume does not run such a member again."""


def root_for(job: Job, output_dir: str | os.PathLike[str] | None = None) -> Path:
    """Where a new run of ``job`` goes: ``output_dir`` (``--output-dir``), else the
    job file's own ``output_dir`` when it sets one, else where every command looks for
    runs (``$FLEET_RUNS_DIR``, else ``runs``)."""
    if output_dir:
        return Path(output_dir)
    if "output_dir" in job.model_fields_set:
        return Path(job.output_dir)
    return runs_root()


class RunDirUnavailable(Exception):
    """No run directory can be made where the job (or ``--output-dir``) says."""


def check_root(root: Path) -> None:
    """Raise :class:`RunDirUnavailable` when run directories cannot be made under ``root``.

    Cheap and before anything else (images, models), so a bad output directory is
    said at once; :meth:`RunDir.create` still reports what this could not foresee.
    """
    probe = Path(root).absolute()
    while not probe.exists() and not probe.is_symlink() and probe != probe.parent:
        probe = probe.parent
    if not probe.is_dir():
        what = "exists and is not a directory" if probe.exists() else "is a broken link"
        raise RunDirUnavailable(_cannot(root, f"{probe} {what}"))
    if not os.access(probe, os.W_OK | os.X_OK):
        raise RunDirUnavailable(_cannot(root, f"{probe} is not writable by this user"))


def _cannot(root: Path, why: str) -> str:
    return (
        f"cannot create run directories under {root}: {why}; give a directory Fleet "
        "can write to (--output-dir DIR, or output_dir in the job file), e.g. --output-dir runs"
    )


def _fsync_write(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` atomically (temp file, fsync, rename)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with tmp.open("w", encoding="utf-8") as fh:
        fh.write(text)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


class Journal:
    """Append-only JSONL of typed entries (:mod:`coordinator.journal.entries`); every
    append is fsync'd before returning.

    ``listeners`` hear every entry once it is on disk, whoever appended it: a run's
    progress table and the API's ``on_journal`` see the same entries the file holds."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.listeners: list[Callable[[JournalEntryModel], None]] = []

    def append(self, entry: JournalEntryModel) -> JournalEntryModel:
        self.append_many([entry])
        return entry

    def note(self, event: str, **fields: Any) -> None:
        """Append the entry of kind ``event``: the ``journal(event, **fields)`` callable
        handed to layers that do not build entries themselves (the run's budget)."""
        self.append(entry(event, **fields))

    def append_many(self, entries: Sequence[JournalEntryModel]) -> None:
        """Every entry, written with one write and one fsync."""
        if not entries:
            return
        data = "".join(e.to_json() + "\n" for e in entries).encode("utf-8")
        # O_APPEND: whole lines land at the end even if two writers overlap.
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            while data:  # a write may be short for a large batch
                data = data[os.write(fd, data) :]
            os.fsync(fd)
        finally:
            os.close(fd)
        for e in entries:
            for listener in self.listeners:
                listener(e)

    def read(self) -> list[AnyEntry]:
        """The entries in file order: a torn line skipped, an unknown or damaged one
        kept as an :class:`~coordinator.journal.entries.UnknownEntry`."""
        try:
            return parse(self.path.read_text(encoding="utf-8", errors="replace"))
        except FileNotFoundError:
            return []


@dataclass
class RunState:
    """What the journal says about a run."""

    status: str = "created"
    """created, running, succeeded, failed, interrupted, or dead (killed mid-run)."""
    started: float = 0.0
    finished: float = 0.0
    members: dict[str, str] = field(default_factory=dict)
    """Member id -> last status (queued, running, retrying, ok, failed, ...)."""
    reasons: dict[str, str] = field(default_factory=dict)
    starts: dict[str, int] = field(default_factory=dict)
    """Member id -> how many attempts were started over the run's whole life."""
    attempts: dict[str, str] = field(default_factory=dict)
    """A parallel attempt's id (``coder.2``) -> its last status; not in ``members``."""
    merge: str | None = None
    """``[merge]``'s last verdict (``passed``, ``failed``, ...); None: no merge ran."""


class RunDir:
    """One run's directory."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.id = self.path.name
        self.journal = Journal(self.path / "journal.jsonl")

    # -- creation and lookup -----------------------------------------------------------

    @classmethod
    def create(
        cls, job: Job, job_text: str, *, root: Path | None = None, name: str | None = None
    ) -> RunDir:
        """A new run directory; ``name`` (the run's id) when it was chosen before, as
        :mod:`coordinator.nodes.prewarm` does to start the run's boxes early."""
        root = Path(root) if root is not None else root_for(job)
        path = root / (name or run_name(job.name))
        check_root(root)
        try:
            (path / "members").mkdir(parents=True)
        except OSError as exc:
            raise RunDirUnavailable(_cannot(root, exc.strerror or str(exc))) from None
        run = cls(path)
        try:
            (path / "job.toml").write_text(job_text, encoding="utf-8")
            _fsync_write(path / "job.json", job.model_dump_json(indent=2))
            # The creator's pid: a run whose coordinator died before it started is dead.
            run.journal.append(
                RunCreatedEntry(name=job.name, members=job.member_count, pid=os.getpid())
            )
        except OSError as exc:  # e.g. a full disk: leave no half-made run behind
            shutil.rmtree(path, ignore_errors=True)
            raise RunDirUnavailable(_cannot(root, exc.strerror or str(exc))) from None
        return run

    @classmethod
    def open(cls, ref: str, *, root: Path | None = None) -> RunDir:
        """A run by directory path, by id or by a unique id prefix under ``root``
        (default: ``$FLEET_RUNS_DIR``, else ``runs``); see :mod:`coordinator.rundir.run_lookup`."""
        return cls(find_run(ref, root))

    @staticmethod
    def list(root: Path | None = None) -> builtins.list[RunDir]:
        """The runs under ``root`` (default as for :meth:`open`), oldest first."""
        return [RunDir(d) for d in run_dirs(runs_root(root))]

    # -- contents ----------------------------------------------------------------------

    @property
    def created(self) -> float:
        return created_at(self.path)

    def job(self) -> Job:
        return Job.model_validate_json((self.path / "job.json").read_text(encoding="utf-8"))

    def save_members(self, members: builtins.list[MemberJob]) -> None:
        data = json.dumps([m.model_dump(mode="json") for m in members], indent=2)
        _fsync_write(self.path / "members.json", data)

    def planned_members(self) -> builtins.list[MemberJob] | None:
        p = self.path / "members.json"
        if not p.exists():
            return None
        return [MemberJob.model_validate(m) for m in json.loads(p.read_text(encoding="utf-8"))]

    def member_dir(self, member: str) -> Path:
        d = self.path / "members" / member
        d.mkdir(parents=True, exist_ok=True)
        return d

    def write_result(self, member: str, outcome: dict[str, Any]) -> None:
        _fsync_write(self.member_dir(member) / "result.json", json.dumps(outcome, indent=2))

    def outcome(self, member: str) -> MemberOutcome | None:
        """The member's recorded outcome, its result typed by its kind (read leniently:
        :mod:`subagents.kinds.results`); None when it has none, or its ``result.json``
        is not an outcome at all (damaged, or from a Fleet that wrote another shape)."""
        return _read_outcome(self.path / "members" / member / "result.json")

    def outcomes(self) -> dict[str, MemberOutcome]:
        """Every member's recorded outcome that reads as one, by member id."""
        out = {}
        for p in sorted((self.path / "members").glob("*/result.json")):
            if (o := _read_outcome(p)) is not None:
                out[p.parent.name] = o
        return out

    # -- liveness ----------------------------------------------------------------------

    def mark_live(self) -> None:
        """Record this process as the run's owner (gc keeps a live run's boxes)."""
        info = {"pid": os.getpid(), "since": time.time()}
        _fsync_write(self.path / "live.json", json.dumps(info))

    def clear_live(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            (self.path / "live.json").unlink()

    def owner_pid(self) -> int | None:
        """Pid of a coordinator still running this run, if any."""
        try:
            pid = int(json.loads((self.path / "live.json").read_text())["pid"])
        except (FileNotFoundError, ValueError, KeyError, json.JSONDecodeError):
            return None
        return pid if pid_alive(pid) else None

    # -- state -------------------------------------------------------------------------

    def state(self) -> RunState:
        st = RunState()
        creator: int | None = None
        for e in self.journal.read():
            member = getattr(e, "member", None)
            if isinstance(member, str) and split_attempt(member) is not None:
                match e:
                    case MemberStartedEntry() | MemberQueuedEntry():
                        st.attempts[member] = "running"
                    case MemberRetryEntry():
                        st.attempts[member] = "retrying"
                    case MemberFinishedEntry():
                        st.attempts[member] = e.status
                continue
            match e:
                case RunCreatedEntry():
                    creator = e.pid
                case RunStartedEntry():
                    st.status, st.started = "running", st.started or e.ts
                case RunFinishedEntry() | RunInterruptedEntry():
                    st.status, st.finished = e.status, e.ts
                case MemberQueuedEntry():
                    st.members[e.member] = f"waiting ({e.waiting})" if e.waiting else "queued"
                case MemberStartedEntry():
                    st.members[e.member] = "running"
                    st.starts[e.member] = st.starts.get(e.member, 0) + 1
                case MemberRetryEntry():
                    st.members[e.member] = "retrying"
                    st.reasons[e.member] = e.reason
                case MemberFinishedEntry():
                    st.members[e.member] = e.status
                    st.reasons[e.member] = e.reason
                case MergeEntry():
                    st.merge = e.verdict
        if st.status == "running" and self.owner_pid() is None:
            st.status = "dead"
        elif st.status == "created" and creator is not None and not pid_alive(creator):
            st.status = "dead"  # its coordinator died before the run started
        return st

    def resume_command(self) -> str:
        """The command that resumes this run, with ``--output-dir`` when the run is not
        where ``fleet resume`` looks by default."""
        where = self.path.parent
        if where.resolve() == runs_root().resolve():
            return f"fleet resume {self.id}"
        return f"fleet resume {self.id} --output-dir {shlex.quote(str(where))}"

    def pending_members(
        self, members: builtins.list[MemberJob], *, retry_failed: bool = False
    ) -> builtins.list[MemberJob]:
        """Members to run on resume: those the journal shows without a final outcome
        (never finished, or cancelled) or that the run's budget stopped, plus the
        failed ones when asked."""
        last = self.state().members
        todo = []
        for m in members:
            status = last.get(m.id or "")
            if status not in FINISHED or (retry_failed and status != "ok"):
                todo.append(m)
            elif status == "incomplete" and self._stopped_by_budget(m.id or ""):
                todo.append(m)  # the run's budget stopped it, not its own limits
        return todo

    def _stopped_by_budget(self, member: str) -> bool:
        o = self.outcome(member)
        return o is not None and o.limit == "budget"


def _read_outcome(path: Path) -> MemberOutcome | None:
    try:
        return MemberOutcome.model_validate_json(path.read_bytes())
    except (OSError, ValueError):
        return None
