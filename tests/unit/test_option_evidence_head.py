"""The option-evidence head: shapes, zero-shot start, option symmetry, persistence."""

from __future__ import annotations

import pytest
import torch

from clef_engine.errors import ModelLoadError
from clef_engine.heads.option_evidence import (
    HeadConfig,
    OptionEvidenceHead,
    fingerprint,
    pad_tokens,
    question_context,
)


def inputs(b: int = 3, length: int = 6, h: int = 16, n: int = 5, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    tokens = torch.randn(b, length, h, generator=gen)
    mask = torch.ones(b, length, dtype=torch.bool)
    mask[0, 4:] = False
    pooled = torch.nn.functional.normalize(torch.randn(b, h, generator=gen), dim=-1)
    options = torch.nn.functional.normalize(torch.randn(n, h, generator=gen), dim=-1)
    return tokens, mask, pooled, options


def trained_like(seed: int = 0) -> OptionEvidenceHead:
    torch.manual_seed(seed)
    head = OptionEvidenceHead(HeadConfig(hidden_size=16, dim=8, heads=2, dropout=0.0))
    with torch.no_grad():  # give the evidence path non-zero output weights
        head.out.weight.normal_()
        head.out.bias.fill_(0.3)
    return head.eval()


@pytest.mark.parametrize("n", [2, 7, 255])
@pytest.mark.parametrize("qtype", ["choice", "noul", "score"])
def test_any_number_of_options_and_any_type(n: int, qtype: str) -> None:
    tokens, mask, pooled, _ = inputs()
    options = torch.randn(n, 16)
    assert trained_like()(tokens, mask, pooled, options, qtype).shape == (3, n)


def test_untrained_head_is_the_scaled_cosine() -> None:
    tokens, mask, pooled, options = inputs()
    head = OptionEvidenceHead(HeadConfig(hidden_size=16, dim=8, heads=2)).eval()
    logits = head(tokens, mask, pooled, options, "choice")
    assert torch.allclose(logits, 20.0 * pooled @ options.T, atol=1e-5)


def test_permuting_options_permutes_logits() -> None:
    tokens, mask, pooled, options = inputs()
    head = trained_like()
    perm = torch.tensor([3, 0, 4, 1, 2])
    a = head(tokens, mask, pooled, options, "choice")
    b = head(tokens, mask, pooled, options[perm], "choice")
    assert torch.allclose(a[:, perm], b, atol=1e-5)


def test_competitors_change_an_options_score() -> None:
    tokens, mask, pooled, options = inputs()
    head = trained_like()
    full = head(tokens, mask, pooled, options, "choice")[:, 0]
    fewer = head(tokens, mask, pooled, options[:2], "choice")[:, 0]
    assert not torch.allclose(full, fewer)


def test_padding_does_not_change_logits() -> None:
    tokens, mask, pooled, options = inputs()
    head = trained_like()
    a = head(tokens, mask, pooled, options, "choice")
    noisy = tokens.clone()
    noisy[0, 4:] = 1e3  # masked positions
    b = head(noisy, mask, pooled, options, "choice")
    assert torch.allclose(a, b, atol=1e-5)


def test_option_bank_is_order_free_for_choice() -> None:
    head = trained_like()
    vectors = torch.randn(3, 16)
    head.add_question("choice", ["a", "b", "c"], vectors)
    assert head.knows("choice", ["c", "a", "b"])
    assert not head.knows("score", ["a", "b", "c"])
    got = head.option_vectors("choice", ["c", "a", "b"], None)
    assert torch.equal(got, vectors[[2, 0, 1]])
    assert fingerprint("score", ["0", "1"]) != fingerprint("score", ["1", "0"])
    with pytest.raises(KeyError):
        head.option_vectors("choice", ["x", "y"], None)


def test_yes_no_and_score_questions_are_known_by_their_wording(tmp_path) -> None:
    from clef_engine import Choice, Noul, Score

    urgent, spam = Noul(instructions="Is it urgent?"), Noul(instructions="Is it spam?")
    levels = ["low", "medium", "high"]
    urgency, severity = (
        Score(instructions="urgency", criteria=levels),
        Score(instructions="severity", criteria=levels),
    )
    # Every yes/no question has the options true/false, every 3-level score "0".."2":
    # their wording is what tells them apart.
    assert question_context(urgent) != question_context(spam)
    assert question_context(urgency) != question_context(severity)
    assert question_context(Noul(instructions="Is it urgent?")) == question_context(urgent)
    assert question_context(Score(instructions="urgency", criteria=["low", "mid", "high"])) != (
        question_context(urgency)
    )
    described = Noul(criteria={"true": "urgent", "false": "can wait"})
    assert question_context(described) != question_context(Noul(criteria={"true": "urgent"}))
    # A choice is known by its option set, whatever its wording (and it keeps the
    # fingerprint it had before contexts existed).
    assert question_context(Choice(instructions="Which team?", criteria=["a", "b"])) == ""
    assert fingerprint("choice", ["a", "b"], "") == fingerprint("choice", ["b", "a"])
    head = trained_like()
    names = ["true", "false"]
    fp = head.add_question("noul", names, torch.randn(2, 16), question_context(urgent))
    assert head.knows("noul", names, question_context(urgent))
    assert not head.knows("noul", names, question_context(spam))
    assert not head.knows("noul", names)
    head.save(tmp_path)
    again = OptionEvidenceHead.load(tmp_path, head.describe())
    assert again.bank_contexts == {fp: question_context(urgent)}
    assert again.knows("noul", names, question_context(urgent))


def test_save_load_round_trip(tmp_path) -> None:
    head = trained_like()
    head.add_question("choice", ["a", "b", "c"], torch.randn(3, 16))
    description = head.save(tmp_path)
    again = OptionEvidenceHead.load(tmp_path, description)
    tokens, mask, pooled, _ = inputs(n=3)
    options = head.option_vectors("choice", ["a", "b", "c"], None)
    assert torch.allclose(
        head(tokens, mask, pooled, options, "choice"),
        again(
            tokens, mask, pooled, again.option_vectors("choice", ["a", "b", "c"], None), "choice"
        ),
    )
    (tmp_path / "head.safetensors").unlink()
    with pytest.raises(ModelLoadError, match=r"head\.safetensors"):
        OptionEvidenceHead.load(tmp_path, description)


def test_prototype_head_answers_its_question_in_any_option_order(tmp_path) -> None:
    head = trained_like()
    head.add_question("choice", ["a", "b", "c"], torch.randn(3, 16))
    head.add_question("noul", ["yes", "no"], torch.randn(2, 16))
    weight, bias = torch.randn(3, 16), torch.tensor([0.1, -0.2, 0.3])
    head.add_prototypes("choice", ["a", "b", "c"], weight, bias)
    _, _, pooled, _ = inputs()
    got = head.prototype_logits("choice", ["a", "b", "c"], pooled)
    assert got is not None and torch.allclose(got, pooled @ weight.T + bias)
    reordered = head.prototype_logits("choice", ["c", "a", "b"], pooled)
    assert reordered is not None and torch.allclose(reordered, got[:, [2, 0, 1]])
    # Questions without prototypes (and unknown ones) keep the evidence path.
    assert head.prototype_logits("noul", ["yes", "no"], pooled) is None
    assert head.prototype_logits("choice", ["x", "y"], pooled) is None
    # Stored with the head, not trainable, and restored by load.
    assert not head.prototype_weight[fingerprint("choice", ["a", "b", "c"])].requires_grad
    description = head.save(tmp_path)
    flags = {q["type"]: q.get("prototype", False) for q in description["questions"].values()}
    assert flags == {"choice": True, "noul": False}
    again = OptionEvidenceHead.load(tmp_path, description)
    assert torch.equal(again.prototype_logits("choice", ["a", "b", "c"], pooled), got)
    assert again.prototype_logits("noul", ["yes", "no"], pooled) is None


def test_prototypes_need_a_registered_question_and_the_right_shapes() -> None:
    head = trained_like()
    with pytest.raises(KeyError, match="add_question"):
        head.add_prototypes("choice", ["a", "b"], torch.randn(2, 16), torch.zeros(2))
    head.add_question("choice", ["a", "b"], torch.randn(2, 16))
    with pytest.raises(ValueError, match=r"needs weight \[2, 16\] and bias \[2\]; got \[2, 8\]"):
        head.add_prototypes("choice", ["a", "b"], torch.randn(2, 8), torch.zeros(2))


def test_no_evidence_ablation_has_no_attention_layers() -> None:
    head = OptionEvidenceHead(HeadConfig(hidden_size=16, evidence=False))
    assert sum(p.numel() for p in head.parameters()) == 1 + 3
    tokens, mask, pooled, options = inputs()
    assert head(tokens, mask, pooled, options, "noul").shape == (3, 5)


def test_pad_tokens() -> None:
    states, mask = pad_tokens([torch.ones(2, 4), torch.ones(5, 4)])
    assert states.shape == (2, 5, 4) and mask.sum().item() == 7
    assert float(states[0, 2:].abs().sum()) == 0.0
