"""The ``fleet`` command line: the CLI room of the coordinator.

``commands`` (run, research, code, resume, runs), ``trace`` (trace, view) and
``approve`` hold the sub-commands; the orchestration they call lives beside this
package in ``coordinator/``, and reading traces in ``coordinator/traceview/``.

Each room registers its own sub-commands (``sandbox.cli.commands`` for ``images`` and
``sandbox``; the coordinator's modules for the rest), so this file only wires
them together and turns expected errors into one-paragraph messages with exit
code 2 (bad input), 1 (failure), 130 (interrupted) or 141 (the reader of its output
went away, as in ``fleet runs | head``) - never a traceback.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence

from ..errors import CommandFailed, UsageError
from . import early

EXIT_BROKEN_PIPE = 128 + 13
"""A reader that closed the pipe: what a process killed by SIGPIPE (git, cat) exits with."""

# Modules that define ``register(subparsers)``; each adds its commands with
# ``set_defaults(func=...)`` where ``func(args) -> int``.
COMMAND_MODULES = (
    "sandbox.cli.commands",
    "coordinator.cli.commands",
    "coordinator.cli.trace",
    "coordinator.cli.approve",
    "coordinator.cli.check",
)
# Which module defines each top-level command. Only that module is imported for
# a known command; `--help` imports them all. None of them imports the model client
# (about a second) at the top: the run commands load it once their job is read.
COMMAND_HOMES = {
    "setup": "sandbox.cli.commands",
    "doctor": "sandbox.cli.commands",
    "images": "sandbox.cli.commands",
    "sandbox": "sandbox.cli.commands",
    "run": "coordinator.cli.commands",
    "research": "coordinator.cli.commands",
    "code": "coordinator.cli.commands",
    "resume": "coordinator.cli.commands",
    "runs": "coordinator.cli.commands",
    "apply": "coordinator.cli.commands",
    "check": "coordinator.cli.check",
    "trace": "coordinator.cli.trace",
    "view": "coordinator.cli.trace",
    "approve": "coordinator.cli.approve",
}


RUN_COMMANDS = ("run", "code", "research")
"""The commands whose start is timed to their first model call: the collector stays
paused through their preflight (:mod:`coordinator.cli.commands` resumes it)."""


def add_runs_dir(p: argparse.ArgumentParser) -> None:
    """``--output-dir`` for a command that finds runs (resume, runs, trace, view): one
    rule for all of them, :mod:`coordinator.rundir.run_lookup`."""
    p.add_argument(
        "--output-dir",
        default=None,
        metavar="DIR",
        help="where the runs are (default: $FLEET_RUNS_DIR, else runs)",
    )


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser; with ``command``, only the module that defines it is loaded."""
    parser = argparse.ArgumentParser(
        prog="fleet",
        description="Fan agent jobs out to browser and coding subagents, each in its own box.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    home = COMMAND_HOMES.get(command or "")
    for name in (home,) if home else COMMAND_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name == name:
                continue
            raise
        module.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    # The interrupt guard covers building the parser too: a command's module may
    # still be importing (the model client takes about a second) when Ctrl-C comes.
    try:
        code = _dispatch(list(sys.argv[1:] if argv is None else argv))
        sys.stdout.flush()  # here, where a closed pipe can still be caught
        return code
    except KeyboardInterrupt:
        print("fleet: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # The reader went away (`fleet runs --json | head`): stop quietly, as git does.
        # Python would print a traceback, then complain again when stdout is flushed
        # at exit; pointing stdout at /dev/null leaves nothing to flush.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_BROKEN_PIPE


def _dispatch(argv: list[str]) -> int:
    # Before the rest of Fleet loads: the first wave's boxes of `fleet run JOB`, then
    # the SDK's import when the job calls the Messages API, each on its thread
    # (coordinator/cli/early.py); whatever no run takes is removed. The boxes first:
    # the engine starts them on another core, while the import and Fleet's own take
    # turns on this one (the GIL), so that order has them ready soonest.
    early.pause_gc()  # until the command has loaded (a run: until its preflight is done)
    prewarm = early.prewarm(argv)
    early.sdk_for_job(argv)
    try:
        parser = build_parser(argv[0] if argv else None)
        args = parser.parse_args(argv)
        args.prewarm = prewarm
        early.sdk_for_command(args)  # `fleet code` / `fleet research`: --model is known now
        early.cluster_probe(args)  # its process runs beside Fleet's start
        if args.command not in RUN_COMMANDS:
            early.resume_gc()
        func = getattr(args, "func", None)
        if func is None:
            parser.print_help()
            return 2
        try:
            return int(func(args) or 0)
        except UsageError as exc:
            print(f"fleet: {exc}", file=sys.stderr)
            return 2
        except CommandFailed as exc:
            print(f"fleet: {exc}", file=sys.stderr)
            return 1
    finally:
        early.resume_gc()
        if prewarm is not None:
            prewarm.close()


if __name__ == "__main__":
    sys.exit(main())
