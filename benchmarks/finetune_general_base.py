"""Fine-tuning from the general decision model against fine-tuning from the bare MiniLM.

Trains a recipe (``TrainConfig.preset``) on BANKING77's training split twice per seed:
from the embedded all-MiniLM-L6-v2 (``backbone=None``) and from the general model
(``backbone="packaged:general"``: the same weights with the general adapter merged), then
evaluates both saved model dirs on the whole test split through
``DecisionEngine.from_pretrained`` (``benchmarks.finetune_banking77.evaluate``). Results are
merged into ``benchmarks/results/finetune_general_base.json`` under ``<recipe>_<shots>``.

    python -m benchmarks.finetune_general_base --recipe few_shot --shots 10 --seeds 0
    python -m benchmarks.finetune_general_base --recipe full --seeds 0   # GPU: --device cuda
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from benchmarks._common import RESULTS, machine
from benchmarks.finetune_banking77 import data_dir, evaluate
from clef_engine.runtime.general import REFERENCE, base_tag
from clef_engine.train import (
    TrainConfig,
    Trainer,
    load_eval_data,
    load_training_data,
    sample_per_label,
)

OUT = RESULTS / "finetune_general_base.json"
BASES = {"bare": None, "general": REFERENCE}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--recipe", default="few_shot", help="a TrainConfig preset")
    parser.add_argument("--shots", type=int, default=10, help="examples per label (0: all)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--device", default=None)
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    root = data_dir()
    train = load_training_data(root / "train.csv", label_col="category")
    test = load_eval_data(
        root / "test.csv", {"category": train.questions["category"]}, label_col="category"
    )
    key = f"{args.recipe}_{args.shots or 'all'}"
    results = json.loads(OUT.read_text()) if OUT.is_file() else {}
    entry: dict[str, Any] = results.get(key, {"runs": []})
    for seed in args.seeds:
        data = sample_per_label(train, args.shots, seed=seed) if args.shots else train
        for base, backbone in BASES.items():
            config = TrainConfig.preset(args.recipe, seed=seed, progress=False)
            if args.device:
                config.device = args.device
            with tempfile.TemporaryDirectory(prefix="clef-base-") as tmp:
                started = time.perf_counter()
                Trainer(config, backbone=backbone).fit(data, tmp)
                seconds = time.perf_counter() - started
                scores = evaluate(Path(tmp), test, device=args.device or "cpu")
            run = {"base": base, "seed": seed, "train_states": len(data),
                   "train_seconds": round(seconds, 1), "fp32": scores}  # fmt: skip
            print(json.dumps(run), flush=True)
            entry["runs"] = [r for r in entry["runs"] if (r["base"], r["seed"]) != (base, seed)] + [
                run
            ]
    entry["mean"] = {
        base: {
            metric: round(float(np.mean([r["fp32"]["calibrated"][metric] for r in runs])), 4)
            for metric in ("accuracy", "macro_f1", "ece")
        }
        | {"seeds": sorted(r["seed"] for r in runs)}
        for base in BASES
        if (runs := [r for r in entry["runs"] if r["base"] == base])
    }
    entry.update(recipe=args.recipe, shots=args.shots, general=base_tag(), machine=machine())
    results[key] = entry
    OUT.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
