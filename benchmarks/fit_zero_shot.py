"""Fit the zero-shot temperatures bundled with the embedded model.

Data: BANKING77 ``train.csv`` only (never the test split), from ../shared/data.
Writes ``engine/data/zero_shot_calibration.json``. Run from the repo root:

    python -m benchmarks.fit_zero_shot [--int8] [--data ../shared/data/banking77/train.csv]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from clef_engine import DecisionEngine
from clef_engine.calibration.temperature import BUNDLED, BUNDLED_INT8
from clef_engine.calibration.zero_shot_fit import fit_zero_shot
from clef_engine.evaluation import columns, read_records

ROOT = Path(__file__).resolve().parent.parent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", default=str(ROOT.parent / "shared/data/banking77/train.csv"))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--int8", action="store_true", help="fit for quantize='int8'")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    args.out = args.out or str(BUNDLED_INT8 if args.int8 else BUNDLED)
    texts, labels = columns(read_records(args.data), "text", "category", args.data)
    engine = DecisionEngine(quantize="int8" if args.int8 else None)
    started = time.perf_counter()
    source = (
        f"BANKING77 train.csv ({len(texts)} rows, not an evaluation set), "
        f"benchmarks/fit_zero_shot.py --seed {args.seed}" + (" --int8" if args.int8 else "")
    )
    calibrator = fit_zero_shot(engine, texts, labels, seed=args.seed, source=source)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(calibrator.to_dict(), indent=2) + "\n")
    print(json.dumps(calibrator.to_dict(), indent=2))
    print(f"fitted in {time.perf_counter() - started:.1f} s -> {out}")


if __name__ == "__main__":
    main()
