"""Image inputs: formats, limits and corruption give typed errors naming the field.

None of these needs OCR: every check runs before pixels reach the OCR models.
"""

from __future__ import annotations

import base64
import io
import struct
import subprocess
import sys
import zlib
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from PIL import Image

from clef_engine import Box, Choice, DecisionRequest, InvalidRequestError, MissingDependencyError
from clef_engine.backbones.vision import images
from clef_engine.backbones.vision import requests as vision_requests
from clef_engine.backbones.vision.images import ImageRef, is_image, open_image
from clef_engine.backbones.vision.layout import Element, ImageEvidence
from clef_engine.backbones.vision.pipeline import VisionPipeline
from clef_engine.errors import UnsupportedQuestionError
from clef_engine.schema import BoxCoords, image_limits

Q = {"page": Choice(instructions="page type", criteria=["login", "article"])}


def encoded(fmt: str = "PNG", size: tuple[int, int] = (40, 20), mode: str = "RGB") -> bytes:
    buf = io.BytesIO()
    Image.new(mode, size, "white").save(buf, fmt)
    return buf.getvalue()


def png_header_only(width: int, height: int) -> bytes:
    """A PNG whose header claims ``width`` x ``height`` but holds almost no data (a bomb)."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return (
            struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
        )

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    idat = zlib.compress(b"\x00" * 64)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", idat) + chunk(b"IEND", b"")


@pytest.mark.parametrize(("fmt", "name"), [("PNG", "png"), ("JPEG", "jpeg"), ("WEBP", "webp")])
def test_accepted_formats_open_with_size(fmt: str, name: str) -> None:
    ref = open_image(encoded(fmt), "state")
    assert (ref.width, ref.height, ref.format) == (40, 20, name)
    assert ref.decode().mode == "RGB"


def test_every_input_kind_gives_the_same_image(tmp_path: Path) -> None:
    data = encoded()
    path = tmp_path / "shot.png"
    path.write_bytes(data)
    b64 = base64.b64encode(data).decode()
    kinds = [data, bytearray(data), path, str(path), b64, f"data:image/png;base64,{b64}"]
    digests = {open_image(k, "state").digest for k in kinds}
    assert len(digests) == 1
    pil = open_image(Image.open(io.BytesIO(data)).convert("RGB"), "state")
    assert (pil.width, pil.height) == (40, 20)


def test_transparent_pixels_become_white() -> None:
    img = Image.new("RGBA", (4, 4), (0, 0, 0, 0))
    assert images.to_rgb(img).getpixel((0, 0)) == (255, 255, 255)


@pytest.mark.parametrize(
    ("value", "top", "expected"),
    [
        ("Sign in to continue", True, False),
        ("screenshot.png", True, True),
        ("https://example.com/shot.png?v=2", True, True),
        ("https://example.com/article", True, False),
        ("data:image/png;base64,AAAA", False, True),
        ("shot.png", False, False),
        ("iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk", True, True),
    ],
)
def test_which_strings_are_images(value: str, top: bool, expected: bool) -> None:
    assert is_image(value, top_level=top) is expected


def test_corrupt_bytes_name_the_field() -> None:
    with pytest.raises(InvalidRequestError) as err:
        open_image(b"definitely not an image", "state.screenshot")
    assert err.value.field == "state.screenshot"
    assert "PNG, JPEG, WebP or GIF" in str(err.value)


def test_truncated_png_fails_on_decode_not_crash() -> None:
    data = encoded(size=(300, 200))
    ref = open_image(data[: len(data) // 2], "state")
    with pytest.raises(InvalidRequestError, match="truncated or corrupt") as err:
        ref.decode()
    assert err.value.field == "state"


def test_gif_bytes_are_read_as_a_pil_gif_is() -> None:
    frames = [Image.new("RGB", (40, 20), c) for c in ("red", "blue")]
    buf = io.BytesIO()
    frames[0].save(buf, "GIF", save_all=True, append_images=frames[1:])
    data = buf.getvalue()
    b64 = base64.b64encode(data).decode()
    for value in (data, b64, f"data:image/gif;base64,{b64}"):
        ref = open_image(value, "state")
        assert (ref.format, ref.width, ref.height) == ("gif", 40, 20)
        assert ref.decode().getpixel((0, 0)) == (255, 0, 0)  # the first frame, in RGB
    pil = open_image(Image.open(io.BytesIO(data)), "state")
    assert pil.decode().getpixel((0, 0)) == (255, 0, 0)


def test_bmp_is_refused_by_name() -> None:
    with pytest.raises(InvalidRequestError, match="format BMP"):
        open_image(encoded("BMP"), "state")


@pytest.mark.parametrize("url", ["https://example.com/shot.png", "http://x.org/a.gif#top"])
def test_image_urls_are_refused_not_read_as_text(tiny_engine, url: str) -> None:
    with pytest.raises(InvalidRequestError, match="never fetched") as err:
        tiny_engine.decide(url, Q)
    assert err.value.field == "state"
    with pytest.raises(InvalidRequestError, match="never fetched") as err:
        open_image(url, "state.screenshot")
    assert err.value.field == "state.screenshot"


def test_decompression_bomb_refused_from_header() -> None:
    with pytest.raises(InvalidRequestError) as err:
        open_image(png_header_only(30_000, 30_000), "state")
    assert err.value.limit in (image_limits.MAX_IMAGE_PIXELS, image_limits.MAX_IMAGE_SIDE)


def test_pixel_limit_per_image() -> None:
    with pytest.raises(InvalidRequestError) as err:
        open_image(png_header_only(8_000, 6_000), "state")
    assert err.value.limit == image_limits.MAX_IMAGE_PIXELS
    assert "48000000" in str(err.value)


def test_byte_limit_checked_before_decoding(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(images, "MAX_IMAGE_BYTES", 100)
    data = encoded(size=(200, 200))
    with pytest.raises(InvalidRequestError) as err:
        open_image(base64.b64encode(data).decode(), "assets.x.data_base64")
    assert err.value.limit == 100


def test_missing_file_names_the_field(tmp_path: Path) -> None:
    with pytest.raises(InvalidRequestError, match="does not exist"):
        open_image(tmp_path / "nope.png", "state")


def test_image_count_limit(tiny_engine) -> None:
    state = [encoded()] * (image_limits.MAX_IMAGES + 1)
    with pytest.raises(InvalidRequestError) as err:
        tiny_engine.decide(state, Q)
    assert err.value.limit == image_limits.MAX_IMAGES
    assert err.value.field == f"state[{image_limits.MAX_IMAGES}]"


def test_total_pixel_limit(tiny_engine, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(vision_requests, "MAX_TOTAL_PIXELS", 1000)
    with pytest.raises(InvalidRequestError) as err:
        tiny_engine.decide([encoded(size=(30, 20)), encoded(size=(30, 20))], Q)
    assert err.value.limit == 1000


def test_corrupt_state_image_through_the_engine(tiny_engine) -> None:
    with pytest.raises(InvalidRequestError) as err:
        tiny_engine.decide({"url": "https://x", "shot": b"\x89PNG broken"}, Q)
    assert err.value.field == "state.shot"


def _wire(assets: dict, state: str = "see <image:0123456789abcdef0123456789abcdef>") -> dict:
    return {"state": state, "questions": {"page": Q["page"].model_dump()}, "assets": assets}


def test_asset_with_bad_base64(tiny_engine) -> None:
    key = "<image:0123456789abcdef0123456789abcdef>"
    request = _wire({key: {"type": "image", "format": "png", "data_base64": "%%%not base64"}})
    with pytest.raises(InvalidRequestError) as err:
        tiny_engine.decide(request)
    assert err.value.field == f"assets.{key}.data_base64"


def test_asset_format_must_match_its_data(tiny_engine) -> None:
    key = "<image:0123456789abcdef0123456789abcdef>"
    data = base64.b64encode(encoded("PNG")).decode()
    request = _wire({key: {"type": "image", "format": "jpg", "data_base64": data}})
    with pytest.raises(InvalidRequestError) as err:
        tiny_engine.decide(request)
    assert err.value.field == f"assets.{key}.format"


class StubPipeline(VisionPipeline):
    """Fixed OCR evidence for every image: a "Sign in" button and an "Email" label."""

    BUTTON = (100.0, 50.0, 300.0, 90.0)

    def evidence(self, refs: Sequence[ImageRef]) -> list[ImageEvidence]:
        elements = [
            Element("Sign in", (150.0, 60.0, 250.0, 80.0), self.BUTTON, "button"),
            Element("Email address", (100.0, 120.0, 250.0, 140.0), (100.0, 120.0, 250.0, 140.0)),
        ]
        return [ImageEvidence(r.digest, r.width, r.height, elements) for r in refs]


@pytest.fixture()
def stub_engine(tiny_engine) -> Iterator[Any]:
    """The tiny engine reading images through :class:`StubPipeline` (no OCR models)."""
    tiny_engine.vision = StubPipeline()
    yield tiny_engine
    tiny_engine.vision = None


def _asset(size: tuple[int, int] = (400, 200)) -> dict[str, str]:
    data = base64.b64encode(encoded(size=size)).decode()
    return {"type": "image", "format": "png", "data_base64": data}


@pytest.mark.parametrize(
    "key", ["screen", "3f2b8c1e-7a4d-4e6b-9c0a-1d2e3f4a5b6c", "<image:" + "ab" * 16 + ">", "x y"]
)
def test_any_asset_key_is_a_placeholder(stub_engine, key: str) -> None:
    request = DecisionRequest.parse(
        {
            "state": {"task": "log in", "screen": f"current page: {key}"},
            "questions": {
                "page": Q["page"].model_dump(),
                "where": {"type": "box", "instructions": f"the sign-in button in {key}"},
            },
            "assets": {key: _asset()},
        }
    )
    text = vision_requests.render(request, stub_engine.vision).text
    # The image's text stands where the key was, once; the object key "screen" stays.
    assert "current page: [image 400x200]\nSign in" in text
    assert key not in text.replace("screen: current", "")
    answer = stub_engine.decide(request).answers["where"]
    assert answer.box == BoxCoords(top=0.25, bottom=0.45, left=0.25, right=0.75)


def test_longer_asset_keys_match_first(stub_engine) -> None:
    request = DecisionRequest.parse(
        {
            "state": "first screen then screen-2",
            "questions": Q,
            "assets": {"screen": _asset((400, 200)), "screen-2": _asset((200, 100))},
        }
    )
    text = vision_requests.render(request, stub_engine.vision).text
    assert text.startswith("first [image 400x200]")
    assert "then [image 200x100]" in text


def test_unreferenced_asset_is_appended_to_the_state(stub_engine) -> None:
    request = DecisionRequest.parse(
        {"state": "what is on the page?", "questions": Q, "assets": {"shot-1": _asset()}}
    )
    text = vision_requests.render(request, stub_engine.vision).text
    assert text.startswith("what is on the page?\n\n[image 400x200]")


class LongPagePipeline(VisionPipeline):
    """Fixed evidence of six lines: a title, a subtitle and four table rows."""

    def evidence(self, refs: Sequence[ImageRef]) -> list[ImageEvidence]:
        lines = ["Account settings", "Billing", *(f"INV-{i} paid" for i in range(4))]
        elements = [
            Element(
                t, (100.0, 40.0 * i, 300.0, 40.0 * i + 20), (100.0, 40.0 * i, 300.0, 40.0 * i + 20)
            )
            for i, t in enumerate(lines)
        ]
        return [ImageEvidence(r.digest, r.width, r.height, elements) for r in refs]


def test_the_headline_view_puts_each_images_headline_where_its_text_was() -> None:
    request = DecisionRequest.parse(
        {
            "state": {"task": "pay the bill", "screen": "screen"},
            "questions": {
                "page": {
                    "type": "choice",
                    "instructions": "Which icon is this page's?",
                    "criteria": {"a": "icon", "b": "something else"},
                },
                "where": {"type": "box", "instructions": "the icon-x"},
            },
            "assets": {"screen": _asset(), "icon-x": _asset((64, 64)), "spare": _asset((80, 80))},
        }
    )
    vis = vision_requests.render(request, LongPagePipeline())
    assert vis.text is not None and "INV-3 paid" in vis.text
    head = vision_requests.headline_text(vis)
    # The state's own text stays; the screen keeps its first three lines; the asset named
    # only in a question is not appended (it is not in the whole text either), the
    # unreferenced one is, as its headline.
    assert head == (
        "screen: [image 400x200]\nAccount settings\nBilling\nINV-0 paid\ntask: pay the bill"
        "\n\n[image 80x80]\nAccount settings\nBilling\nINV-0 paid"
    )
    assert vis.text.count("[image 64x64]") == 0 and vis.text.count("[image 80x80]") == 1
    # A page of three lines or fewer is its own headline: there is no second view.
    short = vision_requests.render(
        DecisionRequest.parse(
            {"state": "<image:a>", "questions": Q, "assets": {"<image:a>": _asset()}}
        ),
        StubPipeline(),
    )
    assert vision_requests.headline_text(short) is None


@pytest.mark.parametrize(
    ("assets", "match"),
    [
        ({"": {}}, "non-empty"),
        ({"   ": {}}, "non-empty"),
        ({"k" * (image_limits.MAX_ASSET_KEY_CHARS + 1): {}}, "257 characters; the limit is 256"),
        ({f"a{i}": {} for i in range(image_limits.MAX_IMAGES + 1)}, "17 assets; the limit is 16"),
        ({"screen \ud800": {}}, "lone surrogate"),
    ],
)
def test_asset_key_limits(assets: dict[str, Any], match: str) -> None:
    data = {k: _asset((4, 4)) for k in assets}
    with pytest.raises(InvalidRequestError, match=match) as err:
        DecisionRequest.parse({"state": "x", "questions": Q, "assets": data})
    assert err.value.field == "assets"


def test_box_is_in_fractions_of_the_image(stub_engine) -> None:
    answer = stub_engine.decide(encoded(size=(400, 200)), {"b": Box(instructions="sign in")})
    box = answer.answers["b"].box
    # The region (100, 50, 300, 90) px of a 400 x 200 image.
    assert box == BoxCoords(top=0.25, bottom=0.45, left=0.25, right=0.75)
    assert box.to_pixels(400, 200) == BoxCoords(top=50, bottom=90, left=100, right=300)
    assert box.center(400, 200) == (200.0, 70.0)


def test_box_without_instructions(stub_engine) -> None:
    image = encoded(size=(400, 200))
    only_image = stub_engine.decide(image, {"b": {"type": "box"}}).answers["b"]
    assert only_image.box == BoxCoords(top=0.0, bottom=1.0, left=0.0, right=1.0)
    assert only_image.confidence is None
    # The state's own text says what to locate.
    asked = stub_engine.decide(
        {"find": "the sign in button", "screen": "<image:" + "c" * 32 + ">"},
        {"b": Box()},
        assets={"<image:" + "c" * 32 + ">": _asset()},
    ).answers["b"]
    assert asked.box == BoxCoords(top=0.25, bottom=0.45, left=0.25, right=0.75)
    assert asked.confidence is not None


def test_placeholder_without_asset(tiny_engine) -> None:
    other = "<image:ffffffffffffffffffffffffffffffff>"
    data = base64.b64encode(encoded()).decode()
    request = _wire({other: {"type": "image", "format": "png", "data_base64": data}})
    with pytest.raises(InvalidRequestError, match="has no entry in assets") as err:
        tiny_engine.decide(request)
    assert err.value.field == "state"


def test_box_question_needs_an_image(tiny_engine) -> None:
    with pytest.raises(UnsupportedQuestionError) as err:
        tiny_engine.decide("just text", {"where": Box(instructions="the sign-in button")})
    assert err.value.field == "questions.where"


def test_batch_keeps_a_corrupt_item_in_its_slot(tiny_engine) -> None:
    out = tiny_engine.decide_batch(["a text state", b"broken"], Q, return_exceptions=True)
    assert out[0].answers["page"].choice in {"login", "article"}
    assert isinstance(out[1], InvalidRequestError) and out[1].field == "state"


def test_missing_ocr_raises_the_install_line(tiny_engine, monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "rapidocr_onnxruntime", None)
    from clef_engine.backbones.vision.pipeline import VisionPipeline

    tiny_engine.vision = VisionPipeline()
    try:
        with pytest.raises(MissingDependencyError) as err:
            tiny_engine.decide(encoded(), Q)
        assert "pip install 'clef-agents[vision]'" in str(err.value)
        assert err.value.package == "rapidocr-onnxruntime"
    finally:
        tiny_engine.vision = None


def test_engine_imports_without_the_vision_extra() -> None:
    code = (
        "import sys\n"
        "for m in ('rapidocr_onnxruntime', 'playwright', 'onnxruntime'): sys.modules[m] = None\n"
        "import engine, clef_agents, clef_agents.vision\n"
        "print('ok')\n"
    )
    root = Path(__file__).resolve().parents[2]
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=root, capture_output=True, text=True, check=False
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"
