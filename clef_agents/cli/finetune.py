"""``clef-agents finetune``: adapt the engine to labelled decisions (LoRA + trained head)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from clef_agents.cli import UsageError
from clef_agents.cli.common import (
    add_deprecated_alias,
    add_threads_arg,
    apply_threads,
    load_structured,
    number,
)

if TYPE_CHECKING:
    from clef_engine.train.config import TrainConfig, TrainResult
    from clef_engine.train.data import TrainingSet

MAX_RANK = 256
"""``clef_engine.train.config.MAX_RANK``, repeated here: importing it loads torch, and every
``clef-agents`` command builds this parser."""

_POSITIVE = number(float, low=0, low_open=True)
_NON_NEGATIVE = number(float, low=0)
_FRACTION = number(float, low=0, high=1, high_open=True)  # [0, 1)
_COUNT = number(int, low=1)
_NON_NEGATIVE_COUNT = number(int, low=0)

EPILOG = """data:
  CSV or JSONL; either text,label (one question, a choice over the labels), or
  state,question,label with --questions FILE ({id: question} in the wire format).

recipes (measured on BANKING77, docs/finetune.md):
  full      (default) LoRA + option-evidence head, 4 epochs: 94.15 macro-F1 on the full set
  few-shot  about 10 examples per label: contrastive stage + prototype head, all examples
            train it (87.58 % at 10 per label; the option-evidence head: 83.50 %)
  ensemble  two full runs at --lr 1e-3 in one model dir: 94.26, at twice the cost

examples:
  clef-agents finetune train.csv --label-col category --out out/banking77
  clef-agents finetune train.csv --label-col category --examples-per-label 10 \\
      --recipe few-shot --out out/banking77-10shot
  clef-agents finetune train.csv --label-col category --examples-per-label 10 \\
      --recipe few-shot --unlabeled train.csv \\
      --out out/banking77-10shot-semi                          # the rest as unlabelled
  clef-agents finetune train.csv --label-col category --recipe ensemble \\
      --out out/banking77-ensemble                             # two runs, one model dir
  clef-agents finetune tickets.jsonl --questions questions.json --out out/tickets
  clef-agents finetune --from-log decisions.sqlite --out out/next   # rows labelled in review
  clef-agents eval test.csv --label-col category --model out/banking77
"""


def register(sub: Any) -> None:
    p = sub.add_parser(
        "finetune",
        help="fine-tune on labelled decisions (LoRA + option-evidence head)",
        description="Fine-tune the engine on labelled decisions and write a model dir.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("data", nargs="?", help="training data (CSV or JSONL), or --from-log")
    p.add_argument(
        "--from-log",
        metavar="LOG",
        help="train on the labelled rows of a decision log (see clef-agents review); "
        "they are written to OUT/from_log/ in the state,question,label layout",
    )
    p.add_argument("--out", required=True, metavar="DIR", help="model dir to write")
    p.add_argument("--questions", metavar="FILE", help="JSON/YAML {id: question}")
    p.add_argument(
        "--text-col", default=None, metavar="COL", help="state column (default: text/state/...)"
    )
    p.add_argument(
        "--label-col",
        default=None,
        metavar="COL",
        help="label column (default: label/category/...)",
    )
    p.add_argument("--instructions", default=None, help="instructions of the inferred choice")
    p.add_argument(
        "--examples-per-label",
        type=_COUNT,
        default=None,
        metavar="K",
        help="train on at most K examples per label (few-shot)",
    )
    p.add_argument(
        "--backbone",
        default=None,
        metavar="DIR",
        help="local HF encoder dir, or packaged:general to start from the general decision "
        "model (default: the embedded all-MiniLM-L6-v2)",
    )
    _add_training_args(p)
    p.add_argument("--seed", type=_NON_NEGATIVE_COUNT, default=None)
    p.add_argument("--device", default=None, help="auto (default), cpu, cuda, mps")
    p.add_argument("--resume", action="store_true", help="continue from OUT/checkpoint")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    add_deprecated_alias(p, "--quiet", "--no-progress")
    add_threads_arg(p)
    p.set_defaults(func=run)


def _add_training_args(p: argparse.ArgumentParser) -> None:
    """The recipe and the flags that override it."""
    p.add_argument(
        "--recipe",
        choices=["full", "few-shot", "ensemble"],
        default="full",
        help="a measured recipe (see below; default full); other flags override its values",
    )
    p.add_argument("--epochs", type=_COUNT, default=None)
    p.add_argument("--batch-size", type=_COUNT, default=None)
    p.add_argument("--lr", type=_POSITIVE, default=None, help="LoRA learning rate")
    p.add_argument(
        "--lora-rank",
        type=number(int, low=0, high=MAX_RANK),
        default=None,
        help="0 freezes the backbone",
    )
    p.add_argument("--target-modules", default=None, help="comma-separated layer names")
    p.add_argument(
        "--unlabeled",
        metavar="FILE",
        default=None,
        help="CSV/JSONL of states without labels (any label column is ignored; labelled "
        "states are dropped): pseudo-labelled for the prototype head (--recipe few-shot)",
    )
    p.add_argument(
        "--unlabeled-text-col",
        default=None,
        metavar="COL",
        help="state column of --unlabeled (default: --text-col, else text/state/...)",
    )
    p.add_argument(
        "--pseudo-per-label",
        type=_COUNT,
        default=None,
        metavar="N",
        help="with --unlabeled: at most N pseudo-labelled states per option (default: all)",
    )
    p.add_argument("--val-fraction", type=_FRACTION, default=None)
    p.add_argument("--patience", type=_COUNT, default=None)
    p.add_argument(
        "--rl-epochs", type=_NON_NEGATIVE_COUNT, default=None, help="RL stage epochs (default 0)"
    )
    p.add_argument("--rl-kl", type=_NON_NEGATIVE, default=None)
    p.add_argument(
        "--similarity",
        metavar="FILE",
        default=None,
        help="JSON {question: [[...]]} option similarities for RL partial credit",
    )
    p.add_argument(
        "--no-memory",
        action="store_true",
        help="keep no example memory (by default the training states' vectors vote with the "
        "head where that lowers the validation NLL; with --recipe few-shot, the NLL of the "
        "head's own 5 folds)",
    )
    p.add_argument(
        "--memory-max-states",
        type=_COUNT,
        default=None,
        metavar="N",
        help="example memory: at most N training states per question (default 100000)",
    )
    p.add_argument(
        "--histogram",
        action="store_true",
        help="also fit histogram binning (kept where a 5-fold check lowers ECE)",
    )
    p.add_argument(
        "--ensemble",
        type=_COUNT,
        default=None,
        metavar="K",
        help="train K runs (seeds SEED..SEED+K-1, each on its own seed's validation split) "
        "into OUT/members/ and answer with the mean of their calibrated answers; K times the "
        "training and the backbone passes per decision (default 1; --recipe ensemble: 2)",
    )


def check_out_dir(path: str) -> None:
    """Refuse an ``--out`` that cannot become a model dir, before any training."""
    out = Path(path)
    if out.exists() and not out.is_dir():
        raise UsageError(f"--out {path}: is a file; name a directory for the model dir")
    for parent in out.parents:
        if parent.exists():
            if not parent.is_dir():
                raise UsageError(f"--out {path}: {parent} is a file, not a directory")
            break


_FIELDS = (
    "epochs",
    "batch_size",
    "lr",
    "lora_rank",
    "val_fraction",
    "patience",
    "rl_epochs",
    "rl_kl",
    "pseudo_per_label",
    "memory_max_states",
    "ensemble",
    "seed",
    "device",
)
"""Flags passed to :meth:`TrainConfig.preset` under the same name when given."""


def run(args: argparse.Namespace) -> int:
    from clef_engine.errors import require

    check_out_dir(args.out)
    require("peft", package="peft", extra="train", feature="clef-agents finetune")
    from clef_engine.train import Trainer, load_unlabeled

    data = _load_data(args)
    config = _train_config(args)
    if args.pseudo_per_label is not None and args.unlabeled is None:
        raise UsageError("--pseudo-per-label caps the pseudo-labels of --unlabeled; give both")
    if args.unlabeled_text_col is not None and args.unlabeled is None:
        raise UsageError("--unlabeled-text-col names a column of --unlabeled; give both")
    apply_threads(args)
    unlabeled = None
    if args.unlabeled:
        column = args.unlabeled_text_col or args.text_col
        unlabeled = load_unlabeled(args.unlabeled, text_col=column)
    result = Trainer(config, backbone=args.backbone).fit(
        data, args.out, resume=args.resume, unlabeled=unlabeled
    )
    sys.stdout.write(json.dumps(_summary(result, len(data)), indent=2) + "\n")
    return 0


def _load_data(args: argparse.Namespace) -> TrainingSet:
    """The labelled training data: from DATA (with ``--questions``) or from ``--from-log``
    (written to OUT/from_log first), cut to ``--examples-per-label`` when given."""
    from clef_engine.train import load_training_data, sample_per_label

    if (args.data is None) == (args.from_log is None):
        raise UsageError("give the training data or --from-log LOG (one of them)")
    if args.from_log:
        from clef_agents.decision_log.review import write_training_data

        if args.questions:
            raise UsageError("--from-log takes the questions from the log; drop --questions")
        data_file, questions_file, _ = write_training_data(
            args.from_log, Path(args.out) / "from_log"
        )
        args.data, args.questions = str(data_file), str(questions_file)
    questions = load_structured(args.questions) if args.questions else None
    if questions is not None and not isinstance(questions, dict):
        raise UsageError(f"{args.questions}: expected a mapping {{id: question}}")
    data = load_training_data(
        args.data,
        questions=questions,
        text_col=args.text_col,
        label_col=args.label_col,
        instructions=args.instructions,
    )
    if args.examples_per_label is not None:
        data = sample_per_label(data, args.examples_per_label, seed=args.seed or 0)
    return data


def _train_config(args: argparse.Namespace) -> TrainConfig:
    """The ``--recipe`` preset with the flags given on the command line; a value the config
    refuses becomes a usage error."""
    from clef_engine.train import TrainConfig

    kwargs: dict[str, Any] = {
        field: getattr(args, field) for field in _FIELDS if getattr(args, field) is not None
    }
    if args.target_modules:
        kwargs["target_modules"] = [t.strip() for t in args.target_modules.split(",") if t.strip()]
    if args.similarity:
        kwargs["similarity"] = load_structured(args.similarity)
    if kwargs.get("lora_rank") == 0:  # no adapters: no contrastive stage (it trains only them)
        kwargs["contrastive_steps"] = 0
    kwargs.update(
        memory=not args.no_memory,
        histogram=args.histogram,
        progress=not args.no_progress,
    )
    try:
        config = TrainConfig.preset(args.recipe, **kwargs)
        config.check()
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    return config


def _summary(result: TrainResult, states: int) -> dict[str, Any]:
    """What ``finetune`` prints: the model dir, validation metrics and timings."""
    # After the labelled states were dropped from the unlabelled ones.
    semi = next((h for h in result.history if "pseudo_labels" in h), None)
    return {
        "model_dir": str(result.directory),
        "states": states,
        "best_epoch": result.best_epoch,
        **({k: int(semi[k]) for k in ("unlabeled_states", "pseudo_labels")} if semi else {}),
        "validation": {k: round(v, 4) for k, v in result.validation.items()},
        **({"memory": result.memory} if result.memory else {}),
        **(
            {
                "members": [
                    {"best_epoch": m.best_epoch, "seconds": round(m.seconds, 1)}
                    for m in result.members
                ]
            }
            if result.members
            else {}
        ),
        "seconds": round(result.seconds, 1),
    }
