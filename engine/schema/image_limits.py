"""Limits on image inputs, beside :mod:`clef_engine.schema.limits`: errors, docs, server agree.

Every limit is checked before pixels are decoded: the encoded size first, then the
dimensions read from the header, so a decompression bomb is refused without allocating it.
"""

from __future__ import annotations

MAX_IMAGES = 16
"""Images per request (state images and ``assets`` together)."""
MAX_ASSET_KEY_CHARS = 256
"""Longest asset key (an opaque placeholder: the SDK's 39-character ``<image:32 hex>``, a
UUID, an alias such as ``screen``)."""
MAX_IMAGE_BYTES = 20 * 1024 * 1024
"""Encoded size of one image, in bytes (20 MiB)."""
MAX_IMAGE_PIXELS = 40_000_000
"""Pixels of one image (width x height): a 1280-wide full-page screenshot 31,000 px tall."""
MAX_TOTAL_PIXELS = 80_000_000
"""Pixels of all images of one request together."""
MAX_IMAGE_SIDE = 32_768
"""Longest side of one image, in pixels."""
IMAGE_FORMATS = ("png", "jpeg", "webp", "gif")
"""Accepted encodings; ``jpg`` is an alias of ``jpeg``. A GIF is read as its first frame
(bytes, files, base64 and data URLs as for a PIL image; a wire asset's ``format`` field
names png, jpg, jpeg or webp, as the API schema does)."""
