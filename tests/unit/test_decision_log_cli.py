"""The decision loop's commands: review (CSV out and back), report, finetune --from-log,
serve --log-decisions (the server hook) and the Parquet export."""

from __future__ import annotations

import asyncio
import csv
import json
import sys
from pathlib import Path
from typing import Any

import pytest

from clef_agents.cli import main
from clef_agents.decision_log import DecisionLog, export_parquet, read_decisions
from clef_agents.decision_log.review import review_items, write_training_data
from clef_agents.decision_log.store import connect
from clef_agents.fake import FakeEngine
from clef_agents.resilience import ResilientEngine, RuleFallback
from clef_engine.errors import MissingDependencyError

QUESTIONS = {
    "route": {
        "type": "choice",
        "instructions": "Route the ticket",
        "criteria": {"billing": "refund invoice payment", "technical": "bug error crash"},
    },
    "urgent": {"type": "noul", "instructions": "Is it urgent?"},
}
STATES = [
    "refund my invoice payment now",  # confident billing
    "the app shows an error",  # technical, less sure
    "hello there",  # no overlap: low confidence
    "invoice crash",  # split
    "refund payment invoice money back",
    "bug error crash again",
]


def _run(capsys: Any, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture()
def log_path(tmp_path: Path) -> Path:
    path = tmp_path / "decisions.sqlite"
    safe = ResilientEngine(
        FakeEngine(), fallback=RuleFallback(default="technical"), min_confidence={"route": 0.55}
    )
    with DecisionLog(path) as log:
        log.wrap(safe).decide_batch(STATES, QUESTIONS)
    return path


def _label_all(path: Path, csv_path: Path, truth: dict[str, str]) -> None:
    with csv_path.open(newline="") as fh:
        rows = list(csv.DictReader(fh))
    for row in rows:
        if row["question_id"] == "route":
            row["label"] = truth[row["state"]]
    with csv_path.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


TRUTH = {
    STATES[0]: "billing",
    STATES[1]: "technical",
    STATES[2]: "billing",
    STATES[3]: "billing",
    STATES[4]: "billing",
    STATES[5]: "technical",
}


def test_review_picks_low_confidence_and_fallbacks(log_path: Path) -> None:
    items = review_items(log_path, below=0.6, question="route")
    conn = connect(log_path, create=False)
    decisions = list(read_decisions(conn))
    conn.close()
    expected = {
        d.id
        for d in decisions
        if d.question_source("route") != "model"
        or max(d.answers["route"]["probabilities"].values()) < 0.6
    }
    assert {it.decision.id for it in items} == expected
    assert any(it.source == "default" for it in items)  # fallbacks are in
    probabilities = [it.probability for it in items]
    assert probabilities == sorted(probabilities)  # least confident first
    # Everything with no threshold and no sources: nothing.
    assert review_items(log_path, below=None, sources=()) == []


def test_review_csv_round_trip_then_training_data(log_path: Path, tmp_path: Path, capsys):
    out = tmp_path / "review.csv"
    code, text, _ = _run(
        capsys, "review", str(log_path), "--out", str(out), "--below", "1", "--question", "route"
    )
    assert code == 0 and "wrote 6 items" in text
    with out.open(newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert [r["label"] for r in rows] == [""] * 6
    assert rows[0]["options"] == "billing|technical"
    _label_all(log_path, out, TRUTH)
    code, text, _ = _run(capsys, "review", str(log_path), "--import", str(out))
    assert code == 0 and "stored 6 labels" in text
    # Labelled items leave the review queue.
    assert review_items(log_path, below=1.0, question="route") == []
    data, questions, n = write_training_data(log_path, tmp_path / "train")
    assert n == 6
    rows = [json.loads(line) for line in data.read_text().splitlines()]
    assert {(r["state"], r["label"]) for r in rows} == set(TRUTH.items())
    assert json.loads(questions.read_text())["route"]["criteria"]["billing"]
    # The table view.
    code, text, _ = _run(capsys, "review", str(log_path), "--include-labelled")
    assert code == 0 and "items to review" in text


@pytest.mark.parametrize(
    ("row", "needle"),
    [
        ({"decision_id": "999", "question_id": "route", "label": "billing"}, "not in the log"),
        ({"decision_id": "1", "question_id": "nope", "label": "billing"}, "was not asked"),
        ({"decision_id": "1", "question_id": "route", "label": "sales"}, "not an answer"),
        ({"decision_id": "1", "question_id": "urgent", "label": "maybe"}, "not an answer"),
        ({"decision_id": "x", "question_id": "route", "label": "billing"}, "not a number"),
    ],
)
def test_import_refuses_bad_rows_naming_them(log_path, tmp_path, capsys, row, needle) -> None:
    bad = tmp_path / "bad.csv"
    with bad.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=["decision_id", "question_id", "label"])
        writer.writeheader()
        writer.writerow({"decision_id": "2", "question_id": "urgent", "label": "yes"})
        writer.writerow(row)
    code, _, err = _run(capsys, "review", str(log_path), "--import", str(bad))
    assert code == 2 and needle in err and "row 3" in err and "Traceback" not in err
    conn = connect(log_path, create=False)
    assert all(not d.labels for d in read_decisions(conn))  # all or nothing
    conn.close()


def test_review_of_a_missing_log_is_one_line(tmp_path: Path, capsys) -> None:
    code, _, err = _run(capsys, "review", str(tmp_path / "none.sqlite"))
    assert code == 2 and "no such decision log" in err


def test_report_table_json_and_plot(log_path: Path, tmp_path: Path, capsys) -> None:
    pytest.importorskip("matplotlib")
    out = tmp_path / "review.csv"
    _run(capsys, "review", str(log_path), "--out", str(out), "--below", "1", "--question", "route")
    _label_all(log_path, out, TRUTH)
    _run(capsys, "review", str(log_path), "--import", str(out))
    png, js = tmp_path / "report.png", tmp_path / "report.json"
    code, text, _ = _run(
        capsys, "report", str(log_path), "--plot", str(png), "--json", str(js), "--buckets", "3"
    )
    assert code == 0
    report = json.loads(js.read_text())
    conn = connect(log_path, create=False)
    decisions = list(read_decisions(conn))
    conn.close()
    for source in ("model", "default"):
        rows = [d for d in decisions if d.question_source("route") == source]
        correct = sum(d.answers["route"]["choice"] == TRUTH[d.state] for d in rows)
        assert report["by_source"][source]["labelled"] == len(rows)
        assert report["by_source"][source]["accuracy"] == pytest.approx(correct / len(rows))
    assert len(report["over_time"]) == 3
    assert sum(r["answers"] for r in report["over_time"]) == report["answers"] == 12
    assert "fallback rate" in text and "model version" in text
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_finetune_from_log_trains_on_the_labelled_rows(log_path, tmp_path, capsys, monkeypatch):
    pytest.importorskip("peft")
    import clef_engine.train

    out = tmp_path / "review.csv"
    _run(capsys, "review", str(log_path), "--out", str(out), "--below", "1", "--question", "route")
    _label_all(log_path, out, TRUTH)
    _run(capsys, "review", str(log_path), "--import", str(out))
    seen: list[Any] = []

    class Stop(Exception):
        pass

    def fit(self: Any, data: Any, *args: Any, **kwargs: Any) -> Any:
        seen.append((data, self.config))
        raise Stop

    monkeypatch.setattr(clef_engine.train.Trainer, "fit", fit)
    with pytest.raises(Stop):
        main(
            [
                "finetune",
                "--from-log",
                str(log_path),
                "--out",
                str(tmp_path / "m"),
                "--recipe",
                "few-shot",
                "--lora-rank",
                "0",
            ]
        )
    [(data, config)] = seen
    # Head only: a frozen backbone has no adapters for the recipe's contrastive stage.
    assert (config.head, config.lora_rank, config.contrastive_steps) == ("prototype", 0, 0)
    names = data.names("route")
    assert {(ex.state, names[ex.labels["route"]]) for ex in data.examples} == set(TRUTH.items())
    assert (tmp_path / "m" / "from_log" / "data.jsonl").is_file()


def test_finetune_from_log_argument_errors(log_path, tmp_path, capsys) -> None:
    pytest.importorskip("peft")
    m = str(tmp_path / "m")
    code, _, err = _run(capsys, "finetune", "--out", m)
    assert code == 2 and "--from-log" in err
    code, _, err = _run(capsys, "finetune", "x.csv", "--from-log", str(log_path), "--out", m)
    assert code == 2 and "one of them" in err
    code, _, err = _run(capsys, "finetune", "--from-log", str(log_path), "--out", m)
    assert code == 2 and "no labelled decisions" in err


def test_parquet_export(log_path: Path, tmp_path: Path, monkeypatch) -> None:
    pq = pytest.importorskip("pyarrow.parquet")
    out = tmp_path / "log.parquet"
    assert export_parquet(log_path, out) == 6
    table = pq.read_table(out).to_pylist()
    assert [json.loads(r["state"]) for r in table] == STATES
    assert json.loads(table[0]["questions"])["route"]["type"] == "choice"
    monkeypatch.setitem(sys.modules, "pyarrow", None)
    with pytest.raises(MissingDependencyError, match=r"clef-agents\[server\]"):
        export_parquet(log_path, out)


def test_server_logs_each_request_with_its_request_id(tmp_path: Path) -> None:
    pytest.importorskip("fastapi")
    import httpx

    from clef_agents.server import ServerConfig, create_app

    path = tmp_path / "server.sqlite"
    log = DecisionLog(path)
    app = create_app(FakeEngine(), ServerConfig(), decision_log=log)
    body = {"model": "jev-latest", "state": "refund my invoice", "questions": QUESTIONS}
    batch = {
        "model": "jev-latest",
        "states": ["bug error", "", "refund"],
        "questions": QUESTIONS,
    }

    async def go() -> tuple[Any, Any]:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
            one = await client.post("/v1/systemone", json=body)
            many = await client.post("/v1/systemone/batch", json=batch)
            return one, many

    one, many = asyncio.run(go())
    assert one.status_code == 200 and many.status_code == 200
    log.close()
    conn = connect(path, create=False)
    rows = list(read_decisions(conn))
    conn.close()
    rid = one.headers["x-typesafe-request-id"]
    brid = many.headers["x-typesafe-request-id"]
    assert [(r.request_id, r.state) for r in rows] == [
        (rid, "refund my invoice"),
        (f"{brid}#0", "bug error"),
        (f"{brid}#2", "refund"),  # the refused empty state is not a decision
    ]
    assert rows[0].answers["route"]["choice"] == one.json()["answers"]["route"]["choice"]


def test_serve_log_flags(tmp_path: Path, capsys) -> None:
    from clef_agents.cli import build_parser
    from clef_agents.cli.serve import open_decision_log

    parser = build_parser()
    args = parser.parse_args(["serve", "--log-max-rows", "5"])
    with pytest.raises(Exception, match="give --log-decisions too"):
        open_decision_log(args)
    path = tmp_path / "s.sqlite"
    args = parser.parse_args(
        ["serve", "--log-decisions", str(path), "--log-state", "hash", "--log-max-age-days", "7"]
    )
    log = open_decision_log(args)
    assert (log.state_policy, log.max_age_s) == ("hash", 7 * 86400.0)
    log.close()
    code, _, err = _run(capsys, "serve", "--log-decisions", str(path), "--ray")
    assert code == 2 and "not with --ray" in err
