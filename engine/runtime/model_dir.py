"""The model directory: ``config.json`` + safetensors weights, nothing else.

Layout::

    config.json          {"format": "clef-agents", "format_version": 1, "model_name",
                          "backbone": {"kind", "path", ...}, "calibration": {...},
                          "head": {...}}
    head.safetensors     trained head weights (when the engine has a trained head)
    memory.safetensors   example memory of trained questions (clef_engine.heads.memory)
    adapter/             peft LoRA adapter (when fine-tuned)
    backbone/            a copy of the backbone (only with ``copy_backbone=True``)

An ensemble (``TrainConfig(ensemble=K)``, :mod:`clef_engine.train.ensemble`) holds K such dirs
and names them instead of a backbone: ``{"format", "format_version", "ensemble":
["members/0", ...], "calibration": {...}}`` (and ``model_name`` when set); the calibration
is that of the members' mean answers (:mod:`clef_engine.heads.ensemble`).

A directory without our ``config.json`` but with a Hugging Face ``config.json`` is taken
as a bare backbone: causal LMs load as ``decoder``, everything else as ``encoder``.
Keys left at their default are omitted, so older readers load newer saves.
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

from clef_engine.backbones import BACKBONES, PACKAGED
from clef_engine.backbones.adapter import ADAPTER_DIR
from clef_engine.calibration.temperature import Calibrator
from clef_engine.errors import ClefError, ModelLoadError
from clef_engine.runtime import general
from clef_engine.runtime.general import is_prompted

if TYPE_CHECKING:
    from clef_engine.runtime.engine import DecisionEngine

FORMAT = "clef-agents"
FORMAT_VERSION = 1
CONFIG = "config.json"
ENSEMBLE_DIR = "members"
"""Where an ensemble keeps its members' model dirs."""
PACKAGED_NAMES = (PACKAGED, "packaged", "default")
"""``backbone.path`` values that name the embedded model, not a directory."""


def read_config(directory: Path) -> dict[str, Any]:
    path = directory / CONFIG
    if not directory.is_dir():
        raise ModelLoadError(f"model dir {str(directory)!r} does not exist or is not a directory")
    if not path.is_file():
        raise ModelLoadError(f"model dir {str(directory)!r} has no {CONFIG}")
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ModelLoadError(f"{path}: not valid JSON ({exc})") from exc
    if not isinstance(data, dict):
        raise ModelLoadError(f"{path}: expected a JSON object")
    return data


def detect_kind(hf_config: dict[str, Any]) -> str:
    """``decoder`` for causal LMs, ``encoder`` otherwise."""
    architectures = hf_config.get("architectures") or []
    if any(str(a).endswith("ForCausalLM") for a in architectures):
        return "decoder"
    return "encoder"


def bad_field(where: Path, field: str, problem: str) -> ModelLoadError:
    """A :class:`ModelLoadError` for ``field`` of the file ``where``."""
    return ModelLoadError(f"{where}: field {field!r} {problem}", file=str(where), field=field)


def _check_common(data: dict[str, Any], where: Path) -> None:
    """The fields every clef-agents ``config.json`` may hold, by type (a model dir is
    input: a wrong type is a :class:`ModelLoadError` naming the field, never a TypeError)."""
    version = data.get("format_version", 1)
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        raise bad_field(where, "format_version", f"must be a positive integer; got {version!r}")
    if version > FORMAT_VERSION:
        raise bad_field(
            where,
            "format_version",
            f"is {version}, newer than this clef-agents understands ({FORMAT_VERSION}); "
            "upgrade clef-agents",
        )
    for name in ("model_name", "model_version"):
        if name in data and not isinstance(data[name], str):
            raise bad_field(where, name, f"must be a string; got {data[name]!r}")


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def read_calibrator(data: dict[str, Any], where: Path) -> Calibrator:
    """The ``calibration`` section of ``config.json``, each value checked."""
    from clef_engine.calibration.histogram import HistogramBinning

    section = data.get("calibration") or {}
    if not isinstance(section, dict):
        raise bad_field(where, "calibration", f"must be an object; got {section!r}")
    for name in ("temperatures", "biases"):
        values = section.get(name) or {}
        if not isinstance(values, dict):
            raise bad_field(where, f"calibration.{name}", f"must be an object; got {values!r}")
        for key, value in values.items():
            if not _number(value) or (name == "temperatures" and value <= 0):
                expected = "a positive number" if name == "temperatures" else "a finite number"
                raise bad_field(
                    where, f"calibration.{name}.{key}", f"must be {expected}; got {value!r}"
                )
    if not isinstance(section.get("source", ""), str):
        raise bad_field(where, "calibration.source", f"must be a string; got {section['source']!r}")
    histograms = section.get("histograms") or {}
    if not isinstance(histograms, dict):
        raise bad_field(where, "calibration.histograms", f"must be an object; got {histograms!r}")
    for key, value in histograms.items():
        try:
            if not isinstance(value, dict):
                raise TypeError("expected an object with 'edges' and 'values'")
            HistogramBinning.from_dict(value)
        except (KeyError, TypeError, ValueError) as exc:
            raise bad_field(
                where, f"calibration.histograms.{key}", f"is not usable ({exc})"
            ) from exc
    return Calibrator.from_dict(section)


def backbone_path(directory: Path, path: Any, where: Path) -> str:
    """Where the backbone of the model dir ``directory`` is, from ``backbone.path``.

    The packaged reference stays symbolic. A relative path must stay inside the model dir
    once resolved (no ``..``, no symlink out): a model dir is input, and must not make
    the engine read files beside it. An absolute path is a backbone that the model was
    saved against on this machine (``save_pretrained`` without ``copy_backbone``), and is
    loaded under the same rules as any backbone dir (no remote code, safetensors only).
    """
    if not isinstance(path, str) or not path:
        raise bad_field(where, "backbone.path", f"must be a non-empty string; got {path!r}")
    if path in PACKAGED_NAMES:
        return path
    if Path(path).is_absolute():
        return path
    inside = directory.resolve()
    resolved = (directory / path).resolve()
    if not resolved.is_relative_to(inside):
        raise bad_field(
            where,
            "backbone.path",
            f"{path!r} leads outside the model dir; a relative backbone path must name a "
            "dir inside it (save with copy_backbone=True to bundle the backbone)",
        )
    return str(resolved)


def load(cls: type[DecisionEngine], directory: Path, **kwargs: Any) -> DecisionEngine:
    data = read_config(directory)
    if data.get("format") != FORMAT:
        # A bare Hugging Face model directory.
        kwargs.setdefault("backbone", detect_kind(data))
        return cls(path=directory, **kwargs)
    where = directory / CONFIG
    _check_common(data, where)
    if "ensemble" in data:
        return _load_ensemble(cls, directory, data, kwargs)
    section = data.get("backbone") or {}
    if not isinstance(section, dict):
        raise bad_field(where, "backbone", f"must be an object; got {section!r}")
    backbone = dict(section)
    kind = backbone.pop("kind", "encoder")
    if not isinstance(kind, str) or kind not in BACKBONES:
        raise bad_field(
            where, "backbone.kind", f"is {kind!r}; known kinds: {', '.join(sorted(BACKBONES))}"
        )
    path = backbone_path(directory, backbone.pop("path", PACKAGED), where)
    # Saved from the general model, or fine-tuned on it: its adapter is merged first.
    base = general.check_base(backbone.pop("base", None), where, path)
    head = data.get("head")
    if head is not None and not isinstance(head, dict):
        raise bad_field(where, "head", f"must be an object; got {head!r}")
    if head:
        _check_head(head, where)
    # The trainer's LoRA is merged into an encoder; a decoder keeps its peft adapter
    # live (``load_adapter`` below) so that its version follows the adapter weights.
    trained = bool(head) or ((directory / ADAPTER_DIR).is_dir() and kind == "encoder")
    # A model dir may carry a second calibration fitted under int8 (the general model's).
    field = "calibration"
    if kwargs.get("quantize") == "int8" and "calibration_int8" in data:
        field = "calibration_int8"
    calibrator = read_calibrator({"calibration": data.get(field)}, where)
    if "backbone" not in kwargs and not trained and base is None:
        rebuilt = _rebuild_backbone(kind, path, backbone, kwargs, where)
        if rebuilt is not None:
            kwargs["backbone"] = rebuilt
    kwargs.setdefault("backbone", kind)
    kwargs.setdefault("calibrator", calibrator)
    if "model_name" in data:
        kwargs.setdefault("model_name", data["model_name"])
    if trained:
        return _load_trained(cls, directory, data, kind, path, kwargs, base=base)
    if base is not None:  # the general model itself, saved with its calibration
        kwargs.setdefault("scorer", "general")
        return cls(**kwargs)
    engine = cls(path=path, **kwargs)
    adapter = directory / "adapter"
    if adapter.is_dir() and hasattr(engine.backbone, "load_adapter"):
        engine.backbone.load_adapter(adapter)
        engine._version = None  # the version follows the adapter weights
    return engine


def _check_head(head: dict[str, Any], where: Path) -> None:
    """The shape of a trained ``head`` entry; its values are checked against the weights
    when the head loads (:meth:`~clef_engine.heads.option_evidence.OptionEvidenceHead.load`)."""
    if not isinstance(head.get("config"), dict):
        raise bad_field(where, "head.config", f"must be an object; got {head.get('config')!r}")
    for name in ("questions", "memory"):
        entries = head.get(name) or {}
        if not isinstance(entries, dict) or not all(isinstance(v, dict) for v in entries.values()):
            raise bad_field(where, f"head.{name}", "must be an object of objects by fingerprint")
    if not isinstance(head.get("scope", "trained"), str):
        raise bad_field(where, "head.scope", f"must be a string; got {head['scope']!r}")


def _rebuild_backbone(
    kind: str, path: str, saved: dict[str, Any], kwargs: dict[str, Any], where: Path
) -> Any:
    """Rebuild the backbone with the options its ``config()`` saved (e.g. ``max_length``,
    the decoder's ``rotations``, the vision backbone's ``clip_path``).

    Only keys the backbone's constructor takes are passed back; ``None`` when there are
    none, so the engine builds the backbone with its defaults. A saved option of the wrong
    type or out of range is a :class:`ModelLoadError` naming ``backbone.<option>``.
    """
    import inspect

    from clef_engine.backbones import backbone_factory

    factory = backbone_factory(kind)
    accepted = inspect.signature(factory).parameters
    options = {
        k: v
        for k, v in saved.items()
        if k in accepted and k not in ("path", "device", "dtype", "quantize")
    }
    if not options:
        return None
    for name, value in options.items():
        if name == "clip_path":
            if value is not None and not isinstance(value, str):
                raise bad_field(where, f"backbone.{name}", f"must be a string; got {value!r}")
        elif value is not None and not isinstance(value, str | int | float):
            raise bad_field(where, f"backbone.{name}", f"must be a scalar; got {value!r}")
    try:
        return factory(
            path,
            device=kwargs.get("device"),
            dtype=kwargs.get("dtype"),
            quantize=kwargs.get("quantize"),
            **options,
        )
    except (TypeError, ValueError) as exc:
        if isinstance(exc, ClefError):  # already names its own field
            raise
        field = f"backbone.{'/'.join(sorted(options))}"
        raise bad_field(where, field, f"is not usable ({exc})") from exc


def _load_trained(
    cls: type[DecisionEngine],
    directory: Path,
    data: dict[str, Any],
    kind: str,
    path: str,
    kwargs: dict[str, Any],
    base: str | None = None,
) -> DecisionEngine:
    """A fine-tuned model: LoRA merged into the backbone, the trained head on top (on the
    general model's weights when ``base`` says it was fine-tuned from them)."""
    from clef_engine.backbones import load_backbone
    from clef_engine.backbones.adapter import merge_lora
    from clef_engine.heads.memory import ExampleMemory
    from clef_engine.heads.option_evidence import HEAD_FILE, OptionEvidenceHead
    from clef_engine.heads.trained import TrainedHead, weights_digest

    kwargs.pop("backbone", None)
    device, dtype = kwargs.pop("device", None), kwargs.pop("dtype", None)
    quantize = kwargs.pop("quantize", None)
    backbone = load_backbone(kind, path, device=device, dtype=dtype)
    if base is not None:
        general.adapt_backbone(backbone, general.GENERAL_DIR, None)
    if (directory / ADAPTER_DIR).is_dir():
        merge_lora(backbone.model, directory / ADAPTER_DIR)  # type: ignore[attr-defined]
    if quantize is not None:
        from clef_engine.backbones.encoder import _quantize_int8

        if quantize != "int8" or backbone.device.type != "cpu":
            raise ValueError("quantize: only 'int8' on the CPU is supported")
        backbone.model = _quantize_int8(backbone.model)  # type: ignore[attr-defined]
        backbone.quantize = "int8"  # type: ignore[attr-defined]
    engine = cls(backbone, **kwargs)
    if is_prompted(data):  # trained on option texts with the instructions in front
        engine.head.prompted = True
    backbone_device = backbone.device
    info = data.get("head")
    if info:
        module = OptionEvidenceHead.load(directory, info).to(backbone.device)

        def base_engine() -> DecisionEngine:
            # The engine's device now, not the one it was loaded on: DecisionEngine.to moves
            # the backbone (and this head) after a CUDA out-of-memory, say.
            moved = engine.backbone.device != backbone_device
            return cls(
                kind,
                None if base is not None else path,  # None: the general model itself
                device=engine.backbone.device,
                dtype=None if moved else dtype,
                quantize=quantize,
                warmup=False,
            )

        memory = None
        if info.get("memory"):  # kNN memory of the training states (clef_engine.heads.memory)
            memory = ExampleMemory.load(directory, info["memory"], hidden_size=backbone.hidden_size)
        engine.head = TrainedHead(  # type: ignore[assignment]
            module,
            engine.calibrator,
            base_engine=base_engine,
            scope=str(info.get("scope", "trained")),
            digest=weights_digest(directory / HEAD_FILE),
            memory=memory,
        )
        engine.head.adapter_source = directory / ADAPTER_DIR  # type: ignore[attr-defined]
        engine.head.prompted = is_prompted(data)  # type: ignore[attr-defined]
        engine._version = None
    return engine


MEMBER_OPTIONS = ("device", "dtype", "quantize", "max_state_chars", "cache_size")
"""``from_pretrained`` options an ensemble passes on to each member."""


def _load_ensemble(
    cls: type[DecisionEngine], directory: Path, data: dict[str, Any], kwargs: dict[str, Any]
) -> DecisionEngine:
    """An ensemble: each member loaded from its own dir, their mean as the head."""
    from clef_engine.heads.ensemble import EnsembleHead

    where = directory / CONFIG
    names = data["ensemble"]
    if not isinstance(names, list) or not names or not all(isinstance(n, str) for n in names):
        raise bad_field(where, "ensemble", "must be a non-empty list of member dirs")
    ensemble_calibrator = read_calibrator(data, where)
    if "backbone" in kwargs:
        raise ModelLoadError(
            f"{where}: an ensemble loads each member's own backbone; do not pass backbone="
        )
    members = []
    questions = None
    for name in names:
        path = (directory / name).resolve()
        if Path(name).is_absolute() or not path.is_relative_to(directory.resolve()):
            raise ModelLoadError(f"{where}: ensemble member {name!r} is not inside the model dir")
        member = read_config(path)
        head = member.get("head")
        if (
            member.get("format") != FORMAT
            or "ensemble" in member
            or not head
            or not isinstance(head, dict)
        ):
            raise ModelLoadError(
                f"{path / CONFIG}: an ensemble member must be a fine-tuned clef-agents model "
                "dir with a trained head (not a bare backbone, nor another ensemble)"
            )
        _check_head(head, path / CONFIG)
        trained = sorted(head.get("questions") or {})
        if questions is not None and trained != questions:
            raise ModelLoadError(
                f"{path / CONFIG}: ensemble member {name!r} was trained on other questions "
                f"than {names[0]!r}; the members must answer the same questions"
            )
        questions = trained
        options = {k: v for k, v in kwargs.items() if k in MEMBER_OPTIONS}
        members.append(load(cls, path, **options, warmup=kwargs.get("warmup", True)))
    calibrator = kwargs.pop("calibrator", None)
    if calibrator is None:
        calibrator = ensemble_calibrator
    if "model_name" in data:
        kwargs.setdefault("model_name", data["model_name"])
    for key in ("device", "dtype", "quantize"):  # the members' backbones are already built
        kwargs.pop(key, None)
    kwargs.setdefault("model_name", members[0].model_name)
    kwargs["warmup"] = False  # each member warmed its own backbone
    engine = cls(members[0].backbone, **kwargs)
    engine.head = EnsembleHead(members, calibrator)  # type: ignore[assignment]
    engine._version = None
    return engine


def save(engine: DecisionEngine, directory: Path, *, copy_backbone: bool = False) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    members = getattr(engine.head, "members", None)
    if members is not None:  # an ensemble: each member in its own dir
        names = [f"{ENSEMBLE_DIR}/{i}" for i in range(len(members))]
        for name, member in zip(names, members, strict=True):
            save(member, directory / name, copy_backbone=copy_backbone)
        ensemble = {
            "format": FORMAT,
            "format_version": FORMAT_VERSION,
            "model_name": engine.model_name,
            "model_version": engine.model_version,
            "ensemble": names,
            "calibration": engine.calibrator.to_dict(),
        }
        (directory / CONFIG).write_text(json.dumps(ensemble, indent=2, sort_keys=True) + "\n")
        return directory
    backbone = dict(engine.backbone.config())
    if copy_backbone and backbone.get("path") not in (None, PACKAGED):
        source = Path(backbone["path"])
        shutil.copytree(source, directory / "backbone", dirs_exist_ok=True)
        backbone["path"] = "backbone"
    config: dict[str, Any] = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "model_name": engine.model_name,
        "model_version": engine.model_version,
        "backbone": backbone,
        "calibration": engine.calibrator.to_dict(),
    }
    save_head = getattr(engine.head, "save", None)
    if save_head is not None:  # a trained head: head.safetensors (+ adapter/)
        config["head"] = save_head(directory)
    (directory / CONFIG).write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    if getattr(engine.backbone, "has_adapter", False):
        engine.backbone.save_adapter(directory / "adapter")  # type: ignore[attr-defined]
    return directory
