"""The decision log: record decisions, review and label them, train and report on them.

- :class:`DecisionLog` writes decisions to one SQLite file off the hot path
  (``log.wrap(engine)`` records everything an engine decides);
- :mod:`clef_agents.decision_log.review` exports low-confidence and fallback decisions
  to CSV for labelling and imports the labels back; labelled rows become training data;
- :mod:`clef_agents.decision_log.report` compares model and fallback accuracy on the
  labelled rows, the fallback rate over time and confidence drift.

See docs/decision_log.md.
"""

from __future__ import annotations

from clef_agents.decision_log.engine import LoggedEngine
from clef_agents.decision_log.export import export_parquet
from clef_agents.decision_log.log import STATE_POLICIES, DecisionLog
from clef_agents.decision_log.store import Decision, DecisionLogError, read_decisions

__all__ = [
    "STATE_POLICIES",
    "Decision",
    "DecisionLog",
    "DecisionLogError",
    "LoggedEngine",
    "export_parquet",
    "read_decisions",
]
