"""Adapter strength probe for the general model: scale the LoRA update by ``lambda``.

Interpolating between the bare encoder (``lambda = 0``) and the trained adapter
(``lambda = 1``) is the LoRA form of weight-space ensembling (WiSE-FT, Wortsman et al.
2022), which often keeps most of the in-distribution gain while losing less on data the
adapter never saw. For each ``lambda`` this copies a model dir, multiplies its ``lora_B``
weights by ``lambda`` (:func:`scale_lora_update`), refits the
per-type temperatures on the same held-out mixture training rows
``clef_engine.train.general`` uses (never on an evaluation set), and scores it as
``benchmarks.general_model`` does. With ``--lodo DIR`` it also scores the
leave-one-dataset-out models in ``DIR/SET`` on the set each never saw.

    python -m benchmarks.general_scale --scales 1.0 0.75 0.5
    python -m benchmarks.general_scale --scales 1.0 0.5 --lodo /tmp/lodo --skip-default

Results go to ``benchmarks/results/general_scale.json``.
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks._common import RESULTS, machine, mixture_roots
from benchmarks.general_model import banking77, score_items, suite_items
from clef_engine import DecisionEngine
from clef_engine.calibration.temperature import Calibrator
from clef_engine.runtime.general import GENERAL_DIR
from clef_engine.train import general
from clef_engine.train.mixture import MixtureSampler, load_mixture

OUT = RESULTS / "general_scale.json"


def scale_lora_update(weights: Path, scale: float) -> None:
    """Multiply every ``lora_B`` matrix in ``weights`` by ``scale``: the merged update
    ``B @ A`` scales with it."""
    from safetensors.torch import load_file, save_file

    tensors = load_file(str(weights))
    if not any(".lora_B." in k for k in tensors):
        raise ValueError(f"{weights}: no lora_B weights to scale")
    save_file({k: v * scale if ".lora_B." in k else v for k, v in tensors.items()}, str(weights))


def scaled_copy(model: Path, scale: float, into: Path, exclude: list[str]) -> Path:
    """``model`` with its LoRA update scaled by ``scale`` and recalibrated, in ``into``."""
    shutil.copytree(model, into, ignore=shutil.ignore_patterns("checkpoint"))
    if scale != 1.0:
        scale_lora_update(into / "adapter" / "adapter_model.safetensors", scale)
    sets = load_mixture(mixture_roots(), split="train", exclude=exclude)
    held = general.split_rows(sets, 0.1, 0)
    items = general.calibration_items(held, 400, 0)
    engine = DecisionEngine.from_pretrained(
        into, calibrator=Calibrator(source="identity"), warmup=False
    )
    source = f"held-out decision-mix training rows ({len(items)} questions), scale {scale}"
    model_config = json.loads((into / "config.json").read_text())
    model_config["calibration"] = general.fit_general_calibration(engine, items, source).to_dict()
    model_config.pop("calibration_int8", None)
    (into / "config.json").write_text(json.dumps(model_config, indent=2) + "\n")
    return into


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scales", nargs="+", type=float, default=[1.0, 0.75, 0.5])
    parser.add_argument("--model", default=str(GENERAL_DIR))
    parser.add_argument("--per-set", type=int, default=300, help="mixture test rows per set")
    parser.add_argument("--lodo", default=None, help="folder of leave-one-out model dirs")
    parser.add_argument("--skip-default", action="store_true")
    args = parser.parse_args()
    tests = MixtureSampler(load_mixture(mixture_roots(), split="test"), seed=0)
    results = json.loads(OUT.read_text()) if OUT.is_file() else {}
    with tempfile.TemporaryDirectory() as tmp:
        for scale in args.scales:
            tag = f"scale_{scale:g}"
            if not args.skip_default:
                engine = DecisionEngine.from_pretrained(
                    scaled_copy(Path(args.model), scale, Path(tmp) / tag, [])
                )
                report: dict[str, Any] = {"scale": scale, "machine": machine()}
                mixture = {n: score_items(engine, tests.canonical(n, limit=args.per_set))
                           for n in sorted(tests.sets)}  # fmt: skip
                report["mixture_test"] = mixture
                report["mixture_mean_accuracy"] = round(
                    sum(s["accuracy"] for s in mixture.values()) / len(mixture), 4
                )
                report["noul_suite"] = score_items(engine, suite_items())
                report["banking77_zero_shot"] = banking77(engine)
                print(tag, report["mixture_mean_accuracy"], report["noul_suite"],
                      report["banking77_zero_shot"], flush=True)  # fmt: skip
                results[tag] = report
                OUT.write_text(json.dumps(results, indent=2) + "\n")
            if args.lodo:
                lodo: dict[str, Any] = {}
                for left in sorted(p.name for p in Path(args.lodo).iterdir()):
                    copy = scaled_copy(Path(args.lodo) / left, scale, Path(tmp) / f"{tag}_{left}",
                                       [left])  # fmt: skip
                    items = tests.canonical(left, limit=500)
                    lodo[left] = score_items(DecisionEngine.from_pretrained(copy), items)
                    print(tag, "lodo", left, lodo[left], flush=True)
                accs = [v["accuracy"] for v in lodo.values()]
                results[f"lodo_{tag}"] = {
                    "left_out": lodo,
                    "mean_accuracy": round(sum(accs) / len(accs), 4),
                    "machine": machine(),
                    "date": time.strftime("%Y-%m-%d"),
                }
                OUT.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
