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


def _shared_data() -> Path:
    """``../shared/data`` beside the checkout (searched upwards, for git worktrees)."""
    for parent in ROOT.parents:
        if (parent / "shared" / "data").is_dir():
            return parent / "shared" / "data"
    return ROOT.parent / "shared" / "data"


SHARED_DATA = _shared_data()


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
    path = SHARED_DATA / "banking77"
    if not (path / "test.csv").is_file():
        pytest.skip("../shared/data/banking77 is not present beside the checkout")
    return path
