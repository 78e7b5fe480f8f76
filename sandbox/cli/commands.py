"""``fleet setup`` and ``fleet images build|ls|prune``; also wires ``fleet sandbox`` and
``fleet doctor`` (:mod:`sandbox.cli.doctor`).

``fleet setup`` makes a machine ready and is what ``make test`` and ``make demo`` run
first: a reachable Docker engine (installed and started when absent and we are
root), as root the host firewall rules of :mod:`sandbox.docker.firewall` (``nftables``
installed when missing), with ``--gvisor`` gVisor's runtimes (:mod:`sandbox.docker.gvisor`:
``runsc`` installed, registered, the engine reloaded), then every image built or
confirmed up to date. When all is done it costs
one ping and one inspect per image, and prints one line.

Exit codes: 0 ready, 1 a build failed, 2 the engine is unavailable or the input is
bad (one paragraph on stderr saying what to do, never a traceback).
"""

from __future__ import annotations

import argparse
import importlib
import sys
import time
from pathlib import Path

from ..cluster.auth import add_insecure_flag
from ..errors import SandboxUnavailable


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``setup`` and ``images`` (and ``sandbox``, when its module exists)."""
    setup = subparsers.add_parser(
        "setup",
        help="make this machine ready: Docker engine and images",
        description="Check (install and start, as root) the Docker engine, then build "
        "every image that is missing or out of date. Fast when everything is done.",
    )
    setup.add_argument(
        "--gvisor",
        action="store_true",
        help='also make gVisor available to boxes (runtime = "gvisor"): install runsc, '
        "register it in /etc/docker/daemon.json and reload the engine (root; no restart)",
    )
    setup.set_defaults(func=cmd_setup)

    images = subparsers.add_parser("images", help="build and list Fleet's images")
    sub = images.add_subparsers(dest="images_command", metavar="ACTION", required=True)
    build = sub.add_parser(
        "build",
        help="build images that are missing or out of date",
        description="Build Fleet's images (and their parents) whose build inputs changed. "
        "An unchanged image is never rebuilt.",
    )
    build.add_argument("names", nargs="*", metavar="NAME", help="images to build (default: all)")
    ca = build.add_mutually_exclusive_group()
    ca.add_argument(
        "--extra-ca",
        type=Path,
        metavar="FILE",
        help="PEM bundle of extra CA certificates (a TLS-intercepting proxy's) to trust in "
        "every image and build; remembered for later builds",
    )
    ca.add_argument(
        "--no-extra-ca", action="store_true", help="forget a remembered extra CA bundle"
    )
    build.add_argument(
        "--force",
        action="store_true",
        help="rebuild the named images (default: all) from scratch, picking up Debian's updates",
    )
    build.set_defaults(func=cmd_images_build)
    ls = sub.add_parser("ls", help="list images: reference, size, up to date or not")
    ls.set_defaults(func=cmd_images_ls)
    push = sub.add_parser(
        "push",
        help="load Fleet's images into every node's engine of a Ray cluster",
        description="Ask each Fleet node of the cluster which of Fleet's images its engine "
        "lacks and stream them there from this host's engine, through Ray (nodes that "
        "share an engine get them once). Build them here first ('fleet images build').",
    )
    push.add_argument("names", nargs="*", metavar="NAME", help="images to push (default: all)")
    push.add_argument(
        "--cluster",
        metavar="ADDRESS",
        required=True,
        help="the Ray cluster's head, HOST:PORT (needs the 'cluster' extra)",
    )
    add_insecure_flag(push)
    push.set_defaults(func=cmd_images_push)
    prune = sub.add_parser("prune", help="remove superseded fleet-* image tags not in use")
    prune.set_defaults(func=cmd_images_prune)

    from . import doctor

    doctor.register(subparsers)

    # ``fleet sandbox ls|gc`` lives in its own module; wire it when it is there.
    try:
        boxes_cli = importlib.import_module("sandbox.cli.boxes")
    except ModuleNotFoundError as exc:
        if exc.name != "sandbox.cli.boxes":
            raise
    else:
        boxes_cli.register(subparsers)


def say(line: str) -> None:
    print(f"fleet: {line}", file=sys.stderr, flush=True)


def fail(exc: BaseException | str, code: int) -> int:
    print(f"fleet: {exc}", file=sys.stderr, flush=True)
    return code


def cmd_setup(args: argparse.Namespace) -> int:
    from ..docker import firewall, gvisor
    from ..docker.engine import ensure_engine
    from ..images.build import ensure_images

    started = time.monotonic()
    try:
        client = ensure_engine(say)
    except SandboxUnavailable as exc:
        return fail(exc, 2)
    try:
        firewall.setup(say)
        if args.gvisor:
            gvisor.ensure_registered(client, say)
    except SandboxUnavailable as exc:
        client.close()
        return fail(exc, 2)
    try:
        refs = ensure_images(None, client=client, say=say)
    except SandboxUnavailable as exc:
        return fail(exc, 1)
    finally:
        client.close()
    with_gvisor = ", gVisor registered" if args.gvisor else ""
    say(
        f"ready: Docker engine up{with_gvisor}, {len(refs)} images current "
        f"({time.monotonic() - started:.1f} s)"
    )
    return 0


def cmd_images_build(args: argparse.Namespace) -> int:
    from ..docker.engine import connect
    from ..images.build import ensure_images
    from ..images.catalog import build_order, save_extra_ca

    try:
        build_order(args.names or None)  # unknown names are bad input: exit 2
        if args.extra_ca is not None or args.no_extra_ca:
            bundle = save_extra_ca(None if args.no_extra_ca else args.extra_ca)
            say(f"extra CA bundle: {_count_certs(bundle)} certificate(s) in force")
        client = connect()
    except SandboxUnavailable as exc:
        return fail(exc, 2)
    started = time.monotonic()
    try:
        refs = ensure_images(args.names or None, client=client, force=args.force, say=say)
    except SandboxUnavailable as exc:
        return fail(exc, 1)
    finally:
        client.close()
    for ref in refs.values():
        print(ref)
    say(f"images current ({time.monotonic() - started:.1f} s)")
    return 0


def cmd_images_push(args: argparse.Namespace) -> int:
    from ..images.catalog import build_order

    try:
        build_order(args.names or None)  # unknown names are bad input: exit 2
        from ..images.push import push
    except SandboxUnavailable as exc:
        return fail(exc, 2)
    except ImportError:
        return fail(
            "--cluster needs Ray, which is not installed; install Fleet's 'cluster' extra: "
            "pip install -e '.[cluster]'",
            2,
        )
    started = time.monotonic()
    try:
        engines = push(
            args.cluster, args.names or None, say, insecure=args.insecure_cluster_without_auth
        )
    except SandboxUnavailable as exc:
        return fail(exc, 2)
    say(f"images pushed to {engines} engine(s) ({time.monotonic() - started:.1f} s)")
    return 0


def _count_certs(bundle: bytes) -> int:
    return bundle.count(b"-----BEGIN CERTIFICATE-----")


def cmd_images_ls(args: argparse.Namespace) -> int:
    from ..docker.engine import connect
    from ..images.catalog import status

    try:
        client = connect()
    except SandboxUnavailable as exc:
        return fail(exc, 2)
    try:
        rows = status(client)
    finally:
        client.close()
    print(f"{'NAME':<10} {'REFERENCE':<28} {'STATE':<10} {'SIZE':>9}  SUPERSEDED")
    for row in rows:
        state = "current" if row.built else ("stale" if row.stale_tags else "missing")
        size = f"{row.size / 2**20:.0f} MiB" if row.size is not None else "-"
        print(f"{row.name:<10} {row.ref:<28} {state:<10} {size:>9}  {len(row.stale_tags)}")
    missing = [r.name for r in rows if not r.built]
    if missing:
        say(f"not built or out of date: {', '.join(missing)}; run 'fleet images build'")
    return 0


def cmd_images_prune(args: argparse.Namespace) -> int:
    from ..docker.engine import connect
    from ..images.catalog import prune_superseded

    try:
        client = connect()
    except SandboxUnavailable as exc:
        return fail(exc, 2)
    try:
        removed, kept = prune_superseded(client)
    finally:
        client.close()
    for ref in removed:
        print(f"removed {ref}")
    for ref in kept:
        say(f"kept {ref}: a container still uses it")
    return 0
