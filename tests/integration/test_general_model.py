"""The general decision model shipped in the package (the default engine), end to end.

These assert the answers the README, the quickstart and the noul suite advertise (the
README's shell commands are read from README.md itself); the
bare similarity scorer of earlier releases got the crash report (billing at 73 %), the
refund request (urgent at 0.11) and the angry customer (0.14) wrong, and 9 of the noul
suite's 20 clearest cases right.
"""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest
import torch

from clef_engine import Choice, DecisionEngine, ModelLoadError, Noul
from clef_engine.runtime.general import GENERAL_DIR, base_tag

pytestmark = pytest.mark.integration

SUITE = Path(__file__).resolve().parent.parent / "data" / "noul_suite.jsonl"
README = Path(__file__).resolve().parents[2] / "README.md"


def _suite(clearest: bool) -> list[dict]:
    cases = [json.loads(line) for line in SUITE.read_text().splitlines() if line.strip()]
    return [c for c in cases if c.get("clearest")] if clearest else cases


def test_the_default_engine_is_the_packaged_general_model(engine):
    config = json.loads((GENERAL_DIR / "config.json").read_text())
    assert engine.model_name == config["model_name"]
    assert engine.head.prompted
    assert engine.model_version.startswith(config["model_name"] + "@")
    similarity = DecisionEngine(scorer="similarity", warmup=False)
    assert not similarity.head.prompted
    assert similarity.model_version != engine.model_version
    with pytest.raises(ValueError, match="scorer"):
        DecisionEngine(scorer="cosine")


def test_the_adapter_fits_the_size_budget():
    total = sum(p.stat().st_size for p in GENERAL_DIR.rglob("*") if p.is_file())
    assert total <= 20 * 2**20


def _wrong(engine, cases: list[dict]) -> list[tuple[str, float]]:
    results = [engine.decide(c["state"], {"q": Noul(instructions=c["question"])}) for c in cases]
    return [
        (c["id"], round(r.answers["q"].noul, 3))
        for c, r in zip(cases, results)
        if (r.answers["q"].noul > 0.5) != c["answer"]
    ]


def test_clearest_noul_suite_cases(engine):
    """The general model answered 17 of the 20 clearest cases (the similarity scorer 9);
    at most 4 wrong leaves room for float noise at the 0.5 line, not for a regression."""
    cases = _suite(clearest=True)
    assert len(cases) == 20
    assert len(_wrong(engine, cases)) <= 4


@pytest.mark.xfail(
    strict=True, reason="issue 31 target, not met: 17 of 20 (urgency-09, spam-01, relevance-09)"
)
def test_every_clearest_noul_suite_case(engine):
    assert _wrong(engine, _suite(clearest=True)) == []


def test_readme_route_example(engine):
    """README, "Route a ticket": billing (0.98 there) and upset (0.73 there)."""
    result = engine.decide(
        {"customer": "Ana", "message": "I was charged twice for my card payment!"},
        {
            "route": Choice(
                instructions="Which team handles this?",
                criteria={
                    "billing": "payments, refunds, charges",
                    "technical": "app errors, login problems",
                    "sales": "pricing, upgrades",
                },
            ),
            "upset": Noul(instructions="Is the customer upset?"),
        },
    )
    route = result.answers["route"]
    assert route.choice == "billing"
    assert route.probabilities["billing"] == pytest.approx(0.98, abs=0.02)
    assert result.answers["upset"].noul == pytest.approx(0.73, abs=0.05)


def test_readme_teach_example(engine):
    """README, "Teach an option with a few examples": cancel, then bug."""
    want = Choice(
        instructions="What does the customer want?",
        criteria={
            "refund": {
                "description": "money back",
                "examples": ["I want my money back", "refund please", "please reverse this charge"],
            },
            "cancel": {
                "description": "end the subscription",
                "examples": [
                    "cancel my plan",
                    "stop my subscription",
                    "I want to close my account",
                ],
            },
            "bug": {
                "description": "the app fails",
                "examples": ["the app crashed", "error 500 on save", "the page won't load"],
            },
        },
    )
    texts = ["I'd like to end my membership", "it keeps freezing when I upload a photo"]
    answers = [engine.decide(t, {"want": want}).answers["want"].choice for t in texts]
    assert answers == ["cancel", "bug"]


def _readme_decide_commands() -> list[list[str]]:
    """The ``clef-agents decide`` commands of the README's shell blocks, as argv lists."""
    text = README.read_text()
    blocks = re.findall(r"```bash\n(.*?)```", text, flags=re.S)
    commands = []
    for block in blocks:
        for line in block.replace("\\\n", " ").splitlines():
            for part in line.split("&&"):
                argv = shlex.split(part)
                if argv[:2] == ["clef-agents", "decide"]:
                    commands.append(argv[1:])
    return commands


def _cli(engine, argv: list[str], monkeypatch, capsys) -> str:
    from clef_agents.cli import decide, main

    monkeypatch.setattr(decide, "build_engine", lambda args: engine)
    assert main(argv) == 0
    return capsys.readouterr().out


def test_readme_shell_commands_give_the_answers_the_readme_shows(engine, monkeypatch, capsys):
    """The install command answers card_arrival (96 % in the README); the shell example
    prints the block under it (technical at 100 %, bug 0.914)."""
    install, example = _readme_decide_commands()
    out = _cli(engine, install, monkeypatch, capsys)
    assert out.startswith("intent: card_arrival")
    assert re.search(r"9[4-8]\.\d%  card_arrival", out), out
    out = _cli(engine, example, monkeypatch, capsys)
    shown = re.search(r"```text\n(team: .*?)```", README.read_text(), flags=re.S).group(1)
    assert out.splitlines()[0] == shown.splitlines()[0]  # team: technical  (confidence 1.00)
    assert "technical" in out.splitlines()[1] and "bug: P(yes) = 0.9" in out


def test_readme_bare_option_names_pick_the_wrong_intent(engine, monkeypatch, capsys):
    """README, zero-shot limits: without descriptions the same card question picks
    lost_or_stolen_card (54 % against 46 %)."""
    argv = [
        "decide",
        "My card still hasn't arrived after two weeks",
        "--choice",
        "intent=card_arrival,lost_or_stolen_card,exchange_rate",
    ]
    out = _cli(engine, argv, monkeypatch, capsys)
    assert out.startswith("intent: lost_or_stolen_card")


def test_quickstart_refund_request_is_urgent(engine):
    urgent = Noul(
        instructions="Is the customer asking for urgent help?",
        criteria={"true": "urgent, asap, immediately, right now"},
    )
    hot = engine.decide("I was charged twice, refund me right now!", {"q": urgent})
    calm = engine.decide("Can we get a demo of the team plan?", {"q": urgent})
    assert hot.answers["q"].noul > 0.5 > calm.answers["q"].noul


def test_int8_keeps_the_general_models_answers(engine):
    int8 = DecisionEngine(quantize="int8")
    assert int8.head.prompted
    assert (
        int8.calibrator.to_dict()
        == json.loads((GENERAL_DIR / "config.json").read_text())["calibration_int8"]
    )
    cases = _suite(clearest=False)
    agree = 0
    for c in cases:
        question = {"q": Noul(instructions=c["question"])}
        fp32 = engine.decide(c["state"], question).answers["q"].noul
        agree += (int8.decide(c["state"], question).answers["q"].noul > 0.5) == (fp32 > 0.5)
    assert agree >= 0.95 * len(cases)


def test_options_taught_by_examples_use_the_bare_models_vectors(engine):
    """Choice examples are fitted on the similarity scorer's vectors (87.6 % against 85.0 %
    on 10-shot BANKING77); a request mixing both kinds of question gets both answers."""
    taught = Choice(
        instructions="Route the message",
        criteria={
            "refund": {
                "description": "money back",
                "examples": ["I want my money back", "refund please"],
            },
            "bug": {
                "description": "the app fails",
                "examples": ["the app crashed", "error 500 on save"],
            },
        },
    )
    plain = Noul(instructions="Is the customer upset?")
    state = "this is the third time the app crashed, I want a refund"
    mixed = engine.decide(state, {"taught": taught, "plain": plain})
    similarity = engine.examples_engine()
    assert similarity is not engine and not similarity.head.prompted
    alone = similarity.decide(state, {"taught": taught})
    assert mixed.answers["taught"].probabilities == pytest.approx(
        alone.answers["taught"].probabilities
    )
    general = engine.decide(state, {"plain": plain})
    assert mixed.answers["plain"].noul == pytest.approx(general.answers["plain"].noul, abs=1e-6)
    assert engine.prepare_question(taught) is similarity.prepare_question(taught)
    batch = engine.decide_batch([state, "refund please"], {"taught": taught, "plain": plain})
    assert [r.answers["taught"].choice for r in batch] == [mixed.answers["taught"].choice, "refund"]


URGENT = [
    "The payment gateway rejects every card since 9am, nobody can check out",
    "Our admin password leaked on a forum an hour ago, lock the account now",
    "The vaccine fridge alarm is going off and the temperature keeps rising",
    "Server disk is at 99 % and the database stops writing in minutes",
]
NOT_URGENT = [
    "Could you add an export to PDF in a future version?",
    "No hurry: please update my billing address sometime this month",
    "Thanks for the quick help last week, all good now",
    "Where can I read your release notes?",
]


def test_a_yes_no_question_taught_by_examples_uses_the_general_models_vectors(engine):
    """Yes/no prototypes are fitted on the general model's own vectors (80.0 % against
    71.6 % on the bare model's, held-out examples of benchmarks/data/noul_examples.json);
    choice options taught by examples still go to the bare model."""
    urgent = Noul(
        instructions="Is it urgent?",
        criteria={"true": {"examples": URGENT}, "false": {"examples": NOT_URGENT}},
    )
    route = Choice(
        instructions="Route the message",
        criteria={"refund": {"examples": ["I want my money back", "refund please"]},
                  "bug": {"examples": ["the app crashed", "error 500 on save"]}},
    )  # fmt: skip
    prepared = engine.prepare_question(urgent)
    assert prepared.classifier is not None
    assert prepared is not engine.examples_engine().prepare_question(urgent)
    assert engine.prepare_question(route) is engine.examples_engine().prepare_question(route)
    state = "The mobile app crashes for every user after today's release, customers are furious"
    answers = engine.decide(state, {"urgent": urgent, "route": route}).answers
    pooled = engine.backbone.encode([state]).pooled.float()
    expected = torch.softmax(prepared.classifier.logits(pooled).double(), -1)[0]
    if prepared.memory is not None:
        expected = prepared.memory.mix(expected.unsqueeze(0), pooled, prepared.names)[0]
    assert answers["urgent"].noul == pytest.approx(float(expected[0]), abs=1e-5)
    assert answers["urgent"].noul > 0.5
    assert answers["route"].choice == "bug"
    calm = engine.decide("Is there a dark mode?", {"urgent": urgent}).answers["urgent"]
    assert calm.noul < 0.5


def test_a_saved_general_engine_loads_on_the_same_weights(engine, tmp_path):
    """Saving the default engine used to write the bare backbone with the general model's
    calibration: the reloaded engine answered the angry customer 0.56 instead of 0.98."""
    question = {"angry": Noul(instructions="Is the customer angry?")}
    state = "I hate this product, you are scammers"
    engine.save_pretrained(tmp_path / "saved")
    saved = json.loads((tmp_path / "saved" / "config.json").read_text())
    assert saved["backbone"]["base"] == base_tag()
    loaded = DecisionEngine.from_pretrained(tmp_path / "saved", warmup=False)
    assert loaded.model_version == engine.model_version
    assert loaded.head.prompted
    before = engine.decide(state, question).answers["angry"].noul
    after = loaded.decide(state, question).answers["angry"].noul
    assert after == pytest.approx(before, abs=1e-6)
    assert after > 0.5


def test_a_model_dir_saved_with_another_general_adapter_is_refused(engine, tmp_path):
    engine.save_pretrained(tmp_path / "saved")
    config_path = tmp_path / "saved" / "config.json"
    config = json.loads(config_path.read_text())
    config["backbone"]["base"] = "general@0000000000000000"
    config_path.write_text(json.dumps(config))
    with pytest.raises(ModelLoadError, match=r"backbone\.base.*this install ships"):
        DecisionEngine.from_pretrained(tmp_path / "saved", warmup=False)
    config["backbone"]["base"] = "mystery"
    config_path.write_text(json.dumps(config))
    with pytest.raises(ModelLoadError, match=r"backbone\.base.*known bases"):
        DecisionEngine.from_pretrained(tmp_path / "saved", warmup=False)


@pytest.mark.slow
def test_finetune_starts_from_the_general_model(tmp_path):
    """``Trainer(backbone="packaged:general")``: the fine-tuned dir records the base and loads
    on the general weights (head-only here, so the loaded encoder equals the general one)."""
    pytest.importorskip("peft")
    from clef_engine.runtime.general import REFERENCE, general_backbone
    from clef_engine.train import Example, TrainConfig, Trainer, TrainingSet

    words = {"billing": "refund payment money charged", "tech": "bug error login crash"}
    examples = [
        Example(f"{words[label]} {i}", {"route": j})
        for i in range(12)
        for j, label in enumerate(words)
    ]
    data = TrainingSet(
        {"route": Choice(instructions="route the ticket", criteria=list(words))},
        examples,
        "synthetic",
    )
    config = TrainConfig(epochs=1, lora_rank=0, batch_size=8, val_fraction=0.25, progress=False)
    Trainer(config, backbone=REFERENCE).fit(data, tmp_path / "tuned")
    saved = json.loads((tmp_path / "tuned" / "config.json").read_text())
    assert saved["backbone"]["base"] == base_tag()
    tuned = DecisionEngine.from_pretrained(tmp_path / "tuned", warmup=False)
    reference = dict(general_backbone().model.named_parameters())
    bare = dict(DecisionEngine(scorer="similarity", warmup=False).backbone.model.named_parameters())
    # The general adapter adapts the top blocks: the last query projection differs.
    name, weight = [
        (n, p) for n, p in tuned.backbone.model.named_parameters() if "query.weight" in n
    ][-1]
    assert torch.equal(weight, reference[name])
    assert not torch.equal(weight, bare[name])
    assert tuned.decide("my card payment was charged twice", {"route": data.questions["route"]})
