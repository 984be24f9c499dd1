"""Real clients against `clef-agents serve` running as a process on loopback.

jevcompat (the open conformance suite), typesafe-sdk (the official client) and
langchain-typesafe's TypeSafeClassifier, all unchanged.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.slow

TICKET = "I was charged twice for my March invoice and the refund still hasn't arrived."
JEVCOMPAT = "import sys; from jevcompat.cli import main; sys.exit(main())"


def _jevcompat(url: str, out: Path, key: str | None = None) -> tuple[int, dict[str, Any], str]:
    """``jevcompat test URL [--key-env VAR] --json OUT``: (exit code, report, output)."""
    argv = [sys.executable, "-c", JEVCOMPAT, "test", url, "--json", str(out)]
    env = dict(os.environ)
    if key:
        env["JEVCOMPAT_TEST_KEY"] = key
        argv += ["--key-env", "JEVCOMPAT_TEST_KEY"]
    done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=600)
    return done.returncode, json.loads(out.read_text()), done.stdout[-6000:]


def _assert_conformant(code: int, report: dict[str, Any], output: str) -> None:
    summary = report["summary"]
    failed = [r["id"] for r in report["results"] if r["status"] == "fail"]
    assert code == 0, output
    assert summary["verdict"] == "conformant", output
    assert failed == [], output
    assert summary["MUST"]["failed"] == 0 and summary["SHOULD"]["failed"] == 0


def test_jevcompat_conformant_without_key(server: Any, tmp_path: Path) -> None:
    code, report, output = _jevcompat(server.url, tmp_path / "report.json")
    _assert_conformant(code, report, output)
    assert report["summary"]["MUST"]["passed"] == 32


def test_jevcompat_conformant_with_key(keyed_server: Any, tmp_path: Path) -> None:
    code, report, output = _jevcompat(
        keyed_server.url, tmp_path / "report.json", key=keyed_server.api_key
    )
    _assert_conformant(code, report, output)
    passed = {r["id"] for r in report["results"] if r["status"] == "pass"}
    # With a key, every SHOULD is tested, the auth ones included.
    assert {"auth.bearer", "auth.missing", "auth.invalid"} <= passed
    assert report["summary"]["SHOULD"]["skipped"] == 0


def _questions(sdk: Any) -> dict[str, Any]:
    return {
        "refund": sdk.Noul(instructions="Is the customer asking for money back?"),
        "refund_sides": sdk.Noul(
            instructions="Refund?", criteria=sdk.NoulCriteria(true="wants money back")
        ),
        "team": sdk.Choice(
            instructions="Which team should handle this ticket?",
            criteria={"Billing": "Payments, invoices, refunds", "Technical": None, "Sales": None},
        ),
        "anger": sdk.Score(
            instructions="How frustrated is the customer?",
            criteria=["Calm", "Frustrated", "Very angry"],
        ),
    }


def test_typesafe_sdk_parses_every_answer_type(keyed_server: Any) -> None:
    import typesafe_sdk as sdk

    with sdk.TypeSafeClient(api_key=keyed_server.api_key, base_url=keyed_server.url) as client:
        r = client.system_one(state=TICKET, questions=_questions(sdk))
        models = client.models.list()
        # A large body: the SDK sends it zstd-compressed (Content-Encoding: zstd).
        long_state = {"ticket": TICKET, "history": [TICKET] * 40}
        big = client.system_one(state=long_state, questions=_questions(sdk))
    assert set(r.nouls) == {"refund", "refund_sides"} and 0 <= r.nouls["refund"].noul <= 1
    assert r.choices["team"].choice in {"Billing", "Technical", "Sales"}
    assert abs(sum(r.choices["team"].probabilities.values()) - 1) < 1e-6
    assert set(r.scores["anger"].legend) == {0, 1, 2}
    assert r.scores["anger"].legend[2] == "Very angry"
    assert r.usage.input_tokens and r.usage.input_tokens > 0
    assert r.request_id is not None or hasattr(r, "raw_http_response")
    assert {m.name for m in models.models} >= {"jev-latest"}
    assert set(big.answers) == set(r.answers)


def test_typesafe_sdk_errors_map_to_its_exceptions(keyed_server: Any, server: Any) -> None:
    import typesafe_sdk as sdk

    no_retry = sdk.RetryPolicy(max_retries=0)
    with sdk.TypeSafeClient(api_key="wrong", base_url=keyed_server.url, retry=no_retry) as c:
        with pytest.raises(sdk.TypeSafeAuthenticationError) as auth:
            c.system_one(state=TICKET, questions=_questions(sdk))
    assert auth.value.request_id and auth.value.request_id.startswith("req_")
    with sdk.TypeSafeClient(api_key="any", base_url=server.url, retry=no_retry) as c:
        with pytest.raises(sdk.TypeSafeUnprocessableEntityError) as invalid:
            c.system_one(
                state=TICKET,
                questions={"q": sdk.Choice(instructions="x", criteria={"only": None})},
            )
        with pytest.raises(sdk.TypeSafeNotFoundError):
            c.system_one(state=TICKET, questions=_questions(sdk), model="no-such-model")
    assert "criteria" in str(invalid.value)


def test_typesafe_sdk_async_client(server: Any) -> None:
    import typesafe_sdk as sdk

    async def main() -> list[Any]:
        async with sdk.AsyncTypeSafeClient(api_key="any", base_url=server.url) as client:
            calls = [
                client.system_one(state=f"{TICKET} #{i}", questions=_questions(sdk))
                for i in range(8)
            ]
            return list(await asyncio.gather(*calls))

    results = asyncio.run(main())
    assert len(results) == 8
    assert all(set(r.answers) == {"refund", "refund_sides", "team", "anger"} for r in results)


def test_langchain_typesafe_classifier_unchanged(keyed_server: Any) -> None:
    from langchain_typesafe import Choice, Noul, Score, TypeSafeClassifier

    classifier = TypeSafeClassifier(base_url=keyed_server.url, api_key=keyed_server.api_key)
    request = {
        "state": TICKET,
        "questions": {
            "department": Choice(
                instructions="Which team should handle this request?",
                criteria={"billing": "Payment issues.", "technical": "Bugs."},
            ),
            "urgent": Noul(instructions="Does this message require an urgent response?"),
            "frustration": Score(
                instructions="How frustrated does the customer appear?",
                criteria=["Calm.", "Concerned but civil.", "Very angry."],
            ),
        },
    }
    sync = classifier.invoke(request)
    async_ = asyncio.run(classifier.ainvoke(request))
    batch = classifier.batch([request, {**request, "state": "Thanks, all good now!"}])
    assert sync.choices["department"].choice in {"billing", "technical"}
    assert 0 <= sync.nouls["urgent"].noul <= 1
    assert set(sync.scores["frustration"].probabilities) == {0, 1, 2}
    assert sync.request_id and sync.request_id.startswith("req_")
    assert async_.nouls["urgent"].noul == pytest.approx(sync.nouls["urgent"].noul, abs=1e-6)
    assert len(batch) == 2
