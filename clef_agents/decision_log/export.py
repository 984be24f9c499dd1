"""Parquet export of a decision log (pyarrow, from the ``server`` extra)."""

from __future__ import annotations

from pathlib import Path

from clef_agents.decision_log.store import COLUMNS, connect
from clef_engine.errors import require


def export_parquet(path: str | Path, out: str | Path) -> int:
    """Write every decision of the log at ``path`` to a Parquet file; returns the row count.

    One row per decision, the log's columns (``answers``, ``labels`` and ``state`` as JSON
    text) plus ``questions``, the JSON of the questions it answered.

    Raises:
        MissingDependencyError: pyarrow is not installed (``pip install
            'clef-agents[server]'``).
        DecisionLogError: ``path`` is not a decision log.
    """
    pa = require("pyarrow", package="pyarrow", extra="server", feature="Parquet export")
    pq = require("pyarrow.parquet", package="pyarrow", extra="server", feature="Parquet export")
    conn = connect(path, create=False)
    try:
        columns = ", ".join(f"d.{c}" for c in COLUMNS)
        rows = conn.execute(
            f"SELECT {columns}, q.json FROM decisions d "
            "LEFT JOIN questions q ON q.hash = d.questions_hash ORDER BY d.id"
        ).fetchall()
    finally:
        conn.close()
    names = [*COLUMNS, "questions"]
    types = {"id": pa.int64(), "ts": pa.float64(), "latency_ms": pa.float64()}
    types["min_probability"] = pa.float64()
    arrays = [
        pa.array([r[i] for r in rows], type=types.get(name, pa.string()))
        for i, name in enumerate(names)
    ]
    target = Path(out)
    target.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_arrays(arrays, names=names), target)
    return len(rows)
