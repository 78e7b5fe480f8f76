"""The container a box is: every secure default of :class:`SandboxSpec` applied in one place.

User 1000, all capabilities dropped, no-new-privileges, read-only root, tmpfs ``/tmp``
(mode 1777) and a size-limited tmpfs ``/workspace`` owned by uid 1000 (see
:mod:`sandbox.docker.backend` for why tmpfs), pids limit, memory limit with swap equal to it
(no swap on top), CPU quota, an init process reaping zombies (Docker's, or in a box
whose agent is reached through its stdio the agent's own: ``attach``), the given network
(``none`` for coding boxes). Nothing from the host: no Docker socket, no host
environment - only ``env`` as given - and no mount but a setup box's wheelhouse
(``spec.wheels``), read-only at ``/wheels``.

Memory and disk. A tmpfs page is charged to the memory cgroup of whoever wrote it
and, with no swap, can never be reclaimed: with the memory limit equal to
``spec.memory``, filling the 1 GB workspace of a 1 GB box OOM-kills the writer (and
every command after it) instead of failing with ENOSPC, and the reason reported is
memory when the real one is disk. So the container's limit is ``spec.memory`` plus
the size of every tmpfs (``/tmp``, ``/workspace`` and ``/dev/shm``, whose size is set
explicitly for that): a full disk is ENOSPC with ``spec.memory`` still free for
programs, and a program that allocates past ``spec.memory`` is OOM-killed and reported
as such (``ExecResult.oom_killed``). The price is that a box whose disks are empty can
hold that much more in programs; the host must have room for the sum, which is what
the box could take anyway. A disk-backed workspace with a quota would keep the two
apart, but the engine offers size limits on volumes only with xfs project quotas,
which a default Debian host (ext4) does not have.

Both tmpfs mounts are ``exec`` (Docker's tmpfs default is ``noexec``): a coding task
runs what it builds - a repo's ``./run-tests.sh``, a compiled test binary, a virtualenv's
``bin/pip`` - and a test suite runs programs it writes under ``/tmp``. ``noexec`` would
not contain anything anyway (``sh FILE``, ``python3 FILE`` and the dynamic loader run any
readable file); the boundary is the non-root user, the dropped capabilities,
no-new-privileges and ``nosuid``/``nodev``, which stay.

Runtime. ``spec.runtime`` picks the engine's default (runc) or one of gVisor's
runtimes; a gVisor box also gets the host limits and the in-box process limits that
keep its promises the same (:mod:`sandbox.docker.gvisor`).
"""

from __future__ import annotations

import secrets

import docker
import docker.errors
import docker.types

from ..errors import SandboxUnavailable, SnapshotGone
from ..prepared.waiting import MOUNT
from ..spec import SHM_BYTES, SandboxSpec, parse_size
from . import attached, gvisor
from .engine import on_engine, remove_box

_STDIO = {"stdin": 1, "stdout": 1, "stderr": 1, "stream": 1}


@on_engine
def create_container(
    client: docker.DockerClient,
    spec: SandboxSpec,
    image: str,
    labels: dict[str, str],
    env: dict[str, str],
    network: str,
    aliases: list[str],
    command: list[str] | None,
    run: str,
    member: str,
    mac_address: str | None = None,
    attach: bool = False,
    tree: str | None = None,
) -> dict:
    """Create and start the box; its details (``inspect``). ``attach``: ``command`` is
    the box agent as PID 1 (:func:`sandbox.inbox.boxagent.init_then_serve`), and the
    host attaches to the container's stdio before it starts, the agent's stream from its
    first byte; the socket waits in :mod:`.attached` for the box's transport. No
    ``docker exec`` is then needed to reach the agent (which costs the engine, containerd
    and runc another round: an eighth of a box's start, ``bench/box_start.py``).
    ``tree``: a host directory the box sees read-only at
    :data:`sandbox.prepared.waiting.MOUNT` (its setup's tree, once made)."""
    api = client.api
    mem = gvisor.host_memory(spec)
    host_config = api.create_host_config(
        network_mode=network,
        cap_drop=["ALL"],
        security_opt=["no-new-privileges"],
        read_only=True,
        tmpfs={
            "/tmp": f"rw,exec,nosuid,nodev,size={parse_size(spec.tmpfs_size)},mode=1777",
            "/workspace": (
                f"rw,exec,nosuid,nodev,size={parse_size(spec.workspace_size)},"
                "uid=1000,gid=1000,mode=0755"
            ),
        },
        pids_limit=gvisor.host_pids(spec),
        mem_limit=mem,
        memswap_limit=mem,
        shm_size=SHM_BYTES,
        nano_cpus=int(spec.cpus * 1e9),
        # The agent as PID 1 reaps (and Docker's init would hold the agent's stdio, open
        # to the box's user through /proc/1/fd); what it writes is the host's alone, so
        # the engine keeps no log of it.
        init=not attach,
        log_config={"type": "none"} if attach else None,
        runtime=gvisor.runtime_name(spec, network),
        mounts=[
            docker.types.Mount(target, source, type="bind", read_only=True)
            for target, source in (("/wheels", spec.wheels), (MOUNT, tree))
            if source
        ]
        or None,
    )
    networking = None
    if aliases:
        endpoint = api.create_endpoint_config(aliases=aliases)
        networking = api.create_networking_config({network: endpoint})
    name = f"fleet-{run}-{member}-{secrets.token_hex(3)}"[:120]
    try:
        created = api.create_container(
            image,
            [*gvisor.command_prefix(spec), *command] if command else command,
            name=name,
            user="1000:1000",
            environment={**env, **gvisor.box_env(spec)},
            labels=labels,
            working_dir=spec.workdir,
            host_config=host_config,
            networking_config=networking,
            hostname=member[:63],
            mac_address=mac_address,
            stdin_open=attach,  # with docker-py's default detach=False: StdinOnce too
        )
    except docker.errors.ImageNotFound:
        if spec.prepared is not None and image == spec.prepared:
            raise SnapshotGone(image) from None
        raise SandboxUnavailable(
            f"image {image!r} is not on this engine; build Fleet's images with "
            f"'fleet images build' (or name an existing image in the spec)"
        ) from None
    except docker.errors.APIError as e:
        missing = gvisor.missing_runtimes(client.info()) if spec.runtime == "gvisor" else []
        if missing:
            raise SandboxUnavailable(gvisor.unregistered_message(missing)) from None
        raise SandboxUnavailable(f"the engine refused to create box {name}: {e}") from None
    try:
        if attach:
            attached.hold(created["Id"], api.attach_socket(created["Id"], params=_STDIO))
        api.start(created["Id"])
    except docker.errors.APIError as e:
        remove_box(client, created["Id"])
        if spec.runtime == "gvisor":  # a failed start can leave runsc's processes running
            gvisor.end_orphans(client, only=created["Id"])
        raise SandboxUnavailable(f"the engine could not start box {name}: {e}") from None
    return api.inspect_container(created["Id"])
