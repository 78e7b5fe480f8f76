"""The ``fleet`` command line.

Each room registers its own sub-commands (``sandbox.cli`` for ``images`` and
``sandbox``; the coordinator's modules for the rest), so this file only wires
them together and turns expected errors into one-paragraph messages with exit
code 2 (bad input), 1 (failure) or 130 (interrupted) - never a traceback.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

# Modules that define ``register(subparsers)``; each adds its commands with
# ``set_defaults(func=...)`` where ``func(args) -> int``.
COMMAND_MODULES = (
    "sandbox.cli",
    "coordinator.commands",
    "coordinator.trace_cli",
)


class UsageError(Exception):
    """Bad input from the user: printed as one paragraph, exit code 2."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="fleet",
        description="Fan agent jobs out to browser and coding subagents, each in its own box.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMAND_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name == name:
                continue
            raise
        module.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    func = getattr(args, "func", None)
    if func is None:
        parser.print_help()
        return 2
    try:
        return int(func(args) or 0)
    except KeyboardInterrupt:
        print("fleet: interrupted", file=sys.stderr)
        return 130
    except UsageError as exc:
        print(f"fleet: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
