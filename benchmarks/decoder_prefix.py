"""Shared-prefix option scoring against naive per-option scoring, on this machine's CPU.

A small random Qwen3 config (built in code, nothing downloaded) scores one choice question
with 2, 16 and 64 options about a 512-token state, two ways:

- ``shared``: the state + question prefilled once, every option in one tree-masked forward;
- ``naive``: one full causal forward over state + question + option per option (batched).

Both give the same scores (checked, ``max_abs_diff``). Reported: median / p95 wall time,
FLOPs counted by ``torch.utils.flop_counter`` (matmuls and attention), tokens processed,
and the marginal cost of one more option.

Run:  python benchmarks/decoder_prefix.py        (~3 minutes on 2 idle cores)
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from torch.utils.flop_counter import FlopCounterMode

from clef_engine.backbones.decoder import DecoderBackbone
from clef_engine.backbones.decoder.prompt import BETWEEN, plan
from clef_engine.backbones.decoder.testing import write_tiny_causal_lm
from clef_engine.backbones.decoder.tree import Group, Row
from clef_engine.schema.questions import Choice

OUT = Path(__file__).resolve().parent / "results" / "decoder_prefix.json"
WORDS = "the card payment was blocked after my transfer and the refund never arrived".split()


def state_text(bb: DecoderBackbone, n_tokens: int) -> str:
    words: list[str] = []
    while len(bb._ids(" ".join(words))) < n_tokens + 8:
        words.extend(WORDS)
    ids = bb._ids(" ".join(words))[:n_tokens]
    return str(bb.tokenizer.decode(ids))


def build_row(bb: DecoderBackbone, state: str, n_options: int) -> Row:
    question = Choice(
        instructions="Which label fits the state best?",
        criteria=dict.fromkeys(f"label_{i}" for i in range(n_options)),
    )
    return bb._row(state, [bb._plan(question)])


def timed(fn: Any) -> float:
    start = time.perf_counter()
    fn()
    return (time.perf_counter() - start) * 1000.0


def order_sensitivity(bb: DecoderBackbone, n_states: int = 8) -> dict[str, Any]:
    """How much a 4-option answer moves with the listing order, single listing vs rotated.

    Each state is scored under the 4 cyclic rotations of the option list (one group per
    rotation, one tree). ``spread``: mean over states and options of max - min probability
    across listings (what a single, fixed listing exposes the answer to);
    ``first_position_mass``: mean probability of whichever option is listed first (0.25
    without position bias). The rotated average is the same for every listing by
    construction, so its spread is 0.
    """
    question = Choice(
        instructions="Which team handles this?", criteria=dict.fromkeys(["a1", "b2", "c3", "d4"])
    )
    p = plan(question, 4)
    blocks = [bb._ids(BETWEEN + b + bb.frame.tail) for b in p.blocks]
    answers = [bb._ids(bb.frame.answer_prefix + a + bb.frame.end) for a in p.answers]
    states = [f"ticket {i}: " + " ".join(WORDS[i:] + WORDS[:i]) for i in range(n_states)]
    rows = [Row(bb._head + bb._ids(s), [Group(b, answers) for b in blocks]) for s in states]
    spread, first = [], []
    for per_listing in bb.scorer.score(rows):
        probs = torch.stack([torch.softmax(x, dim=-1) for x in per_listing])  # [listing, option]
        spread.append(float((probs.max(0).values - probs.min(0).values).mean()))
        # Options are named in sorted order, so listing r starts with option r.
        first.append(float(torch.stack([probs[r, r] for r in range(4)]).mean()))
    return {
        "options": 4,
        "states": n_states,
        "single_listing_spread": round(statistics.mean(spread), 4),
        "rotated_spread": 0.0,
        "first_position_mass": round(statistics.mean(first), 4),
        "note": "random weights: shows the mechanism, not a real model's bias",
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--state-tokens", type=int, default=512)
    parser.add_argument("--options", type=int, nargs="+", default=[2, 16, 64])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--naive-repeats", type=int, default=2)
    parser.add_argument(
        "--threads", type=int, default=1, help="torch threads (1: robust on a shared machine)"
    )
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    directory = write_tiny_causal_lm(
        tempfile.mkdtemp(prefix="clef-bench-qwen3-"),
        arch="qwen3",
        hidden_size=args.hidden,
        layers=args.layers,
        heads=8,
        kv_heads=4,
        intermediate_size=3 * args.hidden,
    )
    bb = DecoderBackbone(directory, device="cpu", rotations=1, prior=None)
    params = sum(p.numel() for p in bb.model.parameters())
    state = state_text(bb, args.state_tokens)
    rows_out = []
    with torch.inference_mode():
        warm = build_row(bb, state, 2)
        bb.scorer.score([warm])
        bb.scorer.score_naive([warm])
        for n in args.options:
            row = build_row(bb, state, n)
            # One counted run each gives the FLOPs and the scores compared below.
            with FlopCounterMode(display=False) as counter:
                shared = bb.scorer.score([row])[0][0]
            f_shared = int(counter.get_total_flops())
            with FlopCounterMode(display=False) as counter:
                naive = bb.scorer.score_naive([row])[0][0]
            f_naive = int(counter.get_total_flops())
            # Interleaved, so that load from other processes hits both alike.
            t_shared, t_naive = [], []
            for r in range(args.repeats):
                t_shared.append(timed(lambda row=row: bb.scorer.score([row])))
                if r < args.naive_repeats:
                    t_naive.append(timed(lambda row=row: bb.scorer.score_naive([row])))
            prompt = len(row.prefix) + len(row.groups[0].block)
            answers = sum(len(o) for o in row.groups[0].options)
            entry = {
                "options": n,
                "prompt_tokens": prompt,
                "answer_tokens": answers,
                "tokens_shared": len(row.prefix) + row.tree_length(),
                "tokens_naive": n * prompt + answers,
                "shared_ms_p50": round(statistics.median(t_shared), 2),
                "shared_ms_p95": round(sorted(t_shared)[int(0.95 * (len(t_shared) - 1))], 2),
                "shared_ms_min": round(min(t_shared), 2),
                "naive_ms_p50": round(statistics.median(t_naive), 2),
                "naive_ms_min": round(min(t_naive), 2),
                "speedup": round(statistics.median(t_naive) / statistics.median(t_shared), 2),
                "shared_gflops": round(f_shared / 1e9, 3),
                "naive_gflops": round(f_naive / 1e9, 3),
                "flop_ratio": round(f_naive / f_shared, 2),
                "max_abs_diff": float((shared - naive).abs().max()),
            }
            rows_out.append(entry)
            print(json.dumps(entry))
    # Marginal cost of one more option: flat for shared (its own tokens only), a whole
    # prompt for naive.
    first, last = rows_out[0], rows_out[-1]
    extra = max(1, last["options"] - first["options"])
    marginal = {
        "shared_mflops_per_option": round(
            (last["shared_gflops"] - first["shared_gflops"]) * 1e3 / extra, 2
        ),
        "naive_mflops_per_option": round(
            (last["naive_gflops"] - first["naive_gflops"]) * 1e3 / extra, 2
        ),
    }
    with torch.inference_mode():
        order = order_sensitivity(bb)
    print(json.dumps(order))
    result = {
        "benchmark": "decoder_prefix",
        "command": "python benchmarks/decoder_prefix.py",
        "model": {
            "arch": "qwen3 (random)",
            "hidden_size": args.hidden,
            "layers": args.layers,
            "parameters": params,
            "vocab_size": int(bb.model.config.vocab_size),
        },
        "state_tokens": args.state_tokens,
        "machine": {
            "cpu": platform.processor() or platform.machine(),
            "torch_threads": torch.get_num_threads(),
            "torch": torch.__version__,
        },
        "results": rows_out,
        "marginal": marginal,
        "order_sensitivity": order,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(marginal))


if __name__ == "__main__":
    main()
