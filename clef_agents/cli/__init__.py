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

from clef_engine import __version__
from clef_engine.errors import ClefError

COMMANDS = [
    "clef_agents.cli.decide",
    "clef_agents.cli.eval",
    "clef_agents.cli.serve",
    "clef_agents.cli.batch",
    "clef_agents.cli.finetune",
    "clef_agents.cli.calibrate",
    "clef_agents.cli.thresholds",
    "clef_agents.cli.review",
    "clef_agents.cli.report",
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


def _check_argv(argv: Sequence[str]) -> None:
    """Refuse an argument that is not valid UTF-8 (a lone surrogate) before parsing.

    POSIX hands Python arguments as bytes; those that are not UTF-8 arrive as lone
    surrogates (``surrogateescape``), which no tokenizer can encode.
    """
    for position, arg in enumerate(argv, 1):
        try:
            arg.encode("utf-8")
        except UnicodeEncodeError as exc:
            shown = arg.encode("utf-8", "backslashreplace").decode("utf-8")
            if len(shown) > 60:
                shown = shown[:57] + "..."
            raise UsageError(
                f"argument {position} ({shown}) is not valid UTF-8 text "
                f"({arg[exc.start]!r} at character {exc.start})"
            ) from None


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        _check_argv(argv)
    except UsageError as exc:
        sys.stderr.write(f"clef-agents: error: {exc}\n")
        return EXIT_USAGE
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
