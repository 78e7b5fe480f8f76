"""The first wave's boxes, started as soon as ``fleet run JOB`` has read the job file
(or :func:`coordinator.api.run_async` its job).

A job of explicit members has no planning phase for box start-up to hide behind, and
until now its warm pool opened when the run began, so its first members waited for
cold boxes: one coding box takes about 0.3 s, sixteen started at once about 2.3 s on
this 2-core engine (4 s with other work on it). Yet before a run exists, ``fleet run``
spends seconds on its own: importing the model client and the harness (2-4 s here)
and the preflight checks. This module starts the boxes at the very beginning of that,
in a thread, from the job file's own text (``tomllib``: nothing heavy to import; the
job is still validated as always afterwards), so that they are running when the
members start. The run's warm pool takes them over (:func:`coordinator.nodes.node.open_pools`).
A program calling the API has imported all that already, but the run's preflight
(models, images, the engine's host: 0.15-0.3 s here) still comes before its first
member, so ``run_async`` starts the same boxes beside it.

What is started: boxes for the explicit coding members that will run first - the
first ``max_parallel`` members in the job's order, ``max_parallel`` as the job sets it
or as :mod:`coordinator.nodes.capacity` will choose it from the engine's host - with the box
settings each member asks for, only coding boxes without a network and on Fleet's
image (no run network or proxy has to exist first). Anything else starts as before.

A member with a repository ``setup`` starts early too when the engine already has the
setup's snapshot: the thread keys the setup as the run will (the image's id, the
command, the wheelhouse's content, the repository's manifests as they are now:
:mod:`sandbox.prepared.key`) and starts the box from that snapshot, which copies its
tree into ``/workspace`` as it starts. A second run of a job with a setup then starts
like a job without one. When there is no snapshot yet (the first run, or a manifest
that changed since) nothing starts here: the member's box waits for its setup, as it
must. A key that came out otherwise than the run's (a file changed between the two
reads) only means no pool takes the box: it is removed with the run's others, and a
member never gets a box of a snapshot its run did not key.

What was measured before choosing this over the other ways to have boxes ready
(2-core engine, Docker 20.10). A pool that outlives its run - idle boxes kept for
the next run of the same image and settings - would make a second run's boxes free,
but only for a process that runs several jobs (``fleet run`` runs one), and it would
be a daemon in all but name: boxes idle between runs, owned by whichever process
made them, to be bounded, timed out and found by ``fleet sandbox gc``; and it would
hide what a first run costs. A faster OCI runtime is the other lever (``runc``
takes 35 ms of CPU to run a container of the coding image here, and every ``docker
exec`` - a box's agent start - runs it again; ``bench/runtime.py``), but Debian 12's
``crun`` (1.8.1) does not run on this host at all ("cgroups in hybrid mode not
supported"), and using any other runtime means registering it in the engine's
``daemon.json`` and reloading dockerd, which Fleet does not do to an engine it shares
with its user. What Fleet controls is what its boxes burn once started,
and that was the larger share: a coding member's per-turn checkpoint ran a
collection in the box (Python, git: about 100 ms of the box's CPU a turn), so 16
members doing five turns put 8 CPU-seconds on two cores; a turn that changed nothing
now costs the box about a quarter of that (:mod:`subagents.kinds.workspace_git`).

Safety. The boxes carry the run's id: its directory name is chosen here, and the run
is created with it. The run is marked live before the first box is made, so a
``fleet sandbox gc`` on a shared engine leaves them alone. If the run never starts (the
job is invalid, the preflight refuses it, Ctrl-C), :meth:`Prewarm.close` removes every
box made here; a box whose settings the validated job reads differently is not taken
and goes with the rest of the run's boxes when it ends.
"""

from __future__ import annotations

import threading
import time
import tomllib
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sandbox.spec import NetworkPolicy, SandboxSpec
from subagents.kinds import RESEARCH_KIND, UnknownKind, trait
from subagents.model.names import calls_the_api

from ..job.run_names import run_name
from .capacity import choose, engine_host


class Prewarm:
    """Boxes being started in a thread for a run that does not exist yet."""

    def __init__(
        self, job_name: str, first: list[Early], members: list[SandboxSpec], base: Path
    ) -> None:
        self.run = run_name(job_name)
        """The run's id and directory name, if it starts (RunDir.create takes it)."""
        self.first = first
        """What each coding member of the first wave starts from, in the job's order."""
        self.base = base
        """What the job's relative paths (a member's ``repo``) are relative to."""
        self.members = members
        """One box spec per member, when Fleet chooses max_parallel (else empty)."""
        self.began: float | None = None
        """When its thread started (the epoch), for whoever asks how early that was."""
        self._boxes: list[tuple[str, dict]] = []
        """(spec key, container details) of every box started, in order."""
        self._taken: set[str] = set()
        self._marked: str | None = None
        """The live marker's key, once the thread wrote it (:meth:`close` removes it)."""
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._work, name="fleet-prewarm", daemon=True)

    @classmethod
    def start(cls, job_file: str | Path) -> Prewarm | None:
        """Start the first wave's boxes of ``job_file``; None when there is nothing to
        start early or the file does not read as a job (its validation says why later)."""
        try:
            text = Path(job_file).read_text(encoding="utf-8")
        except Exception:
            return None
        return cls.from_text(text, base=Path(job_file).resolve().parent)

    @classmethod
    def from_text(cls, job_text: str, *, base: Path | None = None) -> Prewarm | None:
        """The same from a job's TOML text (:func:`coordinator.api.run_async` has it);
        ``base``: what its relative paths are relative to (the current directory)."""
        try:
            name, members, first = _first_wave(tomllib.loads(job_text))
        except Exception:
            return None
        if not first or (len(first) == 1 and calls_the_api(first[0].model)):
            return None  # one box, whose member's first call (seconds) hides its start
        warm = cls(name, first, members, base or Path.cwd())
        warm.began = time.time()
        warm._thread.start()
        return warm

    # -- the thread ---------------------------------------------------------------
    def _work(self) -> None:
        from sandbox.docker import reaper
        from sandbox.docker.engine import connect
        from sandbox.images.catalog import image_ref
        from sandbox.registry import get_backend

        try:
            client = connect()
        except Exception:
            return
        try:
            limit = self._limit(client)
            image = image_ref("coding", client=client)  # built, else nothing starts early
            wanted = self._specs(client, image, self.first[:limit])
            backend = get_backend("docker", client=client)
            self._marked = backend.owner(self.run)
            reaper.mark_live(self._marked)

            def one(i: int) -> None:
                if self._stop.is_set():
                    return
                spec = wanted[i]
                info = backend.start_offline(
                    spec, run=self.run, member=f"pool-{i + 1}", image=spec.prepared or image
                )
                with self._lock:
                    self._boxes.append((spec.pool_key, info))

            with ThreadPoolExecutor(max_workers=len(wanted) or 1) as threads:
                list(threads.map(one, range(len(wanted))))
        except Exception:
            return  # the run starts its boxes itself, as it always could
        finally:
            client.close()

    def _specs(self, client: Any, image: str, first: list[Early]) -> list[SandboxSpec]:
        """The box spec of each early member as its run's warm pool will key it: a
        member with a setup gets a box of the setup's snapshot when the engine has one
        for the key its repository has now (:func:`snapshot`), else none here."""
        out = []
        image_id: str | None = None
        wheels: dict[str | None, str | None] = {}
        for early in first:
            if early.setup is None:
                out.append(early.spec)
                continue
            if image_id is None:
                from sandbox.docker import prepared

                image_id = prepared.image_id(client, image)
            ref = snapshot(client, early, image_id, self.base, wheels)
            if ref is not None:
                out.append(early.spec.model_copy(update={"prepared": ref}))
        return out

    def _limit(self, client: Any) -> int:
        """How many of the first wave start now: as many as will run at once (the job's
        own max_parallel was applied when reading it; else Fleet's choice, made as the
        preflight will make it, from every member and the engine's host)."""
        if not self.members:
            return len(self.first)
        return choose(self.members, engine_host(client)).members

    # -- the run's side -------------------------------------------------------------
    def take(self, key: str) -> list[dict]:
        """The started boxes of box spec ``key`` (waiting for the thread to finish), for
        the run's warm pool; each is handed out once."""
        self._thread.join()
        with self._lock:
            out = [info for k, info in self._boxes if k == key and info["Id"] not in self._taken]
            self._taken.update(info["Id"] for info in out)
        return out

    def close(self) -> None:
        """Remove every box started here that no run took (a run removes its own), and
        the run's live marker: the command is over. A job refused before any box
        started leaves no marker either."""
        self._stop.set()
        self._thread.join()
        with self._lock:
            left = [info["Id"] for _, info in self._boxes if info["Id"] not in self._taken]
        from sandbox.docker import reaper

        try:
            if left:
                self._remove(left)
        finally:
            if self._marked is not None:
                reaper.mark_done(self._marked)

    @staticmethod
    def _remove(left: list[str]) -> None:
        from sandbox.docker.engine import connect, remove_box

        try:
            client = connect()
        except Exception:
            return  # gc takes them once their run is not live
        try:
            for ident in left:
                try:
                    remove_box(client, ident)
                except Exception:
                    pass
        finally:
            client.close()


@dataclass(frozen=True)
class Early:
    """A first-wave coding member, as its job file says it."""

    spec: SandboxSpec
    """Its box (no snapshot yet: :meth:`Prewarm._specs` finds one for a setup)."""
    setup: Any = None
    """Its ``setup`` as the file says it (a string or a table), or None."""
    repo: str | None = None
    """Its ``repo`` as the file says it (relative to the job file)."""
    model: str = "auto"
    """The model of its first call: its own ``model``, else the job's ``[model] name``."""


def snapshot(
    client: Any, early: Early, image_id: str, base: Path, wheels: dict[str | None, str | None]
) -> str | None:
    """The snapshot the engine has for ``early``'s setup, keyed as the run will key it
    (:class:`sandbox.prepared.prepare.Preparer`) from the repository and wheelhouse as
    they are now; None when there is none or the member's setup does not read as one
    (its validation says why, later). A key that comes out otherwise than the run's
    only means that no pool takes the box. ``wheels``: digests made so far, by path."""
    from sandbox.docker import prepared
    from sandbox.prepared.key import key_inputs, setup_key, wheelhouse_digest

    from ..job.work import MemberWork

    try:  # read as the job's member reads it (a string is the command)
        setup = MemberWork.model_validate({"setup": early.setup}).setup
        if setup is None:
            return None
        repo = (base / early.repo).resolve() if early.repo else None
        if setup.wheels is not None:
            setup = setup.model_copy(update={"wheels": str((base / setup.wheels).resolve())})
        if setup.wheels not in wheels:
            wheels[setup.wheels] = wheelhouse_digest(setup.wheels)
        inputs = key_inputs(
            setup,
            image_id=image_id,
            runtime=early.spec.runtime,
            repo=repo,
            wheels=wheels[setup.wheels],
        )
        return prepared.find_for_use(client, setup_key(inputs))
    except Exception:
        return None


def _box_kind(kind: Any) -> Any:
    """The box kind of a member of ``kind`` as the job file says it (None: no box, or a
    kind the job's validation will refuse), asked of the kind, not of its module."""
    try:
        return trait(kind, "box_kind") if trait(kind, "needs_box") else None
    except (UnknownKind, TypeError):
        return None


def _first_wave(raw: dict[str, Any]) -> tuple[str, list[SandboxSpec], list[Early]]:
    """The job's name, a box spec per member it may run (for the choice of
    ``max_parallel``, as :func:`coordinator.nodes.capacity.job_boxes` makes them), and
    its first wave's coding members - all from the job file's text as read (a field the
    job's validation refuses stops nothing here: the boxes are not taken)."""
    name = str(raw["name"])
    if raw.get("lead") or (raw.get("fanout") or {}).get("warm_pool") is False:
        return name, [], []  # a lead decides its members later; no pool, nothing early
    members: Sequence[dict[str, Any]] = raw.get("members") or []
    # The job's [sandbox] runtime, unless a member names its own: an early box is taken
    # only by a member whose box spec is the same, runtime included.
    runtime = {"runtime": (raw.get("sandbox") or {}).get("runtime", "runc")}
    boxes = [
        SandboxSpec(kind=box, **{**runtime, **(m.get("sandbox") or {})})
        for m in members
        if (box := _box_kind(m.get("kind")))
    ]
    research = raw.get("research")
    if isinstance(research, dict):
        box = _box_kind(RESEARCH_KIND)
        boxes += [SandboxSpec(kind=box, **runtime)] * int(research.get("members", 3))
    limit = (raw.get("fanout") or {}).get("max_parallel")
    wave = members[:limit] if isinstance(limit, int) and limit > 0 else members
    first = []
    for member in wave:
        overrides = {**runtime, **(member.get("sandbox") or {})}
        if (
            _box_kind(member.get("kind")) != "coding"  # only a box with no network starts early
            or overrides.get("image")
            or overrides.get("keep")
        ):
            continue  # a kept box is the member's own, never a pool's
        spec = SandboxSpec(kind="coding", network=NetworkPolicy(), **overrides)
        repo = member.get("repo")
        model = member.get("model") or (raw.get("model") or {}).get("name") or "auto"
        first.append(
            Early(
                spec,
                member.get("setup"),
                repo if isinstance(repo, str) else None,
                model if isinstance(model, str) else "auto",
            )
        )
    return name, boxes if not isinstance(limit, int) else [], first
