"""TrainConfig: the measured recipes as presets, and configs written by earlier versions."""

from __future__ import annotations

import dataclasses
import logging

import pytest

from clef_engine.train import PRESETS, TrainConfig


def test_the_default_is_the_full_set_recipe() -> None:
    assert TrainConfig.preset("full") == TrainConfig()
    assert PRESETS["full"] == {}


def test_few_shot_is_the_contrastive_stage_and_the_prototype_head() -> None:
    few = TrainConfig.preset("few_shot")
    assert (few.head, few.contrastive_steps, few.val_fraction) == ("prototype", 30, 0.0)
    assert TrainConfig.preset("few-shot") == few  # the CLI's spelling
    few.check()


def test_ensemble_is_two_runs_at_the_measured_learning_rate() -> None:
    ensemble = TrainConfig.preset("ensemble")
    assert (ensemble.ensemble, ensemble.lr) == (2, 1e-3)
    ensemble.check()


def test_overrides_go_on_top_of_a_preset() -> None:
    few = TrainConfig.preset("few_shot", seed=3, contrastive_steps=60)
    assert (few.seed, few.contrastive_steps, few.head) == (3, 60, "prototype")


def test_an_unknown_preset_is_named_with_the_choices() -> None:
    with pytest.raises(
        ValueError, match="recipe must be one of full, few_shot, ensemble; got 'fast'"
    ):
        TrainConfig.preset("fast")


def test_from_dict_leaves_out_the_fields_of_earlier_versions(caplog) -> None:
    written = {**dataclasses.asdict(TrainConfig(epochs=3)), "rdrop_weight": 1.0, "refit": True}
    with caplog.at_level(logging.INFO, logger="clef_engine.train.config"):
        config = TrainConfig.from_dict(written)
    assert config == TrainConfig(epochs=3)
    assert "['rdrop_weight', 'refit']" in caplog.text


def test_the_ablations_are_not_options_of_the_library() -> None:
    removed = {
        "rdrop_weight",
        "ema_decay",
        "use_dora",
        "lora_plus_ratio",
        "refit",
        "bank_init",
        "contrastive_weight",
        "shared_split",
        "split_seed",
        "ensemble_temperature",
        "evidence",
        "option_bank",
        "group_by_length",
        "memory_add_validation",
    }
    assert not removed & {f.name for f in dataclasses.fields(TrainConfig)}
    with pytest.raises(TypeError, match="rdrop_weight"):
        TrainConfig(rdrop_weight=1.0)  # type: ignore[call-arg]
