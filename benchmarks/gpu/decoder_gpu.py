"""Decoder backbone on a CUDA GPU: latency and throughput of shared-prefix scoring.

Builds a random Qwen3 config of Qwen3-1.7B's shape (hidden 2048, 28 layers, 16/8 heads,
vocab 151936; ~1.7B parameters) in code, saves it in bf16 to a temporary dir, loads it
through :class:`DecoderBackbone` (memory estimate, bf16, SDPA) and measures, for 1, 16 and
64 options and batch 1 and 32 (512-token states):

- ``p50_ms`` / ``p95_ms``: prefill + tree forward + LM head, synchronised;
- ``decisions_per_s`` and ``tokens_per_s`` (prompt + answer tokens processed);
- ``peak_gib``: peak allocated memory; the loader's estimate is reported beside it;
- the naive per-option reference at batch 1, for the speed-up.

Run via ``bash benchmarks/gpu/run.sh`` (see there). Writes
``benchmarks/results/decoder_gpu.json``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

OUT = Path(__file__).resolve().parents[1] / "results" / "decoder_gpu.json"
WORDS = "the card payment was blocked after my transfer and the refund never arrived".split()


def build_model(directory: Path, quick: bool, smoke: bool, device: str) -> dict[str, Any]:
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from clef_engine.backbones.decoder.testing import tiny_tokenizer

    shape: dict[str, Any] = {
        "hidden_size": 2048,
        "num_hidden_layers": 28,
        "intermediate_size": 6144,
    }
    if quick:
        shape = {"hidden_size": 1024, "num_hidden_layers": 8, "intermediate_size": 3072}
    if smoke:
        shape = {"hidden_size": 128, "num_hidden_layers": 2, "intermediate_size": 256}
    tokenizer = tiny_tokenizer(chat_template=True)
    config = Qwen3Config(
        vocab_size=151936,
        num_attention_heads=16,
        num_key_value_heads=8,
        head_dim=128,
        max_position_embeddings=40960,
        tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        **shape,
    )
    torch.manual_seed(0)
    with torch.device(device):
        model: Any = Qwen3ForCausalLM(config)
        model = model.to(torch.bfloat16)
    model.save_pretrained(str(directory), safe_serialization=True)
    tokenizer.save_pretrained(str(directory))
    params = sum(p.numel() for p in model.parameters())
    del model
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return {"arch": "qwen3 (random)", "parameters": params, **shape}


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--compile", action="store_true")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--state-tokens", type=int, default=512)
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument(
        "--smoke", action="store_true", help="tiny shape, any device: checks the script runs"
    )
    args = parser.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    if device != "cuda" and not args.smoke:
        raise SystemExit("no CUDA GPU visible to torch")
    repeats = 2 if args.smoke else 5 if args.quick else args.repeats
    cuda = device == "cuda"

    def sync() -> None:
        if cuda:
            sync()

    def peak_gib() -> float | None:
        return round(torch.cuda.max_memory_allocated() / 2**30, 2) if cuda else None

    from clef_engine.backbones.decoder import DecoderBackbone
    from clef_engine.backbones.decoder.tree import Group, Row
    from clef_engine.schema.questions import Choice

    directory = Path(tempfile.mkdtemp(prefix="clef-gpu-qwen3-"))
    started = time.perf_counter()
    model_info = build_model(directory, args.quick, args.smoke, device)
    build_s = time.perf_counter() - started
    started = time.perf_counter()
    bb = DecoderBackbone(
        directory,
        device=device,
        rotations=1,
        prior=None,
        max_batch_tokens=1 << 17,
        compile=args.compile,
    )
    load_s = time.perf_counter() - started
    words: list[str] = []
    while len(bb._ids(" ".join(words))) < args.state_tokens + 8:
        words.extend(WORDS)
    base_ids = bb._ids(" ".join(words))

    def rows(batch: int, n_options: int) -> list[Row]:
        names = [f"label_{i}" for i in range(max(2, n_options))]
        _, blocks, answers = bb._plan(
            Choice(instructions="Which label fits?", criteria=dict.fromkeys(names))
        )
        out = []
        for b in range(batch):
            # Distinct states per row (rotated words), same length.
            state = base_ids[b % 7 :][: args.state_tokens]
            out.append(Row(bb._head + state, [Group(blocks[0], answers[:n_options])]))
        return out

    def measure(fn: Any, n: int) -> list[float]:
        for _ in range(3):
            fn()
        sync()
        times = []
        for _ in range(n):
            sync()
            start = time.perf_counter()
            fn()
            sync()
            times.append((time.perf_counter() - start) * 1000.0)
        return times

    results = []
    with torch.inference_mode():
        for batch in (1, 2) if args.smoke else (1, 32):
            for n_options in (1, 4) if args.smoke else (1, 16, 64):
                rs = rows(batch, n_options)
                if cuda:
                    torch.cuda.reset_peak_memory_stats()
                times = measure(lambda rs=rs: bb.scorer.score(rs), repeats)
                tokens = sum(len(r.prefix) + r.tree_length() for r in rs)
                p50 = statistics.median(times)
                entry: dict[str, Any] = {
                    "batch": batch,
                    "options": n_options,
                    "p50_ms": round(p50, 2),
                    "p95_ms": round(percentile(times, 0.95), 2),
                    "decisions_per_s": round(batch / (p50 / 1000.0), 1),
                    "tokens_per_s": round(tokens / (p50 / 1000.0)),
                    "tokens": tokens,
                    "peak_gib": peak_gib(),
                }
                if batch == 1 and n_options > 1:
                    naive = measure(lambda rs=rs: bb.scorer.score_naive(rs), max(3, repeats // 4))
                    entry["naive_p50_ms"] = round(statistics.median(naive), 2)
                    entry["speedup_vs_naive"] = round(statistics.median(naive) / p50, 2)
                    diff = (bb.scorer.score(rs)[0][0] - bb.scorer.score_naive(rs)[0][0]).abs()
                    entry["max_abs_diff_vs_naive"] = float(diff.max())
                results.append(entry)
                print(json.dumps(entry), flush=True)
    report = {
        "benchmark": "decoder_gpu",
        "command": "bash benchmarks/gpu/run.sh"
        + (" --quick" if args.quick else "")
        + (" --compile" if args.compile else ""),
        "device": torch.cuda.get_device_name(0) if cuda else "cpu (smoke run)",
        "torch": torch.__version__,
        "dtype": str(bb.dtype).replace("torch.", ""),
        "attention": "sdpa",
        "compile": args.compile,
        "model": model_info,
        "state_tokens": args.state_tokens,
        "build_s": round(build_s, 1),
        "load_s": round(load_s, 1),
        "memory_estimate_gib": round(bb.memory.total_bytes / 2**30, 2),
        "results": results,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
