"""Leave-one-dataset-out for the general decision model: train without a set, test on it.

For each named set (default: all twelve) this trains ``engine.train.general`` with
``--exclude SET`` into ``OUT/SET`` (resumable: a rerun continues each run's checkpoint and
skips finished ones), then scores the model on that set's test split with the set's own
question (``benchmarks.general_model``), next to the bare similarity scorer. Results go to
``benchmarks/results/general_lodo.json``. Each run trains as long as the shipped model did
(700 steps), so all twelve are meant for a CUDA device (``--device cuda``).

    python -m benchmarks.general_lodo --out /tmp/lodo --sets snli cr --device cuda
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from benchmarks._common import RESULTS, machine, shared_data
from benchmarks.general_model import score_items
from engine import DecisionEngine
from engine.train import general
from engine.train.mixture import TASKS, MixtureSampler, load_mixture

OUT = RESULTS / "general_lodo.json"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="folder for the per-set model dirs")
    parser.add_argument("--sets", nargs="*", default=sorted(TASKS))
    parser.add_argument("--steps", type=int, default=700)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--per-set", type=int, default=500, help="test rows scored per set")
    args = parser.parse_args()
    data = shared_data() / "decision-mix"
    tests = MixtureSampler(load_mixture(data, split="test"), seed=0)
    similarity = DecisionEngine(scorer="similarity")
    results = json.loads(OUT.read_text()) if OUT.is_file() else {}
    for name in args.sets:
        model = Path(args.out) / name
        if not (model / "config.json").is_file():
            code = general.main(
                ["--data", str(data), "--out", str(model), "--exclude", name,
                 "--steps", str(args.steps), "--lr", "1e-3", "--batch-size", "24",
                 "--device", args.device]
            )  # fmt: skip
            if code != 0:
                raise SystemExit(code)
        items = tests.canonical(name, limit=args.per_set)
        results[name] = {
            "left_out": score_items(DecisionEngine.from_pretrained(model), items),
            "similarity_scorer": score_items(similarity, items),
            "steps": args.steps,
            "machine": machine(),
        }
        print(name, results[name]["left_out"], results[name]["similarity_scorer"], flush=True)
        OUT.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
