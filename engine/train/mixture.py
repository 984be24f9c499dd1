"""The decision mixture: public classification sets turned into typed questions.

``shared/data/decision-mix/`` (see its README and each ``CARD.md``) holds public data sets
in one JSONL format: ``{"text", "label"}`` or, for pair tasks, ``{"text", "text_pair",
"label"}``. :func:`load_mixture` reads them and :class:`MixtureSampler` turns each row
into a question *the way users ask it*:

- ``choice`` over readable option names (``alarm_query`` -> "alarm query"), with and
  without instructions and descriptions, with the options subsampled and shuffled;
- ``noul`` from every classification label ("Is this about X?", "Does the user want to
  X?", negated wordings too) and from pairs (the state is the premise or text, the
  instructions the hypothesis or a question about it);
- ``score`` from ordered sets (sentiment levels, similarity levels).

Instructions are paraphrased with templates, so the model learns the question's meaning
rather than one wording. The same sampler with a fixed seed gives the evaluation
questions (:meth:`MixtureSampler.canonical`): each set's own question, all its options.

Example:
    >>> import json, pathlib
    >>> hwu64 = pathlib.Path("decision-mix/hwu64")      # one set, three rows of it
    >>> hwu64.mkdir(parents=True)
    >>> rows = [{"text": "wake me up at seven", "label": "alarm_set"},
    ...         {"text": "will it rain today", "label": "weather_query"},
    ...         {"text": "play some jazz", "label": "play_music"}]
    >>> _ = (hwu64 / "train.jsonl").write_text("\\n".join(json.dumps(r) for r in rows))
    >>> sampler = MixtureSampler(load_mixture("decision-mix", split="train"), seed=0)
    >>> item = sampler.draw()
    >>> item.state, item.question.type, item.question.instructions, item.label
    ('will it rain today', 'choice', 'Pick the best category.', 0)
    >>> list(item.question.criteria)                # names raw or readable, shuffled
    ['weather_query', 'set an alarm', 'play music']
    >>> item = sampler.draw()
    >>> item.state, item.question.type, item.question.instructions, item.label
    ('play some jazz', 'noul', 'Does this message concern set an alarm?', 1)
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from clef_engine.schema.questions import Choice, Noul, Score, _Question, readable

T = TypeVar("T")


@dataclass
class Row:
    text: str
    label: str
    pair: str | None = None


@dataclass
class Item:
    """One training or evaluation decision: a state, a question, the right option."""

    state: str
    question: _Question
    label: int
    """Index of the right option (``noul``: 0 = yes, 1 = no; ``score``: the level)."""
    source: str
    kind: str = ""
    """How the question was made (``choice``, ``noul-label``, ``noul-pair``, ...)."""


# -- readable names ------------------------------------------------------------------------

HWU64_NAMES = {
    "alarm_query": "check alarms", "alarm_remove": "remove an alarm", "alarm_set": "set an alarm",
    "audio_volume_down": "turn the volume down", "audio_volume_mute": "mute the audio",
    "audio_volume_up": "turn the volume up", "calendar_query": "check the calendar",
    "calendar_remove": "remove a calendar event", "calendar_set": "add a calendar event",
    "cooking_recipe": "cooking recipe", "datetime_convert": "convert time zones",
    "datetime_query": "ask the date or time", "email_addcontact": "add an email contact",
    "email_query": "check emails", "email_querycontact": "look up a contact",
    "email_sendemail": "send an email", "general_affirm": "say yes",
    "general_commandstop": "stop the assistant", "general_confirm": "confirm",
    "general_dontcare": "does not care", "general_explain": "ask for an explanation",
    "general_joke": "tell a joke", "general_negate": "say no", "general_praise": "praise",
    "general_quirky": "chit chat", "general_repeat": "repeat that",
    "iot_cleaning": "start the vacuum cleaner", "iot_coffee": "make coffee",
    "iot_hue_lightchange": "change the light colour", "iot_hue_lightdim": "dim the lights",
    "iot_hue_lightoff": "turn the lights off", "iot_hue_lighton": "turn the lights on",
    "iot_hue_lightup": "brighten the lights", "iot_wemo_off": "turn the smart plug off",
    "iot_wemo_on": "turn the smart plug on", "lists_createoradd": "add to a list",
    "lists_query": "check a list", "lists_remove": "remove from a list",
    "music_likeness": "music preferences", "music_query": "what song is playing",
    "music_settings": "music settings", "news_query": "news", "play_audiobook": "play an audiobook",
    "play_game": "play a game", "play_music": "play music", "play_podcasts": "play a podcast",
    "play_radio": "play the radio", "qa_currency": "exchange rates",
    "qa_definition": "define a word",
    "qa_factoid": "general knowledge question", "qa_maths": "maths question",
    "qa_stock": "stock prices", "recommendation_events": "recommend events",
    "recommendation_locations": "recommend places", "recommendation_movies": "recommend movies",
    "social_post": "post on social media", "social_query": "social media updates",
    "takeaway_order": "order takeaway food", "takeaway_query": "takeaway order status",
    "transport_query": "public transport information", "transport_taxi": "book a taxi",
    "transport_ticket": "book a train ticket", "transport_traffic": "traffic information",
    "weather_query": "weather",
}  # fmt: skip


def readable_label(name: str) -> str:
    """``AddToPlaylist`` -> "add to playlist", ``card_arrival`` -> "card arrival"."""
    if name in HWU64_NAMES:
        return HWU64_NAMES[name]
    spaced = re.sub(r"(?<=[a-z])(?=[A-Z])", " ", name)
    return readable(spaced).lower()


# -- data sets ----------------------------------------------------------------------------


@dataclass
class DataSet:
    """One folder of the mixture: rows plus how its questions are asked."""

    name: str
    rows: list[Row]
    task: str
    """``choice``, ``noul``, ``pair-choice``, ``score`` or ``pair-score`` (the CARD's type)."""
    labels: list[str] = field(default_factory=list)
    """Every label, in the CARD's order for ordered sets (low -> high)."""


ORDERED = {
    "tweet_sentiment": ["negative", "neutral", "positive"],
    "stsb": [
        "different topics",
        "same topic only",
        "share some details",
        "roughly equivalent",
        "mostly equivalent",
        "completely equivalent",
    ],
}
TASKS = {
    "hwu64": "choice",
    "snips": "choice",
    "tweeteval_emotion": "choice",
    "hate_offensive": "choice",
    "tweeteval_offensive": "noul",
    "tweeteval_irony": "noul",
    "subj": "noul",
    "cr": "noul",
    "tweeteval_stance": "pair-choice",
    "tweet_sentiment": "score",
    "snli": "pair-choice",
    "stsb": "pair-score",
    "prompt_injection": "noul",
}
"""The task type of each set, from its CARD."""


def load_mixture(
    root: str | Path | Sequence[str | Path],
    *,
    split: str = "train",
    exclude: Sequence[str] = (),
) -> dict[str, DataSet]:
    """Every known set under ``root`` (``NAME/{split}.jsonl``), except ``exclude``.

    ``root`` may be several folders (the shared mixture, and one that holds a set built
    here, such as :mod:`clef_engine.train.injection_set`'s); a set is read from the first
    folder that has it.
    """
    roots = [Path(root)] if isinstance(root, (str, Path)) else [Path(r) for r in root]
    out: dict[str, DataSet] = {}
    for name, task in TASKS.items():
        found = [r / name / f"{split}.jsonl" for r in roots]
        path = next((p for p in found if p.is_file()), None)
        if name in exclude or path is None:
            continue
        rows = []
        for line in path.read_text(encoding="utf-8").splitlines():
            if line.strip():
                r = json.loads(line)
                rows.append(Row(str(r["text"]), str(r["label"]), r.get("text_pair")))
        labels = ORDERED.get(name) or sorted({r.label for r in rows})
        out[name] = DataSet(name, rows, task, labels)
    return out


# -- question makers ------------------------------------------------------------------------

CHOICE_INSTRUCTIONS = [
    "Which label fits the text?",
    "What is this message about?",
    "Classify the text.",
    "What does the user want?",
    "Pick the best category.",
    "Which topic is it?",
]
INTENT_NOUL = [
    "Is this about {x}?",
    "Is the user asking about {x}?",
    "Does this message concern {x}?",
    "Is the intent {x}?",
    "Is this a request about {x}?",
    "Does the user want {x}?",
]
EMOTION_ADJ = {"anger": "angry", "joy": "happy", "optimism": "optimistic", "sadness": "sad"}
EMOTION_NOUL = [
    "Is the writer {x}?",
    "Does the author sound {x}?",
    "Is the person {x}?",
    "Is this message {x} in tone?",
]


def _pick(rng: random.Random, options: Sequence[T]) -> T:
    return options[rng.randrange(len(options))]


def _yes_no(yes: Sequence[str], no: Sequence[str]) -> list[Sequence[str]]:
    return [yes, no]


NOUL_QUESTIONS: dict[str, dict[str, list[Sequence[str]]]] = {
    "tweeteval_offensive": {
        "Is this tweet offensive?": _yes_no(["offensive"], ["not offensive"]),
        "Does this message contain offensive language?": _yes_no(["offensive"], ["not offensive"]),
        "Is this text insulting or abusive?": _yes_no(["offensive"], ["not offensive"]),
        "Is this message polite and inoffensive?": _yes_no(["not offensive"], ["offensive"]),
    },
    "tweeteval_irony": {
        "Is this tweet ironic?": _yes_no(["ironic"], ["not ironic"]),
        "Is the writer being sarcastic?": _yes_no(["ironic"], ["not ironic"]),
        "Is this meant literally, without irony?": _yes_no(["not ironic"], ["ironic"]),
    },
    "subj": {
        "Is this sentence subjective (an opinion)?": _yes_no(["subjective"], ["objective"]),
        "Does this express an opinion?": _yes_no(["subjective"], ["objective"]),
        "Is this an objective statement of fact?": _yes_no(["objective"], ["subjective"]),
        "Is this a factual description rather than an opinion?": _yes_no(
            ["objective"], ["subjective"]
        ),
    },
    "cr": {
        "Is the opinion in this review positive?": _yes_no(["positive"], ["negative"]),
        "Is the customer happy with the product?": _yes_no(["positive"], ["negative"]),
        "Is this a complaint?": _yes_no(["negative"], ["positive"]),
        "Is the customer unhappy?": _yes_no(["negative"], ["positive"]),
        "Does the reviewer recommend it?": _yes_no(["positive"], ["negative"]),
    },
    "hate_offensive": {
        "Is this tweet hateful or offensive?": _yes_no(
            ["hate speech", "offensive language"], ["neither"]
        ),
        "Does this contain hate speech?": _yes_no(["hate speech"], ["neither"]),
        "Is this message clean and respectful?": _yes_no(
            ["neither"], ["hate speech", "offensive language"]
        ),
    },
    "tweet_sentiment": {
        "Is this tweet negative?": _yes_no(["negative"], ["positive", "neutral"]),
        "Is the writer unhappy?": _yes_no(["negative"], ["positive"]),
        "Is this tweet positive?": _yes_no(["positive"], ["negative", "neutral"]),
        "Is the sentiment positive?": _yes_no(["positive"], ["negative"]),
    },
    "prompt_injection": {
        "Is this a prompt injection attempt?": _yes_no(["injection"], ["benign"]),
        "Does this input contain a prompt injection?": _yes_no(["injection"], ["benign"]),
        "Does this text try to override the AI's instructions?": _yes_no(["injection"], ["benign"]),
        "Is this a jailbreak attempt?": _yes_no(["injection"], ["benign"]),
        "Does this text hide instructions for the assistant?": _yes_no(["injection"], ["benign"]),
        "Is this input safe to pass to the assistant?": _yes_no(["benign"], ["injection"]),
    },
}
"""Yes/no questions of each classification set: ``{question: [yes labels, no labels]}``."""

CANONICAL_NOUL = {
    "tweeteval_offensive": "Is this tweet offensive?",
    "tweeteval_irony": "Is this tweet ironic?",
    "subj": "Is this sentence subjective (an opinion)?",
    "cr": "Is the opinion in this review positive?",
    "prompt_injection": "Is this a prompt injection attempt?",
}
"""The CARD's own question of each ``noul`` set (the evaluation question)."""

DESCRIPTIONS = {
    "prompt_injection": {
        "injection": "tries to override, hijack or leak the AI's instructions",
        "benign": "an ordinary request or document",
    },
    "hate_offensive": {
        "hate speech": "attacks people for their race, religion, gender or origin",
        "offensive language": "rude, vulgar or insulting words, but no attack on a group",
        "neither": "a normal message without insults",
    },
    "tweeteval_emotion": {
        "anger": "the writer is angry or annoyed",
        "joy": "the writer is happy or amused",
        "optimism": "the writer is hopeful about the future",
        "sadness": "the writer is sad or disappointed",
    },
    "tweet_sentiment": {
        "negative": "unhappy, critical or angry",
        "neutral": "factual, no feeling either way",
        "positive": "happy, approving or enthusiastic",
    },
}

SCORE_INSTRUCTIONS = {
    "tweet_sentiment": [
        "How positive is this tweet?",
        "Rate the sentiment of the text.",
        "How happy is the writer?",
        "What is the sentiment, from negative to positive?",
    ],
}

PAIR_NOUL_TEMPLATES = [
    "{h}",
    "Is it true that {hl}?",
    "Does the text say that {hl}?",
    "Can we conclude that {hl}?",
    "Is this consistent with: {h}",
]

STS_TEMPLATES = [
    "Does this mean the same as: {p}",
    "Is this a paraphrase of: {p}",
    "Do these say the same thing? {p}",
]

STANCE_TEMPLATES = {
    "favor": ["in favour of {t}", "supports {t}", "for {t}"],
    "against": ["against {t}", "opposes {t}", "criticises {t}"],
    "none": ["neutral or unrelated to {t}", "no opinion on {t}", "not about {t}"],
}


def _lower_first(text: str) -> str:
    """A sentence made a clause: "A man sleeps." -> "a man sleeps" (acronyms kept)."""
    text = text.strip().rstrip(".!?")
    first = text.split(" ", 1)[0]
    return text if len(first) > 1 and first.isupper() else text[:1].lower() + text[1:]


class MixtureSampler:
    """Draws typed questions from the mixture's rows.

    Args:
        sets: From :func:`load_mixture`.
        seed: Seed of every draw.
        weights: Relative draw weight of each set (default: the square root of its size,
            so small sets are seen often enough and large ones do not drown the rest).
        max_choice_options: Most options a drawn ``choice`` question has (its gold label
            always among them).
    """

    def __init__(
        self,
        sets: dict[str, DataSet],
        *,
        seed: int = 0,
        weights: dict[str, float] | None = None,
        max_choice_options: int = 64,
    ) -> None:
        if not sets:
            raise ValueError("the mixture has no data sets")
        self.sets = sets
        self.rng = random.Random(seed)
        self.names = sorted(sets)
        w = weights or {n: len(sets[n].rows) ** 0.5 for n in self.names}
        self.weights = [w.get(n, 0.0) for n in self.names]
        self.max_choice_options = max_choice_options

    # -- public -------------------------------------------------------------------------

    def draw(self, source: str | None = None) -> Item:
        """One random decision (from ``source``, or a set drawn by weight)."""
        name = source or self.rng.choices(self.names, self.weights)[0]
        ds = self.sets[name]
        while True:
            row = ds.rows[self.rng.randrange(len(ds.rows))]
            item = self._make(ds, row)
            if item is not None:
                return item

    def canonical(self, name: str, limit: int | None = None) -> list[Item]:
        """The evaluation questions of set ``name``: one per row (the first ``limit``), the
        set's own question with every option, in a fixed wording."""
        ds = self.sets[name]
        out: list[Item] = []
        for row in ds.rows[:limit] if limit else ds.rows:
            item = self._canonical(ds, row)
            if item is not None:
                out.append(item)
        return out

    # -- makers -------------------------------------------------------------------------

    def _make(self, ds: DataSet, row: Row) -> Item | None:
        rng = self.rng
        if ds.task == "choice":
            if ds.name in NOUL_QUESTIONS and rng.random() < (
                0.5 if ds.name == "hate_offensive" else 0.3
            ):
                return self._noul_fixed(ds, row)
            if ds.name == "hate_offensive":  # its labels are no topics to ask "about"
                return self._choice(ds, row)
            return self._choice(ds, row) if rng.random() < 0.55 else self._noul_label(ds, row)
        if ds.task == "noul":
            if rng.random() < 0.8:
                return self._noul_fixed(ds, row)
            return self._choice(ds, row)  # the two labels as a choice
        if ds.task == "score":
            r = rng.random()
            if r < 0.4:
                return self._score(ds, row)
            if r < 0.7:
                return self._noul_fixed(ds, row)
            return self._choice(ds, row)
        if ds.name == "tweeteval_stance":
            return self._stance(ds, row, rng.random() < 0.5)
        if ds.name == "snli":
            return self._nli(ds, row)
        if ds.name == "stsb":
            return self._sts(ds, row, rng.random() < 0.3)
        return None

    def _canonical(self, ds: DataSet, row: Row) -> Item | None:
        q: _Question
        if ds.task == "choice":
            names = {readable_label(label): label for label in ds.labels}
            q = Choice(instructions="Which label fits the text?", criteria=dict.fromkeys(names))
            return Item(row.text, q, list(names.values()).index(row.label), ds.name, "choice")
        if ds.task == "noul":
            question = CANONICAL_NOUL[ds.name]
            yes, no = NOUL_QUESTIONS[ds.name][question]
            if row.label not in yes and row.label not in no:
                return None
            return Item(row.text, Noul(instructions=question), 0 if row.label in yes else 1,
                        ds.name, "noul")  # fmt: skip
        if ds.task == "score":
            q = Score(instructions="How positive is this tweet?", criteria=list(ds.labels))
            return Item(row.text, q, ds.labels.index(row.label), ds.name, "score")
        if ds.name == "tweeteval_stance":
            t = str(row.pair)
            opts = {lab: f"{STANCE_TEMPLATES[lab][0].format(t=t)}" for lab in ds.labels}
            q = Choice(instructions=f"What is the author's stance on {t}?", criteria=opts)
            return Item(row.text, q, ds.labels.index(row.label), ds.name, "choice")
        if ds.name == "snli":
            if row.label == "neutral":
                return None
            q = Noul(instructions=f"Does the text say that {_lower_first(str(row.pair))}?")
            return Item(row.text, q, 0 if row.label == "entailment" else 1, ds.name, "noul")
        if ds.name == "stsb":
            level = ds.labels.index(row.label)
            if 1 < level < 4:
                return None
            q = Noul(instructions=f"Does this mean the same as: {row.pair}")
            return Item(row.text, q, 0 if level >= 4 else 1, ds.name, "noul")
        return None

    def _instructions(self, ds: DataSet) -> str | None:
        r = self.rng.random()
        if r < 0.3:
            return None
        if ds.name == "tweeteval_emotion" and r < 0.7:
            return _pick(
                self.rng, ["Which emotion does the writer express?", "How does the writer feel?"]
            )
        if ds.name in ("hate_offensive", "tweeteval_offensive") and r < 0.7:
            return _pick(self.rng, ["Is this message acceptable?", "Moderate this message."])
        if ds.name in ("cr", "tweet_sentiment") and r < 0.7:
            return _pick(self.rng, ["What is the sentiment?", "How does the customer feel?"])
        return _pick(self.rng, CHOICE_INSTRUCTIONS)

    def _choice(self, ds: DataSet, row: Row) -> Item:
        rng = self.rng
        labels = ds.labels
        others = [lab for lab in labels if lab != row.label]
        most = min(len(labels), self.max_choice_options)
        n = most if rng.random() < 0.3 else rng.randint(2, most)
        chosen = [row.label, *rng.sample(others, n - 1)]
        rng.shuffle(chosen)
        described = DESCRIPTIONS.get(ds.name) if rng.random() < 0.5 else None
        criteria: dict[str, str | None] = {}
        for lab in chosen:
            key = readable_label(lab) if rng.random() < 0.8 else lab
            criteria[key] = described.get(lab) if described else None
        q = Choice(instructions=self._instructions(ds), criteria=criteria)
        return Item(row.text, q, chosen.index(row.label), ds.name, "choice")

    def _noul_label(self, ds: DataSet, row: Row) -> Item:
        """ "Is this about X?" for X the row's label (yes) or another label (no)."""
        rng = self.rng
        positive = rng.random() < 0.5
        label = row.label if positive else _pick(rng, [x for x in ds.labels if x != row.label])
        if ds.name == "tweeteval_emotion":
            text = _pick(rng, EMOTION_NOUL).format(x=EMOTION_ADJ[label])
        else:
            text = _pick(rng, INTENT_NOUL).format(x=readable_label(label))
        return Item(row.text, Noul(instructions=text), 0 if positive else 1, ds.name, "noul-label")

    def _noul_fixed(self, ds: DataSet, row: Row) -> Item | None:
        questions = NOUL_QUESTIONS[ds.name]
        q = _pick(self.rng, list(questions))
        yes, no = questions[q]
        if row.label not in yes and row.label not in no:
            return None
        answer = row.label in yes
        return Item(row.text, Noul(instructions=q), 0 if answer else 1, ds.name, "noul-fixed")

    def _score(self, ds: DataSet, row: Row) -> Item:
        levels = list(ds.labels)
        described = DESCRIPTIONS.get(ds.name)
        if described and self.rng.random() < 0.5:
            levels = [f"{lab}: {described[lab]}" for lab in ds.labels]
        q = Score(instructions=_pick(self.rng, SCORE_INSTRUCTIONS[ds.name]), criteria=levels)
        return Item(row.text, q, ds.labels.index(row.label), ds.name, "score")

    def _stance(self, ds: DataSet, row: Row, as_choice: bool) -> Item | None:
        rng, t = self.rng, str(row.pair)
        if as_choice:
            opts = {lab: _pick(rng, STANCE_TEMPLATES[lab]).format(t=t) for lab in ds.labels}
            names = list(opts)
            rng.shuffle(names)
            choice = Choice(
                instructions=_pick(rng, [f"What is the author's stance on {t}?", "Stance?", None])
                if rng.random() < 0.8
                else None,
                criteria={n: opts[n] for n in names},
            )
            return Item(row.text, choice, names.index(row.label), ds.name, "choice")
        if row.label == "favor":
            text, yes = (
                _pick(rng, [f"Does the author support {t}?", f"Is this tweet in favour of {t}?"]),
                True,
            )
        elif row.label == "against":
            which = rng.random() < 0.5
            text = f"Is the author against {t}?" if which else f"Does the author support {t}?"
            yes = which
        else:
            return None
        return Item(row.text, Noul(instructions=text), 0 if yes else 1, ds.name, "noul-pair")

    def _nli(self, ds: DataSet, row: Row) -> Item | None:
        rng = self.rng
        h = str(row.pair).strip()
        template = _pick(rng, PAIR_NOUL_TEMPLATES)
        if row.label == "neutral" and "say" not in template and "conclude" not in template:
            return None  # "is it true that ...?" has no answer from a neutral pair
        q = template.format(h=h, hl=_lower_first(h))
        return Item(row.text, Noul(instructions=q), 0 if row.label == "entailment" else 1,
                    ds.name, "noul-pair")  # fmt: skip

    def _sts(self, ds: DataSet, row: Row, as_score: bool) -> Item | None:
        q: _Question
        level = ds.labels.index(row.label)
        if as_score:
            q = Score(
                instructions=f"How similar in meaning is this to: {row.pair}",
                criteria=list(ds.labels),
            )
            return Item(row.text, q, level, ds.name, "score")
        if 1 < level < 4:
            return None
        template = _pick(self.rng, STS_TEMPLATES)
        q = Noul(instructions=template.format(p=row.pair))
        return Item(row.text, q, 0 if level >= 4 else 1, ds.name, "noul-pair")
