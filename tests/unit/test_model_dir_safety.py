"""A model dir is input, never code: no remote code, no paths out, typed errors for corruption.

Every test builds a tiny random model in a tmp dir (clef_engine.testing) and then damages it the
way a hostile or truncated download would.
"""

from __future__ import annotations

import builtins
import io
import json
import shutil
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from clef_engine import Choice, DecisionEngine, ModelLoadError
from clef_engine.backbones import PACKAGED
from clef_engine.runtime.model_dir import backbone_path
from clef_engine.testing import write_tiny_bert

QUESTION = {"route": Choice(instructions="route", criteria=["billing", "tech"])}

# The Python a hostile model dir ships: importing it leaves a marker file behind.
EVIL = """
from pathlib import Path
Path({marker!r}).write_text("model-dir code ran")
from transformers import BertConfig, BertModel
class EvilConfig(BertConfig):
    model_type = "evil"
class EvilModel(BertModel):
    config_class = EvilConfig
"""
AUTO_MAP = {"AutoConfig": "evil.EvilConfig", "AutoModel": "evil.EvilModel"}


@pytest.fixture(scope="module")
def bert_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_bert(tmp_path_factory.mktemp("tiny-bert"))


@pytest.fixture(scope="module")
def trained_dir(bert_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fine-tuned model dir (head.safetensors + adapter/) on the tiny encoder."""
    pytest.importorskip("peft")
    from clef_engine.train import Example, TrainConfig, Trainer, TrainingSet

    examples = [
        Example(f"{words} {i}", {"route": i % 2})
        for i, words in enumerate(["refund payment money", "bug error login"] * 4)
    ]
    config = TrainConfig(
        epochs=1,
        batch_size=8,
        lora_rank=2,
        head_dim=16,
        head_heads=2,
        val_fraction=0.25,
        progress=False,
        max_length=32,
    )
    out = tmp_path_factory.mktemp("trained")
    Trainer(config, backbone=str(bert_dir)).fit(TrainingSet(dict(QUESTION), examples, "t"), out)
    return out


@pytest.fixture
def no_prompt(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Answer yes to any prompt (as `echo y | clef-agents ...` did) and record it."""
    asked: list[str] = []

    def answer_yes(prompt: object = "") -> str:
        asked.append(str(prompt))
        return "y"

    monkeypatch.setattr(builtins, "input", answer_yes)
    monkeypatch.setattr(sys, "stdin", io.StringIO("y\n" * 10))
    return asked


def _evil_dir(source: Path, target: Path, marker: Path, where: str) -> Path:
    shutil.copytree(source, target)
    (target / "evil.py").write_text(EVIL.format(marker=str(marker)))
    path = target / where
    data = json.loads(path.read_text())
    data["auto_map"] = AUTO_MAP if where == "config.json" else {"AutoTokenizer": ["evil.T", None]}
    path.write_text(json.dumps(data))
    return target


@pytest.mark.parametrize("where", ["config.json", "tokenizer_config.json"])
@pytest.mark.parametrize("how", ["bare", "backbone_inside", "backbone_absolute"])
def test_a_dir_that_asks_for_remote_code_is_refused_and_none_runs(
    bert_dir: Path, tmp_path: Path, no_prompt: list[str], where: str, how: str
) -> None:
    marker = tmp_path / "ran.txt"
    if how == "bare":
        model = _evil_dir(bert_dir, tmp_path / "m", marker, where)
        evil = model
    else:
        model = tmp_path / "m"
        model.mkdir()
        evil = _evil_dir(
            bert_dir,
            model / "backbone" if how.endswith("inside") else tmp_path / "b",
            marker,
            where,
        )
        path = "backbone" if how.endswith("inside") else str(evil)
        config = {"format": "clef-agents", "format_version": 1, "backbone": {"path": path}}
        (model / "config.json").write_text(json.dumps(config))
    with pytest.raises(ModelLoadError, match="auto_map") as caught:
        DecisionEngine.from_pretrained(model, device="cpu", warmup=False)
    assert caught.value.file == str(evil / where) and caught.value.field == "auto_map"
    with pytest.raises(ModelLoadError, match="auto_map"):
        DecisionEngine(path=evil, device="cpu", warmup=False)
    assert not marker.exists()
    assert no_prompt == []
    assert "evil" not in sys.modules


def test_every_transformers_load_says_trust_remote_code_false(
    bert_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import transformers

    seen: list[tuple[str, dict[str, Any]]] = []
    for name in ("AutoTokenizer", "AutoModel"):
        auto = getattr(transformers, name)
        real = auto.from_pretrained.__func__

        def spy(cls: type, *args: Any, _name: str = name, _real: Any = real, **kw: Any) -> Any:
            seen.append((_name, kw))
            return _real(cls, *args, **kw)

        monkeypatch.setattr(auto, "from_pretrained", classmethod(spy))
    DecisionEngine(path=bert_dir, device="cpu", warmup=False)
    assert [n for n, _ in seen] == ["AutoTokenizer", "AutoModel"]
    assert all(kw["trust_remote_code"] is False and kw["local_files_only"] for _, kw in seen)


def _link_out(model: Path, outside: Path) -> str:
    (model / "backbone").symlink_to(outside, target_is_directory=True)
    return "backbone"


@pytest.mark.parametrize(
    "path",
    ["../outside", "sub/../../outside", "./../outside", _link_out],
    ids=["parent", "dotdot-inside", "dot-parent", "symlink-out"],
)
def test_a_relative_backbone_path_must_stay_inside_the_model_dir(
    bert_dir: Path, tmp_path: Path, path: str | Callable[[Path, Path], str]
) -> None:
    shutil.copytree(bert_dir, tmp_path / "outside")
    model = tmp_path / "m"
    model.mkdir()
    (model / "sub").mkdir()
    if callable(path):
        path = path(model, tmp_path / "outside")
    config = {"format": "clef-agents", "format_version": 1, "backbone": {"path": path}}
    (model / "config.json").write_text(json.dumps(config))
    with pytest.raises(ModelLoadError, match="outside the model dir") as caught:
        DecisionEngine.from_pretrained(model, device="cpu", warmup=False)
    assert caught.value.field == "backbone.path"
    assert caught.value.file == str(model / "config.json")
    assert "config.json" in str(caught.value) and "backbone.path" in str(caught.value)


def test_backbone_references_that_stay_valid(bert_dir: Path, tmp_path: Path) -> None:
    where = tmp_path / "config.json"
    # The packaged default is a symbolic name, not a path.
    assert backbone_path(tmp_path, PACKAGED, where) == PACKAGED
    shutil.copytree(bert_dir, tmp_path / "backbone")
    assert backbone_path(tmp_path, "backbone", where) == str((tmp_path / "backbone").resolve())
    assert backbone_path(tmp_path, "./x/../backbone", where) == str(
        (tmp_path / "backbone").resolve()
    )
    # What save_pretrained writes for a backbone it did not copy: an absolute path.
    assert backbone_path(tmp_path, str(bert_dir), where) == str(bert_dir)
    config = {"format": "clef-agents", "format_version": 1, "backbone": {"path": "backbone"}}
    (tmp_path / "config.json").write_text(json.dumps(config))
    engine = DecisionEngine.from_pretrained(tmp_path, device="cpu", warmup=False)
    assert engine.decide("refund", QUESTION).answers["route"].choice in ("billing", "tech")


@pytest.mark.parametrize("how", ["from_pretrained", "path"])
def test_a_bare_dir_without_tokenizer_files_is_refused(
    bert_dir: Path, tmp_path: Path, how: str
) -> None:
    bare = tmp_path / "bare"
    bare.mkdir()
    for name in ("config.json", "model.safetensors"):
        shutil.copy(bert_dir / name, bare / name)
    with pytest.raises(ModelLoadError, match="no tokenizer files"):
        if how == "path":
            DecisionEngine(path=bare, device="cpu", warmup=False)
        else:
            DecisionEngine.from_pretrained(bare, device="cpu", warmup=False)


def _edit(name: str, change: Callable[[dict[str, Any]], Any]) -> Callable[[Path], None]:
    def apply(model: Path) -> None:
        path = model / name
        data = json.loads(path.read_text())
        change(data)
        path.write_text(json.dumps(data))

    return apply


def _truncate(name: str) -> Callable[[Path], None]:
    def apply(model: Path) -> None:
        data = (model / name).read_bytes()
        (model / name).write_bytes(data[: len(data) // 2])

    return apply


def _write(name: str, text: str) -> Callable[[Path], None]:
    def apply(model: Path) -> None:
        (model / name).write_text(text)

    return apply


CORRUPTIONS: dict[str, tuple[Callable[[Path], None], str, str | None]] = {
    # id: (damage, file named, field named)
    "format_version-string": (
        _edit("config.json", lambda c: c.update(format_version="2")),
        "config.json",
        "format_version",
    ),
    "format_version-newer": (
        _edit("config.json", lambda c: c.update(format_version=7)),
        "config.json",
        "format_version",
    ),
    "format_version-null": (
        _edit("config.json", lambda c: c.update(format_version=None)),
        "config.json",
        "format_version",
    ),
    "unknown-kind": (
        _edit("config.json", lambda c: c["backbone"].update(kind="transformer")),
        "config.json",
        "backbone.kind",
    ),
    "backbone-not-object": (
        _edit("config.json", lambda c: c.update(backbone=["encoder"])),
        "config.json",
        "backbone",
    ),
    "backbone-path-number": (
        _edit("config.json", lambda c: c["backbone"].update(path=3)),
        "config.json",
        "backbone.path",
    ),
    "string-temperature": (
        _edit("config.json", lambda c: c["calibration"].update(temperatures={"choice/b2": "hot"})),
        "config.json",
        "calibration.temperatures.choice/b2",
    ),
    "zero-temperature": (
        _edit("config.json", lambda c: c["calibration"].update(temperatures={"choice/b2": 0})),
        "config.json",
        "calibration.temperatures.choice/b2",
    ),
    "calibration-not-object": (
        _edit("config.json", lambda c: c.update(calibration="identity")),
        "config.json",
        "calibration",
    ),
    "bad-histogram": (
        _edit("config.json", lambda c: c["calibration"].update(histograms={"choice/b2": []})),
        "config.json",
        "calibration.histograms.choice/b2",
    ),
    "head-not-object": (
        _edit("config.json", lambda c: c.update(head="trained")),
        "config.json",
        "head",
    ),
    "head-questions-list": (
        _edit("config.json", lambda c: c["head"].update(questions=["route"])),
        "config.json",
        "head.questions",
    ),
    "model_name-number": (
        _edit("config.json", lambda c: c.update(model_name=5)),
        "config.json",
        "model_name",
    ),
    "truncated-head": (_truncate("head.safetensors"), "head.safetensors", None),
    "truncated-adapter": (
        _truncate("adapter/adapter_model.safetensors"),
        "adapter_model.safetensors",
        None,
    ),
    "adapter-config-not-json": (
        _write("adapter/adapter_config.json", '{"r": 2,'),
        "adapter_config.json",
        None,
    ),
    "adapter-config-list": (
        _write("adapter/adapter_config.json", "[]"),
        "adapter_config.json",
        None,
    ),
    "adapter-rank-string": (
        _edit("adapter/adapter_config.json", lambda c: c.update(r="two")),
        "adapter_config.json",
        "r",
    ),
    "adapter-rank-zero": (
        _edit("adapter/adapter_config.json", lambda c: c.update(r=0)),
        "adapter_config.json",
        "r",
    ),
    "adapter-rank-missing": (
        _edit("adapter/adapter_config.json", lambda c: c.pop("r")),
        "adapter_config.json",
        "r",
    ),
    "adapter-alpha-null": (
        _edit("adapter/adapter_config.json", lambda c: c.update(lora_alpha=None)),
        "adapter_config.json",
        "lora_alpha",
    ),
    "adapter-dora-string": (
        _edit("adapter/adapter_config.json", lambda c: c.update(use_dora="yes")),
        "adapter_config.json",
        "use_dora",
    ),
}


@pytest.mark.parametrize("damage", CORRUPTIONS.values(), ids=list(CORRUPTIONS))
def test_a_corrupt_model_dir_is_a_model_load_error_naming_file_and_field(
    trained_dir: Path, tmp_path: Path, damage: tuple[Callable[[Path], None], str, str | None]
) -> None:
    corrupt, file, field = damage
    model = shutil.copytree(trained_dir, tmp_path / "m")
    assert DecisionEngine.from_pretrained(model, device="cpu", warmup=False)  # intact: loads
    corrupt(model)
    with pytest.raises(Exception) as caught:  # the exact type is asserted below
        DecisionEngine.from_pretrained(model, device="cpu", warmup=False)
    assert type(caught.value) is ModelLoadError, repr(caught.value)
    assert file in str(caught.value)
    assert caught.value.file is None or caught.value.file.endswith(file)
    if field is not None:
        assert repr(field) in str(caught.value)
        assert caught.value.field == field


def test_a_corrupt_bare_encoder_is_a_model_load_error(bert_dir: Path, tmp_path: Path) -> None:
    model = shutil.copytree(bert_dir, tmp_path / "m")
    _truncate("model.safetensors")(model)
    with pytest.raises(ModelLoadError, match="cannot load an encoder"):
        DecisionEngine.from_pretrained(model, device="cpu", warmup=False)
