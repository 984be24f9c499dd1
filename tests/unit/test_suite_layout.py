"""The library's suite tests the library: no test module imports benchmarks/ (lab code)."""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]


def test_no_test_imports_benchmarks() -> None:
    offenders = []
    for path in sorted(TESTS.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            if any(n == "benchmarks" or n.startswith("benchmarks.") for n in names):
                offenders.append(f"{path.relative_to(TESTS)}:{node.lineno}")
    assert offenders == []
