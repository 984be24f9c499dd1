"""The model directory: ``config.json`` + safetensors weights, nothing else.

Layout::

    config.json          {"format": "clef-agents", "format_version": 1, "model_name",
                          "backbone": {"kind", "path", ...}, "calibration": {...},
                          "head": {...}}
    head.safetensors     trained head weights (when the engine has a trained head)
    memory.safetensors   example memory of trained questions (engine.heads.memory)
    adapter/             peft LoRA adapter (when fine-tuned)
    backbone/            a copy of the backbone (only with ``copy_backbone=True``)

An ensemble (``TrainConfig(ensemble=K)``, :mod:`engine.train.ensemble`) holds K such dirs
and names them instead of a backbone: ``{"format", "format_version", "ensemble":
["members/0", ...], "calibration": {...}}`` (and ``model_name`` when set); the calibration
is that of the members' mean answers (:mod:`engine.heads.ensemble`).

A directory without our ``config.json`` but with a Hugging Face ``config.json`` is taken
as a bare backbone: causal LMs load as ``decoder``, everything else as ``encoder``.
Keys left at their default are omitted, so older readers load newer saves.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

from engine.backbones import PACKAGED
from engine.calibration.temperature import Calibrator
from engine.errors import ModelLoadError
from engine.runtime.adapter import ADAPTER_DIR

if TYPE_CHECKING:
    from engine.runtime.engine import DecisionEngine

FORMAT = "clef-agents"
FORMAT_VERSION = 1
CONFIG = "config.json"
ENSEMBLE_DIR = "members"
"""Where an ensemble keeps its members' model dirs."""


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


def load(cls: type[DecisionEngine], directory: Path, **kwargs: Any) -> DecisionEngine:
    data = read_config(directory)
    if data.get("format") != FORMAT:
        # A bare Hugging Face model directory.
        kwargs.setdefault("backbone", detect_kind(data))
        return cls(path=directory, **kwargs)
    version = data.get("format_version", 1)
    if version > FORMAT_VERSION:
        raise ModelLoadError(
            f"{directory / CONFIG}: format_version {version} is newer than this clef-agents "
            f"understands ({FORMAT_VERSION}); upgrade clef-agents"
        )
    if "ensemble" in data:
        return _load_ensemble(cls, directory, data, kwargs)
    backbone = dict(data.get("backbone") or {})
    kind = backbone.pop("kind", "encoder")
    path = backbone.pop("path", PACKAGED)
    if path != PACKAGED and not Path(path).is_absolute():
        path = str((directory / path).resolve())
    # The trainer's LoRA is merged into an encoder; a decoder keeps its peft adapter
    # live (``load_adapter`` below) so that its version follows the adapter weights.
    trained = bool(data.get("head")) or ((directory / ADAPTER_DIR).is_dir() and kind == "encoder")
    if "backbone" not in kwargs and not trained:
        rebuilt = _rebuild_backbone(kind, path, backbone, kwargs)
        if rebuilt is not None:
            kwargs["backbone"] = rebuilt
    kwargs.setdefault("backbone", kind)
    kwargs.setdefault("calibrator", Calibrator.from_dict(data.get("calibration") or {}))
    if "model_name" in data:
        kwargs.setdefault("model_name", data["model_name"])
    if trained:
        return _load_trained(cls, directory, data, kind, path, kwargs)
    engine = cls(path=path, **kwargs)
    adapter = directory / "adapter"
    if adapter.is_dir() and hasattr(engine.backbone, "load_adapter"):
        engine.backbone.load_adapter(adapter)
        engine._version = None  # the version follows the adapter weights
    return engine


def _rebuild_backbone(kind: str, path: str, saved: dict[str, Any], kwargs: dict[str, Any]) -> Any:
    """Rebuild the backbone with the options its ``config()`` saved (e.g. ``max_length``,
    the decoder's ``rotations``, the vision backbone's ``clip_path``).

    Only keys the backbone's constructor takes are passed back; ``None`` when there are
    none, so the engine builds the backbone with its defaults.
    """
    import inspect

    from engine.backbones import backbone_factory

    factory = backbone_factory(kind)
    accepted = inspect.signature(factory).parameters
    options = {
        k: v
        for k, v in saved.items()
        if k in accepted and k not in ("path", "device", "dtype", "quantize")
    }
    if not options:
        return None
    return factory(
        path,
        device=kwargs.get("device"),
        dtype=kwargs.get("dtype"),
        quantize=kwargs.get("quantize"),
        **options,
    )


def _load_trained(
    cls: type[DecisionEngine],
    directory: Path,
    data: dict[str, Any],
    kind: str,
    path: str,
    kwargs: dict[str, Any],
) -> DecisionEngine:
    """A fine-tuned model: LoRA merged into the backbone, the trained head on top."""
    from engine.backbones import load_backbone
    from engine.heads.memory import ExampleMemory
    from engine.heads.option_evidence import HEAD_FILE, OptionEvidenceHead
    from engine.heads.trained import TrainedHead, weights_digest
    from engine.runtime.adapter import merge_lora

    kwargs.pop("backbone", None)
    device, dtype = kwargs.pop("device", None), kwargs.pop("dtype", None)
    quantize = kwargs.pop("quantize", None)
    backbone = load_backbone(kind, path, device=device, dtype=dtype)
    if (directory / ADAPTER_DIR).is_dir():
        merge_lora(backbone.model, directory / ADAPTER_DIR)  # type: ignore[attr-defined]
    if quantize is not None:
        from engine.backbones.encoder import _quantize_int8

        if quantize != "int8" or backbone.device.type != "cpu":
            raise ValueError("quantize: only 'int8' on the CPU is supported")
        backbone.model = _quantize_int8(backbone.model)  # type: ignore[attr-defined]
        backbone.quantize = "int8"  # type: ignore[attr-defined]
    engine = cls(backbone, **kwargs)
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
                path,
                device=engine.backbone.device,
                dtype=None if moved else dtype,
                quantize=quantize,
                warmup=False,
            )

        memory = None
        if info.get("memory"):  # kNN memory of the training states (engine.heads.memory)
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
        engine._version = None
    return engine


MEMBER_OPTIONS = ("device", "dtype", "quantize", "max_state_chars", "cache_size")
"""``from_pretrained`` options an ensemble passes on to each member."""


def _load_ensemble(
    cls: type[DecisionEngine], directory: Path, data: dict[str, Any], kwargs: dict[str, Any]
) -> DecisionEngine:
    """An ensemble: each member loaded from its own dir, their mean as the head."""
    from engine.heads.ensemble import EnsembleHead

    where = directory / CONFIG
    names = data["ensemble"]
    if not isinstance(names, list) or not names or not all(isinstance(n, str) for n in names):
        raise ModelLoadError(f"{where}: 'ensemble' must be a non-empty list of member dirs")
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
        if member.get("format") != FORMAT or "ensemble" in member or not member.get("head"):
            raise ModelLoadError(
                f"{path / CONFIG}: an ensemble member must be a fine-tuned clef-agents model "
                "dir with a trained head (not a bare backbone, nor another ensemble)"
            )
        trained = sorted(member["head"].get("questions") or {})
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
        calibrator = Calibrator.from_dict(data.get("calibration") or {})
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
