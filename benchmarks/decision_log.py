"""The decision log's cost: write throughput, and what it adds to ``decide_batch``.

Targets (issue 33): the log sustains >= 2,000 decisions/s of writes, and slows
``decide_batch`` by <= 5 %. Both use real results: the packaged engine answers BANKING77
test rows with the 77-intent question.

- **write throughput**: real results recorded as fast as the caller can (batches of 32,
  each with its own state text), timed until ``flush()`` returns (everything committed);
  the default settings, ``state="full"``.
- **decide_batch A/B**: the same batches through the bare engine and through
  ``log.wrap(engine)``, interleaved (bare, logged, logged, bare, ...) so load from other
  processes hits both alike; the median of per-batch times on each side. On a shared,
  loaded host the wall-clock difference is within the noise, so the CPU the log spends
  per decision (caller and writer thread, from the throughput run) is also reported as a
  share of the CPU the engine spends per decision (``log_cpu_share_pct``): the slowdown
  the log can cause when the CPU is the bottleneck, whatever the load from others.

Run: python benchmarks/decision_log.py                 (about 2 minutes on 2 CPU cores)
     python benchmarks/decision_log.py --repeats 40 --batch-size 64
"""

from __future__ import annotations

import argparse
import csv
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks._common import shared_data, write_result
from clef_agents.decision_log import DecisionLog
from clef_engine import Choice, DecisionEngine


def banking77(n: int) -> tuple[list[str], dict[str, Choice]]:
    root = shared_data() / "banking77"
    labels = json.loads((root / "categories.json").read_text())
    with (root / "test.csv").open(newline="") as fh:
        texts = [row["text"] for row in csv.DictReader(fh)][:n]
    question = Choice(
        instructions="Which banking intent does the customer message express?",
        criteria=[label.replace("_", " ") for label in labels],
    )
    return texts, {"intent": question}


def write_throughput(results: list[Any], questions: Any, total: int, batch: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "log.sqlite"
        log = DecisionLog(path)
        started = time.perf_counter()
        cpu0 = time.process_time()  # both threads: the caller's record calls and the writer
        record_s = 0.0
        done = 0
        while done < total:
            chunk = [results[(done + k) % len(results)] for k in range(batch)]
            states = [f"state {done + k}" for k in range(batch)]
            t0 = time.perf_counter()
            log.record_many(states, questions, chunk)
            record_s += time.perf_counter() - t0
            done += batch
        log.flush()
        elapsed = time.perf_counter() - started
        cpu = time.process_time() - cpu0
        stats = log.stats
        log.close()
        size = path.stat().st_size + sum(
            p.stat().st_size for p in Path(tmp).glob("log.sqlite-*") if p.exists()
        )
    return {
        "decisions": done,
        "written": stats["written"],
        "dropped": stats["dropped"],
        "seconds_to_committed": round(elapsed, 3),
        "decisions_per_s": round(stats["written"] / elapsed, 1),
        "record_call_us_per_decision": round(1e6 * record_s / done, 2),
        "cpu_us_per_decision": round(1e6 * cpu / max(1, stats["written"]), 1),
        "bytes_per_decision": round(size / max(1, stats["written"]), 1),
    }


def ab(engine: Any, texts: list[str], questions: Any, repeats: int, batch: int) -> dict[str, Any]:
    batches = [texts[i : i + batch] for i in range(0, len(texts) - batch + 1, batch)]
    with tempfile.TemporaryDirectory() as tmp:
        log = DecisionLog(Path(tmp) / "log.sqlite")
        logged = log.wrap(engine)
        for b in batches[:2]:  # warm both paths (option vectors, the writer's connection)
            engine.decide_batch(b, questions)
            logged.decide_batch(b, questions)
        bare_ms: list[float] = []
        logged_ms: list[float] = []
        bare_cpu: list[float] = []
        for r in range(repeats):
            b = batches[r % len(batches)]
            order = [(engine, bare_ms), (logged, logged_ms)]
            if r % 2:
                order.reverse()
            for runner, sink in order:
                t0, c0 = time.perf_counter(), time.process_time()
                runner.decide_batch(b, questions)
                sink.append(1000 * (time.perf_counter() - t0))
                if runner is engine:
                    bare_cpu.append(time.process_time() - c0)
        log.close()
        written = log.stats["written"]
    bare, with_log = statistics.median(bare_ms), statistics.median(logged_ms)
    return {
        "batch_size": batch,
        "repeats": repeats,
        "bare_median_ms": round(bare, 2),
        "logged_median_ms": round(with_log, 2),
        "overhead_pct": round(100 * (with_log - bare) / bare, 2),
        "pairwise_median_overhead_pct": round(
            100
            * statistics.median((lg - br) / br for br, lg in zip(bare_ms, logged_ms, strict=True)),
            2,
        ),
        "decisions_logged": written,
        "engine_cpu_us_per_decision": round(1e6 * statistics.median(bare_cpu) / batch, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=30, help="A/B pairs (default 30)")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--writes", type=int, default=20_000, help="decisions to write")
    args = parser.parse_args()
    texts, questions = banking77(max(256, args.batch_size * 8))
    engine = DecisionEngine()
    results = engine.decide_batch(texts[:64], questions)
    throughput = write_throughput(results, questions, args.writes, args.batch_size)
    print("write throughput:", throughput)
    overhead = ab(engine, texts, questions, args.repeats, args.batch_size)
    overhead["log_cpu_share_pct"] = round(
        100 * throughput["cpu_us_per_decision"] / overhead["engine_cpu_us_per_decision"], 2
    )
    print("decide_batch A/B:", overhead)
    out = write_result(
        "decision_log",
        {
            "data": "BANKING77 test rows, one 77-option choice question, packaged engine",
            "targets": {"decisions_per_s": ">= 2000", "decide_batch_overhead_pct": "<= 5"},
            "write_throughput": throughput,
            "decide_batch_ab": overhead,
            "settings": {"state": "full", "queue_size": 100_000, "flush_interval_s": 0.2},
        },
    )
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
