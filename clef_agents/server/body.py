"""Reading a request body safely: size cap, slow-body timeout, decompression, multipart.

Everything here turns hostile input into a 4xx: a body over the cap is 413 (checked on the
declared length, while streaming, and again after decompression, so a compression bomb
never expands past the cap), a body that trickles in is 408 (one deadline for the whole
body, which no trickle of bytes can push back), bad compression is 400, malformed JSON
(including NaN and infinity, which are not JSON) is 422. A client that disconnects is
recorded as 499 (:func:`~clef_agents.server.errors.client_closed`), and a request whose client
disconnects while it waits for the model is dropped (:func:`until_disconnected`).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import json
import time
import zlib
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Mapping
from typing import Any, TypeVar

from starlette.requests import ClientDisconnect, Request
from starlette.types import Receive

from clef_agents.server.errors import HTTPError, ValidationFailed, client_closed

T = TypeVar("T")

_IMAGE_MAGIC = (
    (b"\x89PNG\r\n\x1a\n", "png"),
    (b"\xff\xd8\xff", "jpeg"),
)


def _too_large(cap: int) -> HTTPError:
    return HTTPError(
        413,
        "request_too_large",
        f"request body is larger than the limit of {cap} bytes",
        headers={"Connection": "close"},
    )


async def read_body(request: Request, cap: int, timeout_s: float) -> bytes:
    """The raw body, or 413 (over ``cap``) / 408 (not complete within ``timeout_s``).

    ``timeout_s`` is one deadline for the whole body, counted from the first read: a
    client that sends a byte now and then cannot extend it. A client that disconnects
    mid-body raises the 499 of :func:`~clef_agents.server.errors.client_closed`.
    """
    declared = request.headers.get("content-length")
    if declared is not None:
        if not declared.isdigit():
            raise HTTPError(400, "invalid_request_error", "Content-Length is not a number")
        if int(declared) > cap:
            raise _too_large(cap)
    deadline = time.monotonic() + timeout_s
    chunks: list[bytes] = []
    size = 0
    stream: AsyncIterator[bytes] = request.stream().__aiter__()
    while True:
        remaining = deadline - time.monotonic()
        try:
            if remaining <= 0:
                raise asyncio.TimeoutError
            chunk = await asyncio.wait_for(stream.__anext__(), remaining)
        except StopAsyncIteration:
            break
        except ClientDisconnect:
            raise client_closed("while sending its body") from None
        except asyncio.TimeoutError:
            raise HTTPError(
                408,
                "request_timeout",
                f"the request body did not arrive within {timeout_s:g} s",
                headers={"Connection": "close"},
            ) from None
        size += len(chunk)
        if size > cap:
            raise _too_large(cap)
        chunks.append(chunk)
    return b"".join(chunks)


async def _disconnected(receive: Receive) -> None:
    """Return when the client has gone (the body must have been read already)."""
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return


async def until_disconnected(work: Awaitable[T], request: Request) -> T:
    """Await ``work``, but cancel it and raise 499 if the client disconnects first.

    Cancelling the wait on a :class:`~clef_agents.server.batcher.MicroBatcher` job drops it
    from the queue, so a request whose client has gone is never computed.
    """
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_disconnected(request.receive))
    try:
        done, _ = await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
        if task in done:
            return task.result()
        raise client_closed("while its request waited for the model")
    finally:
        for pending in (task, watcher):
            if not pending.done():
                pending.cancel()
        # Let the cancellations land (and drop the job) before answering.
        await asyncio.gather(task, watcher, return_exceptions=True)


def decompress(body: bytes, encoding: str | None, cap: int) -> bytes:
    """Undo ``Content-Encoding``: ``gzip``, ``zstd``, ``identity`` (a list in reverse order)."""
    if not encoding:
        return body
    codings = [c.strip().lower() for c in encoding.split(",") if c.strip()]
    for coding in reversed(codings):
        if coding == "identity":
            continue
        if coding in ("gzip", "x-gzip"):
            body = _gunzip(body, cap)
        elif coding == "zstd":
            body = _unzstd(body, cap)
        else:
            raise HTTPError(
                415,
                "unsupported_media_type",
                f"Content-Encoding {coding!r} is not supported; use gzip or zstd",
            )
    return body


def _gunzip(body: bytes, cap: int) -> bytes:
    """Every gzip member in turn (RFC 1952 allows several), within ``cap`` in all."""
    out: list[bytes] = []
    size = 0
    rest = body
    while True:
        decoder = zlib.decompressobj(wbits=47)  # gzip or zlib header, auto-detected
        try:
            chunk = decoder.decompress(rest, cap + 1 - size)
        except zlib.error as exc:
            raise HTTPError(
                400, "invalid_request_error", f"body is not valid gzip: {exc}"
            ) from None
        size += len(chunk)
        out.append(chunk)
        if size > cap:
            raise _too_large(cap)
        if not decoder.eof:
            if decoder.unconsumed_tail:  # stopped at the cap, not at the end of the data
                raise _too_large(cap)
            raise HTTPError(
                400, "invalid_request_error", "body is not valid gzip: truncated stream"
            )
        rest = decoder.unused_data
        if not rest:
            return b"".join(out)


def _unzstd(body: bytes, cap: int) -> bytes:
    import io

    import zstandard

    try:
        reader = zstandard.ZstdDecompressor().stream_reader(
            io.BytesIO(body), read_across_frames=True
        )
        out = _read_up_to(reader, cap + 1)
    except zstandard.ZstdError as exc:
        raise HTTPError(400, "invalid_request_error", f"body is not valid zstd: {exc}") from None
    if len(out) > cap:
        raise _too_large(cap)
    if not out and body:
        raise HTTPError(400, "invalid_request_error", "body is not valid zstd: empty frame")
    return out


def _read_up_to(reader: Any, limit: int) -> bytes:
    """Read until EOF or ``limit`` bytes (one ``read`` may stop at a frame boundary)."""
    chunks: list[bytes] = []
    size = 0
    while size < limit:
        chunk = reader.read(limit - size)
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
    return b"".join(chunks)


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def parse_json(body: bytes) -> Any:
    """Strict JSON (no NaN/Infinity) or 422 with ``loc: ["body", position]``."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ValidationFailed.one([exc.start], "body is not UTF-8", "json_invalid") from None
    try:
        return json.loads(text, parse_constant=_reject_constant)
    except json.JSONDecodeError as exc:
        raise ValidationFailed.one(
            [exc.pos], f"JSON decode error: {exc.msg}", "json_invalid"
        ) from None
    except ValueError as exc:
        raise ValidationFailed.one([], str(exc), "json_invalid") from None
    except RecursionError:
        raise ValidationFailed.one([], "JSON is nested too deeply", "json_invalid") from None


def image_format(data: bytes) -> str | None:
    """``png``, ``jpeg`` or ``webp`` from the magic bytes; ``None`` for anything else."""
    for magic, fmt in _IMAGE_MAGIC:
        if data.startswith(magic):
            return fmt
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "webp"
    return None


async def parse_multipart(
    headers: Mapping[str, str], body: bytes, cap: int
) -> tuple[Any, dict[str, bytes]]:
    """The JSON part named ``request`` and the other parts' bytes by name."""
    from starlette.datastructures import Headers, UploadFile
    from starlette.formparsers import MultiPartException, MultiPartParser

    async def stream() -> AsyncGenerator[bytes, None]:
        yield body

    parser = MultiPartParser(
        Headers(headers=dict(headers)),
        stream(),
        max_files=256,
        max_fields=16,
        max_part_size=cap,
    )
    try:
        form = await parser.parse()
    except MultiPartException as exc:
        raise HTTPError(400, "invalid_request_error", f"malformed multipart body: {exc}") from None
    request_part: bytes | None = None
    parts: dict[str, bytes] = {}
    try:
        for name, value in form.multi_items():
            data = await value.read() if isinstance(value, UploadFile) else value.encode()
            if name == "request":
                if request_part is not None:
                    raise ValidationFailed.one(
                        ["request"], "multipart part 'request' appears twice; send one"
                    )
                request_part = data
            elif name in parts:
                raise ValidationFailed.one([name], f"multipart part {name!r} appears twice")
            else:
                parts[name] = data
    finally:
        await form.close()
    if request_part is None:
        raise ValidationFailed.one(
            ["request"], "a multipart body needs a JSON part named 'request'", "missing"
        )
    return parse_json(request_part), parts


def attach_parts(payload: Any, parts: dict[str, bytes]) -> Any:
    """Replace ``assets[name].part`` references by base64 data; every part must be claimed."""
    if not isinstance(payload, dict):
        return payload
    assets = payload.get("assets")
    claimed: set[str] = set()
    if isinstance(assets, dict):
        resolved: dict[str, Any] = {}
        for name, asset in assets.items():
            if isinstance(asset, dict) and isinstance(asset.get("part"), str):
                part = asset["part"]
                if part not in parts:
                    raise ValidationFailed.one(
                        ["assets", name, "part"], f"no multipart part named {part!r}", "missing"
                    )
                data = parts[part]
                fmt = image_format(data)
                if fmt is None:
                    raise ValidationFailed.one(
                        ["assets", name, "part"],
                        "the part is not a PNG, JPEG or WebP image",
                        "value_error",
                    )
                claimed.add(part)
                resolved[name] = {
                    "type": asset.get("type", "image"),
                    "format": fmt,
                    "data_base64": base64.b64encode(data).decode("ascii"),
                }
            else:
                resolved[name] = asset
        payload = {**payload, "assets": resolved}
    unclaimed = sorted(set(parts) - claimed)
    if unclaimed:
        raise ValidationFailed.one(
            [unclaimed[0]], f"multipart part {unclaimed[0]!r} is not used by any asset"
        )
    return payload


def check_assets(payload: Any) -> None:
    """Reject undecodable base64 and missing formats early, naming the asset (422)."""
    if not isinstance(payload, dict) or not isinstance(payload.get("assets"), dict):
        return
    for name, asset in payload["assets"].items():
        if not isinstance(asset, dict):
            continue
        data = asset.get("data_base64")
        if isinstance(data, str):
            try:
                base64.b64decode(data, validate=True)
            except (binascii.Error, ValueError):
                raise ValidationFailed.one(
                    ["assets", name, "data_base64"], "not valid base64", "value_error"
                ) from None
            if asset.get("format") is None:
                raise ValidationFailed.one(
                    ["assets", name, "format"], "format is required with data_base64", "missing"
                )
