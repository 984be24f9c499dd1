"""What the RL stage costs with and without its feature cache (BANKING77 sample, CPU).

The RL stage trains the head alone; the adapters stay fixed, so since 2026-12-02 each
state goes through the backbone once and the features are cached
(``Trainer.fixed_adapters``). This script trains the same recipe twice on the same
sample, seed and split (``--states`` training states, 1 supervised epoch, then
``--rl-epochs`` RL epochs): once as the trainer does, once with the cache switched off
(each RL step runs the backbone again, the behaviour before the cache), and reports the
RL stage's wall time and the validation metrics after it.

    python benchmarks/finetune_rl_cache.py            # ~3 min on 2 cores

Writes ``benchmarks/results/finetune_rl_cache.json``.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.finetune_banking77 import cpu_model, data_dir, package_versions  # noqa: E402
from clef_engine.train import TrainConfig, Trainer, load_training_data, sample_per_label  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results" / "finetune_rl_cache.json"


def run(data: Any, rl_epochs: int, *, cache: bool) -> dict[str, Any]:
    trainer = Trainer(TrainConfig(epochs=1, rl_epochs=rl_epochs, memory=False, progress=False))
    if not cache:  # the stage as it was: eval mode, every step through the backbone

        @contextmanager
        def eval_only() -> Iterator[None]:
            trainer.model.eval()
            yield

        trainer.fixed_adapters = eval_only  # type: ignore[method-assign]
    spent: list[float] = []
    reinforce = trainer.reinforce

    def timed(train: Any, val: Any) -> list[dict[str, float]]:
        started = time.perf_counter()
        try:
            return reinforce(train, val)
        finally:
            spent.append(time.perf_counter() - started)

    trainer.reinforce = timed  # type: ignore[method-assign]
    with tempfile.TemporaryDirectory(prefix="clef-rl-") as tmp:
        started = time.perf_counter()
        result = trainer.fit(data, tmp)
        total = time.perf_counter() - started
    rl = [h for h in result.history if "rl_loss" in h]
    return {
        "cache": cache,
        "train_seconds": round(total, 1),
        "rl_seconds": round(spent[0], 1),
        "rl_history": [{k: round(v, 4) for k, v in h.items()} for h in rl],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--states", type=int, default=26, help="training states per intent")
    parser.add_argument("--rl-epochs", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(2)
    train = load_training_data(data_dir() / "train.csv", label_col="category")
    data = sample_per_label(train, args.states, seed=0)
    runs = [run(data, args.rl_epochs, cache=c) for c in (True, False)]
    for r in runs:
        print(json.dumps(r), flush=True)
    out = {
        "states": len(data),
        "rl_epochs": args.rl_epochs,
        "runs": runs,
        "rl_speedup": round(runs[1]["rl_seconds"] / runs[0]["rl_seconds"], 2),
        "cpu": cpu_model(),
        "torch_threads": torch.get_num_threads(),
        "packages": package_versions(),
        "torch": torch.__version__,
    }
    RESULTS.write_text(json.dumps(out, indent=2) + "\n")
    print(json.dumps({k: out[k] for k in ("states", "rl_speedup")}))


if __name__ == "__main__":
    main()
