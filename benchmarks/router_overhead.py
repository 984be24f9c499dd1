"""ClefRouter overhead over a bare ``engine.decide``, and ``ClefRouter.batch`` vs
``engine.decide_batch``.

Targets (issue 4): router overhead <= 5 % per call; ``ClefRouter.batch`` of 64 within
1.2x of ``engine.decide_batch``. Calls are interleaved (bare, router, bare, ...) so load
from other processes hits both sides alike; medians are reported.

Run: python benchmarks/router_overhead.py            (a minute or two on a quiet CPU)
     python benchmarks/router_overhead.py --device cuda
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from langchain_core.runnables import RunnableLambda

from clef_agents import Choice, DecisionEngine
from clef_agents.fake import FakeEngine
from clef_agents.langchain import ClefRouter
from clef_agents.resilience import ResilientEngine, RuleFallback

QUESTION = Choice(
    instructions="Which team should handle this support ticket?",
    criteria={
        "billing": "payments, charges, refunds, invoices",
        "technical": "bugs, errors, crashes, login problems",
        "sales": "pricing, plans, demos, upgrades",
        "other": None,
    },
)
STATES = [
    "I was charged twice for my subscription, please refund one payment.",
    "The app crashes whenever I open the settings page on Android.",
    "Could we get a demo of the enterprise plan for forty people?",
    "Where can I download last month's invoice as a PDF?",
    "Login fails with error 500 since this morning.",
    "How much does an extra seat cost on the team plan?",
    "My card payment was declined but the money left my account.",
    "The export button does nothing in Firefox.",
]


def _timed(fn: Callable[[], Any]) -> float:
    started = time.perf_counter()
    fn()
    return (time.perf_counter() - started) * 1000.0


def _summary(bare: list[float], wrapped: list[float]) -> dict[str, Any]:
    b, w = statistics.median(bare), statistics.median(wrapped)
    return {
        "bare_median_ms": round(b, 3),
        "router_median_ms": round(w, 3),
        "bare_mean_ms": round(statistics.fmean(bare), 3),
        "router_mean_ms": round(statistics.fmean(wrapped), 3),
        "overhead_ms": round(w - b, 3),
        "ratio": round(w / b, 4),
        "overhead_pct": round(100.0 * (w / b - 1.0), 2),
        "samples": len(bare),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default=None)
    parser.add_argument("--calls", type=int, default=300, help="single calls per side")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=20, help="batches per side")
    parser.add_argument(
        "--out", type=Path, default=Path(__file__).parent / "results" / "router_overhead.json"
    )
    args = parser.parse_args()

    engine = DecisionEngine(device=args.device)
    questions = {"route": QUESTION}
    routes = {name: RunnableLambda(lambda x: x) for name in ["billing", "technical", "sales"]}
    router = ClefRouter(QUESTION, routes=routes, default=RunnableLambda(lambda x: x), engine=engine)
    safe = ResilientEngine(engine, fallback=RuleFallback(default="other"))
    safe_router = ClefRouter(
        QUESTION, routes=routes, default=RunnableLambda(lambda x: x), engine=safe
    )
    batch = [STATES[i % len(STATES)] + f" (#{i})" for i in range(args.batch)]

    for state in STATES:  # warm caches and code paths on both sides
        engine.decide(state, questions)
        router.invoke(state)
        safe_router.invoke(state)
    engine.decide_batch(batch, questions)
    router.batch(batch)

    bare, routed, resilient = [], [], []
    for i in range(args.calls):
        state = STATES[i % len(STATES)]
        bare.append(_timed(lambda s=state: engine.decide(s, questions)))
        routed.append(_timed(lambda s=state: router.invoke(s)))
        resilient.append(_timed(lambda s=state: safe_router.invoke(s)))

    bare_b, routed_b = [], []
    for _ in range(args.repeats):
        bare_b.append(_timed(lambda: engine.decide_batch(batch, questions)))
        routed_b.append(_timed(lambda: router.batch(batch)))

    # The adapter's own cost, isolated on the model-free FakeEngine (microseconds).
    fake = FakeEngine()
    fake_router = ClefRouter(
        QUESTION, routes=routes, default=RunnableLambda(lambda x: x), engine=fake
    )
    fake_bare, fake_routed = [], []
    for i in range(max(args.calls, 500)):
        state = STATES[i % len(STATES)]
        fake_bare.append(_timed(lambda s=state: fake.decide(s, questions)))
        fake_routed.append(_timed(lambda s=state: fake_router.invoke(s)))
    adapter_ms = statistics.median(fake_routed) - statistics.median(fake_bare)

    single = _summary(bare, routed)
    batched = _summary(bare_b, routed_b)
    result = {
        "benchmark": "router_overhead",
        "device": str(engine.device),
        "model_version": engine.model_version,
        "python": platform.python_version(),
        "machine": platform.machine(),
        "single": single,
        "single_with_resilient_engine": _summary(bare, resilient),
        "adapter_cost_ms": round(adapter_ms, 4),
        "adapter_cost_pct_of_bare_decide": round(100.0 * adapter_ms / single["bare_median_ms"], 2),
        f"batch_{args.batch}": batched,
        "targets": {
            "single_overhead_pct_max": 5.0,
            "single_met": single["overhead_pct"] <= 5.0,
            "batch_ratio_max": 1.2,
            "batch_met": batched["ratio"] <= 1.2,
        },
        "note": (
            "medians of interleaved calls; adapter_cost_ms is the router's own cost measured "
            "on FakeEngine (no model), which does not depend on machine load as much"
        ),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
