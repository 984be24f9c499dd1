"""The ``clef-agents`` command line: a thin adapter over the engine.

Each subcommand lives in its own module with ``register(subparsers)``; the module sets
``func`` on its parser. Every user error becomes one line on stderr and exit code 2,
never a traceback.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from engine import __version__
from engine.errors import ClefError

COMMANDS = [
    "clef_agents.cli.decide",
    "clef_agents.cli.eval",
    "clef_agents.cli.serve",
    "clef_agents.cli.batch",
    "clef_agents.cli.finetune",
    "clef_agents.cli.calibrate",
]
"""Modules that register a subcommand, in help order."""

EXIT_USAGE = 2


class UsageError(Exception):
    """A problem with the command line or its input files (exit code 2)."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(EXIT_USAGE, f"clef-agents: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="clef-agents", description="Calibrated decisions, locally.")
    parser.add_argument("--version", action="version", version=f"clef-agents {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for name in COMMANDS:
        importlib.import_module(name).register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help, --version and usage errors
        return int(exc.code or 0) if not isinstance(exc.code, str) else EXIT_USAGE
    if not getattr(args, "func", None):
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    try:
        return int(args.func(args) or 0)
    except (UsageError, ClefError) as exc:
        sys.stderr.write(f"clef-agents: error: {exc}\n")
        return EXIT_USAGE
    except KeyboardInterrupt:
        sys.stderr.write("clef-agents: interrupted\n")
        return 130


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
