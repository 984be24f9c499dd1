"""Images through the real engine: OCR evidence, the wire format's assets, box answers,
and the optional CLIP fusion on a tiny random CLIP built in code."""

from __future__ import annotations

import base64
import io
from pathlib import Path

import pytest
import torch
from PIL import Image, ImageDraw, ImageFont

from clef_engine import Box, BoxAnswer, Choice, DecisionEngine, DecisionRequest, Noul
from clef_engine.backbones.vision import VisionBackbone
from clef_engine.backbones.vision.images import open_image
from clef_engine.backbones.vision.requests import fuse
from clef_engine.runtime.stages import HEADLINE_WEIGHT

pytest.importorskip("rapidocr_onnxruntime")
pytestmark = pytest.mark.integration

PAGE = Choice(
    instructions="What kind of page is this?",
    criteria={
        "login": "a sign-in form with email and password",
        "article": "a news article with paragraphs",
        "error": "an error page: page not found",
    },
)
BUTTON = (480, 420, 800, 465)  # left, top, right, bottom of the drawn sign-in button


def draw_login() -> Image.Image:
    img = Image.new("RGB", (1280, 800), "white")
    d = ImageDraw.Draw(img)
    big, small = ImageFont.load_default(size=34), ImageFont.load_default(size=18)
    d.text((480, 150), "Sign in to Acme", fill="black", font=big)
    d.text((480, 240), "Email address", fill="#333", font=small)
    d.rectangle((480, 265, 800, 305), outline="#999", width=1)
    d.text((490, 275), "you@example.com", fill="#999", font=small)
    d.text((480, 330), "Password", fill="#333", font=small)
    d.rectangle((480, 355, 800, 395), outline="#999", width=1)
    d.rounded_rectangle(BUTTON, radius=6, fill="#2563eb")
    d.text((610, 432), "Sign in", fill="white", font=small)
    d.text((480, 490), "Forgot password?", fill="#2563eb", font=small)
    return img


def draw_error() -> Image.Image:
    img = Image.new("RGB", (1280, 800), "#f5f5f5")
    d = ImageDraw.Draw(img)
    d.text((520, 250), "404", fill="#b91c1c", font=ImageFont.load_default(size=90))
    d.text((470, 380), "Page not found", fill="black", font=ImageFont.load_default(size=36))
    return img


def png(img: Image.Image) -> bytes:
    buf = io.BytesIO()
    img.save(buf, "PNG")
    return buf.getvalue()


@pytest.fixture(scope="module")
def login_png() -> bytes:
    return png(draw_login())


def inside(answer: BoxAnswer, x: float, y: float, size: tuple[int, int] = (1280, 800)) -> bool:
    """Whether the answer's box (fractions of a ``size`` image) contains pixel ``(x, y)``."""
    assert answer.box is not None
    box = answer.box.to_pixels(*size)
    return box.left <= x <= box.right and box.top <= y <= box.bottom


def test_screenshot_classified_and_button_located(engine, login_png) -> None:
    result = engine.decide(
        login_png,
        {
            "page": PAGE,
            "button": Box(instructions="the sign-in button"),
            "email": Box(instructions="the email field"),
        },
    )
    assert result.answers["page"].choice == "login"
    assert abs(sum(result.answers["page"].probabilities.values()) - 1.0) < 1e-6
    button = result.answers["button"]
    assert inside(button, (BUTTON[0] + BUTTON[2]) / 2, (BUTTON[1] + BUTTON[3]) / 2)
    # The layout analysis widens the text box to the whole drawn button.
    pixels = button.box.to_pixels(1280, 800)
    assert pixels.left <= BUTTON[0] + 2 and pixels.right >= BUTTON[2] - 2
    # On the wire, fractions of the image height and width (the SDK's schema).
    assert button.box.left == pytest.approx(pixels.left / 1280)
    assert 0.0 <= button.box.top < button.box.bottom <= 1.0
    assert 0.0 < button.confidence <= 1.0
    assert inside(result.answers["email"], 640, 285)
    assert list(result.answers) == ["page", "button", "email"]
    assert result.to_wire()["answers"]["button"]["box"].keys() == {"top", "bottom", "left", "right"}


def test_two_screens_get_different_answers(engine, login_png) -> None:
    out = engine.decide_batch([login_png, png(draw_error())], {"page": PAGE})
    assert [r.answers["page"].choice for r in out] == ["login", "error"]


def test_every_input_kind_gives_the_same_decision(engine, login_png, tmp_path: Path) -> None:
    path = tmp_path / "login.png"
    path.write_bytes(login_png)
    b64 = base64.b64encode(login_png).decode()
    states = [login_png, path, str(path), b64, f"data:image/png;base64,{b64}",
              Image.open(io.BytesIO(login_png))]  # fmt: skip
    probs = [engine.decide(s, {"page": PAGE}).answers["page"].probabilities for s in states]
    for p in probs[1:]:
        assert p == pytest.approx(probs[0], abs=1e-6)


def test_wire_assets_with_placeholders_in_state_and_instructions(engine, login_png) -> None:
    key = "<image:" + "ab" * 16 + ">"
    asset = {"type": "image", "format": "png", "data_base64": base64.b64encode(login_png).decode()}
    wire = {
        "model": "clef-minilm-l6",
        "state": {"task": "log in to the shop", "screen": f"current screen: {key}"},
        "questions": {
            "page": PAGE.model_dump(),
            "ready": {"type": "noul", "instructions": f"Does {key} show a password field?"},
            "button": {"type": "box", "instructions": f"the sign-in button in {key}"},
        },
        "assets": {key: asset},
    }
    result = engine.decide(DecisionRequest.parse(wire))
    assert result.answers["page"].choice == "login"
    assert 0.0 <= result.answers["ready"].noul <= 1.0
    assert inside(result.answers["button"], 640, 442)
    # The OCR text stands in for the image in the rendered state.
    assert result.usage.input_tokens > 20


def test_image_inside_chat_message_content(engine, login_png) -> None:
    b64 = base64.b64encode(login_png).decode()
    messages = [
        {"role": "user", "content": [
            {"type": "text", "text": "What am I looking at?"},
            {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{b64}"}},
        ]},
    ]  # fmt: skip
    assert engine.decide(messages, {"page": PAGE}).answers["page"].choice == "login"


def test_blank_image_has_no_box(engine) -> None:
    blank = png(Image.new("RGB", (320, 200), "white"))
    result = engine.decide(blank, {"b": Box(instructions="the sign-in button"), "page": PAGE})
    assert result.answers["b"].box is None and result.answers["b"].confidence is None
    assert abs(sum(result.answers["page"].probabilities.values()) - 1.0) < 1e-6


def draw_settings_with_a_table() -> Image.Image:
    """An account settings page whose billing history table fills the screen."""
    img = Image.new("RGB", (1280, 800), "white")
    d = ImageDraw.Draw(img)
    small = ImageFont.load_default(size=16)
    d.text((80, 40), "Account settings", fill="black", font=ImageFont.load_default(size=34))
    d.text((80, 100), "Billing history", fill="#333", font=ImageFont.load_default(size=22))
    for i, col in enumerate(("Invoice", "Date", "Amount", "Status", "Receipt")):
        d.text((80 + 230 * i, 150), col, fill="black", font=small)
    for r in range(20):
        row = (f"INV-{1040 + r}", f"2026-{r % 12 + 1:02d}-14", f"${19 + 7 * r}.00")
        row += ("Paid" if r % 3 else "Refunded", "Download")
        for i, value in enumerate(row):
            d.text((80 + 230 * i, 190 + 29 * r), value, fill="#222", font=small)
    return img


def test_a_choice_about_a_screenshot_also_reads_its_headline(engine) -> None:
    question = Choice(
        instructions="What kind of page is this?",
        criteria={
            "settings": "account settings or a user profile",
            "data_table": "a table of records with column headers and rows",
            "login": "a sign-in form",
        },
    )
    shot = png(draw_settings_with_a_table())
    result = engine.decide(shot, {"q": question})
    answer = result.answers["q"]
    # The page's twenty table rows outweigh its title in the whole text; the first lines
    # ("Account settings", "Billing history", "Invoice") and the layout say settings.
    evidence = engine.vision.read(open_image(shot, "state"))
    headline = evidence.headline()
    assert headline is not None and headline.splitlines()[1] == "Account settings"
    as_text = engine.decide(evidence.text(), {"q": question})
    whole = as_text.answers["q"]
    head = engine.decide(headline, {"q": question}).answers["q"]
    assert whole.choice == "data_table" and head.choice == "settings"
    # usage counts what the encoder read: the whole text, the headline view and the options.
    read_twice = engine.backbone.count_tokens([headline])[0]
    assert result.usage.input_tokens == as_text.usage.input_tokens + read_twice
    assert answer.choice == "settings"
    labels = list(question.criteria)
    pooled = fuse(
        torch.tensor([whole.probabilities[k] for k in labels], dtype=torch.float64),
        torch.tensor([head.probabilities[k] for k in labels], dtype=torch.float64),
        HEADLINE_WEIGHT,
    )
    assert [answer.probabilities[k] for k in labels] == pytest.approx(pooled.tolist(), abs=1e-4)
    # Only choices read it: a yes/no question about the same page reads the whole text.
    yes_no = Noul(instructions="Is this a table of records?")
    assert engine.decide(shot, {"n": yes_no}).answers["n"].noul == pytest.approx(
        engine.decide(evidence.text(), {"n": yes_no}).answers["n"].noul, abs=1e-6
    )


def test_fusion_is_log_linear() -> None:
    p_text = torch.tensor([0.7, 0.2, 0.1], dtype=torch.float64)
    p_image = torch.tensor([0.1, 0.8, 0.1], dtype=torch.float64)
    assert torch.allclose(fuse(p_text, p_image, 0.0), p_text)
    assert torch.allclose(fuse(p_text, p_image, 1.0), p_image)
    mid = fuse(p_text, p_image, 0.5)
    expected = torch.sqrt(p_text * p_image)
    assert torch.allclose(mid, expected / expected.sum())


@pytest.fixture(scope="module")
def clip_engine(tmp_path_factory) -> DecisionEngine:
    from clef_engine.backbones.vision.testing import write_tiny_clip
    from clef_engine.testing import tiny_encoder

    clip_dir = write_tiny_clip(tmp_path_factory.mktemp("tiny-clip"))
    backbone = VisionBackbone(text=tiny_encoder(max_length=64), clip_path=clip_dir, device="cpu")
    return DecisionEngine(backbone)


def test_tiny_clip_alone_decides_images_without_text(clip_engine) -> None:
    """No OCR text: the image encoder's distribution is the answer (weight 1)."""
    img = Image.new("RGB", (200, 120), (200, 40, 40))
    result = clip_engine.decide(png(img), {"page": PAGE})
    encoder = clip_engine.backbone.vision.image_encoder
    prepared = clip_engine.prepare_question(PAGE)
    expected = encoder.probabilities([img], prepared.texts)[0]
    got = torch.tensor(list(result.answers["page"].probabilities.values()), dtype=torch.float64)
    assert torch.allclose(got, expected, atol=1e-5)


def test_tiny_clip_is_fused_with_ocr_text(clip_engine, login_png) -> None:
    vision = clip_engine.backbone.vision
    fused = clip_engine.decide(login_png, {"page": PAGE}).answers["page"].probabilities
    encoder, vision.image_encoder = vision.image_encoder, None
    try:
        vision._cache.clear()
        text_only = clip_engine.decide(login_png, {"page": PAGE}).answers["page"].probabilities
    finally:
        vision.image_encoder = encoder
        vision._cache.clear()
    assert abs(sum(fused.values()) - 1.0) < 1e-6
    assert fused != pytest.approx(text_only, abs=1e-4)
    assert clip_engine.backbone.config()["kind"] == "vision"
    assert "clip_path" in clip_engine.backbone.config()


class _SyncPage:
    """Duck-typed like a sync Playwright Page (the adapters never import Playwright)."""

    def __init__(self, shot: bytes) -> None:
        self.shot = shot

    def goto(self, url: str) -> None:  # pragma: no cover - never navigated here
        raise AssertionError(url)

    def screenshot(self, full_page: bool = False) -> bytes:
        return self.shot


def test_langchain_decision_takes_a_page_or_screenshot(engine, login_png) -> None:
    pytest.importorskip("langchain_core")
    from clef_agents.langchain import ClefDecision

    decision = ClefDecision(questions={"page": PAGE}, engine=engine)
    from_page = decision.invoke(_SyncPage(login_png)).answers["page"]
    from_bytes = decision.invoke(login_png).answers["page"]
    assert from_page.choice == "login"
    assert from_page.probabilities == pytest.approx(from_bytes.probabilities, abs=1e-6)


def test_llama_index_query_bundle_with_image_path(engine, login_png, tmp_path: Path) -> None:
    pytest.importorskip("llama_index.core")
    from llama_index.core.schema import QueryBundle

    from clef_agents.llama_index.selector import query_state

    path = tmp_path / "shot.png"
    path.write_bytes(login_png)
    assert query_state(QueryBundle(query_str="hello")) == "hello"
    image_only = query_state(QueryBundle(query_str="", image_path=str(path)))
    assert image_only == path
    with_text = query_state(QueryBundle(query_str="what page is this?", image_path=str(path)))
    result = engine.decide(with_text, {"page": PAGE})
    assert result.answers["page"].choice == "login"


def test_ocr_recogniser_settings_reach_rapidocr_and_read_the_page() -> None:
    from clef_engine.backbones.vision.ocr import RapidOcr

    ocr = RapidOcr(rec_batch=2, rec_min_width=96)
    texts = [line.text for line in ocr.read(draw_login())]
    rec = ocr._load().text_rec
    assert rec.rec_batch_num == 2 and rec.rec_image_shape == [3, 48, 96]
    assert "Sign in to Acme" in texts and "Forgot password?" in texts
    assert ocr.config()["rec_min_width"] == 96
    for bad in ({"rec_batch": 0}, {"rec_min_width": 8}):
        with pytest.raises(ValueError, match=next(iter(bad))):
            RapidOcr(**bad)  # type: ignore[arg-type]


def test_openvino_and_onnxruntime_read_the_same_page() -> None:
    pytest.importorskip("openvino")
    from clef_engine.backbones.vision.ocr import RapidOcr, _OpenVinoSession

    ov, ort = RapidOcr(runtime="openvino"), RapidOcr(runtime="onnxruntime")
    assert RapidOcr().runtime == "openvino"  # auto picks OpenVINO when it is installed
    assert ov.config()["runtime"] == "openvino" and ort.config()["runtime"] == "onnxruntime"
    engine = ov._load()
    assert isinstance(engine.text_det.infer, _OpenVinoSession)
    assert isinstance(engine.text_rec.session, _OpenVinoSession)
    assert not isinstance(ort._load().text_rec.session, _OpenVinoSession)
    assert ov.precision in ("f32", "bf16", "f16") and ort.precision == "f32"
    image = draw_login()
    a, b = ov.read(image), ort.read(image)
    assert [line.text for line in a] == [line.text for line in b]
    assert "Sign in to Acme" in [line.text for line in a]
    for x, y in zip(a, b, strict=True):
        assert max(abs(p - q) for p, q in zip(x.box, y.box, strict=True)) <= 3.0


def test_ocr_runtime_choice_is_checked(monkeypatch) -> None:
    import sys

    from clef_engine import MissingDependencyError
    from clef_engine.backbones.vision import ocr as ocr_module

    with pytest.raises(ValueError, match="runtime must be one of auto, openvino, onnxruntime"):
        ocr_module.RapidOcr(runtime="tensorrt")
    monkeypatch.setattr(ocr_module, "_has_openvino", lambda: False)
    assert ocr_module.RapidOcr().runtime == "onnxruntime"  # auto without OpenVINO
    monkeypatch.setitem(sys.modules, "openvino", None)
    wanted = ocr_module.RapidOcr(runtime="openvino")
    for _ in range(2):  # a failed load is not cached as a half-built ONNX Runtime engine
        with pytest.raises(MissingDependencyError, match=r"pip install 'clef-agents\[vision\]'"):
            wanted.read(draw_login())


def test_openvino_recogniser_pads_line_batches_to_recurring_shapes() -> None:
    """OpenVINO prepares kernels per new input shape; the recogniser session pads each
    line batch to ``rec_batch`` rows and a bucketed width and returns only the real rows."""
    import numpy as np

    from clef_engine.backbones.vision.ocr import _OpenVinoSession, rec_width

    assert [rec_width(w) for w in (160, 161, 321, 640, 641, 1280, 1281)] == [
        160, 176, 352, 640, 704, 1280, 1408,
    ]  # fmt: skip
    assert all(w <= rec_width(w) <= 1.1 * w for w in range(160, 4000))

    seen: list[tuple[int, ...]] = []

    class Request:
        def infer(self, inputs: dict[int, np.ndarray]) -> dict[str, np.ndarray]:
            x = inputs[0]
            seen.append(x.shape)
            return {"out": x[:, 0, 0, :].copy()}  # one row per input row

    session = _OpenVinoSession.__new__(_OpenVinoSession)
    session._request, session._output, session.batch = Request(), "out", 4
    batch = np.random.default_rng(0).random((3, 3, 48, 170), dtype=np.float32)
    [out] = session(batch)
    assert seen == [(4, 3, 48, 176)]
    assert out.shape == (3, 176)
    np.testing.assert_array_equal(out[:, :170], batch[:, 0, 0, :])
    assert not out[:, 170:].any()  # RapidOCR's own padding value (0 after normalising)
    session.batch = None  # the detector: inputs go through as they are
    session(batch)
    assert seen[-1] == (3, 3, 48, 170)


def test_detector_input_is_normalised_in_float32_with_the_same_values() -> None:
    import numpy as np
    from rapidocr_onnxruntime.ch_ppocr_det.utils import DetPreProcess

    from clef_engine.backbones.vision.ocr import RapidOcr

    det = RapidOcr(runtime="onnxruntime")._load().text_det
    fast = det.get_preprocess(1280)
    assert fast.mean.dtype == np.float32 and fast.std.dtype == np.float32
    image = np.random.default_rng(1).integers(0, 256, (96, 160, 3), dtype=np.uint8)
    reference = DetPreProcess(fast.limit_side_len, fast.limit_type)(image)  # float64 maths
    assert reference is not None
    np.testing.assert_allclose(fast(image), reference, rtol=0, atol=1e-6)
