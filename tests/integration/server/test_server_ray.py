"""Scale-out on a local Ray instance: the Ray Serve deployment and `batch --ray` (Ray Data)."""

from __future__ import annotations

import concurrent.futures as cf
import json
import os
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pyarrow as pa
import pyarrow.csv as pcsv
import pyarrow.parquet as pq
import pytest

pytestmark = pytest.mark.slow
ray = pytest.importorskip("ray")

ROOT = Path(__file__).resolve().parents[3]
QUESTIONS = {
    "intent": {"type": "choice", "instructions": "intent", "criteria": ["card", "rate", "pin"]},
    "urgent": {"type": "noul", "instructions": "urgent?"},
}


@pytest.fixture(scope="module")
def local_ray() -> Iterator[Any]:
    # Workers import the package from the checkout even when it is not pip-installed.
    path = os.environ.get("PYTHONPATH", "")
    os.environ["PYTHONPATH"] = f"{ROOT}{os.pathsep}{path}" if path else str(ROOT)
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield ray
    ray.shutdown()


def test_ray_serve_deployment_batches_and_answers_like_the_engine(
    local_ray: Any, tiny_model_dir: Path
) -> None:
    from ray import serve

    from clef_agents.server.config import ServerConfig
    from clef_agents.server.ray_serve import deployment
    from clef_engine import DecisionEngine

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    try:
        app = deployment(
            model=str(tiny_model_dir),
            device="cpu",
            config=ServerConfig(max_batch=8, max_wait_ms=20),
        )
        serve.run(app, name="clef", route_prefix="/")
        url = f"http://127.0.0.1:{port}"
        states = [f"ticket {i}: my card never arrived" for i in range(24)]

        def post(state: str) -> httpx.Response:
            payload = {"model": "jev-latest", "state": state, "questions": QUESTIONS}
            return httpx.post(f"{url}/v1/systemone", json=payload, timeout=120)

        with cf.ThreadPoolExecutor(12) as pool:
            responses = list(pool.map(post, states))
        invalid = httpx.post(f"{url}/v1/systemone", json={"state": ""}, timeout=60)
        metrics = httpx.get(f"{url}/metrics", timeout=60).text
    finally:
        serve.shutdown()

    local = DecisionEngine.from_pretrained(tiny_model_dir, device="cpu")
    for state, r in zip(states, responses, strict=True):
        assert r.status_code == 200 and r.headers["x-typesafe-request-id"].startswith("req_")
        want = local.decide(state, QUESTIONS).to_wire()["answers"]
        got = r.json()["answers"]
        assert got["intent"]["probabilities"] == pytest.approx(
            want["intent"]["probabilities"], abs=1e-4
        )
        assert got["urgent"]["noul"] == pytest.approx(want["urgent"]["noul"], abs=1e-4)
    assert invalid.status_code == 422
    count = float(
        next(x for x in metrics.splitlines() if x.startswith("clef_batch_size_count")).split()[1]
    )
    total = float(
        next(x for x in metrics.splitlines() if x.startswith("clef_batch_size_sum")).split()[1]
    )
    assert total == len(states) and count < total, "Ray Serve grouped requests into batches"


def test_batch_cli_on_ray_data_matches_local(
    local_ray: Any, tiny_model_dir: Path, tmp_path: Path
) -> None:
    from clef_agents.cli import main

    states = ["my card never arrived", "", "exchange rate is wrong", "pin blocked"] * 5
    data = tmp_path / "in.csv"
    pcsv.write_csv(pa.table({"text": states}), data)
    qfile = tmp_path / "q.json"
    qfile.write_text(json.dumps(QUESTIONS))
    common = ["--questions", str(qfile), "--model", str(tiny_model_dir), "--device", "cpu"]
    common += ["--chunk-rows", "6", "--no-progress"]
    assert main(["batch", str(data), "--out", str(tmp_path / "ray.parquet"), "--ray", *common]) == 0
    assert main(["batch", str(data), "--out", str(tmp_path / "local.parquet"), *common]) == 0
    on_ray = pq.read_table(tmp_path / "ray.parquet").to_pylist()
    local = pq.read_table(tmp_path / "local.parquet").to_pylist()
    assert [r["row"] for r in on_ray] == list(range(len(states)))
    for a, b in zip(on_ray, local, strict=True):
        assert (a["error"] is None) == (b["error"] is None)
        if a["answers"] is not None:
            # Batches are cut differently on Ray: equal up to float noise of padding
            # (the tiny random model's options are near ties, so compare probabilities).
            pa_, pb = json.loads(a["answers"]), json.loads(b["answers"])
            assert pa_["intent"]["probabilities"] == pytest.approx(
                pb["intent"]["probabilities"], abs=1e-4
            )
            assert a["q.urgent"] == pytest.approx(b["q.urgent"], abs=1e-4)
