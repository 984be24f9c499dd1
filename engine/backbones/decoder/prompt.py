"""Prompts for the decoder backbone: the chat frame, question blocks and option answers.

A decision prompt has three parts, chosen so that what is shared is a token prefix:

1. the **state prefix**: the chat template's opening, ``State:`` and the rendered state;
   it is the same for every question about that state, so it is prefilled once;
2. one **question block** per question (and per listing rotation): the instructions, the
   option list and the template's turn change up to where the assistant's answer starts;
3. one **answer** per option: the option's name followed by the end-of-turn token.

The end-of-turn token makes an option's score include "and then the answer stops", so the
name ``card`` does not win on the first tokens of ``card_arrival``.

Option order: ``choice`` options are listed in a canonical order (sorted by name), so the
prompt, and therefore the answer, does not depend on the order the caller gave them in.
Position bias inside that canonical list is reduced by averaging scores over cyclic
rotations of the list (``rotations``); ``score`` levels keep their given order (it is their
meaning) and ``noul`` has no list.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from clef_engine.schema.questions import Choice, Noul, Score, _Question
from clef_engine.schema.render import question_cache_key

STATE_LABEL = "State:\n"
BETWEEN = "\n\n"
CONTENT_FREE_STATE = "N/A"
"""The state used to measure each question's content-free label prior."""

AUTO_ROTATE_MAX = 4
"""``rotations="auto"``: every cyclic rotation for choices with at most this many options."""

_STATE_MARK = "\x00CLEF_STATE\x00"
_QUESTION_MARK = "\x00CLEF_QUESTION\x00"


@dataclass(frozen=True)
class Frame:
    """How a state and a question sit inside the model's prompt format."""

    head: str
    """Text before the state (template opening + ``State:``)."""
    tail: str
    """Text after the question block, up to where the answer begins."""
    answer_prefix: str
    """Prepended to each answer (a space after ``Answer:`` for models without a template)."""
    end: str
    """Appended to each answer: the end-of-turn (eos) token's text, or ``""``."""
    bos: int | None = None
    """A BOS id to put before ``head`` (models without a chat template that use one)."""


def build_frame(tokenizer: Any, *, use_chat_template: bool = True) -> Frame:
    """The prompt frame for ``tokenizer``: its chat template when it has one."""
    end = getattr(tokenizer, "eos_token", None) or ""
    template = getattr(tokenizer, "chat_template", None)
    if use_chat_template and template:
        content = f"{STATE_LABEL}{_STATE_MARK}{BETWEEN}{_QUESTION_MARK}"
        text = tokenizer.apply_chat_template(
            [{"role": "user", "content": content}],
            tokenize=False,
            add_generation_prompt=True,
            # Qwen3: answer directly, no thinking block; Llama 3: a fixed date, so the
            # prompt (and the answer) does not change from one day to the next.
            enable_thinking=False,
            date_string="01 Jan 2025",
        )
        if not isinstance(text, str) or _STATE_MARK not in text or _QUESTION_MARK not in text:
            raise ValueError("the chat template did not keep the user message verbatim")
        before, rest = text.split(_STATE_MARK, 1)
        _, after = rest.split(_QUESTION_MARK, 1)
        return Frame(head=before, tail=after, answer_prefix="", end=end)
    bos = getattr(tokenizer, "bos_token_id", None)
    return Frame(head=STATE_LABEL, tail="\nAnswer:", answer_prefix=" ", end=end, bos=bos)


@dataclass
class QuestionPlan:
    """What the backbone scores for one question.

    Attributes:
        type: ``choice``, ``noul`` or ``score``.
        names: Option names in answer order (``noul``: ``true``, ``false``).
        answers: The text scored for each option, in answer order.
        blocks: The question block text for each listing rotation.
        key: Content key (question + rotations), for the prior cache.
    """

    type: str
    names: list[str]
    answers: list[str]
    blocks: list[str]
    key: str


_NO_INSTRUCTIONS = {
    "choice": "Which option fits best?",
    "score": "Which level fits best?",
}
"""The question asked when ``instructions`` are left out (optional on the wire): the
options or levels alone then say what is decided. A ``noul`` has its own default below."""


def _instructions(question: _Question) -> str:
    text = question.instructions_text().strip()
    return text or _NO_INSTRUCTIONS.get(str(getattr(question, "type", "")), "")


def _choice_line(name: str, description: str | None, examples: tuple[str, ...]) -> str:
    line = f"- {name}"
    if description:
        line += f": {description}"
    if examples:
        shown = "; ".join(f'"{e}"' for e in examples[:3])
        line += f" (for example {shown})"
    return line


def n_rotations(question: _Question, rotations: int | str) -> int:
    """How many listing rotations ``question`` is scored under."""
    if not isinstance(question, Choice):
        return 1
    n = len(question.criteria)
    if rotations == "auto":
        return n if n <= AUTO_ROTATE_MAX else 1
    if isinstance(rotations, str):
        raise ValueError(f"rotations: use an int or 'auto'; got {rotations!r}")
    return max(1, min(int(rotations), n))


def plan(question: _Question, rotations: int | str = "auto") -> QuestionPlan:
    """Turn ``question`` into question blocks and option answers."""
    specs = question.option_specs()
    names = [s.name for s in specs]
    instructions = _instructions(question)
    k = n_rotations(question, rotations)
    key = question_cache_key(question, rotations=k)
    if isinstance(question, Choice):
        order = sorted(range(len(specs)), key=lambda i: names[i])
        blocks = []
        for r in range(k):
            shift = (r * len(order)) // k
            listed = order[shift:] + order[:shift]
            lines = [
                _choice_line(names[i], specs[i].description, specs[i].examples) for i in listed
            ]
            blocks.append(
                f"Question: {instructions}\nOptions:\n"
                + "\n".join(lines)
                + "\nAnswer with the name of exactly one option."
            )
        return QuestionPlan("choice", names, list(names), blocks, key)
    if isinstance(question, Score):
        lines = [f"- {s.name}: {s.description or s.name}" for s in specs]
        block = (
            f"Question: {instructions}\nRate on this scale:\n"
            + "\n".join(lines)
            + "\nAnswer with the number of exactly one level."
        )
        return QuestionPlan("score", names, list(names), [block], key)
    if isinstance(question, Noul):
        true_desc, false_desc = specs[0].description, specs[1].description
        lines = [f"Question: {instructions or 'Is the following true?'}"]
        if true_desc:
            lines.append(f'"yes" means: {true_desc}')
        if false_desc:
            lines.append(f'"no" means: {false_desc}')
        lines.append("Answer yes or no.")
        return QuestionPlan("noul", names, ["yes", "no"], ["\n".join(lines)], key)
    raise TypeError(f"the decoder backbone cannot score {type(question).__name__} questions")
