"""A run beside the caller: :func:`start` (a handle to wait on, cancel, or cancel one
member of) and :func:`stream` (the run as typed events).

    async with fleet.start(job) as run:          # the run exists: run.id, run.path
        run.cancel_member("coder")               # or run.cancel(): the whole run
        summary = await run.wait()

    async for event in fleet.stream(job):        # RunCreated first, RunEnded last
        print(event.type)

Why a context manager and not a bare awaitable handle: the run is a task, and in
structured concurrency no task outlives the block that started it - leaving the
block waits for the run (or, when the block raised, cancels it), so no run goes on
unowned with boxes nobody will remove. :func:`stream` is an async generator over the
same handle; consume it to the end, or wrap it in ``contextlib.aclosing`` to break
out early (which cancels the run, removes its boxes and journals it ``interrupted``).

Events are pydantic models with a ``type`` discriminator: :class:`RunCreated`, every
journal entry as a :class:`JournalEntry`, every member's trace event as it is
(:data:`subagents.trace.TraceEvent`, e.g. ``model_call``, ``tool_call``), and
:class:`RunEnded` with the run's outcome. Errors are :mod:`coordinator.api`'s, raised
from ``async with`` (before the run exists) or from :meth:`RunHandle.wait` and the
stream (after).
"""

from __future__ import annotations

import contextlib
import math
import os
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from types import TracebackType
from typing import Any, Literal

import anyio
from pydantic import BaseModel, ConfigDict, Field

from sandbox.warm import WarmBoxes
from subagents.results.outcome import MemberOutcome
from subagents.trace import TraceEvent

from .api import (
    EventCallback,
    JobSource,
    JournalCallback,
    OutputDir,
    Ready,
    check_new,
    check_resume,
    interrupted,
    load_with_text,
    make_options,
)
from .fanout.fanout import Fanout
from .journal.entries import JournalEntryModel
from .rundir.runs import RunDir
from .runner.driver import RunOptions, RunSummary


class _Event(BaseModel):
    model_config = ConfigDict(extra="forbid", arbitrary_types_allowed=True)


class RunCreated(_Event):
    """The run exists (a stream's first event)."""

    type: Literal["run_created"] = "run_created"
    run_id: str
    path: Path
    """The run directory."""
    resumed: bool = False


class JournalEntry(_Event):
    """One entry of the run's journal, as written (member queued, started, finished...)."""

    type: Literal["journal"] = "journal"
    event: str
    """``run_started``, ``member_queued``, ``member_started``, ``member_finished``, ..."""
    ts: float
    member: str | None = None
    fields: dict[str, Any] = Field(default_factory=dict)
    """The entry's other fields (``status``, ``reason``, ``attempt``, ...)."""

    entry: JournalEntryModel | None = None
    """The entry itself, as its model (:mod:`coordinator.journal.entries`)."""

    @classmethod
    def of(cls, entry: JournalEntryModel) -> JournalEntry:
        data = entry.model_dump(mode="json", exclude_none=True)
        rest = {k: v for k, v in data.items() if k not in ("event", "ts", "member")}
        member = data.get("member")
        return cls(
            event=entry.event,
            ts=entry.ts,
            member=None if member is None else str(member),
            fields=rest,
            entry=entry,
        )


class RunEnded(_Event):
    """The run ended (a stream's last event); what :meth:`RunHandle.wait` returns."""

    type: Literal["run_ended"] = "run_ended"
    status: str
    """``succeeded``, ``failed`` or ``interrupted``."""
    exit_code: int
    report_path: Path | None = None
    outcomes: dict[str, MemberOutcome] = Field(default_factory=dict)

    @classmethod
    def of(cls, summary: RunSummary) -> RunEnded:
        return cls(
            status=summary.status,
            exit_code=summary.exit_code,
            report_path=summary.report_path,
            outcomes=summary.outcomes,
        )


class RunHandle:
    """A run going on beside the caller, inside ``async with`` (see the module
    docstring); ``id`` and ``path`` are known once the block is entered."""

    def __init__(self, prepare: Callable[[], Ready | RunSummary], opts: RunOptions) -> None:
        self._prepare, self._opts = prepare, opts
        self._scope = anyio.CancelScope()
        self._done = anyio.Event()
        self._summary: RunSummary | None = None
        self._error: Exception | None = None
        self._waited = False
        self._fanout: Fanout | None = None
        self._early: set[str] = set()  # members cancelled before the fan-out existed
        self._tasks: Any = None
        self.run: RunDir | None = None
        self.resumed = False
        self.on_end: list[Callable[[], None]] = []
        opts.on_fanout.append(self._got_fanout)

    @property
    def id(self) -> str:
        return self._opened().id

    @property
    def path(self) -> Path:
        return self._opened().path

    def _opened(self) -> RunDir:
        if self.run is None:
            raise RuntimeError("the run exists once 'async with fleet.start(...)' is entered")
        return self.run

    async def __aenter__(self) -> RunHandle:
        ready = await anyio.to_thread.run_sync(self._prepare)  # the preflight runs a loop
        if isinstance(ready, RunSummary):  # a resume with nothing left to run
            self.run, self._summary = ready.run, ready
            self._end()
            return self
        self.resumed = ready.resume
        self.run = ready.open()
        self._tasks = anyio.create_task_group()
        await self._tasks.__aenter__()
        self._tasks.start_soon(self._body, ready)
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> bool | None:
        if self._tasks is None:
            return None
        if exc is not None:
            self.cancel()  # the block failed (or a stream was closed): the run ends with it
        try:
            # The block's own exception goes on as it is (not in an exception group):
            # the run's task only has to be waited for, and it records its own errors.
            await self._tasks.__aexit__(None, None, None)
        finally:
            self._tasks = None
        if exc is None and self._error is not None and not self._waited:
            raise self._error  # nobody asked: an error must not pass unseen
        return None

    async def _body(self, ready: Ready) -> None:
        try:
            with self._scope:
                try:
                    self._summary = await ready.go()
                except Exception as exc:
                    self._error = exc
            if self._scope.cancelled_caught and self.run is not None:
                self._summary = interrupted(self.run)  # the driver journalled it
        finally:
            self._end()

    def _end(self) -> None:
        self._done.set()
        for told in self.on_end:
            told()

    def _got_fanout(self, fan: Fanout) -> None:
        self._fanout = fan
        for member in self._early:
            fan.cancel(member)

    def cancel(self) -> None:
        """Stop the run: its boxes are removed and it ends ``interrupted`` (resumable)."""
        self._scope.cancel()

    def cancel_member(self, member: str) -> bool:
        """End one member ``cancelled`` (its box removed) while the others go on; a later
        resume runs it again. False when it has already ended."""
        if self._fanout is None:
            self._early.add(member)
            return True
        return self._fanout.cancel(member)

    async def wait(self) -> RunSummary:
        """The run's summary once it has ended; raises what the run raised
        (:class:`~coordinator.api.RunFailed`)."""
        self._waited = True
        await self._done.wait()
        if self._error is not None:
            raise self._error
        assert self._summary is not None
        return self._summary


def start(
    job: JobSource,
    *,
    output_dir: OutputDir = None,
    on_event: EventCallback | None = None,
    on_journal: JournalCallback | None = None,
    echo: bool = False,
    options: RunOptions | None = None,
    warm: WarmBoxes | None = None,
) -> RunHandle:
    """A new run of ``job`` beside the caller: ``async with fleet.start(job) as run:``.
    The job is read now (:class:`~coordinator.job.jobfile.JobError`); the checks of
    :func:`coordinator.api.run` run on entering the block. ``warm``: as for
    :func:`coordinator.api.run_async`."""
    parsed, text = load_with_text(job)
    opts = make_options(options, on_event=on_event, on_journal=on_journal, echo=echo, warm=warm)
    return RunHandle(lambda: check_new(parsed, text, opts, output_dir=output_dir), opts)


def start_resume(
    run_ref: str | os.PathLike[str],
    *,
    output_dir: OutputDir = None,
    on_event: EventCallback | None = None,
    on_journal: JournalCallback | None = None,
    echo: bool = False,
    retry_failed: bool = False,
    options: RunOptions | None = None,
    warm: WarmBoxes | None = None,
) -> RunHandle:
    """:func:`start` for a resume (see :func:`coordinator.api.resume`)."""
    opts = make_options(options, on_event=on_event, on_journal=on_journal, echo=echo, warm=warm)
    opts.retry_failed = retry_failed or opts.retry_failed
    return RunHandle(lambda: check_resume(run_ref, opts, output_dir=output_dir), opts)


RunEvent = RunCreated | JournalEntry | RunEnded | TraceEvent
"""What :func:`stream` yields: the three run events, and members' trace events."""


async def stream(
    job: JobSource,
    *,
    output_dir: OutputDir = None,
    options: RunOptions | None = None,
    warm: WarmBoxes | None = None,
) -> AsyncIterator[RunEvent]:
    """The run of ``job`` as events: :class:`RunCreated` (its id and path) first, then
    journal entries and trace events as they happen, :class:`RunEnded` last (``warm``:
    as for :func:`coordinator.api.run_async`)."""
    send, receive = anyio.create_memory_object_stream[Any](math.inf)

    def put(event: Any) -> None:
        # A consumer that broke out has closed its end; the run's cleanup still journals.
        with contextlib.suppress(anyio.BrokenResourceError, anyio.ClosedResourceError):
            send.send_nowait(event)

    handle = start(
        job,
        output_dir=output_dir,
        on_event=put,
        on_journal=lambda entry: put(JournalEntry.of(entry)),
        options=options,
        warm=warm,
    )
    handle.on_end.append(send.close)
    async with receive, handle:
        yield RunCreated(run_id=handle.id, path=handle.path, resumed=handle.resumed)
        async for event in receive:
            yield event
        yield RunEnded.of(await handle.wait())
