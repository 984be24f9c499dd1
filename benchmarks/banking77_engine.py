"""BANKING77 on the embedded model: accuracy, calibration, latency, throughput; fp32, int8, bf16.

Official split from ../shared/data/banking77: examples come only from train.csv, every
number is measured on test.csv (3,080 rows). Run from the repo root:

    python -m benchmarks.banking77_engine            # ~5 minutes on 2 cores
    python -m benchmarks.banking77_engine --quick    # a smoke run on 300 test rows
    python -m benchmarks.banking77_engine --only int8   # re-measure one mode, keep fp32

Writes benchmarks/results/banking77_engine.json.
"""

from __future__ import annotations

import argparse
import json
import random
import time
from dataclasses import asdict
from typing import Any

import numpy as np
import torch

from benchmarks._common import RESULTS, percentiles, shared_data, write_result
from clef_engine import DecisionEngine
from clef_engine.calibration import Calibrator
from clef_engine.calibration.metrics import expected_calibration_error
from clef_engine.evaluation import columns, evaluate, label_question, read_records, sample_examples

SEEDS = (0, 1, 2)


def _eval(
    engine: DecisionEngine,
    texts: list[str],
    labels: list[str],
    question: Any,
    *,
    uncalibrated: bool = False,
) -> dict[str, Any]:
    """Evaluate in batches of 64 (speed); with ``uncalibrated`` also report T=1 ECE.

    A prototype head's question is also scored without its example memory (``head_alone``:
    the classifier with its temperature); the T=1 ECE is the classifier's, memory off.
    """
    report = evaluate(engine, texts, labels, question, batch_size=64)
    keys = ("accuracy", "macro_f1", "ece", "brier", "nll")
    out = {k: report.summary()[k] for k in keys}
    if uncalibrated:
        prepared = engine.prepare_question(question)
        if prepared.classifier is not None:
            t, memory = prepared.classifier.temperature, prepared.memory
            try:  # the question is the engine's cached one: restore it whatever happens
                prepared.memory = None
                if memory is not None:
                    alone = evaluate(engine, texts, labels, question, batch_size=64).summary()
                    out["head_alone"] = {k: alone[k] for k in keys}
                    out["memory"] = asdict(memory.settings)
                prepared.classifier.temperature = 1.0
                raw = evaluate(engine, texts, labels, question, batch_size=64)
            finally:
                prepared.classifier.temperature, prepared.memory = t, memory
        else:
            calibrated = engine.calibrator
            engine.calibrator = Calibrator(source="identity")
            raw = evaluate(engine, texts, labels, question, batch_size=64)
            engine.calibrator = calibrated
        out["ece_before_calibration"] = round(
            expected_calibration_error(raw.probabilities, raw.label_index), 5
        )
    return out


def _mean(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Mean of each number over ``runs``, nested dicts (``head_alone``) too when every run
    has them; the memory's settings (``memory``) are per run only."""
    out: dict[str, Any] = {}
    for k, v in runs[0].items():
        if k == "memory" or not all(k in r for r in runs):
            continue
        if isinstance(v, dict):
            out[k] = _mean([r[k] for r in runs])
        else:
            out[k] = round(float(np.mean([r[k] for r in runs])), 5)
    return out


def accuracy_section(
    engine: DecisionEngine,
    train: tuple[list[str], list[str]],
    test: tuple[list[str], list[str]],
    intents: list[str],
    *,
    full_train: bool = True,
) -> dict[str, Any]:
    out: dict[str, Any] = {}
    zs_question = label_question(intents)
    out["zero_shot"] = _eval(engine, *test, zs_question, uncalibrated=True)
    print("zero-shot", out["zero_shot"], flush=True)
    runs = []
    for seed in SEEDS:
        examples, _ = sample_examples(*train, 10, seed=seed)
        q = label_question(intents, examples)
        t0 = time.perf_counter()
        engine.prepare_question(q)
        fit_s = time.perf_counter() - t0
        run = _eval(engine, *test, q, uncalibrated=True)
        run["prototype_fit_s"] = round(fit_s, 2)
        runs.append(run)
        print(f"10-shot seed {seed}", run, flush=True)
    out["ten_shot_mean_of_3_seeds"] = _mean(runs)
    out["ten_shot_runs"] = runs
    if not full_train:
        return out
    full: dict[str, list[str]] = {}
    for text, label in zip(*train, strict=True):
        full.setdefault(label, []).append(text)
    q = label_question(intents, full)
    t0 = time.perf_counter()
    engine.prepare_question(q)
    fit_s = time.perf_counter() - t0
    out["full_train_prototypes"] = _eval(engine, *test, q, uncalibrated=True)
    out["full_train_prototypes"]["prototype_fit_s"] = round(fit_s, 2)
    print("full", out["full_train_prototypes"], flush=True)
    return out


def latency_section(
    engine: DecisionEngine, texts: list[str], intents: list[str], n: int
) -> dict[str, Any]:
    """Single decisions with one 77-option question vs a bare backbone forward."""
    question = {"intent": label_question(intents)}
    backbone = engine.backbone
    tokenizer, model = backbone.tokenizer, backbone.model  # type: ignore[attr-defined]
    sample = random.Random(0).sample(texts, n)
    for text in sample[:20]:  # warm-up, and fill the option cache
        engine.decide(text, question)
    decide_ms, bare_ms = [], []
    with torch.inference_mode():
        for text in sample:
            t0 = time.perf_counter()
            enc = tokenizer(
                text, return_tensors="pt", truncation=True, max_length=backbone.max_length
            )
            model(**enc)
            bare_ms.append((time.perf_counter() - t0) * 1000)
            t0 = time.perf_counter()
            engine.decide(text, question)
            decide_ms.append((time.perf_counter() - t0) * 1000)
    d, b = percentiles(decide_ms), percentiles(bare_ms)
    return {
        "decide_77_options": d,
        "bare_backbone_forward": b,
        "engine_overhead_p50": round(d["p50_ms"] / b["p50_ms"] - 1, 4),
        "engine_overhead_mean": round(d["mean_ms"] / b["mean_ms"] - 1, 4),
    }


def throughput_section(
    engine: DecisionEngine, texts: list[str], intents: list[str], batches: int
) -> dict[str, Any]:
    question = {"intent": label_question(intents)}
    sample = random.Random(1).sample(texts, 64 * batches)
    engine.decide_batch(sample[:64], question)
    t0 = time.perf_counter()
    for i in range(batches):
        engine.decide_batch(sample[i * 64 : (i + 1) * 64], question)
    elapsed = time.perf_counter() - t0
    return {
        "batch_size": 64,
        "decisions": 64 * batches,
        "decisions_per_s": round(64 * batches / elapsed, 1),
    }


def mode_section(
    engine: DecisionEngine,
    train: tuple[list[str], list[str]],
    test: tuple[list[str], list[str]],
    intents: list[str],
    fp32: dict[str, Any],
    n_latency: int,
    n_batches: int,
) -> dict[str, Any]:
    """A reduced-precision mode: the fp32 accuracy runs (same seeds), latency, throughput."""
    out: dict[str, Any] = {"calibration": engine.calibrator.source}
    out.update(accuracy_section(engine, train, test, intents, full_train=False))
    out["accuracy_drop_points_vs_fp32"] = {
        key: round(100 * (fp32[key]["accuracy"] - out[key]["accuracy"]), 2)
        for key in ("zero_shot", "ten_shot_mean_of_3_seeds")
    }
    out["latency"] = latency_section(engine, test[0], intents, n_latency)
    out["throughput"] = throughput_section(engine, test[0], intents, n_batches)
    return out


MODES = {"int8": {"quantize": "int8"}, "bf16": {"dtype": "bfloat16"}}
"""Reduced-precision modes measured against fp32. bf16 on the CPU pays off only where the
CPU has bf16 dot products (AVX512-BF16 or AMX); the machine block records the CPU."""


def main() -> None:
    parser = argparse.ArgumentParser(description="BANKING77 engine benchmark")
    parser.add_argument("--quick", action="store_true", help="300 test rows, fewer timings")
    parser.add_argument("--only", choices=sorted(MODES), help="re-run one mode into the JSON")
    args = parser.parse_args()
    data = shared_data() / "banking77"
    intents = json.loads((data / "categories.json").read_text())
    train = columns(read_records(data / "train.csv"), "text", "category")
    test = columns(read_records(data / "test.csv"), "text", "category")
    if args.quick:
        idx = random.Random(0).sample(range(len(test[0])), 300)
        test = ([test[0][i] for i in idx], [test[1][i] for i in idx])
    n_latency, n_batches = (100, 4) if args.quick else (500, 20)
    started = time.perf_counter()
    results: dict[str, Any] = {
        "data": "BANKING77 official split; examples from train.csv, "
        f"metrics on test.csv ({len(test[0])} rows)",
        "quick": args.quick,
    }
    if args.only:
        previous = json.loads((RESULTS / "banking77_engine.json").read_text())
        results = {k: v for k, v in previous.items() if k not in ("benchmark", "machine")}
        results["fp32_from_commit"] = previous.get(
            "fp32_from_commit", previous["machine"]["commit"]
        )
    else:
        fp32 = DecisionEngine()
        results["fp32"] = {
            **accuracy_section(fp32, train, test, intents),
            "latency": latency_section(fp32, test[0], intents, n_latency),
            "throughput": throughput_section(fp32, test[0], intents, n_batches),
        }
        print("fp32", results["fp32"]["latency"], results["fp32"]["throughput"], flush=True)
        del fp32
    for mode in [args.only] if args.only else list(MODES):
        engine = DecisionEngine(**MODES[mode])
        t0 = time.perf_counter()
        section = mode_section(engine, train, test, intents, results["fp32"], n_latency, n_batches)
        section["wall_s"] = round(time.perf_counter() - t0, 1)
        results[mode] = section
        print(mode, section, flush=True)
    if args.only is None:
        results["wall_s"] = round(time.perf_counter() - started, 1)
    print(write_result("banking77_engine", results))


if __name__ == "__main__":
    main()
