"""Running a setup once per key and handing its snapshot to every member that needs it.

A :class:`Preparer` serves one run on one engine (a cluster node has its own, against
its own engine: no node sets up a key twice, and no node waits for another's). For
each key it holds a lock, and a file lock keeps two runs on one host from setting up
one key at once: the first member to need a key runs its setup, the others wait and
then start from the same snapshot; a key whose setup failed fails every
member that needs it in this run, with the same reason, without running it again. A
failed setup is never kept, so the next run tries again; a snapshot is found on the
engine before any setup is run, so a run whose key is cached sets up nothing.

Why each node of a cluster sets up on its own engine rather than one node setting up
and shipping the snapshot to the others (measured by ``bench/setup_nodes.py`` against a
second engine on one machine; figures in ``bench/README.md``): the nodes' setups run at
the same time, so the run waits one setup whichever way; shipping adds its transfer
after it. The whole image is the worst way (478 MiB of ``docker save`` for a 22 MiB
tree, about a build's time through a local pipe and some three times that through
Ray); the tree alone, committed on the node over its own copy of the image, costs about
a third of a small build (3 s against 8.5 s, local pipe) - still time added, never
taken away. What a build per node spends is each node's own CPU (and, for a setup that
downloads, its own downloads, through its own run's proxy, limited to the same hosts).
Shipping the tree would be the choice for a setup much longer than its transfer on
nodes too busy to run it, or one whose downloads must be byte-identical across nodes
(a wheelhouse makes them so already).

The setup box is a box of the member's image, runtime and limits, with no network, or,
when the setup names ``allow`` hosts, the run's network and its egress proxy for those
hosts only (the proxy variables set, so pip, uv, npm and apt use it). The wheelhouse is
mounted read-only at ``/wheels`` with ``PIP_FIND_LINKS`` pointing there. Secrets reach
the setup's command alone, as its environment (never the box's, which a snapshot's
image would keep); their values are replaced by ``***`` in the log, and a tree that
holds one is refused (:mod:`.capture`). The command runs from ``/workspace`` holding
the repository as the member would get it, as the box's user, bounded by ``timeout_s``
and the box's output limit like every command.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import anyio

from ..base import SandboxBackend
from ..errors import SandboxError
from ..spec import SandboxSpec
from . import waiting
from .capture import CaptureRefused, redact
from .key import key_inputs, setup_key, wheelhouse_digest
from .spec import SetupSpec

TAIL_CHARS = 1500
"""The end of a failed setup's output, as its members' reason gives it."""


class SetupFailed(Exception):
    """The setup did not make a snapshot; ``str()`` is the members' reason."""

    def __init__(self, reason: str, *, log: str = "", again: bool = False, key: str = "") -> None:
        super().__init__(reason)
        self.log = log
        self.again = again
        """Met as this run's earlier failure of the same key (the setup did not run)."""
        self.key = key
        """The setup's key, when it is known."""


@dataclass
class Prepared:
    """A snapshot a member's box starts from."""

    key: str
    ref: str
    reused: bool
    """Found on the engine (no setup ran for it in this run)."""
    duration_s: float
    log: str = ""
    """The setup's output (secrets masked); empty when reused."""
    tree: bool = False
    """Its tree is kept for this run's waiting boxes (:meth:`Preparer.waiting_dir`)."""


class Preparer:
    """One run's setups on one engine (see the module docstring)."""

    def __init__(self, backend: SandboxBackend, run: str) -> None:
        self.backend = backend
        self.run = run
        self._locks: dict[str, anyio.Lock] = {}
        self._done: dict[str, Prepared | SetupFailed] = {}
        self._wheels: dict[str, str | None] = {}
        """Each wheelhouse's digest, made once per run however many members use it."""
        self._images: dict[tuple[str, str | None], str] = {}
        """Each box image's id, asked of the engine once per run (by kind and image)."""
        self._trees: dict[str, Path] = {}
        """Keys some box waits for, and where their trees are to be kept."""
        self._kept: set[str] = set()
        """Keys whose trees were kept in this run."""
        self._waiters: dict[str, int] = {}
        """Boxes per key that may still lay its kept tree (:meth:`done_waiting`)."""

    async def key(self, setup: SetupSpec, box: SandboxSpec, repo: Path | None) -> tuple[str, dict]:
        """The setup's key for members of ``box`` with the repository copy ``repo``."""
        which = (box.kind, box.image)
        if which not in self._images:
            self._images[which] = await self.backend.setup_image(box)
        image = self._images[which]
        wheels = setup.wheels
        if wheels is not None and wheels not in self._wheels:
            self._wheels[wheels] = await anyio.to_thread.run_sync(wheelhouse_digest, wheels)
        digest = self._wheels.get(wheels) if wheels is not None else None
        inputs = await anyio.to_thread.run_sync(
            lambda: key_inputs(setup, image_id=image, runtime=box.runtime, repo=repo, wheels=digest)
        )
        return setup_key(inputs), inputs

    async def cached(self, setup: SetupSpec, box: SandboxSpec, repo: Path | None) -> str | None:
        """The snapshot of this setup the engine already has (None: it must run); one
        found is this run's for the key from then on, as :meth:`prepare` would find it."""
        key, _ = await self.key(setup, box, repo)
        done = self._done.get(key)
        if isinstance(done, Prepared):  # another member of the run asked already
            return done.ref
        ref = await self.backend.find_prepared(key)
        if ref is not None:
            self._done.setdefault(key, Prepared(key=key, ref=ref, reused=True, duration_s=0.0))
        return ref

    async def waiting_dir(
        self, setup: SetupSpec, box: SandboxSpec, repo: Path | None
    ) -> Path | None:
        """Where the tree of this setup will be kept for a box that waits for it
        (:mod:`.waiting`), when the setup is still to run here: neither this run nor the
        engine has its snapshot. None when there is one (the box starts from it). Each
        directory given is to be handed back to :meth:`done_waiting` once its box has
        laid the tree or will not."""
        key, _ = await self.key(setup, box, repo)
        if key in self._done or await self.backend.find_prepared(key) is not None:
            return None
        if key not in self._trees:
            owner = self.backend.owner(self.run)
            self._trees[key] = await anyio.to_thread.run_sync(waiting.key_dir, owner, key)
        self._waiters[key] = self._waiters.get(key, 0) + 1
        return self._trees[key]

    def forget(self, ref: str) -> None:
        """The snapshot ``ref`` is gone from the engine (a box could not start from it:
        gc or a person removed it after this run found or made it). What this run knew
        of it is dropped, so the next member - or the retry of the one that met it - that
        needs its key looks again and sets it up if the engine has it no more. Members
        of the key trust what the run knows without asking the engine each time (no
        engine call per member); this is how that trust is withdrawn."""
        for key, done in list(self._done.items()):
            if isinstance(done, Prepared) and done.ref == ref:
                del self._done[key]
                self._kept.discard(key)
                # Its kept tree's directory was removed once its boxes had laid it (or
                # is being laid still, and then goes with the run): a setup of the key
                # again keeps its tree in a directory made anew.
                self._trees.pop(key, None)
                self._waiters.pop(key, None)

    async def done_waiting(self, tree: Path) -> None:
        """A box that was given ``tree`` (:meth:`waiting_dir`) has laid it or never will:
        once no box of its key may still need it and its setup has ended, the kept tree
        is removed (not left on the host's disk until the run ends)."""
        key = next((k for k, path in self._trees.items() if path == tree), None)
        if key is None or self._waiters.get(key, 0) <= 0:
            return
        self._waiters[key] -= 1
        if self._waiters[key] == 0 and key in self._done:
            await anyio.to_thread.run_sync(lambda: shutil.rmtree(tree, ignore_errors=True))

    async def prepare(
        self,
        setup: SetupSpec,
        box: SandboxSpec,
        repo: Path | None,
        *,
        secrets: dict[str, str],
    ) -> Prepared:
        """The snapshot for this setup, made now unless this run or the engine has it.

        Raises:
            SetupFailed: the setup (or this run's earlier try of the same key) failed.
            SandboxError: the engine could not start the setup box.
        """
        key, inputs = await self.key(setup, box, repo)
        done = self._done.get(key)
        if isinstance(done, Prepared):  # this run has it: no lock to wait in line for
            tree = key in self._kept
            return Prepared(key=key, ref=done.ref, reused=True, duration_s=0.0, tree=tree)
        lock = self._locks.setdefault(key, anyio.Lock())
        async with lock, _host_lock(key):
            done = self._done.get(key)
            if isinstance(done, SetupFailed):
                raise SetupFailed(str(done), log=done.log, again=True, key=key)
            if done is not None:
                tree = key in self._kept
                return Prepared(key=key, ref=done.ref, reused=True, duration_s=0.0, tree=tree)
            t0 = time.monotonic()
            ref = await self.backend.find_prepared(key)
            if ref is not None:
                found = Prepared(key=key, ref=ref, reused=True, duration_s=0.0)
                self._done[key] = found
                return found
            try:
                made = await self._run(setup, box, repo, key, inputs, secrets)
            except SetupFailed as exc:
                exc.key = key
                self._done[key] = exc
                raise
            made.duration_s = round(time.monotonic() - t0, 3)
            self._done[key] = made
            return made

    async def _run(
        self,
        setup: SetupSpec,
        box: SandboxSpec,
        repo: Path | None,
        key: str,
        inputs: dict,
        secrets: dict[str, str],
    ) -> Prepared:
        env = dict(box.env)
        env.setdefault("PIP_DISABLE_PIP_VERSION_CHECK", "1")
        # The box's home is on its bounded /tmp, and goes with the setup's box: pip's
        # cache there would only double what a download puts in it. (Another tool's
        # cache - uv's, npm's - is its own to keep there, and gone the same way.)
        env.setdefault("PIP_NO_CACHE_DIR", "1")
        if setup.wheels:
            env["PIP_FIND_LINKS"] = "/wheels"
        spec = box.model_copy(
            update={
                "network": setup.network,
                "wheels": setup.wheels,
                "env": env,
                "keep": False,
                "prepared": None,
            }
        )
        member = f"setup-{key[:12]}"
        sandbox = await self.backend.create(spec, run=self.run, member=member)
        try:
            if repo is not None:
                await sandbox.upload(repo, "/workspace")
            res = await sandbox.exec(
                setup.command, cwd="/workspace", timeout=setup.timeout_s, env=secrets
            )
            log = redact(f"$ {setup.command}\n" + _log_text(res.stdout, res.stderr), secrets)
            if res.timed_out:
                raise SetupFailed(
                    f"setup failed (timed out after {setup.timeout_s:g} s): {_tail(log)}", log=log
                )
            if not res.ok:
                raise SetupFailed(f"setup failed (exit {res.exit_code}): {_tail(log)}", log=log)
            keep = self._trees.get(key)  # some box waits for it
            try:
                ref = await self.backend.save_prepared(
                    sandbox,
                    key=key,
                    inputs=inputs,
                    setup=setup.run,
                    repo=repo,
                    secrets=secrets,
                    keep=keep,
                )
            except CaptureRefused as exc:
                raise SetupFailed(f"setup failed: {exc}", log=log) from None
            if keep is not None:
                self._kept.add(key)
            made = Prepared(key=key, ref=ref, reused=False, duration_s=0.0, log=log)
            made.tree = keep is not None
            return made
        except SandboxError as exc:
            raise SetupFailed(f"setup failed: its box was lost ({exc})") from None
        finally:
            with anyio.CancelScope(shield=True):
                try:
                    await sandbox.close()
                except SandboxError:
                    pass


@asynccontextmanager
async def _host_lock(key: str) -> AsyncIterator[None]:
    """Held while a key is looked up and set up: two runs on one host that need the
    same key set it up once, the second finding the first's snapshot. A file lock,
    polled (never a blocked thread a cancelled run would leave behind)."""
    from ..images.catalog import cache_dir

    path = cache_dir() / "prepared-locks" / key
    await anyio.Path(path.parent).mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                await anyio.sleep(0.25)
        yield
    finally:
        os.close(fd)  # closing the descriptor releases the lock


def _log_text(stdout: str, stderr: str) -> str:
    parts = [stdout.rstrip("\n")] if stdout.strip() else []
    if stderr.strip():
        parts.append(stderr.rstrip("\n"))
    return "\n".join(parts) + ("\n" if parts else "")


def _tail(log: str) -> str:
    text = log.strip()
    if not text:
        return "(no output)"
    return text if len(text) <= TAIL_CHARS else "..." + text[-TAIL_CHARS:]
