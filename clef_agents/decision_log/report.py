"""Report on a decision log: model vs fallback accuracy on labelled rows, the fallback rate
over time, and confidence drift (per time bucket and per model version).

Example:
    >>> summary = build_report("decisions.sqlite", buckets=12)   # 7 decisions, all labelled
    >>> model = summary["by_source"]["model"]
    >>> model["labelled"], model["correct"], round(model["accuracy"], 2)
    (7, 6, 0.86)
    >>> summary["fallback_rate"], len(summary["over_time"])
    (0.0, 12)
"""

from __future__ import annotations

import datetime
import math
from collections import defaultdict
from pathlib import Path
from typing import Any

from clef_agents.decision_log.review import ReviewItem, iter_items
from clef_agents.decision_log.store import DecisionLogError
from clef_engine.errors import require

SOURCES = ("model", "rules", "default", "abstained")


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def _accuracy(items: list[ReviewItem]) -> dict[str, Any]:
    labelled = [it for it in items if it.label is not None]
    correct = sum(1 for it in labelled if it.predicted == it.label)
    return {
        "answers": len(items),
        "labelled": len(labelled),
        "correct": correct,
        "accuracy": correct / len(labelled) if labelled else None,
        "mean_probability": _mean([p for it in items if (p := it.probability) is not None]),
    }


def build_report(path: str | Path, *, buckets: int = 10) -> dict[str, Any]:
    """The report as a JSON-ready dict.

    ``by_source``: per source (``model``, ``rules``, ``default``, ``abstained``) the answers,
    labelled answers and accuracy on them. ``over_time``: ``buckets`` equal time spans from
    the first to the last decision, each with its decisions, fallback rate (answers not
    from the model), abstained rate, mean confidence of the model's answers and accuracy
    on its labelled answers. ``by_model_version``: the same confidence and accuracy per
    model version, so a new model's drift shows.

    Raises:
        DecisionLogError: The log is missing or holds no decisions.
    """
    if buckets < 1:
        raise DecisionLogError(f"buckets must be at least 1; got {buckets}")
    items = list(iter_items(path))
    if not items:
        raise DecisionLogError(f"{path}: the log holds no decisions to report on")
    by_source: dict[str, list[ReviewItem]] = defaultdict(list)
    for it in items:
        by_source[it.source].append(it)
    first = min(it.decision.ts for it in items)
    last = max(it.decision.ts for it in items)
    width = max((last - first) / buckets, 1e-9)
    spans: list[list[ReviewItem]] = [[] for _ in range(buckets)]
    for it in items:
        spans[min(buckets - 1, int((it.decision.ts - first) / width))].append(it)
    over_time = []
    for k, span in enumerate(spans):
        model = [it for it in span if it.source == "model"]
        over_time.append(
            {
                "start": _iso(first + k * width),
                "answers": len(span),
                "fallback_rate": (
                    sum(1 for it in span if it.source != "model") / len(span) if span else None
                ),
                "abstained_rate": (
                    sum(1 for it in span if it.source == "abstained") / len(span) if span else None
                ),
                "model_confidence": _accuracy(model)["mean_probability"],
                "model_accuracy": _accuracy(model)["accuracy"],
            }
        )
    versions: dict[str, list[ReviewItem]] = defaultdict(list)
    for it in items:
        if it.source == "model":
            versions[str(it.decision.model_version)].append(it)
    return {
        "log": str(path),
        "decisions": len({it.decision.id for it in items}),
        "answers": len(items),
        "first": _iso(first),
        "last": _iso(last),
        "by_source": {s: _accuracy(by_source[s]) for s in SOURCES if by_source.get(s)},
        "fallback_rate": sum(1 for it in items if it.source != "model") / len(items),
        "over_time": over_time,
        "by_model_version": {v: _accuracy(its) for v, its in versions.items()},
    }


def _iso(ts: float) -> str:
    return datetime.datetime.fromtimestamp(ts, datetime.timezone.utc).isoformat(timespec="seconds")


def _fmt(value: Any, pct: bool = False) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if pct:
        return f"{100 * value:.1f}%"
    return f"{value:.3f}" if isinstance(value, float) else str(value)


def format_report(report: dict[str, Any]) -> str:
    """The report as plain-text tables."""
    lines = [
        f"{report['log']}: {report['decisions']} decisions, {report['answers']} answers, "
        f"{report['first']} .. {report['last']}",
        f"fallback rate: {_fmt(report['fallback_rate'], pct=True)}",
        "",
        f"{'source':<10} {'answers':>8} {'labelled':>9} {'accuracy':>9} {'mean p':>7}",
    ]
    for source, row in report["by_source"].items():
        lines.append(
            f"{source:<10} {row['answers']:>8} {row['labelled']:>9} "
            f"{_fmt(row['accuracy'], pct=True):>9} {_fmt(row['mean_probability']):>7}"
        )
    lines += [
        "",
        f"{'from':<25} {'answers':>8} {'fallback':>9} {'abstained':>10} "
        f"{'model p':>8} {'model acc':>10}",
    ]
    for row in report["over_time"]:
        lines.append(
            f"{row['start']:<25} {row['answers']:>8} {_fmt(row['fallback_rate'], True):>9} "
            f"{_fmt(row['abstained_rate'], True):>10} {_fmt(row['model_confidence']):>8} "
            f"{_fmt(row['model_accuracy'], True):>10}"
        )
    lines += ["", f"{'model version':<40} {'answers':>8} {'mean p':>7} {'accuracy':>9}"]
    for version, row in report["by_model_version"].items():
        lines.append(
            f"{version[:40]:<40} {row['answers']:>8} {_fmt(row['mean_probability']):>7} "
            f"{_fmt(row['accuracy'], pct=True):>9}"
        )
    return "\n".join(lines) + "\n"


def plot_report(report: dict[str, Any], out: str | Path) -> Path:
    """A PNG: fallback rate and model confidence over time, accuracy by source.

    Raises:
        MissingDependencyError: matplotlib is not installed (the ``eval`` extra).
    """
    require("matplotlib", package="matplotlib", extra="eval", feature="the report's plot")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = report["over_time"]
    x = list(range(len(rows)))
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    ax1.plot(x, [_nan(r["fallback_rate"]) for r in rows], marker="o", label="fallback rate")
    ax1.plot(x, [_nan(r["abstained_rate"]) for r in rows], marker=".", label="abstained rate")
    ax1.plot(x, [_nan(r["model_confidence"]) for r in rows], marker="s", label="model mean p")
    ax1.set_ylim(0, 1)
    ax1.set_xticks(x, [r["start"][5:16] for r in rows], rotation=45, ha="right", fontsize=7)
    ax1.set_title("over time")
    ax1.legend(fontsize=8)
    sources = [s for s, r in report["by_source"].items() if r["accuracy"] is not None]
    ax2.bar(sources, [report["by_source"][s]["accuracy"] for s in sources])
    for i, s in enumerate(sources):
        row = report["by_source"][s]
        ax2.text(i, row["accuracy"] + 0.02, f"n={row['labelled']}", ha="center", fontsize=8)
    ax2.set_ylim(0, 1.1)
    ax2.set_title("accuracy on labelled answers, by source")
    fig.tight_layout()
    target = Path(out)
    target.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(target, dpi=110)
    plt.close(fig)
    return target


def _nan(value: float | None) -> float:
    return float("nan") if value is None else value
