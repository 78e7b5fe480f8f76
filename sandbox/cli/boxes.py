"""``fleet sandbox ls`` and ``fleet sandbox gc``: see and clean up Fleet's boxes.

``ls`` shows every Fleet container on the engine (boxes and egress proxies) with its
run, member, kind, state, age, TTL and whether its run is still live. ``gc`` removes
boxes whose run is over (its live marker is gone or names a dead process), boxes
whose TTL has passed, run networks left behind, and gVisor processes left on the
host with no box behind them. ``--all`` also removes kept
boxes, but never those of a live run (another process may be using them; gc says how
many it spared) unless ``--include-live`` is given too; ``--dry-run`` only says what
would go. ``rm NAME...`` removes the named boxes (a box a member kept for debugging)
and whatever of their run is left only for them (its egress proxy and networks).
``prepared [ls | rm KEY... | gc]`` lists and removes the prepared snapshots repository
setups left on the engine (:mod:`sandbox.docker.prepared`); ``gc`` also removes those
unused for two weeks, then the least recently used past 20 GB.
``gc --cluster ADDRESS`` runs the same gc on every Docker engine of a Ray cluster's
Fleet nodes, once per engine, for boxes a killed coordinator or a dead node left on
other hosts: a cluster box lives as long as its node's actor for the run, which any
process of the cluster can ask Ray about (:func:`sandbox.cluster.nodes.live_owners`); like every command
that connects to a cluster, it refuses one that lets in a process without its token
unless given ``--insecure-cluster-without-auth``.

Exit codes: 0 done, 2 the engine is unavailable (one paragraph saying what to do),
1 another sandbox error.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time

from ..base import BoxInfo
from ..cluster.auth import add_insecure_flag
from ..docker import prepared as prepared_store
from ..docker import reaper
from ..errors import SandboxError, SandboxUnavailable
from ..prepared.spec import PreparedInfo


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("sandbox", help="list and clean up Fleet's sandboxes")
    sub = parser.add_subparsers(dest="sandbox_cmd", required=True)
    ls = sub.add_parser("ls", help="list Fleet's boxes on this engine")
    ls.add_argument("--run", help="only this run's boxes")
    ls.add_argument("--json", action="store_true", help="one JSON object per line")
    ls.set_defaults(func=cmd_ls)
    gc = sub.add_parser("gc", help="remove boxes whose run is over or whose TTL passed")
    gc.add_argument(
        "--all", action="store_true", help="also remove kept boxes (live runs' boxes stay)"
    )
    gc.add_argument(
        "--include-live",
        action="store_true",
        help="with --all: also remove boxes of runs that are still live (stops them)",
    )
    gc.add_argument("--dry-run", action="store_true", help="only list what would be removed")
    gc.add_argument(
        "--cluster",
        metavar="ADDRESS",
        help="gc on every Docker engine of the Ray cluster's Fleet nodes at ADDRESS, once "
        "per engine; a node's box lives while its actor for the run does (needs the "
        "'cluster' extra)",
    )
    add_insecure_flag(gc)
    gc.set_defaults(func=cmd_gc)
    rm = sub.add_parser("rm", help="remove the named boxes (a box kept for debugging, say)")
    rm.add_argument("names", nargs="+", metavar="NAME", help="a box's name, as 'ls' shows it")
    rm.set_defaults(func=cmd_rm)
    prepared = sub.add_parser(
        "prepared", help="list, remove or gc prepared snapshots (a repository's setup, cached)"
    )
    psub = prepared.add_subparsers(dest="prepared_cmd")
    prepared.set_defaults(func=cmd_prepared_ls, json=False)
    pls = psub.add_parser("ls", help="list snapshots: key, size, age, last use, setup")
    pls.add_argument("--json", action="store_true", help="one JSON object per line")
    pls.set_defaults(func=cmd_prepared_ls)
    prm = psub.add_parser("rm", help="remove snapshots by key (or the start of one)")
    prm.add_argument("keys", nargs="*", metavar="KEY", help="a key as 'ls' shows it")
    prm.add_argument("--all", action="store_true", help="remove every snapshot")
    prm.set_defaults(func=cmd_prepared_rm)
    pgc = psub.add_parser("gc", help="remove snapshots unused past a TTL, then past a disk cap")
    pgc.add_argument("--ttl-days", type=float, default=prepared_store.TTL_S / 86400, metavar="D")
    pgc.add_argument(
        "--max-size",
        default=f"{prepared_store.MAX_TOTAL_BYTES // 1024**3}g",
        metavar="SIZE",
        help="most bytes of snapshots kept, least recently used removed first (e.g. 20g)",
    )
    pgc.add_argument("--dry-run", action="store_true", help="only list what would be removed")
    pgc.set_defaults(func=cmd_prepared_gc)


def _age(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f}s"
    if seconds < 7200:
        return f"{seconds / 60:.0f}m"
    return f"{seconds / 3600:.1f}h"


def cmd_ls(args: argparse.Namespace) -> int:
    from ..docker.engine import connect

    try:
        client = connect()
        boxes = reaper.list_boxes(client, args.run)
    except SandboxError as e:
        print(f"fleet: {e}", file=sys.stderr)
        return 2 if isinstance(e, SandboxUnavailable) else 1
    live, now = reaper.live_runs(), time.time()
    if args.json:
        for box in boxes:
            print(json.dumps({**box.model_dump(), "run_live": box.owner in live}))
        return 0
    if not boxes:
        print("no Fleet boxes on this engine")
        return 0
    rows = [("NAME", "RUN", "MEMBER", "KIND", "STATE", "AGE", "TTL", "RUN-LIVE")]
    for b in boxes:
        ttl_left = b.created + b.ttl_s - now
        ttl = "keep" if b.keep and ttl_left > 0 else _age(max(ttl_left, 0))
        live_run = "yes" if b.owner in live else "no"
        rows.append(
            (b.name, b.run, b.member, b.kind, b.status, _age(now - b.created), ttl, live_run)
        )
    # Whole names, never cut: two members' boxes of one run differ only at the end.
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    right = {5, 6}  # AGE, TTL
    for row in rows:
        cells = [
            c.rjust(w) if i in right else c.ljust(w)
            for i, (c, w) in enumerate(zip(row, widths, strict=True))
        ]
        print("  ".join(cells).rstrip())
    return 0


def cmd_rm(args: argparse.Namespace) -> int:
    """Remove named boxes - never another run's in progress, never a box not Fleet's."""
    from ..docker.engine import connect

    try:
        client = connect()
        by_name = {b.name: b for b in reaper.list_boxes(client)}
        live = reaper.live_runs()  # after the look, as gc asks (reaper.collect says why)
        unknown = [n for n in args.names if n not in by_name]
        if unknown:
            print(
                f"fleet: no Fleet box named {', '.join(unknown)}; 'fleet sandbox ls' lists them",
                file=sys.stderr,
            )
            return 2
        busy = [n for n in args.names if by_name[n].owner in live]
        if busy:
            print(
                f"fleet: {', '.join(busy)} belong(s) to a run still live; remove once it ends",
                file=sys.stderr,
            )
            return 2
        removed = reaper.remove_boxes(client, [by_name[n] for n in dict.fromkeys(args.names)])
    except SandboxError as e:
        print(f"fleet: {e}", file=sys.stderr)
        return 2 if isinstance(e, SandboxUnavailable) else 1
    for box in removed.boxes:
        print(f"removed {box.name} (run {box.run}, member {box.member})")
    for net in removed.networks:
        print(f"removed network {net}")
    return 0


def gc_here(everything: bool, include_live: bool, dry_run: bool) -> reaper.Collected:
    """gc on this host's engine by this host's liveness rule."""
    from ..docker.engine import connect

    now = time.time()
    client = connect()
    try:
        removed = reaper.collect(
            client,
            lambda _: reaper.live_runs(),
            now=now,
            everything=everything,
            include_live=include_live,
            dry_run=dry_run,
        )
    finally:
        client.close()
    return removed


def _gc_cluster(address: str, *args: bool, insecure: bool = False) -> reaper.Collected:
    """gc on every Docker engine of the cluster's Fleet nodes, once per engine (on one
    node that uses it): a cluster box lives while its node's actor for the run does,
    other boxes by the markers of the host gc runs on. A cluster that lets in a process
    without its token is refused unless ``insecure``."""
    try:
        from ..cluster.nodes import NodeUnreachable, connect, gc_node, on_each_engine
    except ImportError:
        raise SandboxUnavailable(
            "--cluster needs Ray, which is not installed; install Fleet's 'cluster' extra: "
            "pip install -e '.[cluster]'"
        ) from None
    listed: dict[str, BoxInfo] = {}
    boxes: dict[str, BoxInfo] = {}
    networks: dict[str, None] = {}
    out = reaper.Collected()
    connect(address, insecure=insecure)
    for name, done in on_each_engine(address, gc_node, *args):
        if isinstance(done, NodeUnreachable):
            print(f"fleet: node {name} did not answer ({done}); its boxes stay", file=sys.stderr)
            continue
        listed.update((x.id, x) for x in done.listed)
        boxes.update((x.id, x) for x in done.boxes)
        networks.update(dict.fromkeys(done.networks))
        out.orphans += done.orphans
        out.live |= done.live
    out.listed, out.boxes, out.networks = (
        list(listed.values()),
        list(boxes.values()),
        list(networks),
    )
    return out


def cmd_gc(args: argparse.Namespace) -> int:
    if args.include_live and not args.all:
        print("fleet: --include-live only makes sense with --all", file=sys.stderr)
        return 2
    flags = (args.all, args.include_live, args.dry_run)
    try:
        if args.cluster:
            removed = _gc_cluster(args.cluster, *flags, insecure=args.insecure_cluster_without_auth)
        else:
            removed = gc_here(*flags)
    except SandboxError as e:
        print(f"fleet: {e}", file=sys.stderr)
        return 2 if isinstance(e, SandboxUnavailable) else 1
    verb = "would remove" if args.dry_run else "removed"
    for box in removed.boxes:
        where = f", node {box.node}" if box.node else ""
        print(f"{verb} {box.name} (run {box.run}, member {box.member}{where})")
    for net in removed.networks:
        print(f"{verb} network {net}")
    if removed.orphans:
        print(f"ended {removed.orphans} gVisor process(es) left with no box behind them")
    print(f"{verb} {len(removed.boxes)} box(es) and {len(removed.networks)} network(s)")
    if not args.cluster:
        try:
            _say_prepared(verb, _gc_prepared(dry_run=args.dry_run))
        except SandboxError as e:
            print(f"fleet: prepared snapshots: {e}", file=sys.stderr)
    taken = {b.id for b in removed.boxes}
    spared = [b for b in removed.listed if b.owner in removed.live and b.id not in taken]
    if args.all and spared:
        runs = sorted({b.run for b in spared})
        print(
            f"kept {len(spared)} box(es) of live run(s) {', '.join(runs)}; add --include-live "
            f"to remove them too (their runs will fail)"
        )
    return 0


def _size(n: int) -> str:
    for unit, size in (("G", 1024**3), ("M", 1024**2), ("K", 1024)):
        if n >= size:
            return f"{n / size:.1f}{unit}"
    return f"{n}B"


def _prepared_list() -> list[PreparedInfo]:
    from ..docker.engine import connect

    client = connect()
    try:
        return prepared_store.list_all(client)
    finally:
        client.close()


def _gc_prepared(
    *,
    ttl_s: float = prepared_store.TTL_S,
    max_bytes: int = prepared_store.MAX_TOTAL_BYTES,
    dry_run: bool = False,
) -> list[PreparedInfo]:
    from ..docker.engine import connect

    client = connect()
    try:
        return prepared_store.gc(client, ttl_s=ttl_s, max_bytes=max_bytes, dry_run=dry_run)
    finally:
        client.close()


def _say_prepared(verb: str, removed: list[PreparedInfo]) -> None:
    for info in removed:
        print(
            f"{verb} prepared snapshot {info.key[:16]} ({_size(info.size)}, setup: {info.setup[:60]})"
        )
    if removed:
        print(f"{verb} {len(removed)} prepared snapshot(s)")


def cmd_prepared_ls(args: argparse.Namespace) -> int:
    try:
        snapshots = _prepared_list()
    except SandboxError as e:
        print(f"fleet: {e}", file=sys.stderr)
        return 2 if isinstance(e, SandboxUnavailable) else 1
    if args.json:
        for info in snapshots:
            print(json.dumps(dataclasses.asdict(info)))
        return 0
    if not snapshots:
        print("no prepared snapshots on this engine")
        return 0
    now = time.time()
    rows = [("KEY", "SIZE", "AGE", "LAST-USE", "SETUP")]
    for info in snapshots:
        rows.append(
            (
                info.key[:16],
                _size(info.size),
                _age(now - info.created),
                _age(now - info.last_used) + " ago",
                info.setup.replace("\n", " ")[:60],
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())
    return 0


def cmd_prepared_rm(args: argparse.Namespace) -> int:
    if not args.keys and not args.all:
        print(
            "fleet: name a snapshot's KEY (see 'fleet sandbox prepared ls') or --all",
            file=sys.stderr,
        )
        return 2
    from ..docker.engine import connect

    try:
        client = connect()
        snapshots = prepared_store.list_all(client)
        chosen = snapshots if args.all else []
        for key in args.keys:
            found = [s for s in snapshots if s.key.startswith(key.lower())]
            if len(found) != 1:
                what = "no snapshot" if not found else f"{len(found)} snapshots"
                print(
                    f"fleet: {what} with key {key!r}; 'fleet sandbox prepared ls' lists them",
                    file=sys.stderr,
                )
                return 2
            chosen += found
        for info in chosen:
            if prepared_store.remove(client, info):
                print(f"removed prepared snapshot {info.key[:16]}")
            else:
                print(
                    f"kept prepared snapshot {info.key[:16]}: a box still uses it", file=sys.stderr
                )
    except SandboxError as e:
        print(f"fleet: {e}", file=sys.stderr)
        return 2 if isinstance(e, SandboxUnavailable) else 1
    return 0


def cmd_prepared_gc(args: argparse.Namespace) -> int:
    from ..spec import parse_size

    if args.ttl_days <= 0:
        print("fleet: --ttl-days must be more than 0", file=sys.stderr)
        return 2
    try:
        max_bytes = parse_size(args.max_size)
    except ValueError:
        print(f"fleet: --max-size {args.max_size!r} is not a size (e.g. 20g)", file=sys.stderr)
        return 2
    try:
        removed = _gc_prepared(
            ttl_s=args.ttl_days * 86400, max_bytes=max_bytes, dry_run=args.dry_run
        )
    except SandboxError as e:
        print(f"fleet: {e}", file=sys.stderr)
        return 2 if isinstance(e, SandboxUnavailable) else 1
    verb = "would remove" if args.dry_run else "removed"
    _say_prepared(verb, removed)
    if not removed:
        print("no prepared snapshot to remove")
    return 0
