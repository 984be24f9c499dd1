"""Every docstring example in clef_engine and clef_agents runs (``python -m pytest`` runs them).

The modules are imported by their installed names (``clef_engine.x``, not the ``engine/``
folder's), so each example runs against the package a user imports. An example that
cannot run in a test (a model directory, a browser page, a server) is marked
``# doctest: +SKIP``; their number is pinned below so that it only goes down.
"""

from __future__ import annotations

import doctest
import importlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = {"engine": "clef_engine", "clef_agents": "clef_agents"}
MAX_SKIPPED = 48  # examples marked +SKIP today; lower it when you make one run


def _modules() -> list[str]:
    names = []
    for folder, package in PACKAGES.items():
        for path in sorted((ROOT / folder).rglob("*.py")):
            if ">>>" not in path.read_text():
                continue
            parts = list(path.relative_to(ROOT / folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            names.append(".".join([package, *parts]))
    return names


MODULES = _modules()


def _tests(name: str) -> list[doctest.DocTest]:
    module = importlib.import_module(name)
    return doctest.DocTestFinder(exclude_empty=True).find(module, name)


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples_run(name: str, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    flags = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE
    runner = doctest.DocTestRunner(optionflags=flags)
    report: list[str] = []
    for test in _tests(name):
        runner.run(test, out=report.append)
    assert runner.failures == 0, "".join(report)


def test_skipped_examples_do_not_grow() -> None:
    total = attempted = 0
    for name in MODULES:
        for test in _tests(name):
            total += len(test.examples)
            attempted += sum(
                1 for ex in test.examples if not ex.options.get(doctest.OPTIONFLAGS_BY_NAME["SKIP"])
            )
    skipped = total - attempted
    assert attempted > 0
    assert skipped <= MAX_SKIPPED, f"{skipped} docstring examples skipped (at most {MAX_SKIPPED})"
