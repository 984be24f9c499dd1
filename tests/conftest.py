"""Shared fixtures. Tests never download: the network is blocked by pytest-socket
(loopback stays open for server tests) and every model is either the packaged
all-MiniLM-L6-v2 (loaded once per session) or a tiny random one built in code."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="session")
def engine():
    """The real engine on the packaged model, shared by the whole session."""
    from clef_engine import DecisionEngine

    return DecisionEngine()


@pytest.fixture(scope="session")
def tiny_engine():
    """An engine on a tiny random encoder (fast; behaviour, not accuracy)."""
    from clef_engine import DecisionEngine
    from clef_engine.testing import tiny_encoder

    return DecisionEngine(tiny_encoder(max_length=32))


@pytest.fixture(scope="session")
def banking77_dir() -> Path:
    """The BANKING77 slice shipped in tests/data (770 train and 308 test rows, CC BY 4.0).

    Always the slice, never ``../shared/data/banking77``: a plain clone runs these tests,
    and their outcome cannot differ between CI and a clone. The benchmarks read the full set.
    """
    return ROOT / "tests" / "data" / "banking77"
