"""The python blocks of README.md and docs/*.md run as written.

Each page's ``python`` blocks run in order in one namespace (a page reads as one script), in
a temporary working directory, with the network blocked like every other test. A block that
cannot run here starts with ``# not run: <reason>`` (a GPU, a model directory, a running
server, a long training run); the list of those is pinned below so that it stays short.
Every docs page is linked from the README, so a user can find it.
"""

from __future__ import annotations

import ast
import re
import sys
import types
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
BLOCK = re.compile(r"^```python[ \t]*\n(.*?)^```", flags=re.S | re.M)
OPT_OUT = re.compile(r"\A# not run: (\S.{10,})$", flags=re.M)

# Blocks that do not run in the suite, and why. Keep this list short: a block belongs here
# only when what it needs cannot exist in a test (a GPU, a real model directory, a server).
ALLOWED_OPT_OUTS = {
    "docs/decoder.md": 3,  # a local causal-LM directory (Qwen3-1.7B) and its fine-tuning loop
    "docs/server.md": 1,  # a server listening on 127.0.0.1:8000
    "docs/finetune.md": 1,  # trains on the full BANKING77 files for about ten minutes
}


def _blocks(page: Path) -> list[tuple[int, str]]:
    text = page.read_text()
    return [(text.count("\n", 0, m.start()) + 2, m.group(1)) for m in BLOCK.finditer(text)]


def _name(page: Path) -> str:
    return page.relative_to(ROOT).as_posix()


def test_every_docs_page_is_linked_from_the_readme() -> None:
    readme = (ROOT / "README.md").read_text()
    for page in sorted((ROOT / "docs").glob("*.md")):
        assert f"(docs/{page.name})" in readme, f"README.md does not link docs/{page.name}"
    for link in re.findall(r"\]\((docs/[^)#]+)", readme):
        assert (ROOT / link).is_file(), f"README.md links {link}, which does not exist"


def test_readme_stays_a_short_user_guide() -> None:
    """Results live in docs/results.md; the README keeps what a user needs (issue 35.5)."""
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) < 150, f"README.md has {len(lines)} lines; move detail to docs/"
    assert max(len(line) for line in lines) <= 400, "a README line over 400 characters"


def test_opt_outs_are_few_and_give_a_reason() -> None:
    counts = {}
    for page in PAGES:
        skipped = [code for _, code in _blocks(page) if code.startswith("# not run")]
        for code in skipped:
            assert OPT_OUT.match(code), f"{_name(page)}: '# not run: <reason>' needs a reason"
        if skipped:
            counts[_name(page)] = len(skipped)
    assert counts == ALLOWED_OPT_OUTS


def _runnable(page: Path) -> bool:
    return any(not code.startswith("# not run") for _, code in _blocks(page))


@pytest.mark.parametrize("page", [p for p in PAGES if _runnable(p)], ids=_name)
def test_python_blocks_run(page: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MPLBACKEND", "Agg")
    # The page runs as a module of its own, so annotations it defines (a TypedDict state
    # for LangGraph) resolve as they would in the user's script.
    module = types.ModuleType("docs_page")
    monkeypatch.setitem(sys.modules, module.__name__, module)
    ran = []
    for line, code in _blocks(page):
        if code.startswith("# not run"):
            continue
        where = f"{_name(page)}:{line}"
        try:
            tree = ast.parse(code, filename=where)  # top-level await is a SyntaxError here
            exec(compile(tree, where, "exec"), module.__dict__)
        except Exception as exc:
            pytest.fail(f"the block at {where} failed: {type(exc).__name__}: {exc}")
        ran.append(where)
    runnable = [line for line, code in _blocks(page) if not code.startswith("# not run")]
    assert len(ran) == len(runnable) > 0, f"{_name(page)}: ran {ran} of blocks at {runnable}"
