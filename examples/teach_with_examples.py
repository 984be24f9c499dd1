"""Teach a router with a handful of utterances per option: no training run.

Options whose description carries ``examples`` get a prototype head fitted on the
examples' embeddings in well under a second, calibrated by cross-validation on those
same examples. Run: ``python examples/teach_with_examples.py``.
"""

from __future__ import annotations

from typing import Any

from clef_agents import Choice, DecisionEngine

ROUTER = Choice(
    instructions="Which queue should this message go to?",
    criteria={
        "refund": {
            "description": "the customer wants money back",
            "examples": [
                "I want my money back",
                "Please refund my order",
                "Can I get a refund for this?",
                "Return the payment to my card",
            ],
        },
        "delivery": {
            "description": "where an order or card is",
            "examples": [
                "Where is my parcel?",
                "My card has not arrived yet",
                "The package is late",
                "When will my order be delivered?",
            ],
        },
        "account": {
            "description": "logging in, passwords, profile",
            "examples": [
                "I can't log in",
                "Reset my password please",
                "How do I change my email address?",
                "My account is locked",
            ],
        },
    },
)

MESSAGES = [
    "I'd like a refund, the item was broken",
    "It's been ten days and the courier still hasn't delivered anything",
    "The app says my password is wrong but it isn't",
]


def main(engine: DecisionEngine | None = None) -> list[dict[str, Any]]:
    engine = engine or DecisionEngine()
    out = []
    for result, text in zip(
        engine.decide_batch(MESSAGES, {"queue": ROUTER}), MESSAGES, strict=True
    ):
        answer = result.answers["queue"]
        out.append(
            {
                "text": text,
                "queue": answer.choice,
                "probabilities": answer.probabilities,
                "confidence": answer.confidence,
            }
        )
        print(f"{answer.choice:<9} p={answer.probabilities[answer.choice]:.2f}  {text}")
    return out


if __name__ == "__main__":
    main()
