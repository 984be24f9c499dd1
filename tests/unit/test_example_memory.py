"""Example memory (clef_engine.heads.memory): the vote, the mixture, its fit and its files."""

from __future__ import annotations

import json
import math

import pytest
import torch

from clef_engine.errors import ModelLoadError
from clef_engine.heads.memory import (
    MEMORY_FILE,
    MIN_HELD_OUT,
    TEMPERATURE_RANGE,
    ExampleMemory,
    MemorySettings,
    QuestionMemory,
    fit_question_memory,
    fit_question_memory_cross,
    refit_memory,
    refit_question_memory,
)
from clef_engine.heads.option_evidence import fingerprint

NAMES = ["a", "b", "c"]


def unit(*rows: list[float]) -> torch.Tensor:
    return torch.nn.functional.normalize(torch.tensor(rows, dtype=torch.float32), dim=-1)


def test_vote_weights_the_k_nearest_by_exp_cos_over_tau() -> None:
    vectors = unit([1, 0], [0.8, 0.6], [0, 1], [-1, 0])
    memory = QuestionMemory(
        vectors, torch.tensor([0, 1, 1, 2]), NAMES, MemorySettings(k=2, tau=0.5, lam=0.5)
    )
    vote = memory.vote(unit([1, 0]))
    # The two nearest are [1, 0] (cos 1, label a) and [0.8, 0.6] (cos 0.8, label b).
    wa, wb = math.exp(1 / 0.5), math.exp(0.8 / 0.5)
    expected = torch.tensor([[wa, wb, 0.0]], dtype=torch.float64) / (wa + wb)
    torch.testing.assert_close(vote, expected)
    assert vote.dtype == torch.float64


def test_extended_memory_keeps_options_and_settings_and_votes_with_the_new_states() -> None:
    settings = MemorySettings(k=1, tau=0.1, lam=0.5)
    memory = QuestionMemory(unit([1, 0]), torch.tensor([0]), NAMES, settings)
    grown = memory.extended(unit([0, 1]), torch.tensor([2]))
    assert (len(memory), len(grown)) == (1, 2)  # the original is left as it was
    assert grown.names == NAMES and grown.settings == settings
    assert grown.labels.tolist() == [0, 2]
    assert memory.vote(unit([0.1, 1])).argmax(-1).item() == 0  # its only state
    assert grown.vote(unit([0.1, 1])).argmax(-1).item() == 2  # the new, nearer one
    with pytest.raises(ValueError, match="memory labels must index the 3 options"):
        memory.extended(unit([0, 1]), torch.tensor([3]))


def test_mix_is_the_weighted_sum_under_the_mixture_temperature() -> None:
    settings = MemorySettings(k=1, tau=0.1, lam=0.25, temperature=2.0)
    memory = QuestionMemory(unit([1, 0], [0, 1]), torch.tensor([0, 2]), NAMES, settings)
    head = torch.tensor([[0.2, 0.5, 0.3]], dtype=torch.float64)
    got = memory.mix(head, unit([1, 0.1]), NAMES)
    mixed = 0.75 * head + 0.25 * torch.tensor([[1.0, 0.0, 0.0]], dtype=torch.float64)
    expected = torch.softmax(mixed.clamp(min=1e-12).log() / 2.0, dim=-1)
    torch.testing.assert_close(got, expected)
    assert float(got.sum()) == pytest.approx(1.0)


def test_mix_follows_the_asked_option_order() -> None:
    settings = MemorySettings(k=2, tau=0.1, lam=0.5)
    memory = QuestionMemory(unit([1, 0], [0, 1]), torch.tensor([0, 2]), NAMES, settings)
    state = unit([1, 0.3])
    head = torch.tensor([[0.2, 0.5, 0.3]], dtype=torch.float64)
    stored = memory.mix(head, state, NAMES)
    reordered = memory.mix(head[:, [2, 0, 1]], state, ["c", "a", "b"])
    torch.testing.assert_close(reordered, stored[:, [2, 0, 1]])


def test_settings_and_shapes_are_checked() -> None:
    vectors, labels = unit([1, 0], [0, 1]), torch.tensor([0, 1])
    for bad, message in [
        (MemorySettings(k=0, tau=0.1, lam=0.5), "k must be at least 1"),
        (MemorySettings(k=1, tau=0.0, lam=0.5), "tau must be a positive number"),
        (MemorySettings(k=1, tau=0.1, lam=0.0), r"lam must be in \(0, 1\]"),
        (MemorySettings(k=1, tau=0.1, lam=0.5, temperature=math.nan), "temperature"),
    ]:
        with pytest.raises(ValueError, match=message):
            QuestionMemory(vectors, labels, NAMES, bad)
    ok = MemorySettings(k=1, tau=0.1, lam=0.5)
    with pytest.raises(ValueError, match="must index the 3 options"):
        QuestionMemory(vectors, torch.tensor([0, 3]), NAMES, ok)
    with pytest.raises(ValueError, match=r"vectors \[M, H\] and labels \[M\]"):
        QuestionMemory(vectors, torch.tensor([0]), NAMES, ok)


def clusters(n: int, seed: int, noise: float = 0.3) -> tuple[torch.Tensor, torch.Tensor]:
    """``n`` unit vectors around one centre per label of NAMES (the same centres for every
    seed), and their labels."""
    centres = torch.randn(len(NAMES), 16, generator=torch.Generator().manual_seed(0))
    gen = torch.Generator().manual_seed(seed)
    labels = torch.arange(n) % len(NAMES)
    x = centres[labels] + noise * torch.randn(n, 16, generator=gen) / 4
    return torch.nn.functional.normalize(x, dim=-1), labels


def calibrated_head(labels: torch.Tensor, seed: int, top: float = 0.5) -> torch.Tensor:
    """Head probabilities of ``top`` on one label, shared evenly by the other two, where
    that label is the true one ``top`` of the time: a calibrated head."""
    gen = torch.Generator().manual_seed(seed)
    n = len(labels)
    wrong = (labels + 1 + torch.randint(0, 2, (n,), generator=gen)) % 3
    guess = torch.where(torch.rand(n, generator=gen) < top, labels, wrong)
    probs = torch.full((n, 3), (1 - top) / 2, dtype=torch.float64)
    probs[torch.arange(n), guess] = top
    return probs


def held_out(n: int = 60) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``n`` held-out vectors, their labels, and a calibrated but vague head's answers."""
    x, y = clusters(n, seed=2)
    return x, y, calibrated_head(y, seed=3)


def test_fit_keeps_a_memory_that_lowers_the_held_out_nll() -> None:
    held_x, held_y, probs = held_out()
    fitted, report = fit_question_memory(*clusters(90, seed=1), NAMES, held_x, probs, held_y)
    assert fitted is not None
    assert report["nll_memory"] < report["nll_head"]
    assert report["states"] == 90 and report["held_out"] == 60
    assert fitted.settings.lam == report["lam"] > 0
    # The memory it returns gives the held-out NLL it reports.
    mixed = fitted.mix(probs, held_x, NAMES)
    nll = float(-mixed[torch.arange(60), held_y].log().mean())
    assert nll == pytest.approx(report["nll_memory"], abs=1e-4)


def test_fit_keeps_no_memory_whose_neighbours_say_nothing() -> None:
    memory_x, _ = clusters(90, seed=1)
    noise = torch.randint(0, 3, (90,), generator=torch.Generator().manual_seed(4))
    held_x, held_y = clusters(600, seed=2)
    probs = calibrated_head(held_y, seed=3, top=0.9)
    fitted, report = fit_question_memory(memory_x, noise, NAMES, held_x, probs, held_y)
    assert fitted is None
    assert set(report) == {"states", "held_out", "nll_head"}


def test_fit_needs_enough_held_out_states() -> None:
    memory_x, memory_y = clusters(30, seed=1)
    held_x, held_y, probs = held_out(MIN_HELD_OUT - 1)
    fitted, report = fit_question_memory(memory_x, memory_y, NAMES, held_x, probs, held_y)
    assert fitted is None and report["held_out"] == MIN_HELD_OUT - 1
    with pytest.raises(ValueError, match="needs memory states and held-out states"):
        fit_question_memory(memory_x, memory_y, NAMES, held_x[:0], probs[:0], held_y[:0])


def test_a_memory_smaller_than_k_votes_with_all_its_states() -> None:
    held_x, held_y, probs = held_out()
    fitted, _ = fit_question_memory(*clusters(6, seed=1), NAMES, held_x, probs, held_y)
    assert fitted is not None and fitted.settings.k <= 6
    assert fitted.vote(held_x).shape == (60, 3)


def test_cross_fitted_memory_is_chosen_on_the_other_folds_votes() -> None:
    x, y = clusters(90, seed=1)
    folds = torch.arange(90) % 5
    probs = calibrated_head(y, seed=3)  # each state's out-of-fold head answers
    fitted, report = fit_question_memory_cross(x, y, NAMES, folds, probs)
    assert fitted is not None and len(fitted) == 90  # the memory holds every state
    assert report["cross_fitted"] == 1.0
    assert report["states"] == report["held_out"] == 90
    assert report["nll_memory"] < report["nll_head"]
    # The report's NLL is that of each state mixed with the vote of the other folds: the
    # same as fitting a memory of the other folds for each fold in turn, held out.
    mixed = torch.empty(90, 3, dtype=torch.float64)
    for f in range(5):
        held = folds == f
        rest = QuestionMemory(x[~held], y[~held], NAMES, fitted.settings)
        mixed[held] = rest.mix(probs[held], x[held], NAMES)
    nll = float(-mixed[torch.arange(90), y].log().mean())
    assert nll == pytest.approx(report["nll_memory"], abs=1e-4)


def test_copies_inside_a_fold_do_not_vote_for_each_other() -> None:
    """Random vectors with random labels, each with an exact copy in its own fold: across
    folds the neighbours say nothing, so they cannot help a head that is right 90 % of the
    time. Counting the copy would make the memory look perfect."""
    gen = torch.Generator().manual_seed(5)
    x = torch.nn.functional.normalize(torch.randn(300, 16, generator=gen), dim=-1)
    y = torch.randint(0, 3, (300,), generator=gen)
    x, y = torch.cat([x, x]), torch.cat([y, y])
    folds = torch.cat([torch.arange(300) % 5] * 2)
    probs = calibrated_head(y, seed=3, top=0.9)
    fitted, report = fit_question_memory_cross(x, y, NAMES, folds, probs)
    assert fitted is None and report["cross_fitted"] == 1.0
    # Held out against a memory of the copies themselves, the same states do keep one.
    copies, _ = fit_question_memory(x[:300], y[:300], NAMES, x[300:], probs[300:], y[300:])
    assert copies is not None


def test_cross_fitted_memory_checks_its_folds() -> None:
    x, y = clusters(90, seed=1)
    probs = calibrated_head(y, seed=3)
    one_fold = torch.zeros(90, dtype=torch.long)  # no other fold to vote: no memory
    fitted, report = fit_question_memory_cross(x, y, NAMES, one_fold, probs)
    assert fitted is None and report["held_out"] == 90 and "lam" not in report
    with pytest.raises(ValueError, match="one row per memory state"):
        fit_question_memory_cross(x, y, NAMES, torch.arange(89) % 5, probs)
    few = MIN_HELD_OUT - 1
    fitted, report = fit_question_memory_cross(
        x[:few], y[:few], NAMES, torch.arange(few) % 5, probs[:few]
    )
    assert fitted is None and report["held_out"] == few and report["cross_fitted"] == 1.0


def test_refit_in_another_option_order_matches_the_fit_in_the_stored_order() -> None:
    held_x, held_y, probs = held_out()
    fitted, report = fit_question_memory(*clusters(90, seed=1), NAMES, held_x, probs, held_y)
    assert fitted is not None
    asked = ["c", "a", "b"]  # held probabilities and labels in this order
    relabel = torch.tensor([asked.index(n) for n in NAMES])
    again, again_report = refit_question_memory(
        fitted, held_x, probs[:, [2, 0, 1]], relabel[held_y], asked
    )
    assert again is not None and again_report == report
    with pytest.raises(ValueError, match="not those of the memory"):
        refit_question_memory(fitted, held_x, probs, held_y, ["a", "b", "z"])


def test_held_out_copies_of_memory_states_cannot_sharpen_the_mixture_without_bound() -> None:
    memory_x, memory_y = clusters(90, seed=1)
    probs = calibrated_head(memory_y, seed=3)
    # "Held-out" states that are the memory states: each one's own copy votes for it.
    fitted, report = fit_question_memory(memory_x, memory_y, NAMES, memory_x, probs, memory_y)
    assert fitted is not None and report["temperature"] == TEMPERATURE_RANGE[0]


def test_refit_keeps_the_memory_as_it_is_on_few_held_out_states() -> None:
    held_x, held_y, probs = held_out()
    fitted, _ = fit_question_memory(*clusters(90, seed=1), NAMES, held_x, probs, held_y)
    assert fitted is not None
    few = MIN_HELD_OUT - 1
    again, report = refit_question_memory(
        fitted, held_x[:few], probs[:few], held_y[:few], NAMES, before=probs[:few]
    )
    assert again is fitted
    assert report["unchanged"] == 1 and report["held_out"] == few
    expected = fitted.mix(probs[:few], held_x[:few], NAMES)[torch.arange(few), held_y[:few]]
    assert report["nll_before"] == pytest.approx(float(-expected.log().mean()), abs=1e-4)


def test_refit_memory_pools_the_rows_of_one_fingerprint_in_any_option_order() -> None:
    held_x, held_y, probs = held_out(90)
    fitted, _ = fit_question_memory(*clusters(90, seed=1), NAMES, held_x, probs, held_y)
    assert fitted is not None
    states = [f"state {i}" for i in range(90)]
    lookup = dict(zip(states, held_x, strict=True))
    asked = ["c", "a", "b"]  # the second half asks the same options in this order
    rows = []
    for i in range(90):
        p = probs[i].tolist()
        if i < 45:
            rows.append(("choice", "", NAMES, states[i], p, p, int(held_y[i])))
        else:
            q = [p[2], p[0], p[1]]
            rows.append(("choice", "", asked, states[i], q, q, asked.index(NAMES[held_y[i]])))
    rows.append(("score", "", ["0", "1"], "not in the memory", [0.5, 0.5], [0.5, 0.5], 0))
    memory = ExampleMemory()
    memory.add("choice", fitted)
    seen: list[list[str]] = []

    def encode(texts: list[str]) -> torch.Tensor:
        seen.append(texts)
        return torch.stack([lookup[t] for t in texts])

    reports = refit_memory(memory, rows, encode)
    fp = fingerprint("choice", NAMES)
    _, alone = refit_question_memory(fitted, held_x, probs, held_y, NAMES, before=probs)
    assert reports == {fp: alone}  # the 90 rows, as one held-out set in one order
    assert seen == [states]
    assert memory.questions[fp].settings == fitted.settings


def test_refit_memory_removes_a_memory_that_stopped_helping() -> None:
    held_x, held_y, probs = held_out(90)
    fitted, _ = fit_question_memory(*clusters(90, seed=1), NAMES, held_x, probs, held_y)
    assert fitted is not None
    memory = ExampleMemory()
    memory.add("choice", fitted)
    wrong = (held_y + 1) % 3  # every neighbour now votes for the wrong label
    confident = calibrated_head(wrong, seed=5, top=0.9)
    rows = [
        ("choice", "", NAMES, str(i), confident[i].tolist(), probs[i].tolist(), int(wrong[i]))
        for i in range(90)
    ]
    reports = refit_memory(memory, rows, lambda texts: held_x[[int(t) for t in texts]])
    (report,) = reports.values()
    assert "lam" not in report and report["nll_before"] > report["nll_head"]
    assert len(memory) == 0


def test_digest_follows_settings_and_vectors() -> None:
    vectors, labels = clusters(12, seed=1)
    memory = ExampleMemory()
    memory.add("choice", QuestionMemory(vectors, labels, NAMES, MemorySettings(3, 0.05, 0.3)))
    first = memory.digest()
    assert first == memory.digest() and len(first) == 12
    memory.add("choice", QuestionMemory(vectors, labels, NAMES, MemorySettings(3, 0.05, 0.5)))
    second = memory.digest()
    memory.add(
        "choice", QuestionMemory(vectors.flip(0), labels, NAMES, MemorySettings(3, 0.05, 0.5))
    )
    assert len({first, second, memory.digest()}) == 3


def test_save_and_load_round_trip(tmp_path) -> None:
    settings = MemorySettings(k=3, tau=0.05, lam=0.3, temperature=1.1)
    memory = ExampleMemory()
    memory.add("choice", QuestionMemory(*clusters(12, seed=1), NAMES, settings))
    description = memory.save(tmp_path)
    fp = fingerprint("choice", NAMES)
    assert description == {
        fp: {"names": NAMES, "k": 3, "tau": 0.05, "lam": 0.3, "temperature": 1.1}
    }
    json.dumps(description)  # goes into config.json as it is
    loaded = ExampleMemory.load(tmp_path, description)
    got = loaded.get("choice", ["b", "a", "c"])  # any order of the same options
    assert got is not None and got.settings == settings
    torch.testing.assert_close(got.vectors, memory.questions[fp].vectors)
    assert loaded.get("choice", ["a", "b"]) is None
    assert loaded.get("score", NAMES) is None
    # The default temperature is left out of config.json; loading fills it in.
    memory.add("choice", QuestionMemory(*clusters(12, seed=1), NAMES, MemorySettings(3, 0.05, 0.3)))
    assert "temperature" not in memory.save(tmp_path)[fp]
    assert (
        ExampleMemory.load(tmp_path, memory.save(tmp_path)).questions[fp].settings.temperature
        == 1.0
    )


def test_load_names_what_is_missing_or_inconsistent(tmp_path) -> None:
    memory = ExampleMemory()
    settings = MemorySettings(k=3, tau=0.05, lam=0.3)
    memory.add("choice", QuestionMemory(*clusters(12, seed=1), NAMES, settings))
    description = memory.save(tmp_path)
    with pytest.raises(ModelLoadError, match=r"does not match its config\.json memory entry"):
        ExampleMemory.load(tmp_path, {"0123456789abcdef": next(iter(description.values()))})
    bad = {fp: {**info, "lam": 2.0} for fp, info in description.items()}
    with pytest.raises(ModelLoadError, match=r"lam must be in \(0, 1\]"):
        ExampleMemory.load(tmp_path, bad)
    with pytest.raises(ModelLoadError, match=r"expected \{fingerprint"):
        ExampleMemory.load(tmp_path, {"fp": ["not", "a", "dict"]})
    with pytest.raises(ModelLoadError, match="width 16; the backbone's are 384"):
        ExampleMemory.load(tmp_path, description, hidden_size=384)
    (tmp_path / MEMORY_FILE).write_bytes(b"not safetensors")
    with pytest.raises(ModelLoadError, match="cannot read the weights"):
        ExampleMemory.load(tmp_path, description)
    (tmp_path / MEMORY_FILE).unlink()
    with pytest.raises(ModelLoadError, match=f"has no {MEMORY_FILE}"):
        ExampleMemory.load(tmp_path, description)
