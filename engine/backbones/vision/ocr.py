"""OCR evidence from RapidOCR (PP-OCRv4 det + rec, ONNX models shipped inside the wheel).

The OCR models load once per :class:`RapidOcr` and are reused for every image. Images are
downscaled so that their longest side is at most ``max_side`` before detection
(detection time grows with the pixel count), and the boxes are scaled back to the
caller's pixels.

RapidOCR does the pre- and post-processing; the two networks run on OpenVINO when the
``openvino`` package is installed (part of the ``[vision]`` extra) and on ONNX Runtime
otherwise (``runtime=``). Both read the same ONNX files. On the 2-core AMD EPYC of the
benchmarks OpenVINO ran the recogniser about 3x faster (62-70 against 186-236 ms per page
p50 in interleaved rounds); 501 of the 529 fixture lines read identically, and the other
28 differ in spaces ("Qty2" / "Qty 2") or one character.

``rapidocr_onnxruntime`` is imported lazily: ``engine`` imports without the ``[vision]``
extra, and the first image raises :class:`~clef_engine.errors.MissingDependencyError` with the
install line.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import re
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
from PIL import Image

from clef_engine.errors import ModelLoadError, require

DEFAULT_MAX_SIDE = 1280
"""Longest side OCR sees. 1280x800 screenshots are read as they are (at 1024 px the
recogniser drops many spaces between words: "Sendresetlink"); larger ones are downscaled."""

DEFAULT_DET_SIDE = 768
"""Longest side the text *detector* sees. Detection finds line boxes and is 3-4x cheaper at
0.6x with the same lines found; recognition then reads crops from the ``max_side`` image."""

DEFAULT_REC_BATCH = 4
"""Text lines per recogniser call. The recogniser pads every line of a call to the widest
one, and the padding both costs time and swallows spaces between words: on the 41 fixture
screenshots, calls of 16 lines read "wemadealong theway." where calls of 6 read "we made
along the way." (508 of 529 lines identical), and took 300 against 434 ms p50 per page."""

DEFAULT_REC_MIN_WIDTH = 160
"""Narrowest input (pixels, at the recogniser's 48 px height) a call is padded to. The
model's default of 320 pads a "Sign in" button's crop to 4x its width; 160 read the
fixture pages in 345 ms p50 against 403 ms for 320 (both in calls of 4 and 6 lines,
interleaved on the same machine), with 509 of 529 lines identical."""

RUNTIMES = ("auto", "openvino", "onnxruntime")
"""``auto``: OpenVINO when it is installed, else ONNX Runtime."""

_CAMEL = re.compile(r"(?<=[a-z])(?=[A-Z][a-z])")


@dataclass(frozen=True)
class OcrLine:
    """One line of text found in an image.

    Attributes:
        text: The recognised text.
        box: ``(left, top, right, bottom)`` in pixels of the image that was read.
        score: Recognition confidence in [0, 1].
    """

    text: str
    box: tuple[float, float, float, float]
    score: float


class OcrEngine(Protocol):
    """What the vision pipeline needs from an OCR engine."""

    def read(self, image: Image.Image) -> list[OcrLine]:
        """Text lines of an RGB image, boxes in that image's pixels."""
        ...

    def config(self) -> dict[str, Any]:
        """JSON-serialisable settings (part of the model version)."""
        ...


def load_rapidocr(**kwargs: Any) -> Any:
    """Build ``rapidocr_onnxruntime.RapidOCR`` or raise the ``[vision]`` install line."""
    if importlib.util.find_spec("rapidocr_onnxruntime") is not None:
        try:
            importlib.import_module("rapidocr_onnxruntime")
        except ImportError as exc:
            # Installed, but a system library is missing (OpenCV needs libGL).
            raise ModelLoadError(
                f"rapidocr-onnxruntime is installed but cannot be imported ({exc}); on Debian/"
                "Ubuntu install the system libraries with: apt-get install libgl1 libglib2.0-0"
            ) from exc
    module = require(
        "rapidocr_onnxruntime",
        package="rapidocr-onnxruntime",
        extra="vision",
        feature="Image input (OCR)",
    )
    return module.RapidOCR(**kwargs)


class RapidOcr:
    """RapidOCR with settings for screenshots (upright text: no angle classifier).

    Args:
        max_side: Downscale so the longest side is at most this many pixels before OCR.
        det_side: Longest side of the copy the text detector runs on (``None``: the
            ``max_side`` image itself); recognition always reads the ``max_side`` image.
        min_score: Drop lines recognised with less confidence.
        rec_batch: Text lines per recogniser call (see :data:`DEFAULT_REC_BATCH`).
        rec_min_width: Narrowest recogniser input (see :data:`DEFAULT_REC_MIN_WIDTH`).
        threads: Inference threads; default: the CPUs this process may use.
        runtime: ``"auto"`` (OpenVINO if installed, else ONNX Runtime), ``"openvino"`` or
            ``"onnxruntime"``; see the module docstring.
        second_pass: Look again, at full resolution, where the ``det_side`` pass found no
            text but the pixels have text-like strokes (see :func:`missed_text`).

    Example:
        >>> ocr = RapidOcr()
        >>> [line.text for line in ocr.read(screenshot)][:2]     # a PIL image of a sign-in page
        ['Sign in to Acme', 'Email address']
    """

    def __init__(
        self,
        *,
        max_side: int = DEFAULT_MAX_SIDE,
        det_side: int | None = DEFAULT_DET_SIDE,
        min_score: float = 0.5,
        rec_batch: int = DEFAULT_REC_BATCH,
        rec_min_width: int = DEFAULT_REC_MIN_WIDTH,
        threads: int | None = None,
        runtime: str = "auto",
        second_pass: bool = True,
    ) -> None:
        if runtime not in RUNTIMES:
            raise ValueError(f"runtime must be one of {', '.join(RUNTIMES)}; got {runtime!r}")
        if max_side < 64:
            raise ValueError(f"max_side must be at least 64; got {max_side}")
        if rec_batch < 1:
            raise ValueError(f"rec_batch must be at least 1; got {rec_batch}")
        if rec_min_width < 16:
            raise ValueError(f"rec_min_width must be at least 16; got {rec_min_width}")
        self.rec_batch = int(rec_batch)
        self.rec_min_width = int(rec_min_width)
        self.max_side = int(max_side)
        self.det_side = None if det_side is None else max(64, min(int(det_side), self.max_side))
        self.min_score = float(min_score)
        if threads is None:
            threads = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 2
        self.threads = max(1, int(threads))
        self.second_pass = bool(second_pass)
        self.runtime = runtime
        if runtime == "auto":
            self.runtime = "openvino" if _has_openvino() else "onnxruntime"
        self._engine: Any = None
        self._lock = threading.Lock()

    def config(self) -> dict[str, Any]:
        return {
            "ocr": "rapidocr-onnxruntime",
            "runtime": self.runtime,
            "max_side": self.max_side,
            "det_side": self.det_side,
            "rec_batch": self.rec_batch,
            "rec_min_width": self.rec_min_width,
            "second_pass": self.second_pass,
            # OpenVINO pads line batches to recurring shapes (_OpenVinoSession), which
            # changes a few lines' text: part of the model version.
            "rec_shapes": "padded" if self.runtime == "openvino" else "exact",
        }

    @property
    def precision(self) -> str:
        """The recogniser's arithmetic (loads the models on first use): OpenVINO picks
        ``"bf16"`` on CPUs with AMX (and reads a few lines differently from ``"f32"``);
        ONNX Runtime is ``"f32"``."""
        session = getattr(getattr(self._load(), "text_rec", None), "session", None)
        return str(getattr(session, "precision", "f32"))

    def with_threads(self, threads: int) -> RapidOcr:
        """The same reader on ``threads`` CPU threads (``self`` when it already is)."""
        if int(threads) == self.threads:
            return self
        return RapidOcr(
            max_side=self.max_side,
            det_side=self.det_side,
            min_score=self.min_score,
            rec_batch=self.rec_batch,
            rec_min_width=self.rec_min_width,
            threads=threads,
            runtime=self.runtime,
            second_pass=self.second_pass,
        )

    def _load(self) -> Any:
        with self._lock:
            if self._engine is None:
                engine = load_rapidocr(
                    use_cls=False,
                    text_score=self.min_score,
                    intra_op_num_threads=self.threads,
                    inter_op_num_threads=1,
                    rec_batch_num=self.rec_batch,
                    rec_img_shape=[3, 48, self.rec_min_width],
                    # We downscale ourselves; "max" keeps the detector from upscaling again.
                    det_limit_type="max",
                    det_limit_side_len=self.max_side,
                )
                if self.runtime == "openvino":
                    # Raises on failure: nothing is kept half-built.
                    _use_openvino(engine, self.threads, self.rec_batch)
                _float32_detector_input(engine)
                self._engine = engine
            return self._engine

    def scale_for(self, width: int, height: int) -> float:
        """The factor an image of this size is resized by before OCR (<= 1)."""
        return min(1.0, self.max_side / max(width, height))

    def read(self, image: Image.Image) -> list[OcrLine]:
        """Text lines of ``image`` (RGB), boxes in ``image``'s pixels, in detector order."""
        engine = self._load()
        scale = self.scale_for(*image.size)
        if scale < 1.0:
            size = (max(1, round(image.width * scale)), max(1, round(image.height * scale)))
            image = image.resize(size, Image.Resampling.BILINEAR, reducing_gap=2.0)
        array = np.asarray(image.convert("RGB"))
        # RapidOCR is not documented as thread-safe; one image at a time per engine.
        with self._lock:
            result = self._two_scale(engine, image, array)
            if result is None:
                result, _ = engine(array)
        lines = []
        for points, text, score in result or []:
            xs = [float(p[0]) / scale for p in points]
            ys = [float(p[1]) / scale for p in points]
            # The recogniser sometimes drops the space between words; where the case
            # changes ("AcceptAll") put it back.
            text = _CAMEL.sub(" ", str(text).strip())
            if text:
                lines.append(OcrLine(text, (min(xs), min(ys), max(xs), max(ys)), float(score)))
        return lines

    def read_faint(
        self, image: Image.Image, rects: Sequence[tuple[int, int, int, int]]
    ) -> list[OcrLine | None]:
        """The faint text (a light grey placeholder) inside each of ``rects`` of ``image``.

        The detector misses placeholders a few grey levels off white (#e3e3e3 on white);
        knowing where an input is, its ink is cut out, stretched to full contrast and read
        by the recogniser alone, all crops in one call. ``None`` for a rectangle with no
        ink or nothing read with ``min_score``.
        """
        array = np.asarray(image.convert("RGB"))
        crops, where = [], []
        for i, rect in enumerate(rects):
            found = faint_crop(array, rect)
            if found is not None:
                crops.append(found[0])
                where.append((i, found[1]))
        out: list[OcrLine | None] = [None] * len(rects)
        if not crops:
            return out
        engine = self._load()
        with self._lock:
            recognised, _ = engine.text_rec(crops)
        for (i, box), (text, score) in zip(where, recognised, strict=False):
            text = _CAMEL.sub(" ", str(text).strip())
            if text and float(score) >= self.min_score:
                out[i] = OcrLine(text, box, float(score))
        return out

    def _two_scale(self, engine: Any, image: Image.Image, array: np.ndarray) -> Any:
        """Detect on a smaller copy, recognise crops of the full one (``None``: not possible)."""
        det_scale = 1.0 if self.det_side is None else self.det_side / max(image.size)
        needed = ("text_det", "sorted_boxes", "get_crop_img_list", "text_rec")
        if det_scale >= 1.0 or not all(hasattr(engine, n) for n in needed):
            return None  # the plain call (also for a RapidOCR without these internals)
        small = image.resize(
            (max(1, round(image.width * det_scale)), max(1, round(image.height * det_scale))),
            Image.Resampling.BILINEAR,
            reducing_gap=2.0,
        )
        boxes, _ = engine.text_det(np.asarray(small))
        found = [] if boxes is None or len(boxes) == 0 else list(np.asarray(boxes) / det_scale)
        if self.second_pass:
            found, regions = extend_cut_lines(found, ink_regions(array, found))
            more = missed_text(engine, array, found, regions)
            # A whole line read again replaces the fragment of it the first pass found.
            found = [f for f, c in zip(found, _covered(found, more), strict=True) if not c] + more
        if not found:
            return []
        boxes = np.asarray(engine.sorted_boxes(np.asarray(found)), dtype=np.float32)
        recognised, _ = engine.text_rec(engine.get_crop_img_list(array, boxes))
        return [
            (box.tolist(), rec[0], rec[1])
            for box, rec in zip(boxes, recognised, strict=False)
            if float(rec[1]) >= self.min_score
        ]


def _float32_detector_input(engine: Any) -> None:
    """Normalise detector input in float32 rather than float64 (same values).

    RapidOCR keeps the detector's mean and std as Python lists, which NumPy turns into
    float64 arrays, so every page was normalised in float64 and cast back: 39 ms of a
    1280x800 page's detection on 2 Xeon cores, 14 ms in float32, bit-identical input.
    """
    det = getattr(engine, "text_det", None)
    if det is None or not hasattr(det, "mean") or not hasattr(det, "std"):
        return
    det.mean = np.asarray([0.5, 0.5, 0.5] if det.mean is None else det.mean, np.float32)
    det.std = np.asarray([0.5, 0.5, 0.5] if det.std is None else det.std, np.float32)


_INK = 24
"""Morphological-gradient level (grey levels across 3 px) that counts as a stroke: light
grey 10 px text (#a3adb8 on white) still crosses it."""
_PAD = 8
"""Pixels of context around each region the second pass looks at."""
_MOSAIC_MAX = 0.5
"""Past this share of the page, the second pass reads the whole page at full resolution."""


def ink_regions(
    array: np.ndarray, covered: Sequence[np.ndarray]
) -> list[tuple[int, int, int, int]]:
    """Text-like regions of an RGB page that no box in ``covered`` (4-point quads) holds.

    Strokes are where the morphological gradient crosses :data:`_INK`; found lines are
    blanked out, the rest is joined horizontally into words, and components shaped like a
    line of text (7-36 px tall, wider than tall, neither hollow nor solid) are kept.
    """
    import cv2

    gray = cv2.cvtColor(array, cv2.COLOR_RGB2GRAY)
    grad = cv2.morphologyEx(gray, cv2.MORPH_GRADIENT, np.ones((3, 3), np.uint8))
    ink = (grad > _INK).astype(np.uint8)
    for quad in covered:
        xs, ys = quad[:, 0], quad[:, 1]
        ink[
            max(0, int(ys.min()) - 2) : int(ys.max()) + 3,
            max(0, int(xs.min()) - 2) : int(xs.max()) + 3,
        ] = 0
    joined = cv2.dilate(ink, np.ones((3, 9), np.uint8))
    n, _, stats, _ = cv2.connectedComponentsWithStats(joined, connectivity=8)
    out = []
    for x, y, w, h, _area in stats[1:n]:
        if not (7 <= h <= 36 and w >= 10 and w >= 0.8 * h):
            continue
        density = float(ink[y : y + h, x : x + w].mean())
        if 0.12 <= density <= 0.8:  # a hollow rectangle, or a filled block, is not text
            out.append((int(x), int(y), int(x + w), int(y + h)))
    return out


_WORD_SHAPE = 1.6
"""Least width / height of an ink region that continues a cut line (:func:`extend_cut_lines`).
Regions are dilated 4 px each side and 1 px up and down: a 14 px icon is 22 x 16 (1.4),
the "es" of a cut "Save chang" 23 x 13 (1.8)."""

_CUT_GAP = 3
"""Most pixels between a line box and the ink that continues it (:func:`extend_cut_lines`).
A line cut mid-word continues right at the box's edge (-1 px: the region's bounds are
dilated by 4 px, the box blanked 2 px wider); a word beyond a select's border is 7 px off."""


def extend_cut_lines(
    found: Sequence[np.ndarray], regions: Sequence[tuple[int, int, int, int]]
) -> tuple[list[np.ndarray], list[tuple[int, int, int, int]]]:
    """Line boxes grown over the text their small-copy detection cut off, and the regions
    of :func:`ink_regions` that are still unexplained.

    At 0.6x the detector sometimes ends a light or small line early ("Type a cor" of "Type a
    comment"); the rest is left as ink on the same row, right after (or before) the box. A
    word-shaped region (at least :data:`_WORD_SHAPE` times as wide as tall, so not an icon)
    that close is joined
    to the box, and the recogniser reads the whole line. Detecting the rest on its own
    found the whole line again at full resolution, which was then dropped as a line
    already found.
    """
    boxes = [
        [float(q[:, 0].min()), float(q[:, 1].min()), float(q[:, 0].max()), float(q[:, 1].max())]
        for q in found
    ]
    grown = [False] * len(boxes)
    left_over = []
    for region in regions:
        left, top, right, bottom = region
        height = bottom - top
        joined = False
        # Word-shaped, and clear of every line found: ink around a found line (a button's
        # edge around its label) is no continuation of a neighbour.
        if right - left >= _WORD_SHAPE * height and not any(
            min(right, b[2]) - max(left, b[0]) > 4 and min(bottom, b[3]) - max(top, b[1]) > 4
            for b in boxes
        ):
            for i, (b_left, b_top, b_right, b_bottom) in enumerate(boxes):
                # The rest of a line lies within the line's band (an input box beside
                # its label is taller).
                if top < b_top - 3 or bottom > b_bottom + 3:
                    continue
                if -4 <= left - b_right <= _CUT_GAP or -4 <= b_left - right <= _CUT_GAP:
                    boxes[i] = [min(b_left, left), min(b_top, top), max(b_right, right),
                                max(b_bottom, bottom)]  # fmt: skip
                    grown[i] = joined = True
                    break
        if not joined:
            left_over.append(region)
    out = [
        np.array([[b[0], b[1]], [b[2], b[1]], [b[2], b[3]], [b[0], b[3]]], np.float32) if g else q
        for q, b, g in zip(found, boxes, grown, strict=True)
    ]
    return out, left_over


def missed_text(
    engine: Any,
    array: np.ndarray,
    found: Sequence[np.ndarray],
    regions: Sequence[tuple[int, int, int, int]] | None = None,
) -> list[np.ndarray]:
    """Line boxes (4-point quads, full-resolution pixels) the small-copy detector missed.

    Small or light text (10-11 px grey captions, breadcrumbs, footers) is lost when the
    detector sees a 0.6x copy. The regions that still have text-like strokes are cut out
    with some context, stacked into one mosaic and detected once at full resolution, so
    the second pass costs in proportion to what was missed; past half the page, the whole
    page is detected again instead. ``regions`` are the :func:`ink_regions` of ``found``
    where already known (what :func:`extend_cut_lines` left unexplained).
    """
    height, width = array.shape[:2]
    regions = list(ink_regions(array, found) if regions is None else regions)
    if not regions:
        return []
    # Regions on overlapping rows share one strip.
    regions.sort(key=lambda r: r[1])
    strips: list[list[int]] = []
    for left, top, right, bottom in regions:
        top, bottom = max(0, top - _PAD), min(height, bottom + _PAD)
        left, right = max(0, left - 2 * _PAD), min(width, right + 2 * _PAD)
        if strips and top <= strips[-1][3]:
            strip = strips[-1]
            strip[0], strip[2], strip[3] = (
                min(strip[0], left),
                max(strip[2], right),
                max(strip[3], bottom),
            )
        else:
            strips.append([left, top, right, bottom])
    gap = 2 * _PAD
    mosaic_h = sum(b - t for _, t, _, b in strips) + gap * (len(strips) - 1)
    mosaic_w = max(right - left for left, _, right, _ in strips)
    if mosaic_h * mosaic_w > _MOSAIC_MAX * height * width:
        boxes, _ = engine.text_det(array)
        new = [] if boxes is None else list(np.asarray(boxes, dtype=np.float32))
    else:
        mosaic = np.full((mosaic_h, mosaic_w, 3), 255, np.uint8)
        offsets = []
        y = 0
        for left, top, right, bottom in strips:
            mosaic[y : y + bottom - top, : right - left] = array[top:bottom, left:right]
            offsets.append((y, y + bottom - top, left - 0, top - y))
            y += bottom - top + gap
        boxes, _ = engine.text_det(mosaic)
        new = []
        for quad in [] if boxes is None else np.asarray(boxes, dtype=np.float32):
            cy = float(quad[:, 1].mean())
            for y0, y1, dx, dy in offsets:
                if y0 <= cy < y1:
                    new.append(quad + np.array([dx, dy], np.float32))
                    break
    return [q for q, c in zip(new, _covered(new, found), strict=True) if not c]


_FAINT = 10
"""Grey levels off the input's fill that count as ink in :func:`faint_crop`."""


def faint_crop(
    array: np.ndarray, rect: tuple[int, int, int, int]
) -> tuple[np.ndarray, tuple[float, float, float, float]] | None:
    """The ink inside ``rect`` (an input box, borders cut off), stretched so the faintest
    text is black on white, with its box in ``array``'s pixels; ``None`` without ink."""
    left, top, right, bottom = rect
    m = 4
    inside = array[top + m : bottom - m, left + m : right - m].astype(np.int32)
    if inside.shape[0] < 6 or inside.shape[1] < 8:
        return None
    gray = inside.mean(axis=2)
    fill = float(np.median(gray))
    ink = np.abs(gray - fill) > _FAINT
    rows, cols = np.nonzero(ink.any(axis=1))[0], np.nonzero(ink.any(axis=0))[0]
    if len(rows) < 4 or len(cols) < 4:
        return None
    y0, y1 = max(0, rows[0] - 3), min(gray.shape[0], rows[-1] + 4)
    x0, x1 = max(0, cols[0] - 4), min(gray.shape[1], cols[-1] + 5)
    part = gray[y0:y1, x0:x1]
    far = float(np.abs(part - fill).max())
    # Distance from the fill, stretched: the faintest stroke's darkest pixel becomes black.
    stretched = 255.0 - np.clip(np.abs(part - fill) * (255.0 / max(far, 1.0)), 0, 255)
    crop = np.repeat(stretched.astype(np.uint8)[:, :, None], 3, axis=2)
    box = (float(left + m + x0), float(top + m + y0), float(left + m + x1), float(top + m + y1))
    return np.ascontiguousarray(crop), box


def _covered(quads: Sequence[np.ndarray], found: Sequence[np.ndarray]) -> list[bool]:
    """For each of ``quads``, whether its centre lies in one of the boxes found already.

    One array comparison for all pairs: text-heavy pages compare ~100 lines with ~100
    boxes, which one pair at a time cost ~15 ms a page.
    """
    if not len(quads) or not len(found):
        return [False] * len(quads)
    centres = np.asarray(quads, np.float64).mean(axis=1)  # (n, 2)
    boxes = np.asarray(found, np.float64)  # (m, 4, 2)
    low, high = boxes.min(axis=1), boxes.max(axis=1)  # (m, 2) each
    inside = (low[None] <= centres[:, None]) & (centres[:, None] <= high[None])
    return inside.all(axis=2).any(axis=1).tolist()  # type: ignore[no-any-return]


def _has_openvino() -> bool:
    return importlib.util.find_spec("openvino") is not None


class _OpenVinoSession:
    """Runs one ONNX model on OpenVINO's CPU plugin; called like RapidOCR's ORT session.

    OpenVINO prepares its kernels again for every input shape it has not run yet, which
    made a line batch of a new width about 2x slower than one seen before. With
    ``batch`` set (the recogniser), inputs are zero-padded (RapidOCR's own padding) to
    ``batch`` rows and to a width of :func:`rec_width`, so a few dozen shapes recur from
    page to page; the rows added are cut from the output.
    """

    def __init__(self, core: Any, path: str, threads: int, batch: int | None = None) -> None:
        model = core.compile_model(
            core.read_model(path),
            "CPU",
            {"INFERENCE_NUM_THREADS": threads, "PERFORMANCE_HINT": "LATENCY"},
        )
        self._request = model.create_infer_request()
        self._output = model.output(0)
        self.batch = batch
        # bf16 where OpenVINO picks it for this CPU (it does with AMX), else f32.
        hint = model.get_property("INFERENCE_PRECISION_HINT")  # an openvino.Type
        self.precision = hint.to_string() if hasattr(hint, "to_string") else str(hint)

    def __call__(self, inputs: np.ndarray) -> list[np.ndarray]:
        if self.batch is None or inputs.ndim != 4:
            return [self._request.infer({0: inputs})[self._output]]
        n, channels, height, width = inputs.shape
        rows, wide = max(n, self.batch), rec_width(width)
        if (rows, wide) != (n, width):
            padded = np.zeros((rows, channels, height, wide), np.float32)
            padded[:n, :, :, :width] = inputs
            inputs = padded
        return [self._request.infer({0: inputs})[self._output][:n]]


def rec_width(width: int) -> int:
    """The recogniser input width a batch ``width`` pixels wide is padded to: the next
    multiple of 16 up to 320 px, of 32 up to 640, of 64 up to 1280, of 128 beyond, so at
    most 10 % wider than the batch (the narrowest batch is ``rec_min_width``, 160)."""
    step = 16 if width <= 320 else 32 if width <= 640 else 64 if width <= 1280 else 128
    return -(-int(width) // step) * step


def _use_openvino(engine: Any, threads: int, rec_batch: int) -> None:
    """Swap the detector's and recogniser's ONNX Runtime sessions for OpenVINO ones."""
    ov = require("openvino", package="openvino", extra="vision", feature="OCR on OpenVINO")
    try:
        from rapidocr_onnxruntime.main import DEFAULT_CFG_PATH
        from rapidocr_onnxruntime.utils import read_yaml, update_model_path

        paths = update_model_path(read_yaml(DEFAULT_CFG_PATH))
        core = ov.Core()
        det = _OpenVinoSession(core, str(paths["Det"]["model_path"]), threads)
        rec = _OpenVinoSession(core, str(paths["Rec"]["model_path"]), threads, rec_batch)
    except Exception as exc:
        raise ModelLoadError(
            f"cannot run the OCR models on OpenVINO ({type(exc).__name__}: {exc}); "
            "pass runtime='onnxruntime' to use ONNX Runtime"
        ) from exc
    engine.text_det.infer = det
    engine.text_rec.session = rec
