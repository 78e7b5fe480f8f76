"""How many members run at once when the job does not say: what the engine's host holds.

``[fanout] max_parallel`` left out means Fleet chooses, from the job's members and
the machine the boxes run on - asked of the Docker engine itself (``NCPU`` and
``MemTotal`` of ``docker info``), since the engine may be another machine than the
one Fleet runs on. A job's own ``max_parallel`` always wins. The run's first line
says what was chosen and from what.

Memory is the hard bound. A box's memory limit (its programs' ``memory`` plus its
tmpfs mounts, :attr:`sandbox.spec.SandboxSpec.box_memory_bytes`; 2.3 GiB by default)
is a ceiling, not what it uses: a coding box at rest holds tens of MiB, a browser box
with a documentation page loaded about 260 MiB (``bench/README.md``). So the running
boxes' limits may add up to :data:`MEMORY_OVERCOMMIT` times the host's memory - a sum
reached only if most boxes filled their programs' memory *and* their tmpfs at once.
Were it reached, the kernel's OOM killer takes a box's command first (the box agent
raises every command's OOM score), which ends that member ``crashed`` and retryable,
not the host.

CPU is a soft bound, and the CPU count alone is the wrong one: a member spends most
of its life waiting for the model. One turn is a model call of seconds (0.5 s in the
fan-out benchmark's fake API, 2-30 s with Claude) against a few milliseconds of
harness CPU (``bench/harness.py``: under 4 ms a turn) and a tool call that is mostly
short in a coding box. Chromium is the exception: a browser member burns about 2.8
CPU-seconds over a 4-10 s life (loading and laying out pages). So each member is
budgeted the share of a CPU it keeps busy on average - :data:`CPU_SHARE` by box kind,
an eighth for a coding box, half for a browser box - and as many run as the host's
CPUs cover. Past that, members would only queue for the CPUs (slower, not broken: a
run at twice the CPU budget takes about as long as two waves). A job whose members
run heavy builds in their boxes should say ``max_parallel`` itself.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sandbox.docker.gvisor import host_memory
from sandbox.spec import NetworkPolicy, SandboxSpec

if TYPE_CHECKING:  # the job model imports the harness; choose() must not (prewarm.py)
    from ..job.spec import Job

MEMORY_OVERCOMMIT = 2.0
"""The running boxes' memory limits may add up to this many times the host's memory."""
CPU_SHARE = {"coding": 0.125, "browser": 0.5}
"""Average share of a CPU one member keeps busy, by box kind (others: a whole CPU)."""


@dataclass(frozen=True)
class HostSize:
    """What the engine reports of the machine it runs the boxes on."""

    cpus: int
    memory_bytes: int

    def describe(self) -> str:
        return f"{self.cpus} CPUs and {self.memory_bytes / 2**30:.1f} GiB on the engine's host"


@dataclass(frozen=True)
class Parallelism:
    """Members at once, and why that many (for the run's first line)."""

    members: int
    why: str


def choose(boxes: Sequence[SandboxSpec], host: HostSize | None, per_member: int = 1) -> Parallelism:
    """Members at once for members running in ``boxes`` (one spec per member) on ``host``
    (None: the engine did not say; then all members, at most 4, as before); a member
    may hold ``per_member`` boxes at once (its parallel attempts)."""
    count = len(boxes)
    if count == 0:
        return Parallelism(1, "no members")
    if host is None:
        return Parallelism(min(count, 4), "the engine did not report its host's size")
    largest = max(host_memory(b) for b in boxes)  # a gVisor box's Sentry included
    by_memory = int(host.memory_bytes * MEMORY_OVERCOMMIT // largest) // per_member
    share = max(CPU_SHARE.get(b.kind, 1.0) for b in boxes)
    by_cpu = int(host.cpus / share) // per_member
    chosen = max(1, min(count, by_memory, by_cpu))
    if chosen == count:
        why = f"all of them: {host.describe()}"
    else:
        bound = "memory" if by_memory <= by_cpu else "CPUs"
        why = f"{host.describe()}; bound by {bound} (memory {by_memory}, CPUs {by_cpu})"
    return Parallelism(chosen, why)


def engine_host(client: Any) -> HostSize | None:
    """What ``docker info`` says of the engine's machine; None when it does not say."""
    try:
        info = client.info()
        return HostSize(cpus=int(info["NCPU"]), memory_bytes=int(info["MemTotal"]))
    except Exception:  # an old or odd engine: Fleet falls back, the run goes on
        return None


def widest(job: Job) -> int:
    """The most boxes one member of ``job`` holds at once (its parallel attempts)."""
    return max((m.attempts for m in job.members), default=1)


def job_boxes(job: Job) -> list[SandboxSpec]:
    """One box spec per member the job may run (a lead's: its most of its heaviest kind)."""
    from subagents.kinds import RESEARCH_KIND, trait

    from ..job.spec import SandboxOverrides

    none, runtime = NetworkPolicy(), job.sandbox.runtime
    boxes = [
        m.sandbox.box(trait(m.kind, "box_kind"), network=none, runtime=runtime) for m in job.members
    ]
    if job.research is not None:
        research = SandboxOverrides().box(
            trait(RESEARCH_KIND, "box_kind"), network=none, runtime=runtime
        )
        boxes += [research] * job.research.members
    if job.lead is not None:
        kinds = [trait(k, "box_kind") for k in job.lead.kinds]
        heaviest = max(kinds, key=lambda k: CPU_SHARE.get(k, 1.0))
        spawned = SandboxOverrides().box(heaviest, network=none, runtime=runtime)
        boxes += [spawned] * job.lead.max_members
    return boxes
