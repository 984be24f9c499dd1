"""Does the general model's calibration carry over to sets it never saw? Two probes.

The shipped temperatures are fitted per (type, option-count bucket) on held-out rows of
the sets the model trained on. On a left-out set (``benchmarks.general_lodo``) they
are within ECE 0.05 on only 2 of 12 sets. This probe tests two fixes that need no new
training, on the leave-one-dataset-out model dirs that ``benchmarks.general_lodo --out DIR``
leaves in ``DIR/SET``:

- **softening**: each type's temperatures times one factor ``k``. For each left-out set,
  ``k`` is the one minimising the pooled NLL on the *other* runs' left-out sets of the same
  type, so no set picks its own factor;
- **offsets** (contextual calibration, Zhao et al. 2021, "Calibrate Before Use"): subtract
  from every option score the score of a content-free state (``""``, ``"N/A"``,
  ``"[MASK]"``, ``"text"``; variant ``cf``) or of the mean calibration state (``mu``),
  at full or half weight, then refit the temperatures on the corrected calibration rows.

The shipped model gets the same treatments (``k`` from all twelve runs) and is scored on
the hand-written yes/no suite, BANKING77 and the mixture's test rows, none of which any
fit here sees. Uncalibrated scores are cached in each run dir (``probe_*.pkl``), so a rerun
only redoes the arithmetic.

    python -m benchmarks.general_lodo --out /tmp/lodo --steps 250 --batch-size 16
    python -m benchmarks.general_lodo_calibration --lodo /tmp/lodo

Results go to ``benchmarks/results/general_lodo_calibration.json``.
"""

from __future__ import annotations

import argparse
import json
import pickle
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from benchmarks._common import RESULTS, machine, mixture_roots, shared_data
from benchmarks.general_model import suite_items
from clef_engine import DecisionEngine
from clef_engine.calibration.fit import fit_calibrator
from clef_engine.calibration.metrics import top_label_ece
from clef_engine.calibration.temperature import Calibrator
from clef_engine.evaluation import columns, label_question, read_records
from clef_engine.runtime.general import GENERAL_DIR
from clef_engine.train import general
from clef_engine.train.mixture import TASKS, Item, MixtureSampler, load_mixture

OUT = RESULTS / "general_lodo_calibration.json"
CONTENT_FREE = ["", "N/A", "[MASK]", "text"]
FACTORS = np.exp(np.linspace(np.log(0.5), np.log(4.0), 43))
OFFSETS = {"cf": ("cf", 1.0), "cf_half": ("cf", 0.5), "mu": ("mu", 1.0), "mu_half": ("mu", 0.5)}

Parts = dict[str, dict[str, list[Any]]]


def _states(engine: DecisionEngine, texts: Sequence[str]) -> torch.Tensor:
    return torch.cat(
        [engine.backbone.encode(list(texts[i : i + 64])).pooled.float()
         for i in range(0, len(texts), 64)]
    )  # fmt: skip


def scores(engine: DecisionEngine, parts: dict[str, list[Item]], cal: list[Item]) -> Parts:
    """Per part: uncalibrated option scores, labels, types and sets, and the option scores
    of the content-free state (``cf``) and of the mean calibration state (``mu``)."""
    cf = _states(engine, CONTENT_FREE).mean(0)
    mu = _states(engine, [it.state for it in cal[::4]]).mean(0)
    out: Parts = {}
    for name, items in parts.items():
        vectors = [engine.prepare_question(it.question).vectors.float() for it in items]
        out[name] = {
            "logits": [x.numpy() for x in general.raw_logits(engine, items)],
            "labels": [it.label for it in items],
            "types": [str(it.question.type) for it in items],  # type: ignore[attr-defined]
            "sets": [it.source for it in items],
            "cf": [(cf @ v.T).numpy() for v in vectors],
            "mu": [(mu @ v.T).numpy() for v in vectors],
        }
    return out


def cached(path: Path, compute: Callable[[], Parts]) -> Parts:
    if path.is_file():
        return pickle.loads(path.read_bytes())
    data = compute()
    path.write_bytes(pickle.dumps(data))
    return data


def corrected(part: dict[str, list[Any]], offset: str | None, weight: float) -> list[Any]:
    if offset is None:
        return part["logits"]
    return [x - weight * o for x, o in zip(part["logits"], part[offset], strict=True)]


def fit(part: dict[str, list[Any]], logits: list[Any]) -> Calibrator:
    return fit_calibrator(
        [torch.tensor(x) for x in logits], part["labels"], part["types"], source="probe"
    )


def probabilities(
    cal: Calibrator, logits: list[Any], types: list[str], factors: dict[str, float] | None = None
) -> list[np.ndarray]:
    out = []
    for x, t in zip(logits, types, strict=True):
        z = x / (cal.temperature(t, len(x)) * (factors or {}).get(t, 1.0))
        e = np.exp(z - z.max())
        out.append(e / e.sum())
    return out


def summary(probs: list[np.ndarray], labels: list[int]) -> dict[str, float]:
    conf = np.array([p.max() for p in probs])
    correct = np.array([int(p.argmax()) == y for p, y in zip(probs, labels, strict=True)])
    nll = -np.mean([np.log(max(float(p[y]), 1e-12)) for p, y in zip(probs, labels, strict=True)])
    return {
        "n": len(labels),
        "accuracy": round(float(correct.mean()), 4),
        "ece": round(top_label_ece(conf, correct), 4),
        "nll": round(float(nll), 4),
    }


def best_factor(
    runs: dict[str, Parts], fitted: dict[str, Calibrator], names: Sequence[str], qtype: str
) -> float:
    """The factor minimising the pooled NLL of the left-out sets ``names`` of type ``qtype``."""
    chosen = [n for n in names if runs[n]["test"]["types"][0] == qtype]
    if not chosen:
        return 1.0
    losses = []
    for k in FACTORS:
        total = 0.0
        for n in chosen:
            test = runs[n]["test"]
            probs = probabilities(fitted[n], test["logits"], test["types"], {qtype: float(k)})
            total += summary(probs, test["labels"])["nll"] * len(test["labels"])
        losses.append(total)
    return float(FACTORS[int(np.argmin(losses))])


def variants(runs: dict[str, Parts], fitted: dict[str, Calibrator]) -> dict[str, dict[str, Any]]:
    """Every left-out set under each treatment (nested factors for ``softened``)."""
    out: dict[str, dict[str, Any]] = {v: {} for v in ("base", "softened", *OFFSETS)}
    for name, run in runs.items():
        test, cal = run["test"], run["cal"]
        qtype = test["types"][0]
        base = fitted[name]
        out["base"][name] = summary(probabilities(base, test["logits"], test["types"]),
                                    test["labels"])  # fmt: skip
        k = best_factor(runs, fitted, [n for n in runs if n != name], qtype)
        soft = probabilities(base, test["logits"], test["types"], {qtype: k})
        out["softened"][name] = {**summary(soft, test["labels"]), "factor": round(k, 3)}
        for label, (offset, weight) in OFFSETS.items():
            c = fit(cal, corrected(cal, offset, weight))
            probs = probabilities(c, corrected(test, offset, weight), test["types"])
            out[label][name] = summary(probs, test["labels"])
    for per_set in out.values():
        rows = [r for r in per_set.values() if isinstance(r, dict)]
        per_set["_mean"] = {
            "accuracy": round(float(np.mean([r["accuracy"] for r in rows])), 5),
            "ece": round(float(np.mean([r["ece"] for r in rows])), 5),
            "sets_within_0.05": sum(r["ece"] <= 0.05 for r in rows),
            "sets": len(rows),
        }
    return out


def shipped_parts() -> tuple[dict[str, list[Item]], list[Item]]:
    data = [str(mixture_roots()[0])]
    held = general.split_rows(load_mixture(data, split="train"), 0.1, 0)
    cal = general.calibration_items(held, 400, 0)
    tests = MixtureSampler(load_mixture(data, split="test"), seed=0)
    mixture = [it for name in sorted(TASKS) if name in tests.names
               for it in tests.canonical(name, limit=500)]  # fmt: skip
    b77 = shared_data() / "banking77"
    texts, labels = columns(read_records(b77 / "test.csv"), "text", "category")
    intents = list(dict.fromkeys(json.loads((b77 / "categories.json").read_text())))
    question = label_question(intents)
    banking = [
        Item(t, question, intents.index(y), "banking77") for t, y in zip(texts, labels, strict=True)
    ]
    return {"cal": cal, "suite": suite_items(), "b77": banking, "mix": mixture}, cal


def shipped(parts: Parts, factors: dict[str, float]) -> dict[str, dict[str, Any]]:
    """The shipped model on the suite, BANKING77 and each mixture set, per treatment."""
    cal = parts["cal"]
    treatments: dict[str, tuple[str | None, float, dict[str, float] | None]] = {
        "base": (None, 0.0, None),
        "softened": (None, 0.0, factors),
        **{k: (o, w, None) for k, (o, w) in OFFSETS.items()},
    }
    out: dict[str, dict[str, Any]] = {}
    for label, (offset, weight, fac) in treatments.items():
        calibrator = fit(cal, corrected(cal, offset, weight))
        entry: dict[str, Any] = {}
        for name in ("suite", "b77"):
            part = parts[name]
            probs = probabilities(calibrator, corrected(part, offset, weight), part["types"], fac)
            entry[name] = summary(probs, part["labels"])
        mix = parts["mix"]
        probs = probabilities(calibrator, corrected(mix, offset, weight), mix["types"], fac)
        sets = np.array(mix["sets"])
        per_set = []
        for s in sorted(set(mix["sets"])):
            idx = np.where(sets == s)[0]
            per_set.append(summary([probs[i] for i in idx], [mix["labels"][i] for i in idx]))
        entry["mixture"] = {
            "mean_accuracy": round(float(np.mean([r["accuracy"] for r in per_set])), 4),
            "mean_ece": round(float(np.mean([r["ece"] for r in per_set])), 4),
            "sets_within_0.05": sum(r["ece"] <= 0.05 for r in per_set),
            "sets": len(per_set),
        }
        out[label] = entry
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lodo", required=True, help="the --out folder of benchmarks.general_lodo")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    data = [str(mixture_roots()[0])]
    tests = MixtureSampler(load_mixture(data, split="test"), seed=0)
    root = Path(args.lodo)
    runs: dict[str, Parts] = {}
    for name in sorted(TASKS):
        model = root / name
        if not (model / "config.json").is_file():
            continue

        def compute(model: Path = model, name: str = name) -> Parts:
            held = general.split_rows(load_mixture(data, split="train", exclude=[name]), 0.1, 0)
            cal = general.calibration_items(held, 400, 0)
            engine = DecisionEngine.from_pretrained(
                model, calibrator=Calibrator(source="identity"), warmup=False
            )
            return scores(engine, {"cal": cal, "test": tests.canonical(name, limit=500)}, cal)

        runs[name] = cached(model / "probe_scores.pkl", compute)
        print(name, "scored", flush=True)

    def compute_shipped() -> Parts:
        parts, cal = shipped_parts()
        engine = DecisionEngine.from_pretrained(
            GENERAL_DIR, calibrator=Calibrator(source="identity"), warmup=False
        )
        return scores(engine, parts, cal)

    # Each run's own calibration, fitted once on its calibration rows.
    fitted = {n: fit(run["cal"], run["cal"]["logits"]) for n, run in runs.items()}
    factors = {t: best_factor(runs, fitted, list(runs), t) for t in ("noul", "choice", "score")}
    report = {
        "left_out": variants(runs, fitted),
        "factors_from_all_runs": {t: round(k, 3) for t, k in factors.items()},
        "shipped": shipped(cached(root / "probe_shipped_scores.pkl", compute_shipped), factors),
        "machine": machine(),
    }
    OUT.write_text(json.dumps(report, indent=2) + "\n")
    for label, per_set in report["left_out"].items():
        print(label, per_set["_mean"], report["shipped"][label], flush=True)


if __name__ == "__main__":
    main()
