"""Zero-shot quality of an engine: the decision mixture's test sets, BANKING77, the noul suite.

Scores the engine as users meet it, with no examples and no fine-tuning:

- every set of ``shared/data/decision-mix`` (and of ``data/mixture-extra``, the sets built
  here, such as ``prompt_injection``) on its **test** split, asked its own question
  (:meth:`clef_engine.train.mixture.MixtureSampler.canonical`; at most ``--per-set`` rows);
  the mean is over the shared sets only;
- BANKING77's test split (3,080 rows) as one 77-way choice over readable intent names
  (never part of the general model's training or calibration);
- ``tests/data/noul_suite.jsonl``, hand-written yes/no cases (never trained on).

Each reports accuracy, top-label ECE (15 bins) and Brier. Run from the repo root:

    python -m benchmarks.general_model                       # the default engine
    python -m benchmarks.general_model --scorer similarity   # the bare similarity scorer
    python -m benchmarks.general_model --model DIR --name lodo_snli --only snli

Results go to ``benchmarks/results/general_model.json`` under ``--name``.
"""

from __future__ import annotations

import argparse
import json
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks._common import RESULTS, ROOT, machine, mixture_roots, percentiles, shared_data
from clef_engine import DecisionEngine
from clef_engine.calibration.metrics import brier_score, top_label_ece
from clef_engine.evaluation import columns, evaluate, label_question, read_records, sample_examples
from clef_engine.schema.questions import Noul
from clef_engine.schema.request import build_request
from clef_engine.train.mixture import Item, MixtureSampler, load_mixture

SUITE = ROOT / "tests" / "data" / "noul_suite.jsonl"
OUT = RESULTS / "general_model.json"


def score_items(engine: DecisionEngine, items: list[Item], batch: int = 64) -> dict[str, Any]:
    """Accuracy, ECE and Brier of ``engine`` on ``items`` (each its own question)."""
    correct, confidence, briers = [], [], []
    for start in range(0, len(items), batch):
        chunk = items[start : start + batch]
        results = engine.decide_batch(
            [build_request(it.state, {"q": it.question}, engine.model_name) for it in chunk]
        )
        for it, result in zip(chunk, results, strict=True):
            answer = result.answers["q"]
            probs = _probabilities(answer)
            top = int(np.argmax(probs))
            correct.append(top == it.label)
            confidence.append(float(probs[top]))
            briers.append(brier_score(np.array([probs]), np.array([it.label])))
    return {
        "n": len(items),
        "accuracy": round(float(np.mean(correct)), 4),
        "ece": round(top_label_ece(np.array(confidence), np.array(correct)), 4),
        "brier": round(float(np.mean(briers)), 4),
    }


def _probabilities(answer: Any) -> np.ndarray:
    if answer.type == "noul":
        return np.array([answer.noul, 1.0 - answer.noul])
    return np.array(list(answer.probabilities.values()))


def banking77(engine: DecisionEngine, examples_per_intent: int = 0) -> dict[str, Any]:
    """BANKING77's test split as one 77-way choice, asked as ``benchmarks.banking77_engine``
    asks it; with ``examples_per_intent``, that many prototypes per intent from
    ``train.csv`` (seed 0)."""
    data = shared_data() / "banking77"
    texts, labels = columns(read_records(data / "test.csv"), "text", "category")
    intents = json.loads((data / "categories.json").read_text())
    examples = None
    if examples_per_intent:
        train = columns(read_records(data / "train.csv"), "text", "category")
        examples, _ = sample_examples(*train, examples_per_intent, seed=0)
    report = evaluate(engine, texts, labels, label_question(intents, examples), batch_size=64)
    summary = report.summary()
    return {k: summary[k] for k in ("n", "accuracy", "macro_f1", "ece", "brier") if k in summary}


def suite_items(path: Path = SUITE) -> list[Item]:
    out = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.strip():
            case = json.loads(line)
            q = Noul(instructions=case["question"])
            out.append(Item(case["state"], q, 0 if case["answer"] else 1, case["category"]))
    return out


def latency(engine: DecisionEngine, n: int = 200) -> dict[str, float]:
    """Single ``decide`` calls on BANKING77 test states, one 77-option question."""
    data = shared_data() / "banking77"
    texts, _ = columns(read_records(data / "test.csv"), "text", "category")
    question = {"q": label_question(json.loads((data / "categories.json").read_text()))}
    for text in texts[:10]:
        engine.decide(text, question)
    times = []
    for text in texts[:n]:
        t0 = time.perf_counter()
        engine.decide(text, question)
        times.append((time.perf_counter() - t0) * 1000.0)
    return percentiles(times)


def latency_ab(rounds: int = 5, n: int = 100) -> dict[str, Any]:
    """The general model against the similarity scorer, fp32 and int8, measured in
    alternating rounds in one process, so both see the same machine state."""
    engines = {
        f"{scorer}_{mode}": DecisionEngine(scorer=scorer, quantize=quant)
        for scorer in ("general", "similarity")
        for mode, quant in (("fp32", None), ("int8", "int8"))
    }
    times: dict[str, list[float]] = {k: [] for k in engines}
    for _ in range(rounds):
        for name, engine in engines.items():
            lat = latency(engine, n)
            times[name].append(lat["p50_ms"])
    out: dict[str, Any] = {k: {"p50_ms_per_round": v, "p50_ms_median": float(np.median(v))}
                           for k, v in times.items()}  # fmt: skip
    for mode in ("fp32", "int8"):
        ratio = out[f"general_{mode}"]["p50_ms_median"] / out[f"similarity_{mode}"]["p50_ms_median"]
        out[f"ratio_{mode}"] = round(ratio, 3)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--name", default=None, help="section of the results JSON (default, or latency_ab)"
    )
    parser.add_argument("--model", default=None, help="a model dir (default: the default engine)")
    parser.add_argument("--scorer", default=None, help="DecisionEngine(scorer=...)")
    parser.add_argument("--quantize", default=None, choices=[None, "int8"])
    parser.add_argument("--per-set", type=int, default=500)
    parser.add_argument("--only", nargs="*", default=None, help="mixture sets to score")
    parser.add_argument("--skip-banking77", action="store_true")
    parser.add_argument("--latency", action="store_true")
    parser.add_argument("--ten-shot", action="store_true", help="BANKING77 10-shot, seed 0")
    parser.add_argument("--latency-ab", action="store_true", help="only the latency A/B")
    args = parser.parse_args()
    args.name = args.name or ("latency_ab" if args.latency_ab else "default")
    if args.latency_ab:
        results = json.loads(OUT.read_text()) if OUT.is_file() else {}
        results[args.name] = {"latency_ab": latency_ab(), "machine": machine(),
                              "date": time.strftime("%Y-%m-%d")}  # fmt: skip
        print(results[args.name], flush=True)
        OUT.write_text(json.dumps(results, indent=2) + "\n")
        return

    kwargs: dict[str, Any] = {"quantize": args.quantize}
    if args.model:
        engine = DecisionEngine.from_pretrained(args.model, **kwargs)
    else:
        if args.scorer:
            kwargs["scorer"] = args.scorer
        engine = DecisionEngine(**kwargs)
    report: dict[str, Any] = {
        "engine": engine.model_version,
        "model": args.model,
        "scorer": args.scorer,
        "quantize": args.quantize,
        "machine": machine(),
        "date": time.strftime("%Y-%m-%d"),
    }
    tests = load_mixture(mixture_roots(), split="test")
    sampler = MixtureSampler(tests, seed=0)
    sets: dict[str, Any] = {}
    for name in args.only or sorted(tests):
        sets[name] = score_items(engine, sampler.canonical(name, limit=args.per_set))
        print(name, sets[name], flush=True)
    report["mixture_test"] = sets
    shared = [n for n in sets if (mixture_roots()[0] / n).is_dir()]
    if shared:  # the 12 shared sets, so runs with and without a set built here compare
        report["mixture_mean_accuracy"] = round(
            float(np.mean([sets[n]["accuracy"] for n in shared])), 4
        )
    suite = suite_items()
    report["noul_suite"] = score_items(engine, suite)
    by_category: dict[str, list[Item]] = defaultdict(list)
    for it in suite:
        by_category[it.source].append(it)
    report["noul_suite_by_category"] = {
        c: score_items(engine, its)["accuracy"] for c, its in sorted(by_category.items())
    }
    print("noul suite", report["noul_suite"], report["noul_suite_by_category"], flush=True)
    if not args.skip_banking77:
        report["banking77_zero_shot"] = banking77(engine)
        print("banking77", report["banking77_zero_shot"], flush=True)
        if args.ten_shot:
            report["banking77_ten_shot_seed0"] = banking77(engine, 10)
            print("banking77 10-shot", report["banking77_ten_shot_seed0"], flush=True)
        if args.latency:
            report["latency_ms_77_options"] = latency(engine)
            print("latency", report["latency_ms_77_options"], flush=True)
    results = json.loads(OUT.read_text()) if OUT.is_file() else {}
    results[args.name] = report
    OUT.write_text(json.dumps(results, indent=2) + "\n")
    print(f"wrote {OUT} [{args.name}]")


if __name__ == "__main__":
    main()
