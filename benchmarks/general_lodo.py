"""Leave-one-dataset-out for the general decision model: train without a set, test on it.

For each named set (default: all twelve) this trains ``clef_engine.train.general`` with
``--exclude SET`` into ``OUT/SET`` (resumable: a rerun continues each run's checkpoint and
skips finished ones), then scores the model on that set's test split with the set's own
question (``benchmarks.general_model``), next to the bare similarity scorer. Results go to
``benchmarks/results/general_lodo.json``. Each run trains as long as the shipped model did
(700 steps) by default, so all twelve are meant for a CUDA device (``--device cuda``); on
CPU, ``--steps`` and ``--batch-size`` shorten every run (the JSON records both), and the
shipped model (trained on every set) is scored on the same rows as the in-distribution
reference.

    python -m benchmarks.general_lodo --out /tmp/lodo --sets snli cr --device cuda
    python -m benchmarks.general_lodo --out /tmp/lodo --steps 250 --batch-size 16
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from benchmarks._common import RESULTS, machine, mixture_roots
from benchmarks.general_model import score_items
from clef_engine import DecisionEngine
from clef_engine.train import general
from clef_engine.train.mixture import TASKS, MixtureSampler, load_mixture

OUT = RESULTS / "general_lodo.json"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="folder for the per-set model dirs")
    parser.add_argument("--sets", nargs="*", default=sorted(TASKS))
    parser.add_argument("--steps", type=int, default=700)
    parser.add_argument("--batch-size", type=int, default=24)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--per-set", type=int, default=500, help="test rows scored per set")
    args = parser.parse_args()
    # Trained on the shared sets, as the shipped model was (not on a set built here).
    data = [str(mixture_roots()[0])]
    tests = MixtureSampler(load_mixture(data, split="test"), seed=0)
    similarity = DecisionEngine(scorer="similarity")
    shipped = DecisionEngine()
    results = json.loads(OUT.read_text()) if OUT.is_file() else {}
    for name in args.sets:
        model = Path(args.out) / name
        if not (model / "config.json").is_file():
            code = general.main(
                ["--data", *data, "--out", str(model), "--exclude", name,
                 "--steps", str(args.steps), "--lr", "1e-3",
                 "--batch-size", str(args.batch_size), "--device", args.device]
                + (["--threads", str(args.threads)] if args.threads else [])
            )  # fmt: skip
            if code != 0:
                raise SystemExit(code)
        items = tests.canonical(name, limit=args.per_set)
        results[name] = {
            "left_out": score_items(DecisionEngine.from_pretrained(model), items),
            "similarity_scorer": score_items(similarity, items),
            "shipped_general_in_distribution": score_items(shipped, items),
            "steps": args.steps,
            "batch_size": args.batch_size,
            "train_seconds": json.loads((model / "train.json").read_text()).get("seconds"),
            "machine": machine(),
        }
        print(name, results[name]["left_out"], results[name]["similarity_scorer"], flush=True)
        OUT.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
