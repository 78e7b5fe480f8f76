"""Checks before a run exists: the job's repositories can be copied, its models can be
made, and its images are there (Fleet's own are built when missing).

Models are checked without importing the ``anthropic`` SDK (a Claude model's
credentials only): its import was started on a thread before the preflight and runs
beside it; :func:`check_sdk`, the last check, joins it.

All run after the job file is validated and before any run directory is created,
so a job that cannot start leaves nothing behind and says why in one paragraph
(exit 2), instead of every member "crashing" the same way, being retried, and the
run exiting 1 after its planner has spent model calls.

Repositories. A coding member's ``repo`` is refused when it is the root of the file
system, when it is a bare repository (no work tree to copy), when its selection is
past the copy limit, or when a file in it cannot be read: each would otherwise fail
the member at its start, every try.

A member's own image (``sandbox.image``) must already be on the engine: Fleet never
pulls (no registry is assumed reachable) and cannot build someone else's image.

Images. A job needs Fleet's image for each member kind it runs (unless a member
names its own ``sandbox.image``), the default image for the egress proxy of any
box on the run network (browser members), and the corpus image when browser
members may reach ``corpus:8080``. When one of those is missing or out of date we
*build it*, with a progress line saying so, rather than refuse:

- the user asked to run a job, and building is exactly what they would be told to
  do next; an image is a pure function of the files under ``images/`` (its tag is a
  hash of them), so the build is what ``fleet images build`` would produce, and an
  unchanged image is never rebuilt - the check costs one inspect per image;
- ``make demo`` already builds them; this is the path of someone who ran
  ``pip install`` and ``fleet run``, or pulled a change to ``images/``;
- the cost is visible, not silent: a line before the build, one per build step.

When the images cannot be built here - the Docker engine does not answer, the build
inputs (``images/`` of a source checkout) are absent, the base image needs root for
``debootstrap`` - that is exit 2 with one paragraph naming ``fleet setup`` and
``fleet images build``. A build that starts and fails (a Dockerfile step, Debian's
mirror) is exit 1 with the end of its log, as ``fleet images build`` does.
"""

from __future__ import annotations

import sys
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import TextIO

import anyio

from sandbox.errors import SandboxUnavailable
from sandbox.spec import NetworkPolicy
from subagents.browser.corpus import CORPUS_MEMBER
from subagents.kinds import RESEARCH_KIND, get_kind, kind_is, trait
from subagents.model import ModelError, make_model, parse_model, resolve_model
from subagents.model.credentials import api_credentials
from subagents.model.names import calls_the_api
from subagents.model.profiles import profile_for
from subagents.model.tokens import estimate_bytes

from ..errors import CommandFailed, UsageError
from ..job.spec import Job
from ..nodes.capacity import Parallelism, choose, engine_host, job_boxes, widest
from ..nodes.repo_copy import RepoRefused, RepoTooLarge, check_size, copy_room


def preflight(
    job: Job,
    flags: dict[str, str] | None = None,
    *,
    out: TextIO | None = None,
    cluster: str | None = None,
    insecure_cluster: bool = False,
) -> Parallelism:
    """Everything a run needs before it starts; raises :class:`UsageError` (exit 2).
    With ``cluster``, the images and firewall are checked on each of its nodes instead
    of on this machine (which may have no Docker engine), once the cluster is known to
    refuse a process without its token (or ``insecure_cluster`` says to go on). Returns
    how many members will run at once (:func:`check_parallel`)."""
    check_repos(job, flags)
    check_models(job, flags)
    check_budget(job)
    slots = None
    if cluster:
        slots = check_cluster(job, cluster, insecure=insecure_cluster)
    else:
        check_images(job, out=out)
        check_runtime(job)
    parallel = check_parallel(job, cluster_slots=slots)
    check_sdk(job)
    return parallel


def check_sdk(job: Job) -> None:
    """The last check, for a job that calls the Messages API: the model client loads.

    Its import (the ``anthropic`` SDK, about a second) was started on a thread before
    the preflight (:mod:`subagents.model.sdk_import`) and has run beside it; this joins
    it (Python's import lock: the main thread waits for the thread's import and gets
    the finished module). Joined here, not at the member's first model call, so that an
    SDK that cannot be imported stops the command before a run exists, once, as it
    always did - not as every member's attempt crashing the same way. What the main
    thread does between here and the first request (the run directory, the member's
    start: about 0.1 s of Python) could not run beside the import anyway: one thread
    at a time runs Python (the GIL), so the import overlaps only what waits on the
    Docker engine, the disk and the prewarm's boxes - the preflight above. Raises
    :class:`CommandFailed` (exit 1) naming the error and what to do."""
    if not any(calls_the_api(name) for name in model_names(job)):
        return
    try:
        import subagents.model.claude  # noqa: F401
    except Exception as exc:
        raise CommandFailed(
            f"the Messages API client cannot be loaded: the 'anthropic' package fails to "
            f"import ({type(exc).__name__}: {exc}); reinstall Fleet's dependencies "
            "(pip install -e . in its checkout) or choose an offline model (--model offline)"
        ) from exc


def first_call_need(job: Job) -> tuple[float, float]:
    """What the cheapest member's first call needs free under the run's budget, in USD
    and budget tokens: its input (its kind's system prompt and its task - a lower
    bound: its tools are left out), ``[model] max_tokens`` of output (nothing is known
    yet of what answers produce) and its closing room (that input again and
    ``closing_max_tokens`` of output)."""
    closing = job.budget.closing_max_tokens if job.budget else 1024
    out = job.model.max_tokens
    needs = []
    for m in job.members:
        profile = profile_for(resolve_model(m.model or job.model.name))
        given = estimate_bytes(len(get_kind(m.kind).system_prompt) + len(m.task))
        tokens = 2 * given + out + min(closing, out)
        usd = (
            2 * given * profile.input_per_mtok + (out + min(closing, out)) * profile.output_per_mtok
        )
        needs.append((usd / 1_000_000, float(tokens)))
    return min(needs, default=(0.0, 0.0), key=lambda n: n[1])


def check_budget(job: Job) -> None:
    """A ``[budget]`` line that cannot carry even one member's first call is refused
    before any box starts (exit 2), the line and the call's estimate named."""
    if job.budget is None or not job.members:
        return
    usd, tokens = first_call_need(job)
    how = "raise it, or lower [model] max_tokens"
    if job.budget.tokens is not None and job.budget.tokens < tokens:
        raise UsageError(
            f"budget.tokens: {job.budget.tokens:,} cannot carry one member's first call: it "
            f"needs about {round(tokens):,} tokens free (its system prompt and task, "
            f"{job.model.max_tokens:,} tokens of output and room for its closing call); {how}"
        )
    if job.budget.usd is not None and job.budget.usd < usd:
        raise UsageError(
            f"budget.usd: ${job.budget.usd:g} cannot carry one member's first call: it "
            f"needs about ${usd:.4f} free (its system prompt and task, "
            f"{job.model.max_tokens:,} tokens of output and room for its closing call); {how}"
        )


def check_runtime(job: Job) -> None:
    """A job that asks for gVisor finds it registered with the engine, or is refused
    (exit 2) with the command that registers it - before any box starts."""
    from sandbox.docker.engine import connect
    from sandbox.docker.gvisor import missing_runtimes, unregistered_message

    wants = job.sandbox.runtime == "gvisor" or any(
        m.sandbox.runtime == "gvisor" for m in job.members
    )
    if not wants:
        return
    try:
        client = connect()
    except SandboxUnavailable as exc:
        raise UsageError(str(exc)) from None
    try:
        missing = missing_runtimes(client.info())
    finally:
        client.close()
    if missing:
        raise UsageError(unregistered_message(missing))


def check_parallel(job: Job, *, cluster_slots: int | None = None) -> Parallelism:
    """``max_parallel`` for the run: the job's own, else chosen from its members and
    the engine's host (:mod:`coordinator.nodes.capacity`; the engine may be another machine,
    so it is asked, not this one). On a cluster (``cluster_slots``: the ``fleet_slots``
    its nodes offer, which say what each node can hold), as many as those slots."""
    if job.fanout.max_parallel is not None:
        return Parallelism(job.fanout.max_parallel, "as the job says")
    if cluster_slots is not None:
        members = max(1, min(len(job_boxes(job)), cluster_slots // widest(job)))
        return Parallelism(members, f"the cluster's nodes offer {cluster_slots} fleet_slots")
    from sandbox.docker.engine import connect

    try:
        client = connect()
    except SandboxUnavailable:
        host = None
    else:
        try:
            host = engine_host(client)
        finally:
            client.close()
    return choose(job_boxes(job), host, widest(job))


def check_cluster(job: Job, address: str, *, insecure: bool = False) -> int:
    """The cluster answers and each of its Fleet nodes has the job's images - Fleet's
    and any a member names itself (``sandbox.image``) - and, for browser boxes, the host
    firewall rules; else one paragraph naming the node and ``fleet setup``. A node
    cannot build images on a run's behalf: a build is root's job on that host, once.
    Returns the ``fleet_slots`` the nodes offer."""
    try:
        from ..nodes.cluster import ClusterUnavailable, check_nodes
    except ImportError:
        raise UsageError(
            f"--cluster {address} needs Ray, which is not installed; install Fleet's "
            "'cluster' extra: pip install -e '.[cluster]' (make setup does)"
        ) from None
    names = needed_images(job)
    own = {
        str(m.sandbox.image): f"members[{i}].sandbox.image"
        for i, m in enumerate(job.members)
        if m.sandbox.image
    }
    try:
        return check_nodes(address, names, own, firewall="browser" in names, insecure=insecure)
    except ClusterUnavailable as exc:
        raise UsageError(str(exc)) from None


def _field(where: str, flags: dict[str, str] | None) -> str:
    """``members[0].repo``, or ``REPO (members[0].repo)`` when a flag stands for it."""
    shown = (flags or {}).get(where)
    return f"{shown} ({where})" if shown else where


# ---------------------------------------------------------------- repositories


def check_repos(job: Job, flags: dict[str, str] | None = None) -> None:
    """Every coding member's ``repo`` can be copied into a box: not the root of the file
    system, within the size limit, every selected file readable. Checked here, not when
    the member starts, so a repo that can never be copied is bad input, not a member
    that "crashes" and is retried."""
    for i, member in enumerate(job.members):
        if member.repo is None:
            continue
        repo = Path(member.repo)
        field = _field(f"members[{i}].repo", flags)
        if repo == Path(repo.anchor):
            raise UsageError(
                f"{field}: {repo} is the root of the file system, not a project; "
                "point it at the project's own directory (e.g. ./my-project)"
            )
        try:
            box = member.sandbox.box(trait(member.kind, "box_kind"), network=NetworkPolicy())
            check_size(repo, room=copy_room(box))
        except (RepoTooLarge, RepoRefused) as exc:
            raise UsageError(f"{field}: {exc}") from None
        except OSError as exc:
            raise UsageError(
                f"{field}: {exc.filename or repo} cannot be read ({exc.strerror or exc}); "
                "only what this user can read is copied into the box: fix its permissions "
                "or list it in .gitignore"
            ) from None


# ---------------------------------------------------------------- models


def model_names(job: Job) -> list[str]:
    """Every distinct model the job will make, ``auto`` resolved."""
    return list(_model_fields(job))


def _model_fields(job: Job) -> dict[str, str]:
    """Each distinct model the job will make (``auto`` resolved) -> the field naming it."""
    named = [("model.name", job.model.name)]
    named += [(f"members[{i}].model", m.model) for i, m in enumerate(job.members) if m.model]
    if job.synthesis.model:
        named.append(("synthesis.model", job.synthesis.model))
    if job.lead is not None and job.lead.model:
        named.append(("lead.model", job.lead.model))
    out: dict[str, str] = {}
    for where, name in named:
        out.setdefault(resolve_model(name), where)
    return out


def check_models(job: Job, flags: dict[str, str] | None = None) -> None:
    """Check every model the job names, so that a model that cannot be used (no API
    key, a replay file that is not there) is bad input before a run exists - not a run
    that fails after its boxes and planner have started. An offline or replay model is
    made and closed; a Claude model's credentials are checked without making its
    client, whose SDK is still being imported beside the preflight
    (:mod:`subagents.model.sdk_import`): the preflight never waits for that import."""

    async def probe(name: str) -> None:
        with warnings.catch_warnings():
            # An unknown model string is logged once as a plain line; not twice.
            warnings.simplefilter("ignore")
            model = make_model(name)
        await model.aclose()

    for name, where in _model_fields(job).items():
        try:
            choice = parse_model(name)
            if choice.source == "claude":
                api_credentials(choice.name)
            else:
                anyio.run(probe, name)
        except ModelError as exc:
            raise UsageError(f"{_field(where, flags)}: {exc}") from None


# ---------------------------------------------------------------- images


def needed_images(job: Job) -> list[str]:
    """Fleet's images the job's boxes will run on, in build order."""
    from sandbox.images.catalog import image_defs

    kinds: list[str] = [m.kind for m in job.members if not m.sandbox.image]
    if job.research is not None:
        kinds.append(RESEARCH_KIND)
    if job.lead is not None:
        kinds += job.lead.kinds
    names: set[str] = {trait(k, "box_kind") for k in kinds}  # an image per box kind
    if any(kind_is(k, "reads_web") for k in [*kinds, *(m.kind for m in job.members)]):
        names.add("coding")  # the run network's egress proxy runs on the default image
        if any(h.split(":")[0] == CORPUS_MEMBER for h in job.egress.allow):
            names.add("corpus")
    return [n for n in image_defs() if n in names]


def _say(out: TextIO) -> Callable[[str], None]:
    def say(line: str) -> None:
        print(f"fleet: {line}", file=out, flush=True)

    return say


def check_images(job: Job, *, out: TextIO | None = None) -> dict[str, str]:
    """Build the job's missing or out-of-date images, or :class:`UsageError` when they
    cannot be built here; name -> reference. Blocking (a CLI step, before the run)."""
    from sandbox.docker.engine import connect
    from sandbox.images.build import ensure_images
    from sandbox.images.catalog import ImageBuildFailed, current_refs, image_exists

    names = needed_images(job)
    own = {f"members[{i}].sandbox.image": m for i, m in enumerate(job.members) if m.sandbox.image}
    if not names and not own:
        return {}
    out = out or sys.stderr
    try:
        client = connect()
    except SandboxUnavailable as exc:
        raise UsageError(str(exc)) from None
    try:
        for where, member in own.items():
            ref = str(member.sandbox.image)
            if not image_exists(client, ref):
                raise UsageError(
                    f"{where}: image {ref!r} is not on this Docker engine, and Fleet never "
                    f"pulls images; build or load it first ('docker build -t {ref} DIR' or "
                    f"'docker load -i FILE'), or leave sandbox.image out to use Fleet's "
                    f"{member.kind} image"
                )
        if not names:
            return {}
        refs = current_refs(names)
        missing = [n for n in names if not image_exists(client, refs[n])]
        if not missing:
            return {n: refs[n] for n in names}
        _say(out)(
            f"image(s) {', '.join(refs[n] for n in missing)} not built yet (missing, or "
            "out of date with images/); building them now - minutes the first time, "
            "then only when images/ changes ('fleet images build' does this ahead of time)"
        )
        built = ensure_images(names, client=client, say=_say(out))
    except ImageBuildFailed as exc:
        raise CommandFailed(f"building the job's images failed: {exc}") from None
    except SandboxUnavailable as exc:
        where = ""
        if "does not exist" in str(exc):  # installed without the build inputs
            where = ", from a Fleet source checkout (its images/ directory is the input)"
        raise UsageError(
            f"the job needs Fleet's image(s) {', '.join(names)}, which are not built (or are "
            f"out of date with images/) and cannot be built here: {str(exc).rstrip('.')}. "
            "Build them once with 'fleet setup' (as root; it also starts the Docker engine) "
            f"or 'fleet images build'{where}, then run this again."
        ) from None
    finally:
        client.close()
    return {n: built[n] for n in names}
