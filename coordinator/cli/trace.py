"""``fleet trace`` and ``fleet view``: inspect a run's member traces.

``fleet trace RUN`` prints one row per member; ``fleet trace RUN MEMBER`` that member
turn by turn; ``--json`` gives the same views as stable JSON (pydantic models, fields
in declaration order, members sorted by id) for scripts; ``--follow`` tails a run
live; ``--html FILE`` writes the self-contained page; ``--otlp URL`` exports the run
as OpenTelemetry spans. ``fleet view RUN`` serves the page, following the run live,
on 127.0.0.1 only: the page embeds task texts and tool outputs, which must not be
reachable from the LAN. ``fleet view`` with no run serves the list of every run.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from urllib.parse import urlsplit

from coordinator.cli import add_runs_dir
from coordinator.errors import UsageError
from coordinator.oversight.visible import on_terminal
from coordinator.traceview.detail import member_detail
from coordinator.traceview.load import RunNotFound, load_run
from coordinator.traceview.rollup import rollup_run
from coordinator.traceview.text import format_member, format_run


def _usage(message: str) -> Exception:
    return UsageError(message)


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = subparsers.add_parser("trace", help="inspect a run's member traces")
    p.add_argument("run", help="run id (or the start of one) or run directory")
    p.add_argument("member", nargs="?", help="show this member turn by turn")
    p.add_argument("--json", action="store_true", help="print JSON instead of text")
    p.add_argument("--follow", "-f", action="store_true", help="tail the run live until it ends")
    p.add_argument("--html", metavar="FILE", help="write the self-contained HTML page to FILE")
    p.add_argument("--otlp", metavar="URL", help="export the run as OTLP/HTTP spans to URL")
    p.add_argument("--otel-content", action="store_true", help="include message contents in spans")
    p.add_argument("--limit", type=int, default=2_000, help="characters kept per content (2000)")
    p.add_argument("--interval", type=float, default=0.5, help="--follow poll interval in seconds")
    add_runs_dir(p)
    p.set_defaults(func=cmd_trace)

    v = subparsers.add_parser(
        "view", help="serve a run's live trace page (or, with no run, every run) on 127.0.0.1"
    )
    v.add_argument(
        "run", nargs="?", help="run id (or the start of one) or run directory; none: every run"
    )
    v.add_argument("--port", type=int, default=8765, help="port on 127.0.0.1 (8765; 0 = any)")
    add_runs_dir(v)
    v.set_defaults(func=cmd_view)


def _load(args: argparse.Namespace):  # type: ignore[no-untyped-def]
    try:
        return load_run(args.run, args.output_dir)
    except RunNotFound as exc:
        raise _usage(str(exc)) from None


def cmd_trace(args: argparse.Namespace) -> int:
    if args.limit < 20:
        raise _usage(
            f"--limit {args.limit} is too small; keep at least 20 characters, e.g. --limit 2000."
        )
    if args.follow:
        from coordinator.traceview.follow import follow

        run = _load(args)  # a missing run is a usage error before anything is printed
        return follow(run.dir, sys.stdout, member=args.member, interval=args.interval)
    run = _load(args)
    ids = [m.id for m in run.members]
    if args.member is not None and args.member not in ids:
        raise _usage(
            f"run {run.id} has no member '{args.member}'; its members are: {', '.join(ids) or 'none yet'}."
        )
    done = False
    if args.html:
        from coordinator.traceview.html import write_page

        size = write_page(run, Path(args.html), limit=min(args.limit, 1_200))
        print(f"wrote {args.html} ({size / 1e6:.2f} MB)", file=sys.stderr)
        done = True
    if args.otlp:
        if not _export_otlp(run, args.otlp, content=args.otel_content):
            return 1
        done = True
    if done:
        return 0
    return _print_views(run, args)


def _print_views(run, args: argparse.Namespace) -> int:  # type: ignore[no-untyped-def]
    if args.member is None:
        roll = rollup_run(run)
        print(
            json.dumps(roll.model_dump(mode="json"), indent=2)
            if args.json
            else on_terminal(format_run(roll))
        )
        return 0
    index = next(i for i, m in enumerate(run.members) if m.id == args.member)
    row = rollup_run(run).members[index]
    detail = member_detail(run.members[index], limit=args.limit, rollup=row)
    print(
        json.dumps(detail.model_dump(mode="json"), indent=2)
        if args.json
        else on_terminal(format_member(detail))
    )
    return 0


def _export_otlp(run, endpoint: str, *, content: bool) -> bool:  # type: ignore[no-untyped-def]
    """Export the run; False (after one line saying why) when the collector did not take it."""
    parts = urlsplit(endpoint)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise _usage(
            f"--otlp {endpoint} is not an http(s) URL; give the collector's OTLP/HTTP "
            "endpoint, e.g. --otlp http://127.0.0.1:4318."
        )
    try:
        from coordinator.traceview import otel
        from coordinator.traceview.otel_send import ExportFailed
    except ImportError as exc:
        raise _usage(
            f"OpenTelemetry export needs the 'otel' extra ({exc.name} is missing): "
            "pip install 'fleet[otel]'."
        ) from None
    try:
        count = otel.export_run(run, endpoint=endpoint, content=content)
    except ExportFailed as exc:
        print(f"fleet: {exc}", file=sys.stderr)
        return False
    print(f"exported {count} spans to {endpoint}", file=sys.stderr)
    return True


def cmd_view(args: argparse.Namespace) -> int:
    from coordinator.traceview.serve import serve_forever

    if not 0 <= args.port <= 65535:
        raise _usage(f"--port {args.port} is not a TCP port; use 0-65535, e.g. --port 8765.")
    if args.run is None:
        from coordinator.rundir.run_lookup import RUNS_DIR_ENV, runs_root

        root = runs_root(args.output_dir)
        if not root.is_dir():
            raise _usage(
                f"no runs directory at {root}/; start a run first, or name where runs are: "
                f"--output-dir DIR or {RUNS_DIR_ENV}=DIR"
            )
        return serve_forever(root, port=args.port, index=True)
    run = _load(args)
    return serve_forever(run.dir, port=args.port)
