"""Rule fallbacks: an answer for every request, tagged with where it came from.

``ResilientEngine`` wraps the engine: transient errors are retried, and ordered rules (a
keyword list, a regular expression, a predicate over the state) answer when the model
is unsure, too slow, fails, or cannot load at all. Counters say how often that happened.

Run: python examples/fallback_rules.py
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from clef_agents import Choice
from clef_agents.resilience import ResilientEngine, Rule, RuleFallback

QUESTIONS = {
    "intent": Choice(
        instructions="What does the customer want?",
        criteria={
            "cancel": "close the account or stop the subscription",
            "complaint": "unhappy about the service and wants it fixed",
            "question": "asks how something works",
        },
    )
}

RULES = RuleFallback(
    [
        Rule.keywords(["cancel", "unsubscribe", "close my account"], "cancel", 0.85),
        Rule.regex(r"\b(terrible|awful|worst)\b", "complaint", 0.75),
        Rule.when(lambda s: isinstance(s, str) and s.rstrip().endswith("?"), "question", 0.6),
    ],
    default="question",
)

STATES = [
    "Please cancel my subscription today.",
    "This is the worst support I have ever had.",
    "How do I export my data?",
    "hmm",
]


def main(engine: Any = None) -> dict[str, Any]:
    if engine is None:
        from clef_agents import DecisionEngine

        engine = DecisionEngine()
    # A strict gate: answers under 0.9 come from the rules instead.
    gated = ResilientEngine(engine, fallback=RULES, min_confidence=0.9, timeout_s=10.0)
    gated_results = gated.decide_batch(STATES, QUESTIONS)
    for state, result in zip(STATES, gated_results, strict=True):
        reason = getattr(result, "x_fallback_reason", "-")
        print(f"{result['intent'].choice:>9} [{result.x_source:>7}, {reason}]  <- {state}")
    print("gated counters:", gated.counters.as_dict())

    # An engine that cannot load (a missing model dir): the rules answer everything.
    def load_missing() -> Any:
        from clef_agents import DecisionEngine

        return DecisionEngine(path=Path("/nonexistent/model-dir"))

    offline = ResilientEngine(load_missing, fallback=RULES)
    offline_results = offline.decide_batch(STATES, QUESTIONS)
    print("unavailable engine:", [r.x_source for r in offline_results], offline.load_error)
    return {
        "gated": gated_results,
        "gated_counters": gated.counters.as_dict(),
        "offline": offline_results,
        "offline_counters": offline.counters.as_dict(),
    }


if __name__ == "__main__":
    main()
