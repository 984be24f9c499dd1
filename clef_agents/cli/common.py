"""Helpers shared by CLI subcommands: reading inputs, checking flags, building the engine."""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from clef_agents.cli import UsageError

MAX_THREADS = 1024
"""The most CPU threads ``--threads`` accepts."""


# -- text ---------------------------------------------------------------------------------


def check_text(text: str, where: str) -> str:
    """Return ``text``, or raise :class:`UsageError` if it holds a lone surrogate.

    Python maps bytes that are not UTF-8 in command-line arguments and stdin to lone
    surrogates (``surrogateescape``); no tokenizer can encode them, so they are refused here,
    naming where they came from.
    """
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise UsageError(
            f"{where}: not valid UTF-8 text ({text[exc.start]!r} at character {exc.start})"
        ) from None
    return text


def decode_utf8(data: bytes, where: str) -> str:
    """Decode ``data`` as strict UTF-8, or raise :class:`UsageError` naming the bad byte."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UsageError(
            f"{where}: not valid UTF-8 (byte 0x{data[exc.start]:02x} at offset {exc.start})"
        ) from None


def read_stdin() -> str:
    """All of stdin as strict UTF-8 text (bytes that are not UTF-8 are a usage error)."""
    buffer = getattr(sys.stdin, "buffer", None)
    if buffer is not None:
        return decode_utf8(buffer.read(), "stdin")
    return check_text(sys.stdin.read(), "stdin")


def read_text(path: str) -> str:
    """Read a file (``-`` is stdin) or raise :class:`UsageError` naming it."""
    if path == "-":
        return read_stdin()
    try:
        data = Path(path).read_bytes()
    except FileNotFoundError:
        raise UsageError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise UsageError(f"{path}: is a directory, expected a file") from None
    except OSError as exc:
        raise UsageError(f"{path}: cannot read ({exc})") from None
    return decode_utf8(data, path)


class _BadNumber(ValueError):
    pass


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        shown = text if len(text) <= 20 else text[:20] + "..."
        raise _BadNumber(f"the number {shown} is out of range")
    return value


def _no_constant(name: str) -> float:
    raise _BadNumber(f"{name} is not a JSON number")


def parse_json(text: str, where: str, *, or_text: bool = False) -> Any:
    """Parse JSON text; every way it can fail is a one-line :class:`UsageError`.

    Besides malformed text that covers nesting deeper than Python's recursion limit,
    integers longer than ``sys.get_int_max_str_digits()`` digits, numbers out of the
    float range, and ``NaN``/``Infinity`` (not JSON). With ``or_text``, text that is not
    JSON at all is returned unchanged (a text state that happens to start with a bracket).
    """
    try:
        return json.loads(text, parse_float=_finite_float, parse_constant=_no_constant)
    except json.JSONDecodeError as exc:
        if or_text:
            return text
        raise UsageError(
            f"{where}: malformed JSON at line {exc.lineno} column {exc.colno} ({exc.msg})"
        ) from None
    except RecursionError:
        raise UsageError(f"{where}: JSON nested too deeply") from None
    except _BadNumber as exc:
        raise UsageError(f"{where}: {exc}") from None
    except ValueError:  # int() past the digit limit: the one other ValueError json raises
        limit = sys.get_int_max_str_digits()
        raise UsageError(f"{where}: a number has more than {limit} digits") from None


def load_structured(path: str) -> Any:
    """Parse a JSON or YAML file (by extension; JSON first for anything else)."""
    text = read_text(path)
    if path.endswith((".yaml", ".yml")):
        import yaml

        try:
            return yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise UsageError(f"{path}: malformed YAML ({str(exc).splitlines()[0]})") from None
        except RecursionError:
            raise UsageError(f"{path}: YAML nested too deeply") from None
        except ValueError:  # int() past the digit limit
            limit = sys.get_int_max_str_digits()
            raise UsageError(f"{path}: a number has more than {limit} digits") from None
    return parse_json(text, path)


# -- flags --------------------------------------------------------------------------------


def number(
    kind: type[int] | type[float],
    *,
    low: float | None = None,
    high: float | None = None,
    low_open: bool = False,
    high_open: bool = False,
) -> Callable[[str], Any]:
    """An argparse ``type=`` that parses a finite number inside a range.

    Example:
        >>> parser = argparse.ArgumentParser()
        >>> _ = parser.add_argument("--lr", type=number(float, low=0, low_open=True))
        >>> parser.parse_args(["--lr", "3e-4"]).lr
        0.0003
        >>> number(float, low=0, low_open=True)("0")
        Traceback (most recent call last):
        argparse.ArgumentTypeError: must be > 0; got 0
    """
    lo = "(" if low_open else "["
    hi = ")" if high_open else "]"
    if low is not None and high is not None:
        span = f"in {lo}{low:g}, {high:g}{hi}"
    elif low is not None:
        span = f"{'>' if low_open else '>='} {low:g}"
    else:
        span = f"{'<' if high_open else '<='} {high:g}"
    noun = "an integer" if kind is int else "a number"

    def parse(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {noun} {span}; got {text!r}") from None
        ok = math.isfinite(value)
        if ok and low is not None:
            ok = value > low if low_open else value >= low
        if ok and high is not None:
            ok = value < high if high_open else value <= high
        if not ok:
            raise argparse.ArgumentTypeError(f"must be {span}; got {text}")
        return value

    parse.__name__ = kind.__name__  # argparse names the type in some messages
    return parse


class _DeprecatedAlias(argparse.Action):
    """An old spelling of a flag: hidden from ``--help``, warns once per use, then acts
    exactly as the new flag does (same type, choices and action)."""

    def __init__(
        self, option_strings: list[str], dest: str, target: argparse.Action, **_: Any
    ) -> None:
        super().__init__(
            option_strings,
            dest=target.dest,
            nargs=target.nargs,
            default=argparse.SUPPRESS,  # the new flag's default stands
            type=target.type,  # type: ignore[arg-type]
            choices=target.choices,
            metavar=target.metavar,
            help=argparse.SUPPRESS,
        )
        self.target = target

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        new = self.target.option_strings[0]
        sys.stderr.write(
            f"clef-agents: warning: {option_string} is deprecated and will be removed; use {new}\n"
        )
        self.target(parser, namespace, values, new)


def add_deprecated_alias(parser: argparse.ArgumentParser, old: str, new: str) -> None:
    """Keep ``old`` working as a hidden, deprecated spelling of the existing flag ``new``.

    Example:
        >>> parser = argparse.ArgumentParser()
        >>> _ = parser.add_argument("--text-col", default="text")
        >>> add_deprecated_alias(parser, "--column", "--text-col")
        >>> parser.parse_args(["--column", "question"]).text_col  # warns on stderr
        'question'
    """
    target = next(a for a in parser._actions if new in a.option_strings)
    parser.add_argument(old, action=_DeprecatedAlias, target=target)


def add_threads_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--threads",
        type=number(int, low=1, high=MAX_THREADS),
        default=None,
        metavar="N",
        help="CPU threads for torch (default: torch's own choice, usually one per core)",
    )


def apply_threads(args: argparse.Namespace) -> None:
    """Set torch's CPU thread count from ``--threads`` (when given)."""
    threads = getattr(args, "threads", None)
    if threads is None:
        return
    import torch

    torch.set_num_threads(threads)
    os.environ["OMP_NUM_THREADS"] = str(threads)  # for libraries that start their own pools


def check_writable(path: str, flag: str) -> None:
    """Fail now, before any work, if ``path`` cannot be written (``flag`` names it).

    Opens the file for appending (creating it if needed, then removing what it created), so
    a missing directory, a parent that is a file, a read-only file system or a directory at
    ``path`` is found before minutes of evaluation instead of after.
    """
    p = Path(path)
    if p.is_dir():
        raise UsageError(f"{flag} {path}: is a directory, expected a file path")
    existed = p.exists()
    try:
        with p.open("ab"):
            pass
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        raise UsageError(f"{flag} {path}: cannot write there ({reason})") from None
    if not existed:
        p.unlink(missing_ok=True)


# -- the engine ---------------------------------------------------------------------------


def add_engine_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--model",
        metavar="DIR",
        default=None,
        help="model dir (from save_pretrained/finetune) or a local HF model dir; "
        "default: the embedded general decision model",
    )
    parser.add_argument(
        "--scorer",
        default="general",
        choices=["general", "similarity"],
        help="without --model: general (default), the decision model shipped in the package; "
        "similarity, the bare all-MiniLM-L6-v2 embedding similarity of earlier releases",
    )
    parser.add_argument("--device", default="auto", help="auto (default), cpu, cuda, cuda:1, mps")
    parser.add_argument(
        "--int8",
        action="store_true",
        help="dynamic int8 quantization of the linear layers (CPU only)",
    )
    parser.add_argument(
        "--dtype",
        default="auto",
        choices=["auto", "fp32", "bf16", "fp16"],
        help="auto (default): bf16 on CUDA, fp32 elsewhere; bf16 on a CPU with AVX512-BF16 "
        "or AMX ran 1.55x the fp32 throughput on BANKING77 for a 0.06-point accuracy change",
    )


def build_engine(args: argparse.Namespace) -> Any:
    from clef_engine import DecisionEngine

    kwargs: dict[str, Any] = {"device": args.device}
    if args.int8:
        kwargs["quantize"] = "int8"
    if getattr(args, "dtype", "auto") != "auto":
        kwargs["dtype"] = args.dtype
    if args.model:
        return DecisionEngine.from_pretrained(args.model, **kwargs)
    return DecisionEngine(scorer=getattr(args, "scorer", "general"), **kwargs)
