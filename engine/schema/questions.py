"""Question types of the ``/v1/systemone`` question model: choice, noul, score, box.

Each question renders itself into :class:`OptionSpec` entries, the unit the engine scores:
an option name, the text that describes it, and optional example utterances that act as
prototypes (our extension of the wire format: ``{"description": ..., "examples": [...]}``).

Example:
    >>> q = Choice(instructions="Route the ticket", criteria={"billing": "money", "bug": None})
    >>> [o.name for o in q.option_specs()]
    ['billing', 'bug']
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from clef_engine.schema.limits import (
    MAX_CHOICE_OPTIONS,
    MAX_EXAMPLES_PER_OPTION,
    MAX_OPTION_NAME_CHARS,
    MAX_SCORE_LEVELS,
    MAX_TEXT_CHARS,
    MIN_CHOICE_OPTIONS,
    MIN_SCORE_LEVELS,
)
from clef_engine.schema.render import render_value, surrogate_message

JSONText = str | dict[str, Any] | list[Any]
"""Instructions and descriptions: a string or structured JSON."""


def readable(name: str) -> str:
    """Turn an option name such as ``card_arrival`` into ``card arrival``."""
    return " ".join(name.replace("_", " ").replace("-", " ").split())


def _check_unicode(text: str, what: str) -> None:
    message = surrogate_message(text, what)
    if message is not None:
        raise ValueError(message)


def _check_text(value: Any, field_name: str) -> str:
    text = render_value(value, field_name)
    # The rendered text holds every string and key of structured JSON too.
    _check_unicode(text, field_name)
    if len(text) > MAX_TEXT_CHARS:
        raise ValueError(
            f"{field_name} renders to {len(text)} characters; the limit is {MAX_TEXT_CHARS}"
        )
    return text


@dataclass(frozen=True)
class OptionSpec:
    """One scorable option, as the engine sees it."""

    name: str
    """The option's key in the answer (``probabilities`` keys)."""
    description: str | None = None
    """Rendered description, or ``None`` when the criteria gave none."""
    examples: tuple[str, ...] = field(default_factory=tuple)
    """Example states for this option; used as prototypes."""

    def text(self) -> str:
        """The text the backbone encodes for this option."""
        base = readable(self.name) or self.name
        return f"{base}: {self.description}" if self.description else base


def _parse_criterion(name: str, value: Any, where: str) -> OptionSpec:
    _check_unicode(name, f"{where}: an option name")
    if not name.strip():
        raise ValueError(f"{where}: option names must be non-empty")
    if len(name) > MAX_OPTION_NAME_CHARS:
        raise ValueError(
            f"{where}: option name has {len(name)} characters; the limit is {MAX_OPTION_NAME_CHARS}"
        )
    if value is None:
        return OptionSpec(name)
    if isinstance(value, Mapping) and set(value) <= {"description", "examples"} and value:
        examples = value.get("examples") or []
        if not isinstance(examples, list) or not all(isinstance(e, str) for e in examples):
            raise ValueError(f"{where}.{name}.examples must be a list of strings")
        if len(examples) > MAX_EXAMPLES_PER_OPTION:
            raise ValueError(
                f"{where}.{name}.examples has {len(examples)} items; "
                f"the limit is {MAX_EXAMPLES_PER_OPTION}"
            )
        for i, example in enumerate(examples):
            _check_unicode(example, f"{where}.{name}.examples[{i}]")
        desc = value.get("description")
        text = None if desc is None else _check_text(desc, f"{where}.{name}.description")
        return OptionSpec(name, text, tuple(examples))
    return OptionSpec(name, _check_text(value, f"{where}.{name}"))


class _Question(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)

    def option_specs(self) -> list[OptionSpec]:  # pragma: no cover - overridden
        raise NotImplementedError

    def instructions_text(self) -> str:
        value = getattr(self, "instructions", None)
        return "" if value is None else render_value(value, "instructions")


NONE_OF_THESE = "none_of_these"
"""The option :attr:`Choice.none_of_these` adds: the input fits none of the others."""

NONE_OF_THESE_DESCRIPTION = "none of the other options fits; the input is about something else"
"""How ``none_of_these=True`` describes the option (weak on its own: teach it with examples
or give it a margin, see docs/abstention.md)."""


class Choice(_Question):
    """Pick one of 2..255 options; the answer has ``probabilities`` summing to 1.

    ``criteria`` maps option name to a description (string or JSON), ``None``, or
    ``{"description": ..., "examples": [...]}``. A list of names is accepted as shorthand.

    Out of scope: ``none_of_these`` adds the option ``"none_of_these"``, taught by
    examples of inputs that fit no option (the strong way) and/or chosen by a margin rule
    (``none_below``: exactly when the best other option's probability is below it).

    Example:
        >>> q = Choice(criteria=["card_arrival", "exchange_rate"],
        ...            none_of_these=["what is the weather like?", "book me a flight"],
        ...            none_below=0.3)
        >>> [o.name for o in q.option_specs()]
        ['card_arrival', 'exchange_rate', 'none_of_these']
    """

    type: Literal["choice"] = "choice"
    instructions: JSONText | None = None
    """Optional: without it the question is the choice between the options alone."""
    criteria: dict[str, Any]
    none_of_these: bool | list[str] | dict[str, Any] = False
    """Add an out-of-scope option named ``none_of_these``: ``True`` (described only), a
    list of example inputs that fit none of the options (prototypes, as for any option), or
    ``{"description": ..., "examples": [...]}``."""
    none_below: float | None = None
    """Margin rule of ``none_of_these``: the answer is ``none_of_these`` exactly when the
    best other option's probability is below this (fit it on labelled data with
    :func:`clef_engine.runtime.none_of_these.fit_none_below`)."""
    temperature: float | None = None
    """This question's own calibration, applied to the engine's answer: probabilities
    ``∝ p^(1/temperature)`` (below 1 sharpens, above 1 flattens; ``None``: as the engine
    answers). For a question whose states differ from what calibrated the engine (page
    types taught by hand-written examples, asked about OCR'd screenshots); fit it on
    labelled states with :func:`clef_engine.calibration.fit.fit_choice_temperature`."""

    @field_validator("temperature")
    @classmethod
    def _check_temperature(cls, value: float | None) -> float | None:
        if value is not None and not (math.isfinite(value) and 0.01 <= value <= 100.0):
            raise ValueError(f"temperature must be between 0.01 and 100; got {value!r}")
        return value

    @model_validator(mode="after")
    def _check_none_of_these(self) -> Choice:
        if self.none_of_these is False or self.none_of_these is None:
            if self.none_below is not None:
                raise ValueError("none_below needs none_of_these (the option it chooses)")
            return self
        if NONE_OF_THESE in self.criteria:
            raise ValueError(
                f"none_of_these adds the option {NONE_OF_THESE!r}; criteria already has one"
            )
        if len(self.criteria) + 1 > MAX_CHOICE_OPTIONS:
            raise ValueError(
                f"none_of_these adds an option to {len(self.criteria)}; a choice takes at "
                f"most {MAX_CHOICE_OPTIONS}"
            )
        self._none_spec()  # checks the examples and description
        if self.none_below is not None and not 0.0 < self.none_below < 1.0:
            raise ValueError(f"none_below must be in (0, 1); got {self.none_below!r}")
        return self

    def _none_spec(self) -> OptionSpec:
        value = self.none_of_these
        if value is True:
            return OptionSpec(NONE_OF_THESE, NONE_OF_THESE_DESCRIPTION)
        if isinstance(value, list):
            value = {"description": NONE_OF_THESE_DESCRIPTION, "examples": value}
        if isinstance(value, dict) and not value.get("description"):
            value = {**value, "description": NONE_OF_THESE_DESCRIPTION}
        return _parse_criterion(NONE_OF_THESE, value, "none_of_these")

    @field_validator("criteria", mode="before")
    @classmethod
    def _names_as_mapping(cls, value: Any) -> Any:
        if isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):
            if len(set(value)) != len(value):
                raise ValueError("option names must be unique")
            return dict.fromkeys(value)
        return value

    @field_validator("criteria")
    @classmethod
    def _check_criteria(cls, value: dict[str, Any]) -> dict[str, Any]:
        n = len(value)
        if n < MIN_CHOICE_OPTIONS or n > MAX_CHOICE_OPTIONS:
            raise ValueError(
                f"a choice needs {MIN_CHOICE_OPTIONS}..{MAX_CHOICE_OPTIONS} options; got {n}"
            )
        for name, desc in value.items():
            _parse_criterion(name, desc, "criteria")
        return value

    @field_validator("instructions")
    @classmethod
    def _check_instructions(cls, value: Any) -> Any:
        if value is not None:
            _check_text(value, "instructions")
        return value

    def option_specs(self) -> list[OptionSpec]:
        specs = [_parse_criterion(k, v, "criteria") for k, v in self.criteria.items()]
        if self.none_of_these is not False and self.none_of_these is not None:
            specs.append(self._none_spec())
        return specs


class Noul(_Question):
    """A yes/no question; the answer ``noul`` is P(yes) in [0, 1].

    ``criteria`` may describe the ``true`` side, the ``false`` side, or both. Examples
    (``{"true": {"examples": [...]}, "false": {"examples": [...]}}``) teach prototypes when
    both sides have them; on one side only they are read as its description.
    """

    type: Literal["noul"] = "noul"
    instructions: JSONText | None = None
    criteria: dict[str, Any] | None = None

    @model_validator(mode="after")
    def _check(self) -> Noul:
        crit = self.criteria or {}
        unknown = set(crit) - {"true", "false"}
        if unknown:
            raise ValueError(f"noul criteria take only 'true' and 'false'; got {sorted(unknown)}")
        if self.instructions is None and not any(crit.get(k) is not None for k in crit):
            raise ValueError("a noul question needs instructions or a 'true'/'false' criterion")
        if self.instructions is not None:
            _check_text(self.instructions, "instructions")
        for k, v in crit.items():
            if v is not None:
                _parse_criterion(k, v, "criteria")
        return self

    def option_specs(self) -> list[OptionSpec]:
        """The yes side first, then the no side; a missing side has no description.

        Examples on one side only are read as that side's description (the structured text
        a Jev server reads there), not as prototypes: fitted against the other side's option
        text alone they answered 48.4 % of held-out cases right (benchmarks/noul_examples.py
        at 5193eb3), below the 65.2 % of asking with no examples."""
        crit = self.criteria or {}
        out = []
        for key in ("true", "false"):
            value = crit.get(key)
            out.append(
                _parse_criterion(key, value, "criteria") if value is not None else OptionSpec(key)
            )
        if sum(bool(spec.examples) for spec in out) == 1:
            out = [
                OptionSpec(s.name, _check_text(crit[s.name], f"criteria.{s.name}"))
                if s.examples
                else s
                for s in out
            ]
        return out

    def sides(self) -> tuple[bool, bool]:
        """Which sides the criteria describe: ``(has_true, has_false)``."""
        crit = self.criteria or {}
        return crit.get("true") is not None, crit.get("false") is not None


class Score(_Question):
    """Rate on 2..10 ordered levels; ``score`` is the expected level index."""

    type: Literal["score"] = "score"
    instructions: JSONText | None = None
    """Optional: without it the question is which level fits, from the levels alone."""
    criteria: list[Any]

    @field_validator("criteria")
    @classmethod
    def _check_levels(cls, value: list[Any]) -> list[Any]:
        n = len(value)
        if n < MIN_SCORE_LEVELS or n > MAX_SCORE_LEVELS:
            raise ValueError(
                f"a score needs {MIN_SCORE_LEVELS}..{MAX_SCORE_LEVELS} levels; got {n}"
            )
        for i, level in enumerate(value):
            _parse_criterion(str(i), level, "criteria")
        return value

    @field_validator("instructions")
    @classmethod
    def _check_instructions(cls, value: Any) -> Any:
        if value is not None:
            _check_text(value, "instructions")
        return value

    def option_specs(self) -> list[OptionSpec]:
        return [_parse_criterion(str(i), v, "criteria") for i, v in enumerate(self.criteria)]

    def legend(self) -> dict[str, str]:
        return {str(i): render_value(v, f"criteria[{i}]") for i, v in enumerate(self.criteria)}


class Box(_Question):
    """Locate the element that ``instructions`` describe in an image of the state.

    The answer's box is in fractions (0-1) of the image's height and width. Without
    ``instructions``, the text of the state beside its images says what to locate; a state
    that is only an image gives the whole image with ``confidence`` null.
    """

    type: Literal["box"] = "box"
    instructions: JSONText | None = None

    @field_validator("instructions")
    @classmethod
    def _check_instructions(cls, value: Any) -> Any:
        if value is not None:
            _check_text(value, "instructions")
        return value

    def option_specs(self) -> list[OptionSpec]:
        return []


Question = Annotated[Choice | Noul | Score | Box, Field(discriminator="type")]
"""Any question; discriminated by ``type``."""

QUESTION_TYPES: dict[str, type[_Question]] = {
    "choice": Choice,
    "noul": Noul,
    "score": Score,
    "box": Box,
}
