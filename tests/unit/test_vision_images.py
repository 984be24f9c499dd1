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
from pathlib import Path

import pytest
from PIL import Image

from engine import Box, Choice, InvalidRequestError, MissingDependencyError
from engine.backbones.vision import images
from engine.backbones.vision import requests as vision_requests
from engine.backbones.vision.images import is_image, open_image
from engine.errors import UnsupportedQuestionError
from engine.schema import image_limits

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
        ("https://example.com/shot.png", True, False),
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
    assert "PNG, JPEG or WebP" in str(err.value)


def test_truncated_png_fails_on_decode_not_crash() -> None:
    data = encoded(size=(300, 200))
    ref = open_image(data[: len(data) // 2], "state")
    with pytest.raises(InvalidRequestError, match="truncated or corrupt") as err:
        ref.decode()
    assert err.value.field == "state"


def test_gif_is_refused() -> None:
    with pytest.raises(InvalidRequestError, match="format GIF"):
        open_image(encoded("GIF"), "state")


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


def test_asset_keys_must_be_placeholders(tiny_engine) -> None:
    data = base64.b64encode(encoded()).decode()
    request = _wire({"screenshot": {"type": "image", "format": "png", "data_base64": data}})
    with pytest.raises(InvalidRequestError) as err:
        tiny_engine.decide(request)
    assert err.value.field == "assets.screenshot"


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
    from engine.backbones.vision.pipeline import VisionPipeline

    vision_requests.attach(tiny_engine, VisionPipeline())
    try:
        with pytest.raises(MissingDependencyError) as err:
            tiny_engine.decide(encoded(), Q)
        assert "pip install 'clef-agents[vision]'" in str(err.value)
        assert err.value.package == "rapidocr-onnxruntime"
    finally:
        tiny_engine.__dict__.pop("_vision_pipeline", None)


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
