"""Support triage as a LangGraph graph that branches on calibrated probabilities.

ticket -> classify -> billing | technical | sales | human_review

The route is a calibrated ``choice`` from the embedded model (offline). A confidence gate
(0.7: on three teams a coin-flip-like 0.5 is not a decision) sends unsure tickets such as
"Hello?" to human review, and a rule fallback answers when the model fails or
is unsure, so every ticket is handled and every answer says where it came from.

Run: python examples/support_triage_langgraph.py
"""

from __future__ import annotations

import operator
from typing import Annotated, Any, TypedDict

from langgraph.graph import END, START, StateGraph

from clef_agents import Choice
from clef_agents.langchain import add_clef_edges
from clef_agents.resilience import ResilientEngine, Rule, RuleFallback

ROUTE = Choice(
    instructions="Which team should handle this support ticket?",
    criteria={
        "billing": {
            "description": "payments, charges, refunds, invoices, subscriptions",
            "examples": ["I was charged twice", "Please refund my last invoice"],
        },
        "technical": {
            "description": "bugs, errors, crashes, login problems, outages",
            "examples": ["The app crashes on startup", "I get error 500 when I log in"],
        },
        "sales": {
            "description": "pricing, plans, demos, upgrades, buying more seats",
            "examples": ["Can I get a demo of the enterprise plan?", "How much is a seat?"],
        },
    },
)

RULES = RuleFallback(
    [
        Rule.keywords(["refund", "invoice", "charged"], "billing", 0.8),
        Rule.regex(r"\berror\s*\d{3}\b|\bcrash", "technical", 0.8),
        Rule.keywords(["pricing", "demo", "quote"], "sales", 0.7),
    ],
)

TICKETS = [
    "I was charged twice for my subscription this month, please refund one of them.",
    "The mobile app crashes every time I open the settings page.",
    "We'd like a demo of the enterprise plan for a team of forty people.",
    "Hello?",
]


class Ticket(TypedDict, total=False):
    ticket: str
    handled_by: Annotated[list[str], operator.add]


def _team(name: str) -> Any:
    return lambda state: {"handled_by": [name]}


def build(engine: Any, *, min_confidence: float = 0.7) -> Any:
    """The compiled graph; ``engine`` is a DecisionEngine (or FakeEngine)."""
    safe = ResilientEngine(engine, fallback=RULES, timeout_s=10.0)
    graph = StateGraph(Ticket)
    graph.add_node("classify", lambda state: {"handled_by": []})
    for team in ["billing", "technical", "sales", "human_review"]:
        graph.add_node(team, _team(team))
        graph.add_edge(team, END)
    graph.add_edge(START, "classify")
    add_clef_edges(
        graph,
        "classify",
        ROUTE,
        fallback="human_review",
        min_confidence=min_confidence,
        state_from="ticket",
        engine=safe,
    )
    return graph.compile()


def main(engine: Any = None) -> list[dict[str, Any]]:
    if engine is None:
        from clef_agents import DecisionEngine

        engine = DecisionEngine()
    app = build(engine)
    out = []
    for ticket in TICKETS:
        state = app.invoke({"ticket": ticket})
        out.append({"ticket": ticket, "handled_by": state["handled_by"]})
        print(f"{state['handled_by'][-1]:>13}  <- {ticket}")
    return out


if __name__ == "__main__":
    main()
