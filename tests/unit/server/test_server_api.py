"""The /v1 API surface: no file paths over HTTP, the compute budget, OpenAPI, headers, names."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
from PIL import Image, ImageDraw

QUESTIONS = {"refund": {"type": "noul", "instructions": "Does the customer want a refund?"}}


def _request(state: Any, questions: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"model": "jev-latest", "state": state, "questions": questions or dict(QUESTIONS)}


def _png_with_text(path: Path) -> Path:
    image = Image.new("RGB", (480, 120), "white")
    ImageDraw.Draw(image).text((20, 50), "REFUND MY ORDER NOW", fill="black")
    image.save(path)
    return path


def _same_answers(a: dict[str, Any], b: dict[str, Any]) -> bool:
    return all(
        math.isclose(a["answers"][q]["noul"], b["answers"][q]["noul"], abs_tol=1e-6)
        for q in a["answers"]
    )


class _Recording:
    """An engine wrapper that records every batch that reaches the model."""

    def __init__(self, engine: Any) -> None:
        self.engine = engine
        self.model_name = engine.model_name
        self.model_version = engine.model_version
        self.batches: list[int] = []

    def decide_batch(self, items: list[Any], return_exceptions: bool = False) -> list[Any]:
        self.batches.append(len(items))
        return self.engine.decide_batch(items, return_exceptions=return_exceptions)


# -- S1: the server never reads its own files -----------------------------------------------


async def test_a_path_state_is_text_whether_or_not_the_file_exists(
    make_app: Any, h: Any, tmp_path: Path
) -> None:
    image = _png_with_text(tmp_path / "x.png")
    async with h.client(make_app()) as c:
        present = await c.post("/v1/systemone", json=_request(str(image)))
        image.unlink()
        missing = await c.post("/v1/systemone", json=_request(str(image)))
    assert present.status_code == 200, present.text
    assert missing.status_code == 200, missing.text
    # Read as text, the answer is the same with the file there or gone.
    assert _same_answers(present.json(), missing.json())
    assert present.json()["usage"] == missing.json()["usage"]


@pytest.mark.parametrize("state", ["~/x.png", "/no/such/dir/x.png", "../../etc/x.jpg"])
async def test_a_path_state_reveals_nothing_about_the_disk(
    make_app: Any, h: Any, state: str
) -> None:
    async with h.client(make_app()) as c:
        r = await c.post("/v1/systemone", json=_request(state))
    assert r.status_code == 200, r.text
    assert "exist" not in r.text
    assert str(Path.home()) not in r.text


async def test_paths_in_chat_image_parts_and_batch_states_are_not_read(
    make_app: Any, h: Any, tmp_path: Path
) -> None:
    image = _png_with_text(tmp_path / "shot.png")

    def chat(path: str) -> list[dict[str, Any]]:
        part = {"type": "image_url", "image_url": {"url": path}}
        return [{"role": "user", "content": [{"type": "text", "text": "see this"}, part]}]

    gone = str(tmp_path / "gone.png")
    async with h.client(make_app()) as c:
        a = await c.post("/v1/systemone", json=_request(chat(str(image))))
        b = await c.post("/v1/systemone", json=_request(chat(gone)))
        batch = await c.post(
            "/v1/systemone/batch",
            json={"model": "jev-latest", "states": [str(image), gone], "questions": QUESTIONS},
        )
    assert a.status_code == b.status_code == 200, (a.text, b.text)
    assert _same_answers(a.json(), b.json())
    assert batch.status_code == 200
    results = batch.json()["results"]
    assert [("error" in item) for item in results] == [False, False], results
    assert "exist" not in batch.text


def test_paths_stay_images_in_the_python_api(tmp_path: Path) -> None:
    from clef_engine.backbones.vision.requests import has_images
    from clef_engine.schema.request import DecisionRequest

    request = DecisionRequest.parse(_request(str(tmp_path / "x.png")))
    assert request.allow_paths and has_images(request)
    over_http = request.without_paths()
    assert not over_http.allow_paths and not has_images(over_http)
    assert request.allow_paths, "without_paths returns a copy"


def test_open_image_refuses_paths_without_naming_them(tmp_path: Path) -> None:
    from clef_engine.backbones.vision.images import open_image
    from clef_engine.errors import InvalidRequestError

    missing = tmp_path / "secret.png"
    with pytest.raises(InvalidRequestError) as info:
        open_image(str(missing), "state", allow_paths=False)
    assert "secret" not in str(info.value) and "exist" not in str(info.value)


# -- A1: the compute budget -----------------------------------------------------------------


async def test_a_huge_state_gets_413_before_the_model(tiny_engine: Any, h: Any) -> None:
    from clef_agents.server import ServerConfig, create_app

    engine = _Recording(tiny_engine)
    state = "refund " * 141_429  # 990,003 characters, the audit's shape
    async with h.client(create_app(engine, ServerConfig())) as c:
        r = await c.post("/v1/systemone", json=_request(state))
    assert r.status_code == 413, r.text
    detail = r.json()["detail"]
    assert detail["error_type"] == "request_too_large"
    assert "state renders to 990003 characters" in detail["message"]
    assert "100000" in detail["message"] and "max_state_chars" in detail["message"]
    assert engine.batches == []


async def test_thousands_of_examples_get_422_before_the_model(tiny_engine: Any, h: Any) -> None:
    from clef_agents.server import ServerConfig, create_app

    engine = _Recording(tiny_engine)
    criteria = {
        f"intent_{i}": {
            "description": f"intent {i}",
            "examples": [f"ex {i} {j}" for j in range(50)],
        }
        for i in range(100)
    }  # 5,000 distinct examples
    question = {"route": {"type": "choice", "instructions": "Route", "criteria": criteria}}
    async with h.client(create_app(engine, ServerConfig())) as c:
        r = await c.post("/v1/systemone", json=_request("hello", question))
    assert r.status_code == 422, r.text
    [entry] = r.json()["detail"]
    assert entry["loc"] == ["body", "questions"] and entry["type"] == "too_long"
    assert "5000 option examples" in entry["msg"] and "limit is 1000" in entry["msg"]
    assert "max_example_texts" in entry["msg"]
    assert engine.batches == []


async def test_128_questions_of_255_fresh_options_get_422(tiny_engine: Any, h: Any) -> None:
    from clef_agents.server import ServerConfig, create_app

    engine = _Recording(tiny_engine)
    questions = {
        f"q{q}": {
            "type": "choice",
            "instructions": "Pick",
            "criteria": [f"o{q}_{i}" for i in range(255)],
        }
        for q in range(128)
    }
    async with h.client(create_app(engine, ServerConfig())) as c:
        r = await c.post("/v1/systemone", json=_request("hello", questions))
    assert r.status_code == 422, r.text
    [entry] = r.json()["detail"]
    assert entry["loc"] == ["body", "questions"]
    assert "32640 distinct option texts" in entry["msg"] and "limit is 1024" in entry["msg"]
    assert engine.batches == []


async def test_the_budget_is_configurable_and_a_request_inside_it_is_answered(
    make_app: Any, h: Any
) -> None:
    app = make_app(max_state_chars=20, max_option_texts=3, max_example_texts=1)
    three = {"c": {"type": "choice", "instructions": "x", "criteria": ["a", "b", "c"]}}
    four = {"c": {"type": "choice", "instructions": "x", "criteria": ["a", "b", "c", "d"]}}
    examples = {
        "c": {
            "type": "choice",
            "instructions": "x",
            "criteria": {"a": {"examples": ["one", "two"]}, "b": None},
        }
    }
    async with h.client(app) as c:
        ok = await c.post("/v1/systemone", json=_request("twenty characters ok", three))
        long = await c.post("/v1/systemone", json=_request("twenty-one characters", three))
        options = await c.post("/v1/systemone", json=_request("short", four))
        many = await c.post("/v1/systemone", json=_request("short", examples))
    assert ok.status_code == 200, ok.text
    assert long.status_code == 413 and "limit is 20 " in long.json()["detail"]["message"]
    assert options.status_code == 422 and "limit is 3 " in options.json()["detail"][0]["msg"]
    assert many.status_code == 422 and "limit is 1 " in many.json()["detail"][0]["msg"]


def test_images_do_not_count_toward_the_state_budget() -> None:
    import base64
    import io

    from clef_agents.server import budget

    buf = io.BytesIO()
    Image.new("RGB", (64, 64), "white").save(buf, "PNG")
    url = "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()
    assert len(url) > 100
    assert budget.state_chars({"screenshot": url, "note": "hi"}) == len(
        "note: hi\nscreenshot: [image]"
    )


async def test_batch_budget_per_item_and_in_all(make_app: Any, h: Any) -> None:
    app = make_app(max_state_chars=50, max_batch_state_chars=120)
    async with h.client(app) as c:
        mixed = await c.post(
            "/v1/systemone/batch",
            json={"states": ["short one", "x" * 51, "short two"], "questions": QUESTIONS},
        )
        total = await c.post(
            "/v1/systemone/batch",
            json={"states": ["y" * 50] * 3, "questions": QUESTIONS},
        )
    assert mixed.status_code == 200, mixed.text
    results = mixed.json()["results"]
    assert "answers" in results[0] and "answers" in results[2]
    assert results[1]["error"]["status"] == 413
    assert "states[1] renders to 51" in results[1]["error"]["detail"]["message"]
    assert total.status_code == 413
    assert "states renders to 150 characters" in total.json()["detail"]["message"]
    assert "max_batch_state_chars" in total.json()["detail"]["message"]


def test_serve_flags_set_the_budget_and_keep_jev_latest() -> None:
    from clef_agents.cli import build_parser
    from clef_agents.cli.serve import server_config
    from clef_engine.schema import limits

    defaults = server_config(build_parser().parse_args(["serve"]))
    assert defaults.max_state_chars == limits.SERVER_MAX_STATE_CHARS
    assert defaults.max_option_texts == limits.SERVER_MAX_OPTION_TEXTS
    assert defaults.max_example_texts == limits.SERVER_MAX_EXAMPLE_TEXTS
    assert defaults.max_batch_state_chars == limits.SERVER_MAX_BATCH_STATE_CHARS
    assert defaults.jev_versions is True
    args = build_parser().parse_args(
        [
            "serve",
            "--alias",
            "my-router",
            "--max-state-chars",
            "5000",
            "--max-option-texts",
            "64",
            "--max-example-texts",
            "10",
            "--max-batch-state-chars",
            "9000",
            "--no-jev-versions",
        ]
    )
    cfg = server_config(args)
    assert cfg.aliases == ("jev-latest", "my-router")
    assert (cfg.max_state_chars, cfg.max_option_texts, cfg.max_example_texts) == (5000, 64, 10)
    assert cfg.max_batch_state_chars == 9000 and cfg.jev_versions is False


def test_a_budget_below_one_is_refused() -> None:
    from clef_agents.server import ServerConfig

    with pytest.raises(ValueError, match="max_option_texts must be >= 1"):
        ServerConfig(max_option_texts=0).validate()


# -- model names ----------------------------------------------------------------------------


async def test_an_alias_adds_to_jev_latest_and_versioned_names_are_accepted(
    tiny_engine: Any, h: Any
) -> None:
    from clef_agents.cli import build_parser
    from clef_agents.cli.serve import server_config
    from clef_agents.server import create_app

    cfg = server_config(build_parser().parse_args(["serve", "--alias", "my-router"]))
    body = {"state": "refund me", "questions": QUESTIONS}
    async with h.client(create_app(tiny_engine, cfg)) as c:
        codes = {
            name: (await c.post("/v1/systemone", json={**body, "model": name})).status_code
            for name in ("jev-latest", "my-router", "jev-1.13.0", "jev-2.0.0-beta.1", "jev-one")
        }
    assert codes == {
        "jev-latest": 200,
        "my-router": 200,
        "jev-1.13.0": 200,
        "jev-2.0.0-beta.1": 200,
        "jev-one": 404,
    }


async def test_versioned_names_can_be_turned_off(make_app: Any, h: Any) -> None:
    body = {"state": "refund me", "questions": QUESTIONS, "model": "jev-1.13.0"}
    async with h.client(make_app(jev_versions=False)) as c:
        r = await c.post("/v1/systemone", json=body)
    assert r.status_code == 404


# -- OpenAPI, headers, redirects, empty states -----------------------------------------------


async def test_openapi_publishes_the_request_and_response_schemas(make_app: Any, h: Any) -> None:
    async with h.client(make_app()) as c:
        r = await c.get("/openapi.json")
    assert r.status_code == 200
    doc = r.json()
    schemas = doc["components"]["schemas"]
    request = schemas["DecisionRequest"]
    assert {"model", "state", "questions", "assets"} <= set(request["properties"])
    assert set(request["required"]) == {"state", "questions"}
    assert {"Choice", "Noul", "Score", "Box", "DecisionResult", "ChoiceAnswer"} <= set(schemas)
    assert {"model", "answers", "usage"} <= set(schemas["DecisionResult"]["properties"])
    post = doc["paths"]["/v1/systemone"]["post"]
    body = post["requestBody"]["content"]["application/json"]["schema"]
    assert body == {"$ref": "#/components/schemas/DecisionRequest"}
    ok = post["responses"]["200"]["content"]["application/json"]["schema"]
    assert ok == {"$ref": "#/components/schemas/DecisionResult"}
    assert "422" in post["responses"] and "413" in post["responses"]
    batch = doc["paths"]["/v1/systemone/batch"]["post"]
    assert batch["requestBody"]["content"]["application/json"]["schema"]["$ref"].endswith(
        "/BatchRequest"
    )
    # Every $ref resolves.
    refs = {v for v in _walk_refs(doc)}
    assert refs and all(ref.split("/")[-1] in schemas for ref in refs)


def _walk_refs(value: Any) -> list[str]:
    found: list[str] = []
    if isinstance(value, dict):
        for key, item in value.items():
            if key == "$ref" and isinstance(item, str):
                found.append(item)
            else:
                found.extend(_walk_refs(item))
    elif isinstance(value, list):
        for item in value:
            found.extend(_walk_refs(item))
    return found


async def test_405_says_which_methods_are_allowed(make_app: Any, h: Any) -> None:
    async with h.client(make_app()) as c:
        put = await c.put("/v1/systemone", json={})
        post = await c.post("/healthz")
    assert put.status_code == 405 and put.headers["allow"] == "POST"
    assert put.json()["detail"]["error_type"] == "method_not_allowed"
    assert post.status_code == 405 and "GET" in post.headers["allow"]


async def test_401_carries_www_authenticate_bearer(make_app: Any, h: Any) -> None:
    async with h.client(make_app(api_key="s3cret")) as c:
        missing = await c.post("/v1/systemone", json=h.valid_request())
        wrong = await c.post(
            "/v1/systemone", json=h.valid_request(), headers={"Authorization": "Bearer nope"}
        )
    for r in (missing, wrong):
        assert r.status_code == 401
        assert r.headers["www-authenticate"].startswith("Bearer")
    assert 'error="invalid_token"' in wrong.headers["www-authenticate"]


async def test_a_trailing_slash_is_not_redirected_to_the_clients_host(
    make_app: Any, h: Any
) -> None:
    async with h.client(make_app()) as c:
        r = await c.post("/v1/systemone/", json=h.valid_request(), headers={"Host": "evil.example"})
    assert r.status_code == 404
    assert "location" not in r.headers
    assert all("evil" not in v for v in r.headers.values())


@pytest.mark.parametrize("state", [{}, [], "", "   "])
async def test_an_empty_state_is_422(make_app: Any, h: Any, state: Any) -> None:
    async with h.client(make_app()) as c:
        r = await c.post("/v1/systemone", json=_request(state))
    assert r.status_code == 422, r.text
    assert r.json()["detail"][0]["loc"][:2] == ["body", "state"]


async def test_a_lone_surrogate_echoed_in_an_error_is_still_a_422(make_app: Any, h: Any) -> None:
    # The multipart/asset pre-check names the asset key in its loc; a lone surrogate there
    # has no UTF-8 form and used to fail the response encoder with a 500.
    body = _request("look at this")
    body["assets"] = {"\ud800": {"type": "image", "format": "png", "data_base64": "data:x,!!"}}
    async with h.client(make_app()) as c:
        r = await c.post(
            "/v1/systemone",
            content=json.dumps(body).encode(),  # ensure_ascii: the key travels as \\ud800
            headers={"Content-Type": "application/json"},
        )
    assert r.status_code == 422, r.text
    assert r.json()["detail"][0]["loc"][:2] == ["body", "assets"]
