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
    python benchmarks/gpu/finetune_sweep.py --workers 8 --probabilities \
        --variant "default (4 epochs)@0,1,2,3,4,5" --variant "3 epochs@0,1,2,3"

``NAME@SEEDS`` gives one variant its own seeds. Runs go out seed-major (every variant's
first seed, then every variant's second, ...), so a budget cuts all variants alike.
``--workers N`` trains N runs at once in separate processes on the one GPU (a MiniLM run
leaves most of an H200 idle). ``--probabilities`` also writes each run's test answers
(the engine's own: calibrated, with the example memory; float16, items x options, values
under 0.001 stored as 0) to
``finetune_sweep_gpu_probabilities.npz``, keyed ``"variant|seed"`` with the test labels
under ``"labels"``, so that ensembles of any runs can be scored afterwards without
training again.

Appends to ``benchmarks/results/finetune_sweep_gpu.json`` after every run (and copies it
to ``$OUT`` when that is set).
"""

from __future__ import annotations

import argparse
import importlib.metadata
import itertools
import json
import multiprocessing
import os
import platform
import sys
import tempfile
import time
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from pathlib import Path
from typing import Any

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from benchmarks.finetune_banking77 import data_dir, run  # noqa: E402
from benchmarks.probe_trainer import ProbeConfig  # noqa: E402
from clef_engine.calibration import expected_calibration_error, macro_f1  # noqa: E402
from clef_engine.train import (  # noqa: E402
    load_eval_data,
    load_training_data,
    sample_per_label,
)

RESULTS = ROOT / "benchmarks" / "results" / "finetune_sweep_gpu.json"
PROBABILITIES = RESULTS.with_name("finetune_sweep_gpu_probabilities.npz")
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
    # Since the example memory (2026-12-02): the recipe's neighbours, several seeds each.
    ("full", "lr 1e-3", {"lr": 1e-3}, (0, 1, 2, 3)),
    ("full", "lr 2.5e-4", {"lr": 2.5e-4}, (0, 1, 2, 3)),
    ("full", "3 epochs", {"epochs": 3}, (0, 1, 2, 3)),
    ("full", "batch 16", {"batch_size": 16}, (0, 1, 2, 3)),
    ("full", "smoothing 0", {"label_smoothing": 0.0}, (0, 1, 2, 3)),
    ("full", "rank 32", {"lora_rank": 32}, (0, 1, 2, 3)),
]


def save(payload: dict[str, Any], probabilities: dict[str, np.ndarray] | None = None) -> None:
    text = json.dumps(payload, indent=2) + "\n"
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(text)
    targets = [RESULTS]
    if os.environ.get("OUT"):
        Path(os.environ["OUT"], RESULTS.name).write_text(text)
        targets = [RESULTS, Path(os.environ["OUT"], RESULTS.name)]
    if probabilities:
        for target in targets:
            with open(target.with_name(PROBABILITIES.name), "wb") as f:
                np.savez_compressed(f, **probabilities)


_DATA: dict[str, Any] = {}


def _load(quick: bool) -> tuple[Any, Any]:
    """BANKING77 train and test, loaded once per process."""
    if "train" not in _DATA:
        root = data_dir()
        train = load_training_data(root / "train.csv", label_col="category")
        test = load_eval_data(
            root / "test.csv", {"category": train.questions["category"]}, label_col="category"
        )
        _DATA["train"] = train
        _DATA["test"] = sample_per_label(test, 2, seed=0) if quick else test
    return _DATA["train"], _DATA["test"]


def _worker_init(threads: int) -> None:
    torch.set_num_threads(threads)
    os.environ["TOKENIZERS_PARALLELISM"] = "false"


def one_run(
    section: str,
    name: str,
    overrides: dict[str, Any],
    seed: int,
    device: str,
    quick: bool,
    probabilities: bool,
) -> dict[str, Any]:
    """Train and evaluate one (variant, seed); runs in the main process or a worker."""
    train, test = _load(quick)
    kw = {"progress": False, "device": device, "seed": seed, **overrides}
    if quick:
        kw["epochs"] = 1
    if section == "fewshot":
        data = sample_per_label(train, 3 if quick else 10, seed=seed)
    else:
        data = sample_per_label(train, 5, seed=0) if quick else train
    entry = run(
        f"{section}: {name} (seed {seed})",
        data,
        test,
        ProbeConfig(**kw),  # bank_init is a probe, not a TrainConfig option
        int8=False,
        probabilities=probabilities,
    )
    entry.update({"section": section, "variant": name, "seed": seed})
    return entry


def tasks(
    selected: list[str] | None, only: str | None, seeds: str | None
) -> list[tuple[str, str, dict[str, Any], int]]:
    """(section, variant, overrides, seed) in run order: seed-major over the variants."""
    known = {v[1]: v for v in VARIANTS}
    wanted: list[tuple[str, tuple[int, ...] | None]] = []
    for item in selected or []:
        name, _, own = item.partition("@")
        if name not in known:
            raise SystemExit(f"unknown variant {name!r}; known: {sorted(known)}")
        wanted.append((name, tuple(int(x) for x in own.split(",")) if own else None))
    if not wanted:
        wanted = [(v[1], None) for v in VARIANTS]
    default_seeds = tuple(int(x) for x in seeds.split(",")) if seeds else None
    rows = []
    for order, (name, own) in enumerate(wanted):
        section, _, overrides, variant_seeds = known[name]
        if only and section != only:
            continue
        for position, seed in enumerate(own or default_seeds or variant_seeds):
            rows.append((position, order, (section, name, overrides, seed)))
    return [task for _, _, task in sorted(rows, key=lambda r: (r[0], r[1]))]


def score_ensembles(
    probabilities: dict[str, np.ndarray], sizes: tuple[int, ...] = (2, 3, 4)
) -> dict:
    """Test macro-F1 and ECE of ensembles of the saved runs, as the engine answers with one
    (the mean of its members' calibrated answers, no temperature for the mean).

    Per variant and size K: ``consecutive`` scores the ensembles that ``TrainConfig(
    ensemble=K, seed=N)`` trains (the runs of seeds N .. N+K-1, for every N where all of
    them were run); ``combinations`` every K of the variant's runs (for K <= 3), whose
    samples share runs and so are not independent. ``pairs_across_variants`` scores every
    two runs of two variants with different seeds (different validation splits).
    """
    labels = probabilities["labels"]
    runs: dict[str, dict[int, np.ndarray]] = {}
    for key, answers in probabilities.items():
        if "|" in key:
            variant, seed = key.rsplit("|", 1)
            runs.setdefault(variant, {})[int(seed)] = answers.astype(np.float64)

    def score(members: list[np.ndarray]) -> tuple[float, float]:
        p = np.mean(members, 0)
        pred = p.argmax(1)
        return macro_f1(pred, labels, p.shape[1]) * 100, expected_calibration_error(p, labels)

    def summary(scores: list[tuple[float, float]]) -> dict[str, Any]:
        f1s = [f for f, _ in scores]
        return {
            "n": len(scores),
            "macro_f1_mean": round(float(np.mean(f1s)), 3),
            "macro_f1_min": round(min(f1s), 2),
            "macro_f1_max": round(max(f1s), 2),
            "share_at_least_94.2": round(float(np.mean([f >= 94.195 for f in f1s])), 3),
            "ece_mean": round(float(np.mean([e for _, e in scores])), 4),
        }

    out: dict[str, Any] = {"variants": {}, "pairs_across_variants": {}}
    for variant, by_seed in sorted(runs.items()):
        seeds = sorted(by_seed)
        entry: dict[str, Any] = {
            "seeds": seeds,
            "single": summary([score([by_seed[s]]) for s in seeds]),
        }
        for k in sizes:
            starts = [n for n in seeds if all(n + i in by_seed for i in range(k))]
            if starts:
                consecutive = [score([by_seed[n + i] for i in range(k)]) for n in starts]
                entry[f"k{k}_consecutive"] = summary(consecutive)
            if k <= 3 and len(seeds) >= k:
                combos = itertools.combinations(seeds, k)
                entry[f"k{k}_combinations"] = summary(
                    [score([by_seed[s] for s in c]) for c in combos]
                )
        out["variants"][variant] = entry
    for a, b in itertools.combinations(sorted(runs), 2):
        pairs = [score([runs[a][i], runs[b][j]]) for i in runs[a] for j in runs[b] if i != j]
        if pairs:
            out["pairs_across_variants"][f"{a} + {b}"] = summary(pairs)
    return out


def main() -> None:
    global RESULTS, PROBABILITIES
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--only", choices=["full", "fewshot"], default=None)
    parser.add_argument("--budget-s", type=float, default=None, help="start no run after this")
    parser.add_argument(
        "--variant", action="append", help="run only these (by name; NAME@0,1,2 for own seeds)"
    )
    parser.add_argument("--seeds", default=None, help="comma-separated; default: per variant")
    parser.add_argument("--workers", type=int, default=1, help="runs trained at once")
    parser.add_argument(
        "--probabilities", action="store_true", help="also save each run's test answers (npz)"
    )
    parser.add_argument("--quick", action="store_true", help="tiny slices, 1 epoch (smoke run)")
    parser.add_argument(
        "--score-ensembles",
        action="store_true",
        help="train nothing: score ensembles of the runs in the probabilities file and write "
        "them to the results JSON under 'ensembles'",
    )
    args = parser.parse_args()
    if args.score_ensembles:
        if not PROBABILITIES.is_file():
            raise SystemExit(f"{PROBABILITIES} not found: run the sweep with --probabilities")
        payload = json.loads(RESULTS.read_text())
        payload["ensembles"] = score_ensembles(dict(np.load(PROBABILITIES)))
        save(payload)
        print(json.dumps(payload["ensembles"]["variants"], indent=1))
        return
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        raise SystemExit("no CUDA GPU visible to torch (use --device cpu for a smoke run)")
    if args.workers < 1:
        raise SystemExit(f"--workers must be at least 1, got {args.workers}")
    todo = tasks(args.variant, args.only, args.seeds)
    if args.quick:  # a smoke run keeps the recorded sweep as it is
        RESULTS = Path(tempfile.mkdtemp(prefix="clef-sweep-")) / RESULTS.name
        PROBABILITIES = RESULTS.with_name(PROBABILITIES.name)
        print(f"--quick: writing {RESULTS}", flush=True)
    device_name = (
        torch.cuda.get_device_name(0) if args.device.startswith("cuda") else platform.processor()
    )
    payload: dict[str, Any] = {
        "environment": {
            "device": device_name,
            "torch": torch.__version__,
            "python": platform.python_version(),
            "transformers": importlib.metadata.version("transformers"),
            "peft": importlib.metadata.version("peft"),
            "note": "recipe sweep on a GPU; the CPU numbers in finetune_banking77.json are "
            "the measurements of record",
        },
        "runs": [],
    }
    probabilities: dict[str, np.ndarray] = {}
    if not args.quick:
        if RESULTS.is_file():
            payload["runs"] = json.loads(RESULTS.read_text()).get("runs", [])
        if args.probabilities and PROBABILITIES.is_file():
            probabilities = dict(np.load(PROBABILITIES))
    if args.probabilities:
        _, test = _load(args.quick)
        qid = next(iter(test.questions))
        probabilities["labels"] = np.array([ex.labels[qid] for ex in test.examples])
    started = time.perf_counter()

    def record(entry: dict[str, Any]) -> None:
        answers = entry["fp32"].pop("probabilities", None)
        if answers is not None:
            # Answers under 0.001 are stored as 0: 1.4 MB instead of 12 MB for 34 runs, and
            # every score of score_ensembles came out the same to the digits it writes.
            kept = np.where(answers >= 1e-3, answers, 0.0).astype(np.float16)
            probabilities[f"{entry['variant']}|{entry['seed']}"] = kept
        entry["workers"] = args.workers
        entry["date"] = time.strftime("%Y-%m-%d")
        entry["packages"] = {
            k: payload["environment"][k] for k in ("torch", "transformers", "peft")
        }
        payload["runs"].append(entry)
        payload["elapsed_s"] = round(time.perf_counter() - started, 1)
        save(payload, probabilities if args.probabilities else None)

    def over_budget() -> bool:
        return bool(args.budget_s) and time.perf_counter() - started > args.budget_s

    common = (args.device, args.quick, args.probabilities)
    queue = list(todo)
    if args.workers == 1:
        while queue and not over_budget():
            section, name, overrides, seed = queue.pop(0)
            record(one_run(section, name, overrides, seed, *common))
    else:
        threads = max(1, (os.cpu_count() or 2) // args.workers)
        with ProcessPoolExecutor(
            args.workers,
            mp_context=multiprocessing.get_context("spawn"),
            initializer=_worker_init,
            initargs=(threads,),
        ) as pool:
            pending: set[Future[dict[str, Any]]] = set()
            while queue or pending:
                while queue and len(pending) < args.workers and not over_budget():
                    section, name, overrides, seed = queue.pop(0)
                    pending.add(pool.submit(one_run, section, name, overrides, seed, *common))
                if not pending:
                    break
                done, pending = wait(pending, return_when=FIRST_COMPLETED)
                for future in done:
                    try:
                        record(future.result())
                    except Exception as exc:  # one failed run must not lose the others
                        payload.setdefault("errors", []).append(repr(exc))
                        print(f"run failed: {exc!r}", flush=True)
    if queue:
        payload["stopped"] = f"budget of {args.budget_s:.0f} s reached; not run: " + ", ".join(
            f"{name} (seed {seed})" for _, name, _, seed in queue
        )
    payload["elapsed_s"] = round(time.perf_counter() - started, 1)
    save(payload, probabilities if args.probabilities else None)


if __name__ == "__main__":
    main()
