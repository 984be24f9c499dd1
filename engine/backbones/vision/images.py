"""Image inputs: PIL images, bytes, paths, base64 strings and data URLs, checked and decoded.

Every image is checked against :mod:`clef_engine.schema.image_limits` before its pixels are
decoded: the encoded size first, then the format and dimensions read from the header
(so a decompression bomb is refused without allocating it). Truncated or corrupt files
raise :class:`~clef_engine.errors.InvalidRequestError` naming the field, never a crash.

Only Pillow is needed here (a core dependency); OCR and CLIP live in sibling modules.

Example:
    >>> import io
    >>> from PIL import Image
    >>> buf = io.BytesIO(); Image.new("RGB", (4, 3), "white").save(buf, "PNG")
    >>> ref = open_image(buf.getvalue(), "state")
    >>> (ref.width, ref.height, ref.format)
    (4, 3, 'png')
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import io
import os
import re
import warnings
from dataclasses import dataclass
from dataclasses import field as dataclass_field
from pathlib import Path
from typing import Any

from PIL import Image

from clef_engine.errors import InvalidRequestError
from clef_engine.schema.image_limits import (
    IMAGE_FORMATS,
    MAX_IMAGE_BYTES,
    MAX_IMAGE_PIXELS,
    MAX_IMAGE_SIDE,
)

_PIL_FORMATS = {"PNG": "png", "JPEG": "jpeg", "WEBP": "webp", "MPO": "jpeg", "GIF": "gif"}
_SUFFIXES = (".png", ".jpg", ".jpeg", ".webp", ".gif")
# Base64 of the magic bytes of PNG, JPEG, WebP ("RIFF") and GIF: a string that starts with
# one of these and has no whitespace is an image, not prose.
_B64_MAGIC = ("iVBORw0KGgo", "/9j/", "UklGR", "R0lGOD")
_URL = re.compile(r"^(?:https?|ftp)://\S+$", re.IGNORECASE)
_DATA_URL = re.compile(r"^data:image/([a-zA-Z0-9.+-]+)?(;[^,]*)?,", re.ASCII)
_MAX_PATH_CHARS = 4096


def normalise_format(name: str | None) -> str | None:
    """``jpg`` → ``jpeg``; lower case; ``None`` stays ``None``."""
    if name is None:
        return None
    lowered = name.lower().strip()
    return "jpeg" if lowered in ("jpg", "jpe", "pjpeg") else lowered


@dataclass
class ImageRef:
    """One image of a request: checked header, content digest, decoded on demand.

    Attributes:
        field: Where the image came from (``state``, ``state.screenshot``, ``assets.<key>``).
        digest: Hex digest of the content (cache key of its OCR evidence).
        width: Width in pixels (from the header).
        height: Height in pixels.
        format: ``png``, ``jpeg`` or ``webp``; ``None`` for an in-memory PIL image.
    """

    field: str
    digest: str
    width: int
    height: int
    format: str | None
    _image: Image.Image = dataclass_field(repr=False)
    _data: bytes | None = dataclass_field(default=None, repr=False)

    @property
    def pixels(self) -> int:
        return self.width * self.height

    def decode(self) -> Image.Image:
        """The fully decoded image in RGB (alpha composited onto white).

        Raises:
            InvalidRequestError: The file is truncated or corrupt.
        """
        # Decode a fresh copy from the encoded bytes, so the pixels are not kept alive by
        # this reference (requests are memoised briefly; their evidence, not pixels).
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", Image.DecompressionBombWarning)
                img = self._image if self._data is None else Image.open(io.BytesIO(self._data))
                img.load()
                return to_rgb(img)
        except (OSError, SyntaxError, ValueError, EOFError, Image.DecompressionBombError) as exc:
            raise InvalidRequestError(
                f"image is truncated or corrupt and cannot be decoded ({type(exc).__name__}: "
                f"{exc})",
                field=self.field,
            ) from None


def to_rgb(img: Image.Image) -> Image.Image:
    """RGB copy of ``img``; transparent pixels become white (as a browser page shows them)."""
    if img.mode == "RGB":
        return img
    if img.mode in ("RGBA", "LA", "PA") or (img.mode == "P" and "transparency" in img.info):
        rgba = img.convert("RGBA")
        canvas = Image.new("RGB", rgba.size, (255, 255, 255))
        canvas.paste(rgba, mask=rgba.getchannel("A"))
        return canvas
    if img.mode.startswith("I;16") or img.mode in ("I", "F"):
        # 16-bit and float greys: scale to 8 bits before conversion.
        return img.point(lambda v: v / 256).convert("L").convert("RGB")
    return img.convert("RGB")


def _check_dimensions(width: int, height: int, where: str) -> None:
    if width < 1 or height < 1:
        raise InvalidRequestError(f"image has no pixels ({width}x{height})", field=where)
    if max(width, height) > MAX_IMAGE_SIDE:
        raise InvalidRequestError(
            f"image is {width}x{height} px; the longest side may be at most {MAX_IMAGE_SIDE} px",
            field=where,
            limit=MAX_IMAGE_SIDE,
        )
    if width * height > MAX_IMAGE_PIXELS:
        raise InvalidRequestError(
            f"image is {width}x{height} = {width * height} px; the limit is {MAX_IMAGE_PIXELS} "
            "px per image",
            field=where,
            limit=MAX_IMAGE_PIXELS,
        )


def _check_bytes(n: int, where: str) -> None:
    if n > MAX_IMAGE_BYTES:
        raise InvalidRequestError(
            f"image has {n} bytes; the limit is {MAX_IMAGE_BYTES} bytes per image",
            field=where,
            limit=MAX_IMAGE_BYTES,
        )
    if n == 0:
        raise InvalidRequestError("image is empty (0 bytes)", field=where)


def from_bytes(data: bytes, where: str, *, declared: str | None = None) -> ImageRef:
    """Check and open encoded image bytes (header only; pixels are decoded later)."""
    _check_bytes(len(data), where)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            img = Image.open(io.BytesIO(data))
    except Image.DecompressionBombError:
        raise InvalidRequestError(
            f"image has more than {MAX_IMAGE_PIXELS} px (decompression bomb refused)",
            field=where,
            limit=MAX_IMAGE_PIXELS,
        ) from None
    except (OSError, SyntaxError, ValueError, EOFError):
        raise InvalidRequestError(
            "not a readable image (expected PNG, JPEG, WebP or GIF bytes)", field=where
        ) from None
    fmt = _PIL_FORMATS.get(str(img.format))
    if fmt is None or fmt not in IMAGE_FORMATS:
        raise InvalidRequestError(
            f"image format {img.format or 'unknown'} is not accepted; use one of "
            f"{', '.join(IMAGE_FORMATS)} (jpg is jpeg)",
            field=where,
        )
    declared = normalise_format(declared)
    if declared is not None and declared != fmt:
        raise InvalidRequestError(
            f"the data is {fmt} but the asset declares format {declared!r}",
            field=f"{where}.format" if where.startswith("assets.") else where,
        )
    width, height = img.size
    _check_dimensions(width, height, where)
    digest = hashlib.sha256(data).hexdigest()[:32]
    return ImageRef(where, digest, width, height, fmt, img, data)


def from_pil(img: Image.Image, where: str) -> ImageRef:
    """Check an in-memory PIL image (its size; the digest is taken over its pixels)."""
    width, height = img.size
    _check_dimensions(width, height, where)
    try:
        img.load()
        payload = img.tobytes()
    except (OSError, SyntaxError, ValueError, EOFError) as exc:
        raise InvalidRequestError(
            f"image is truncated or corrupt and cannot be decoded ({exc})", field=where
        ) from None
    h = hashlib.sha256(f"{img.mode}:{width}x{height}:".encode())
    h.update(payload)
    fmt = _PIL_FORMATS.get(str(img.format)) if img.format else None
    return ImageRef(where, h.hexdigest()[:32], width, height, fmt, img)


def from_path(path: str | os.PathLike[str], where: str) -> ImageRef:
    """Check and open an image file (its size is checked before it is read)."""
    p = Path(path).expanduser()
    if not p.is_file():
        raise InvalidRequestError(f"image file {str(p)!r} does not exist", field=where)
    _check_bytes(p.stat().st_size, where)
    return from_bytes(p.read_bytes(), where)


def decode_base64(text: str, where: str) -> bytes:
    """Decode base64 (standard or URL-safe, whitespace allowed) after a size check."""
    compact = "".join(text.split())
    # Refuse oversized payloads before allocating their decoded bytes.
    if len(compact) * 3 // 4 > MAX_IMAGE_BYTES + 3:
        raise InvalidRequestError(
            f"image has about {len(compact) * 3 // 4} bytes; the limit is {MAX_IMAGE_BYTES} "
            "bytes per image",
            field=where,
            limit=MAX_IMAGE_BYTES,
        )
    if "-" in compact or "_" in compact:
        compact = compact.replace("-", "+").replace("_", "/")
    compact += "=" * (-len(compact) % 4)
    try:
        return base64.b64decode(compact, validate=True)
    except (binascii.Error, ValueError):
        raise InvalidRequestError("not valid base64", field=where) from None


def from_data_url(url: str, where: str) -> ImageRef:
    """Open a ``data:image/<fmt>;base64,...`` URL."""
    match = _DATA_URL.match(url)
    if match is None or ";base64" not in (match.group(2) or ""):
        raise InvalidRequestError(
            "only base64 data URLs are accepted (data:image/png;base64,...)", field=where
        )
    data = decode_base64(url[match.end() :], where)
    return from_bytes(data, where, declared=match.group(1))


def is_image_string(text: str, *, top_level: bool, allow_paths: bool = True) -> bool:
    """Whether a string is an image rather than prose.

    Data URLs always are. A whole state (``top_level``) is also an image when it is bare
    base64 of a PNG/JPEG/WebP/GIF file, an image URL (so that it is refused by name rather
    scored as text), or (with ``allow_paths``) a single token ending in
    .png/.jpg/.jpeg/.webp (a path). Without ``allow_paths`` (requests over HTTP) such a
    token is text: the server never reads its own files for a client.
    """
    if text.startswith("data:image/"):
        return True
    if not top_level:
        return False
    stripped = text.strip()
    if not stripped or any(c.isspace() for c in stripped[:_MAX_PATH_CHARS]):
        return False
    if stripped.startswith(_B64_MAGIC) and len(stripped) >= 32:
        return True
    if is_image_url(stripped):
        return True  # an image, named by a URL: refused by open_image (never fetched)
    if not allow_paths or "://" in stripped or len(stripped) > _MAX_PATH_CHARS:
        return False  # other URLs are text
    return stripped.lower().endswith(_SUFFIXES)


def is_image_url(text: str) -> bool:
    """Whether ``text`` is one http(s)/ftp URL whose path ends in an image suffix."""
    stripped = text.strip()
    if len(stripped) > _MAX_PATH_CHARS or _URL.match(stripped) is None:
        return False
    path = stripped.split("?", 1)[0].split("#", 1)[0].lower()
    return path.endswith(_SUFFIXES)


def refuse_url(url: str, where: str) -> InvalidRequestError:
    """The error for an image given as a URL: the engine never fetches anything."""
    shown = url if len(url) <= 80 else url[:79] + "…"
    return InvalidRequestError(
        f"{shown!r} is a URL; images are never fetched: download it yourself and pass the "
        "bytes (or give ScreenshotClassifier a fetcher=)",
        field=where,
    )


def is_image(value: Any, *, top_level: bool = False, allow_paths: bool = True) -> bool:
    """Whether ``value`` is an image input (not a container that holds one)."""
    if isinstance(value, Image.Image):
        return True
    if isinstance(value, (bytes, bytearray, memoryview)):
        return True
    if isinstance(value, os.PathLike):
        return allow_paths
    if isinstance(value, str):
        return is_image_string(value, top_level=top_level, allow_paths=allow_paths)
    return False


def open_image(
    value: Any, where: str, *, declared: str | None = None, allow_paths: bool = True
) -> ImageRef:
    """Check and open any accepted image input.

    Args:
        value: A PIL image, encoded bytes, a path, a data URL or a base64 string.
        where: The field name used in errors.
        declared: The format an asset declares (``png``, ``jpg``, ``jpeg``, ``webp``).
        allow_paths: Whether ``value`` may name a file to read. ``False`` for requests over
            HTTP; the error then neither names the path nor says whether it exists.

    Raises:
        InvalidRequestError: Unreadable, corrupt, of a refused format, or over a limit.
    """
    if isinstance(value, Image.Image):
        return from_pil(value, where)
    if isinstance(value, (bytes, bytearray, memoryview)):
        return from_bytes(bytes(value), where, declared=declared)
    if isinstance(value, str):
        stripped = value.strip()
        if stripped.startswith("data:"):
            return from_data_url(stripped, where)
        if _URL.match(stripped):
            raise refuse_url(stripped, where)
        if declared is not None or stripped.startswith(_B64_MAGIC):
            return from_bytes(decode_base64(stripped, where), where, declared=declared)
    if isinstance(value, (str, os.PathLike)):
        if not allow_paths:
            raise InvalidRequestError(
                "images here must be data URLs or base64 (or multipart parts); "
                "file paths are not read",
                field=where,
            )
        return from_path(value.strip() if isinstance(value, str) else value, where)
    raise InvalidRequestError(
        f"unsupported image type {type(value).__name__}; use PIL, bytes, a path, base64 or a "
        "data URL",
        field=where,
    )
