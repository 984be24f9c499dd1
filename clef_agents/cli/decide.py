"""``clef-agents decide``: answer questions about one state."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping
from typing import Any

from clef_agents.cli import UsageError
from clef_agents.cli.common import (
    add_engine_args,
    build_engine,
    load_structured,
    parse_json,
    read_stdin,
    read_text,
)

EPILOG = """examples:
  clef-agents decide "my card never arrived" --choice intent=card_arrival,lost_card,refund
  clef-agents decide "charged twice, refund one payment" \\
      --choice "team=billing:payments, refunds and invoices,technical:app errors and crashes"
  clef-agents decide "charged twice, refund one payment" \\
      --choice 'team={"billing": "payments, refunds, invoices", "technical": "errors: app broken"}'
  echo '{"user": "bob", "msg": "app crashes"}' | clef-agents decide - --noul bug="Is this a bug?"
  clef-agents decide --state-file ticket.txt --questions questions.yaml --json
"""


def register(sub: Any) -> None:
    p = sub.add_parser(
        "decide",
        help="answer questions about a state",
        description="Answer typed questions about one state.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("state", nargs="?", help="the state text; '-' reads stdin")
    p.add_argument("--state-file", metavar="FILE", help="read the state from FILE")
    p.add_argument(
        "--questions",
        metavar="FILE",
        help="JSON/YAML: {id: question} in the wire format, or a whole request",
    )
    p.add_argument(
        "--choice",
        action="append",
        default=[],
        metavar="ID=OPTIONS",
        help="a choice question (repeatable). OPTIONS: names (OPT1,OPT2); names with "
        "descriptions (OPT1:DESCRIPTION,OPT2:DESCRIPTION; a comma followed by text without a "
        "colon continues the description); or a JSON object {OPT: DESCRIPTION} for any text",
    )
    p.add_argument(
        "--noul",
        action="append",
        default=[],
        metavar='ID="INSTRUCTIONS"',
        help="a yes/no question (repeatable)",
    )
    p.add_argument(
        "--score",
        action="append",
        default=[],
        metavar="ID=LEVELS",
        help="a score question on ordered levels (repeatable): LEVEL0,LEVEL1,... or a JSON "
        "array of level descriptions",
    )
    p.add_argument("--json", action="store_true", help="print the exact wire JSON")
    add_engine_args(p)
    p.set_defaults(func=run)


def _split(spec: str, flag: str) -> tuple[str, str]:
    qid, sep, rest = spec.partition("=")
    if not sep or not qid.strip():
        raise UsageError(f"{flag} {spec!r}: expected ID=VALUE")
    return qid.strip(), rest


def parse_options(text: str, where: str) -> dict[str, Any]:
    """The options of a ``--choice``: ``{name: description or None}``.

    ``a,b,c`` are names; ``a:desc,b:desc`` gives descriptions, where a comma followed by
    text without a colon continues the previous description (``billing:payments, refunds,
    technical:errors`` has two options); ``{"a": "desc", ...}`` (JSON) allows any text.

    Example:
        >>> parse_options("billing:payments, refunds,technical:app errors", "--choice")
        {'billing': 'payments, refunds', 'technical': 'app errors'}
    """
    stripped = text.strip()
    if stripped.startswith("{"):
        parsed = parse_json(stripped, where)
        if not isinstance(parsed, Mapping):  # pragma: no cover - "{" parses to an object
            raise UsageError(f"{where}: expected a JSON object {{option: description}}")
        return {str(k).strip(): v for k, v in parsed.items()}
    if stripped.startswith("["):
        return dict.fromkeys(str(o).strip() for o in _json_list(stripped, where))
    options: dict[str, Any] = {}
    last: str | None = None
    for piece in stripped.split(","):
        name, colon, description = piece.partition(":")
        if colon and name.strip():
            last = name.strip()
            options[last] = description.strip() or None
        elif last is not None and options[last] is not None:
            options[last] += "," + piece  # a comma inside the description
        elif piece.strip():
            options[piece.strip()] = None
    return options


def _json_list(text: str, where: str) -> list[Any]:
    parsed = parse_json(text, where)
    if not isinstance(parsed, list):  # pragma: no cover - "[" parses to an array
        raise UsageError(f"{where}: expected a JSON array")
    return parsed


def _parse_state(text: str) -> Any:
    stripped = text.strip()
    if stripped[:1] in "{[":
        parsed = parse_json(stripped, "state", or_text=True)
        return text if parsed is stripped else parsed
    return text


def collect_questions(args: argparse.Namespace) -> dict[str, Any]:
    questions: dict[str, Any] = {}
    if args.questions:
        loaded = load_structured(args.questions)
        if isinstance(loaded, Mapping) and "questions" in loaded:
            loaded = loaded["questions"]
        if not isinstance(loaded, Mapping):
            raise UsageError(f"{args.questions}: expected a mapping of question id to question")
        questions.update(loaded)
    for spec in args.choice:
        qid, rest = _split(spec, "--choice")
        questions[qid] = {
            "type": "choice",
            "instructions": qid.replace("_", " "),
            "criteria": parse_options(rest, f"--choice {qid}"),
        }
    for spec in args.noul:
        qid, rest = _split(spec, "--noul")
        questions[qid] = {"type": "noul", "instructions": rest or qid.replace("_", " ")}
    for spec in args.score:
        qid, rest = _split(spec, "--score")
        if rest.strip().startswith("["):
            levels = _json_list(rest.strip(), f"--score {qid}")
        else:
            levels = [o.strip() for o in rest.split(",") if o.strip()]
        questions[qid] = {
            "type": "score",
            "instructions": qid.replace("_", " "),
            "criteria": levels,
        }
    if not questions:
        raise UsageError("no questions: give --questions FILE, --choice, --noul or --score")
    return questions


def read_state(args: argparse.Namespace) -> Any:
    if args.questions == "-" and (args.state == "-" or args.state_file == "-"):
        raise UsageError("stdin can hold the state or --questions, not both")
    if args.state_file and args.state:
        raise UsageError("give the state as an argument or with --state-file, not both")
    if args.state_file:
        text = read_text(args.state_file)
    elif args.state == "-" or (args.state is None and not sys.stdin.isatty()):
        text = read_stdin()
    elif args.state is not None:
        text = args.state
    else:
        raise UsageError("no state: pass it as an argument, with --state-file, or on stdin")
    if not text.strip():
        raise UsageError("state is empty")
    return _parse_state(text)


def format_table(result: Any) -> str:
    lines = []
    for qid, answer in result.answers.items():
        data = answer.model_dump()
        # A fine-tuned model answers a question its head was not trained on zero-shot.
        tag = "  [zero-shot: not a trained question]" if data.get("x_head") == "zero_shot" else ""
        if "choice" in data:
            lines.append(f"{qid}: {data['choice']}  (confidence {data['confidence']:.2f}){tag}")
            ranked = sorted(data["probabilities"].items(), key=lambda kv: -kv[1])
            for name, p in ranked[:5]:
                lines.append(f"    {p:6.1%}  {name}")
            if len(ranked) > 5:
                lines.append(f"    ... {len(ranked) - 5} more")
        elif "noul" in data:
            lines.append(f"{qid}: P(yes) = {data['noul']:.3f}{tag}")
        elif "score" in data:
            lines.append(
                f"{qid}: score {data['score']:.2f}  (confidence {data['confidence']:.2f}){tag}"
            )
            for level, p in data["probabilities"].items():
                lines.append(f"    {p:6.1%}  {level}: {data['legend'].get(level, '')}")
    lines.append(
        f"model {result.x_model_version}, {result.x_latency_ms:.1f} ms, "
        f"{result.usage.input_tokens} tokens, {result.x_windows} window(s)"
    )
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    from clef_engine.schema.request import questions_from

    questions = questions_from(collect_questions(args))  # validate before loading a model
    state = read_state(args)
    engine = build_engine(args)
    result = engine.decide(state, questions)
    if args.json:
        sys.stdout.write(json.dumps(result.to_wire(), ensure_ascii=False) + "\n")
    else:
        sys.stdout.write(format_table(result) + "\n")
    return 0
