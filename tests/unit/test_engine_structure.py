"""The engine's structure: layers, import cycles and the declared seams (issue 35.2).

Backbones and heads import nothing from ``clef_engine.runtime``; no two clef_engine modules
import each other (directly or around a loop); heads get what they use of the engine
through :class:`~clef_engine.heads.base.ScoringContext`; every engine the framework layers
accept satisfies :class:`clef_engine.Engine`; no function in ``engine/`` or ``clef_agents/``
passes 80 lines.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
import torch

import clef_agents
import clef_engine
from clef_engine import Box, Choice, DecisionRequest, Engine, Noul
from clef_engine.backbones.vision.images import ImageRef
from clef_engine.backbones.vision.layout import Element, ImageEvidence
from clef_engine.backbones.vision.pipeline import VisionPipeline
from clef_engine.heads.base import Head, Scorer, ScoringContext
from clef_engine.heads.box import locate
from clef_engine.heads.zero_shot import ZeroShotHead

ROOT = Path(clef_engine.__file__).parent


def _module(path: Path) -> str:
    parts = ["clef_engine", *path.relative_to(ROOT).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module(p): p for p in sorted(ROOT.rglob("*.py"))}


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(module: str, *, type_checking: bool) -> Iterator[tuple[str, int]]:
    """``(imported clef_engine module, line)`` for every import in ``module``, at any depth
    (functions included); ``type_checking``: also those under ``if TYPE_CHECKING:``."""
    path = MODULES[module]
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]

    def walk(node: ast.AST) -> Iterator[tuple[str, int]]:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _is_type_checking(child) and not type_checking:
                yield from (x for c in child.orelse for x in walk(c))
                continue
            if isinstance(child, ast.Import):
                for alias in child.names:
                    yield alias.name, child.lineno
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:
                    up = package.split(".")[: len(package.split(".")) - child.level + 1]
                    base = ".".join([*up, base] if base else up)
                for alias in child.names:
                    name = f"{base}.{alias.name}"
                    yield (name if name in MODULES else base), child.lineno
            yield from walk(child)

    for name, line in walk(ast.parse(path.read_text(encoding="utf-8"))):
        if name == "clef_engine" or name.startswith("clef_engine."):
            yield name, line


def test_the_walk_finds_imports_at_every_depth() -> None:
    """The checks below are only as good as the walk: it sees module-level, deferred
    (inside functions) and TYPE_CHECKING imports."""
    engine = dict(_imports("clef_engine.runtime.engine", type_checking=True))
    assert "clef_engine.heads.base" in engine  # module level
    model_dir = {name for name, _ in _imports("clef_engine.runtime.model_dir", type_checking=False)}
    assert "clef_engine.heads.trained" in model_dir  # inside _load_trained
    typed = {name for name, _ in _imports("clef_engine.runtime.model_dir", type_checking=True)}
    assert "clef_engine.runtime.engine" in typed - model_dir  # only under TYPE_CHECKING


def test_backbones_and_heads_import_nothing_from_runtime() -> None:
    found = [
        f"{MODULES[module].relative_to(ROOT.parent)}:{line} imports {name}"
        for module in MODULES
        if module.startswith(("clef_engine.backbones", "clef_engine.heads"))
        for name, line in _imports(module, type_checking=True)
        if name == "clef_engine.runtime" or name.startswith("clef_engine.runtime.")
    ]
    assert not found, "\n".join(found)


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in graph[node]:
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_cycle_finder_finds_a_loop() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycles_among_clef_engine_modules() -> None:
    """At module level and in deferred (function-level) imports alike: a deferred import
    that closes a loop is the same tangle, only hidden until run time. TYPE_CHECKING
    imports are types only and not counted; nor is a package's ``__init__`` importing
    its own submodules (Python runs a package before its submodules, by design)."""
    graph = {
        module: {
            name
            for name, _ in _imports(module, type_checking=False)
            if name in MODULES and name != module
        }
        for module in MODULES
    }
    assert _cycles(graph) == []


# -- function length --------------------------------------------------------------------

MAX_FUNCTION_LINES = 80
LIBRARY = (ROOT, Path(clef_agents.__file__).parent)
"""The folders of the installed packages: ``engine/`` (as clef_engine) and ``clef_agents/``."""


def _long_functions(source: str, limit: int) -> list[tuple[str, int, int]]:
    """``(qualified name, line, length)`` of each function in ``source`` longer than
    ``limit`` lines, from its ``def`` line to its last line (docstring included). A nested
    function's lines count in its parent too, and it is checked on its own as well."""
    found: list[tuple[str, int, int]] = []

    def walk(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            name = prefix
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                name = f"{prefix}{child.name}."
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = (child.end_lineno or child.lineno) - child.lineno + 1
                if length > limit:
                    found.append((name[:-1], child.lineno, length))
            walk(child, name)

    walk(ast.parse(source), "")
    return found


def _function(name: str, lines: int, indent: str = "", keyword: str = "def") -> str:
    """Source of a function ``lines`` lines long, its ``def`` line included."""
    body = "".join(f"{indent}    x{i} = {i}\n" for i in range(lines - 1))
    return f"{indent}{keyword} {name}():\n{body}"


def test_the_length_check_finds_long_functions() -> None:
    source = (
        _function("over", 81)
        + _function("fits", 80)
        + "class Box:\n"
        + _function("method", 1, indent="    ", keyword="async def")  # its def line alone
        + _function("inner", 81, indent="        ")
        + "def parent():\n"  # 91 lines, though neither of its functions is long
        + _function("first", 45, indent="    ")
        + _function("second", 45, indent="    ")
    )
    found = _long_functions(source, MAX_FUNCTION_LINES)
    assert [(name, length) for name, _, length in found] == [
        ("over", 81),
        ("Box.method", 82),
        ("Box.method.inner", 81),
        ("parent", 91),
    ]
    lines = source.splitlines()
    assert all(f" {name.rpartition('.')[2]}(" in lines[line - 1] for name, line, _ in found)


def test_no_library_function_passes_80_lines() -> None:
    """Every function in ``engine/`` and ``clef_agents/`` fits in 80 lines; a longer one
    reads better as named stages (issue 35)."""
    found = [
        f"{path.relative_to(folder.parent)}:{line} {name}: {length} lines"
        for folder in LIBRARY
        for path in sorted(folder.rglob("*.py"))
        for name, line, length in _long_functions(
            path.read_text(encoding="utf-8"), MAX_FUNCTION_LINES
        )
    ]
    assert not found, f"over {MAX_FUNCTION_LINES} lines:\n" + "\n".join(found)


# -- declared seams ---------------------------------------------------------------------


class _Lookalike:
    """An engine that is not one: no async forms."""

    model_name = "x"
    model_version = "x@1"

    def decide(self, state: Any, questions: Any = None, **kwargs: Any) -> Any: ...

    def decide_batch(self, states: Sequence[Any], questions: Any = None, **kw: Any) -> Any: ...


def test_every_engine_satisfies_the_engine_protocol(tiny_engine: Any, tmp_path: Path) -> None:
    from clef_agents.decision_log import DecisionLog
    from clef_agents.fake import FakeEngine
    from clef_agents.resilience import ResilientEngine

    fake = FakeEngine()
    log = DecisionLog(tmp_path / "log.sqlite")
    try:
        engines = [tiny_engine, fake, ResilientEngine(fake), log.wrap(fake)]
        assert all(isinstance(e, Engine) for e in engines)
    finally:
        log.close()
    assert not isinstance(_Lookalike(), Engine)


def test_heads_and_scoring_backbones_are_declared_scorers(tiny_engine: Any) -> None:
    from clef_engine.backbones.decoder import DecoderBackbone
    from clef_engine.heads.ensemble import EnsembleHead
    from clef_engine.heads.trained import TrainedHead

    assert isinstance(tiny_engine.head, Head)
    for cls in (ZeroShotHead, TrainedHead, EnsembleHead, DecoderBackbone):
        assert issubclass(cls, Scorer)
    assert not isinstance(tiny_engine.backbone, Scorer)  # the encoder leaves it to the head


def test_a_head_scores_through_its_context_alone(tiny_engine: Any) -> None:
    """The zero-shot head needs no engine: a context with the backbone, an embed and a
    prepare function is enough, and gives the engine's own probabilities."""
    question = Choice(criteria=["billing question", "login problem"])
    request = DecisionRequest(state="I cannot sign in", questions={"q": question})
    embedded: list[str] = []

    def embed(texts: Sequence[str]) -> torch.Tensor:
        embedded.extend(texts)
        return tiny_engine.backbone.encode(list(texts)).pooled

    def prepare(q: Any) -> Any:
        from clef_engine.heads.zero_shot import prepare as bare

        prepared = bare(q)
        prepared.vectors = embed(prepared.texts)
        return prepared

    context = ScoringContext(tiny_engine.backbone, embed, prepare, tiny_engine.calibrator)
    [scored] = ZeroShotHead(tiny_engine.calibrator).score_requests(
        context, ["I cannot sign in"], [request]
    )
    assert embedded == ["billing question", "login problem"]
    expected = tiny_engine.decide(request).answers["q"].probabilities
    got = dict(zip(["billing question", "login problem"], scored.probabilities["q"].tolist()))
    assert got == pytest.approx(expected, abs=1e-6)


def test_the_box_head_ranks_candidates_with_the_embed_it_is_given() -> None:
    """``locate`` takes an embed function, not the engine: here one that puts the words
    "cart" and the instructions on the same axis, so the cart button wins."""
    elements = [
        Element("Sign in", (10.0, 10.0, 60.0, 30.0), (5.0, 5.0, 65.0, 35.0), "button"),
        Element("Basket", (100.0, 10.0, 160.0, 30.0), (95.0, 5.0, 165.0, 35.0), "button"),
    ]
    evidence = [ImageEvidence("d", 200, 100, elements)]

    asked: list[str] = []

    def embed(texts: Sequence[str]) -> torch.Tensor:
        asked.extend(texts)
        return torch.tensor(
            [[1.0, 0.0] if "asket" in t or "cart" in t else [0.0, 1.0] for t in texts]
        )

    answer = locate(embed, "the cart button", evidence)
    assert asked[0] == "the cart button" and any("Basket" in t for t in asked)
    assert answer.box is not None and answer.box.left == pytest.approx(95.0 / 200)


class _CountingPipeline(VisionPipeline):
    """Reads every image as one "Sign in" button and counts the reads."""

    def __init__(self) -> None:
        super().__init__()
        self.reads = 0

    def evidence(self, refs: Sequence[ImageRef]) -> list[ImageEvidence]:
        self.reads += len(refs)
        button = Element(
            "Sign in", (150.0, 60.0, 250.0, 80.0), (100.0, 50.0, 300.0, 90.0), "button"
        )
        return [ImageEvidence(r.digest, r.width, r.height, [button]) for r in refs]


@pytest.fixture()
def counting(tiny_engine: Any) -> Iterator[_CountingPipeline]:
    pipeline = _CountingPipeline()
    tiny_engine.vision = pipeline
    yield pipeline
    tiny_engine.vision = None


def _png() -> bytes:
    import io

    from PIL import Image

    out = io.BytesIO()
    Image.new("RGB", (400, 200), "white").save(out, format="PNG")
    return out.getvalue()


def test_each_image_is_read_once_per_request(tiny_engine: Any, counting: Any) -> None:
    """The rendered state carries its read images to the box head and the scorer (no
    per-request memo): one read per image for decide and for each batch item."""
    questions = {
        "where": Box(instructions="the sign-in button"),
        "login": Noul(instructions="Is this a login page?"),
    }
    answer = tiny_engine.decide(_png(), questions).answers["where"]
    assert answer.box is not None
    assert counting.reads == 1
    results = tiny_engine.decide_batch(
        [_png(), _png(), "no image"], questions, return_exceptions=True
    )
    assert counting.reads == 3
    assert [type(r).__name__ for r in results] == [
        "DecisionResult",
        "DecisionResult",
        "UnsupportedQuestionError",
    ]


def test_the_engine_vision_pipeline_is_an_attribute(tiny_engine: Any) -> None:
    assert "_vision_pipeline" not in vars(tiny_engine)
    default = tiny_engine.vision
    assert isinstance(default, VisionPipeline) and tiny_engine.vision is default
    replacement = VisionPipeline()
    tiny_engine.vision = replacement
    try:
        assert tiny_engine.vision is replacement
    finally:
        tiny_engine.vision = None
    assert tiny_engine.vision is not replacement
