"""``clef-agents finetune``: adapt the engine to labelled decisions (LoRA + trained head)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from clef_agents.cli import UsageError
from clef_agents.cli.common import (
    add_deprecated_alias,
    add_threads_arg,
    apply_threads,
    load_structured,
    number,
)

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

examples:
  clef-agents finetune train.csv --label-col category --out out/banking77
  clef-agents finetune train.csv --label-col category --examples-per-label 10 \\
      --head prototype --contrastive-steps 30 --val-fraction 0 --out out/banking77-10shot
  clef-agents finetune train.csv --label-col category --examples-per-label 10 \\
      --head prototype --contrastive-steps 30 --val-fraction 0 \\
      --unlabeled train.csv --out out/banking77-10shot-semi   # the rest as unlabelled
  clef-agents finetune train.csv --label-col category --ensemble 2 \\
      --out out/banking77-ensemble                             # two runs, one model dir
  clef-agents finetune tickets.jsonl --questions questions.json --out out/tickets
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
    p.add_argument("data", help="training data (CSV or JSONL)")
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
        help="local HF encoder dir (default: the embedded all-MiniLM-L6-v2)",
    )
    p.add_argument("--epochs", type=_COUNT, default=None)
    p.add_argument("--batch-size", type=_COUNT, default=None)
    p.add_argument("--lr", type=_POSITIVE, default=None, help="LoRA learning rate")
    p.add_argument("--head-lr", type=_POSITIVE, default=None)
    p.add_argument(
        "--lora-rank",
        type=number(int, low=0, high=MAX_RANK),
        default=None,
        help="0 freezes the backbone",
    )
    p.add_argument("--lora-alpha", type=_POSITIVE, default=None)
    p.add_argument("--lora-dropout", type=_FRACTION, default=None)
    p.add_argument("--target-modules", default=None, help="comma-separated layer names")
    p.add_argument("--label-smoothing", type=_FRACTION, default=None)
    p.add_argument("--brier-weight", type=_NON_NEGATIVE, default=None)
    p.add_argument("--ordinal-weight", type=_NON_NEGATIVE, default=None)
    p.add_argument(
        "--head",
        choices=["option_evidence", "prototype"],
        default=None,
        help="option_evidence (default): train the head for --epochs; prototype: fit a "
        "linear head on the (adapted) state vectors, no epochs (few-shot recipe)",
    )
    p.add_argument(
        "--contrastive-steps",
        type=_NON_NEGATIVE_COUNT,
        default=None,
        metavar="N",
        help="contrastive stage on the LoRA adapters before the head (default 0; "
        "30 with --head prototype is the measured few-shot recipe)",
    )
    p.add_argument("--contrastive-per-label", type=number(int, low=2), default=None, metavar="K")
    p.add_argument("--contrastive-temperature", type=_POSITIVE, default=None)
    p.add_argument("--contrastive-lr", type=_POSITIVE, default=None, help="default: --lr")
    p.add_argument(
        "--contrastive-weight",
        type=_NON_NEGATIVE,
        default=None,
        metavar="W",
        help="during the head epochs, + W x a supervised contrastive loss on each batch's "
        "pooled vectors (default 0: off)",
    )
    p.add_argument(
        "--unlabeled",
        metavar="FILE",
        default=None,
        help="CSV/JSONL of states without labels (any label column is ignored; labelled "
        "states are dropped): pseudo-labelled for the prototype head (--head prototype)",
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
    p.add_argument(
        "--rdrop-weight",
        type=_NON_NEGATIVE,
        default=None,
        help="R-Drop: each batch twice, + this weight x symmetric KL (default 0: off)",
    )
    p.add_argument(
        "--ema-decay",
        type=_FRACTION,
        default=None,
        help="keep a moving average of the trained weights (e.g. 0.998; default 0: off)",
    )
    p.add_argument(
        "--dora",
        dest="use_dora",
        action="store_true",
        default=None,
        help="DoRA: LoRA on the direction of each weight plus a trained magnitude",
    )
    p.add_argument(
        "--lora-plus-ratio",
        type=_POSITIVE,
        default=None,
        metavar="R",
        help="LoRA+: the adapters' B matrices learn R times faster than --lr (default 1)",
    )
    p.add_argument(
        "--refit",
        action="store_true",
        default=None,
        help="after choosing the epoch and calibration on the validation split, train again "
        "on all the data for that many epochs (about twice the time)",
    )
    p.add_argument("--no-head", action="store_true", help="cosine scoring only (ablation)")
    p.add_argument(
        "--bank-init",
        choices=["text", "examples"],
        default=None,
        help="start option vectors from the option text (default) or from its states' mean",
    )
    p.add_argument(
        "--no-group-by-length",
        action="store_true",
        help="random batches instead of batches of similar length (slower: more padding)",
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
        "head where that lowers the validation NLL; with --head prototype and no validation "
        "split, the NLL of the head's own 5 folds)",
    )
    p.add_argument(
        "--memory-max-states",
        type=_COUNT,
        default=None,
        metavar="N",
        help="example memory: at most N training states per question (default 100000)",
    )
    p.add_argument(
        "--memory-add-validation",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="example memory: once the validation split has chosen its settings, add the "
        "validation states to it too (default: on)",
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
        help="train K runs (seeds SEED..SEED+K-1; validation splits: see --shared-split) into "
        "OUT/members/ and answer with the mean of their calibrated answers; K times the "
        "training and the backbone passes per decision (default 1)",
    )
    p.add_argument(
        "--shared-split",
        type=number(float, low=0, high=1),
        default=None,
        metavar="F",
        help="with --ensemble: the share of the validation split of SEED that every member "
        "holds out; each draws the rest with its own seed (default 0: each member holds out "
        "its own seed's split, as its single run; 1: one split for all)",
    )
    p.add_argument(
        "--ensemble-temperature",
        action="store_true",
        default=None,
        help="with --ensemble: also fit a temperature for the members' mean on the states "
        "all of them held out (off by default: it raised test ECE in 12 of 15 BANKING77 "
        "ensembles)",
    )
    p.add_argument("--seed", type=_NON_NEGATIVE_COUNT, default=None)
    p.add_argument("--device", default=None, help="auto (default), cpu, cuda, mps")
    p.add_argument("--resume", action="store_true", help="continue from OUT/checkpoint")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    add_deprecated_alias(p, "--quiet", "--no-progress")
    add_threads_arg(p)
    p.set_defaults(func=run)


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
    "head_lr",
    "lora_rank",
    "lora_alpha",
    "lora_dropout",
    "lora_plus_ratio",
    "use_dora",
    "label_smoothing",
    "brier_weight",
    "ordinal_weight",
    "val_fraction",
    "patience",
    "rl_epochs",
    "rl_kl",
    "bank_init",
    "head",
    "contrastive_steps",
    "contrastive_per_label",
    "contrastive_temperature",
    "contrastive_lr",
    "contrastive_weight",
    "pseudo_per_label",
    "rdrop_weight",
    "ema_decay",
    "refit",
    "memory_max_states",
    "memory_add_validation",
    "ensemble",
    "shared_split",
    "ensemble_temperature",
    "seed",
    "device",
)
"""Flags passed to :class:`TrainConfig` under the same name when given."""


def run(args: argparse.Namespace) -> int:
    from clef_engine.errors import require

    check_out_dir(args.out)
    require("peft", package="peft", extra="train", feature="clef-agents finetune")
    from clef_engine.train import (
        TrainConfig,
        Trainer,
        load_training_data,
        load_unlabeled,
        sample_per_label,
    )

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
    kwargs: dict[str, Any] = {
        field: getattr(args, field) for field in _FIELDS if getattr(args, field) is not None
    }
    if args.target_modules:
        kwargs["target_modules"] = [t.strip() for t in args.target_modules.split(",") if t.strip()]
    if args.similarity:
        kwargs["similarity"] = load_structured(args.similarity)
    kwargs.update(
        evidence=not args.no_head,
        memory=not args.no_memory,
        histogram=args.histogram,
        progress=not args.no_progress,
        group_by_length=not args.no_group_by_length,
    )
    try:
        config = TrainConfig(**kwargs)
        config.check()
    except ValueError as exc:
        raise UsageError(str(exc)) from None
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
    # After the labelled states were dropped from the unlabelled ones.
    semi = next((h for h in result.history if "pseudo_labels" in h), None)
    summary = {
        "model_dir": str(result.directory),
        "states": len(data),
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
    sys.stdout.write(json.dumps(summary, indent=2) + "\n")
    return 0
