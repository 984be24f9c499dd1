"""Fine-tuning recipe sweep on a CUDA GPU: BANKING77 full set and 10-shot.

A GPU trains a MiniLM LoRA run in a minute or two where the 2-core CPU takes half an hour,
so this script tries recipe variants there (epochs, learning rate, rank, option-bank
initialisation, validation share) and the CPU benchmark (``finetune_banking77.py``) then
measures the chosen recipe where the targets are set. GPU and CPU results differ a little
(other kernels, other summation order); this sweep ranks variants, it does not replace the
CPU numbers.

Every run trains on ``train.csv`` only (validation carved from it) and reports test
accuracy, macro-F1 and ECE through ``DecisionEngine.from_pretrained`` on the same device.

Usage::

    python benchmarks/gpu/finetune_sweep.py                    # every variant, in order
    python benchmarks/gpu/finetune_sweep.py --budget-s 420     # start no run after 420 s
    python benchmarks/gpu/finetune_sweep.py --only fewshot     # or: full
    python benchmarks/gpu/finetune_sweep.py --variant "default (4 epochs)" --seeds 1,2
    python benchmarks/gpu/finetune_sweep.py --device cpu --quick   # smoke run

Appends to ``benchmarks/results/finetune_sweep_gpu.json`` after every run (and copies it
to ``$OUT`` when that is set).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from benchmarks.finetune_banking77 import data_dir, run  # noqa: E402
from engine.train import (  # noqa: E402
    TrainConfig,
    load_eval_data,
    load_training_data,
    sample_per_label,
)

RESULTS = ROOT / "benchmarks" / "results" / "finetune_sweep_gpu.json"
FEW = {"epochs": 10, "val_fraction": 0.2, "batch_size": 16}
EX = {"bank_init": "examples"}

# (section, name, config overrides, seeds): in priority order, the baselines first.
VARIANTS: list[tuple[str, str, dict[str, Any], tuple[int, ...]]] = [
    ("full", "default (4 epochs)", {}, (0,)),
    ("fewshot", "default", FEW, (0, 1, 2)),
    ("fewshot", "bank from examples", {**FEW, **EX}, (0, 1, 2)),
    ("fewshot", "bank from examples, frozen backbone", {**FEW, **EX, "lora_rank": 0}, (0, 1, 2)),
    ("full", "8 epochs, bank from examples", {"epochs": 8, **EX}, (0,)),
    ("full", "8 epochs", {"epochs": 8}, (0,)),
    ("fewshot", "bank from examples, val 0.1", {**FEW, **EX, "val_fraction": 0.1}, (0, 1, 2)),
    ("fewshot", "bank from examples, lr 2e-4", {**FEW, **EX, "lr": 2e-4}, (0, 1, 2)),
    (
        "fewshot",
        "bank from examples, smoothing 0",
        {**FEW, **EX, "label_smoothing": 0.0},
        (0, 1, 2),
    ),
    ("full", "8 epochs, lr 1e-3", {"epochs": 8, "lr": 1e-3}, (0,)),
    ("full", "6 epochs, bank from examples", {"epochs": 6, **EX}, (0,)),
    ("full", "8 epochs, rank 32", {"epochs": 8, "lora_rank": 32}, (0,)),
    ("full", "10 epochs, bank from examples", {"epochs": 10, **EX}, (0,)),
    ("full", "8 epochs, bank from examples, batch 16", {"epochs": 8, "batch_size": 16, **EX}, (0,)),
    ("full", "5 epochs, val 0.05", {"epochs": 5, "val_fraction": 0.05}, (0,)),
]


def save(payload: dict[str, Any]) -> None:
    text = json.dumps(payload, indent=2) + "\n"
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(text)
    if os.environ.get("OUT"):
        Path(os.environ["OUT"], RESULTS.name).write_text(text)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--only", choices=["full", "fewshot"], default=None)
    parser.add_argument("--budget-s", type=float, default=None, help="start no run after this")
    parser.add_argument("--variant", action="append", help="run only these (by name)")
    parser.add_argument("--seeds", default=None, help="comma-separated; default: per variant")
    parser.add_argument("--quick", action="store_true", help="tiny slices, 1 epoch (smoke run)")
    args = parser.parse_args()
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        raise SystemExit("no CUDA GPU visible to torch (use --device cpu for a smoke run)")
    root = data_dir()
    train = load_training_data(root / "train.csv", label_col="category")
    test = load_eval_data(
        root / "test.csv", {"category": train.questions["category"]}, label_col="category"
    )
    if args.quick:
        test = sample_per_label(test, 2, seed=0)
    device_name = (
        torch.cuda.get_device_name(0) if args.device.startswith("cuda") else platform.processor()
    )
    payload: dict[str, Any] = {
        "environment": {
            "device": device_name,
            "torch": torch.__version__,
            "python": platform.python_version(),
            "note": "recipe sweep on a GPU; the CPU numbers in finetune_banking77.json are "
            "the measurements of record",
        },
        "runs": [],
    }
    if RESULTS.is_file() and not args.quick:
        payload["runs"] = json.loads(RESULTS.read_text()).get("runs", [])
    names = {v[1] for v in VARIANTS}
    unknown = [v for v in args.variant or [] if v not in names]
    if unknown:
        raise SystemExit(f"unknown variant(s) {unknown}; known: {sorted(names)}")
    started = time.perf_counter()
    for section, name, overrides, seeds in VARIANTS:
        if (args.only and section != args.only) or (args.variant and name not in args.variant):
            continue
        if args.seeds:
            seeds = tuple(int(x) for x in args.seeds.split(","))
        for seed in seeds:
            if args.budget_s and time.perf_counter() - started > args.budget_s:
                payload["stopped"] = f"budget of {args.budget_s:.0f} s reached"
                save(payload)
                return
            kw = {"progress": False, "device": args.device, "seed": seed, **overrides}
            if args.quick:
                kw["epochs"] = 1
            if section == "fewshot":
                data = sample_per_label(train, 3 if args.quick else 10, seed=seed)
            else:
                data = sample_per_label(train, 5, seed=0) if args.quick else train
            label = f"{section}: {name} (seed {seed})"
            entry = run(label, data, test, TrainConfig(**kw), int8=False)
            entry.update({"section": section, "variant": name, "seed": seed})
            payload["runs"].append(entry)
            payload["elapsed_s"] = round(time.perf_counter() - started, 1)
            save(payload)


if __name__ == "__main__":
    main()
