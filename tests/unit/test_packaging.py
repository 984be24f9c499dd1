"""The installed import names are the project's own (issue 35): the engine lives in the
repository's ``engine/`` folder but installs as ``clef_engine``, so a user's own top-level
``engine`` package cannot shadow it."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parents[2]
FOLDERS = {"clef_engine": "engine", "clef_agents": "clef_agents"}


def _declared() -> tuple[dict[str, str], list[str]]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    return config["package-dir"], config["packages"]


def test_pyproject_lists_every_package_folder_under_its_installed_name():
    package_dir, packages = _declared()
    assert package_dir == FOLDERS
    on_disk = set()
    for name, folder in FOLDERS.items():
        for init in (ROOT / folder).rglob("__init__.py"):
            rel = init.parent.relative_to(ROOT / folder).parts
            on_disk.add(".".join((name, *rel)))
    assert set(packages) == on_disk, "a new subpackage must be added to [tool.setuptools].packages"


def test_no_source_file_imports_the_bare_engine_name():
    offenders = []
    for folder in ("engine", "clef_agents", "benchmarks", "examples", "tests"):
        for path in (ROOT / folder).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
                names = []
                if isinstance(node, ast.Import):
                    names = [alias.name for alias in node.names]
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    names = [node.module]
                if any(n == "engine" or n.startswith("engine.") for n in names):
                    offenders.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert offenders == []


def test_a_users_own_engine_package_does_not_shadow_clef_agents(tmp_path):
    user_engine = tmp_path / "engine"
    user_engine.mkdir()
    (user_engine / "__init__.py").write_text("raise ImportError('the user project engine')\n")
    code = "import engine\nassert False, 'unreachable'\n"
    shadowed = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True
    )
    assert "the user project engine" in shadowed.stderr  # the user's package is found first
    code = (
        "from clef_agents import DecisionEngine, __version__\n"
        "import clef_engine\n"
        "print(DecisionEngine.__module__, clef_engine.__file__)\n"
    )
    ours = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert ours.returncode == 0, ours.stderr
    module, path = ours.stdout.split()
    assert module == "clef_engine.runtime.engine"
    assert Path(path).resolve().parent != user_engine.resolve()
