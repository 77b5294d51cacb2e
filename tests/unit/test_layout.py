"""The package layout's rules, read from the source with `ast` (imports, not text):

- no import cycle inside `middleware/` or `sidecar/`, imports under TYPE_CHECKING included;
- `middleware` never imports `sidecar` (the sidecar is built on the middleware, not the reverse);
- the guard core never imports telemetry: telemetry attaches through the cycle class it supplies.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CORE = (
    "middleware.cycle",
    "middleware.relay",
    "middleware.receiver",
    "middleware.deadlines",
    "middleware.phases",
    "middleware.stream_response",
    "middleware.sse",
    "middleware.errors",
    "middleware.registry",
    "middleware.guard",
    "middleware.types",
    "middleware.dialects",
)


def modules(package: str) -> dict[str, Path]:
    found = {}
    for path in sorted((ROOT / package).rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


def imports(name: str, path: Path, known: set[str]) -> set[str]:
    """The project modules `name` imports, anywhere in its file (functions and TYPE_CHECKING
    blocks too). `from pkg import x` counts as `pkg.x` when that is a module, else `pkg`."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            for alias in node.names:
                full = f"{base}.{alias.name}"
                found.add(full if full in known else base)
    return {m for m in found if m in known}


def graph() -> dict[str, set[str]]:
    mods = {**modules("middleware"), **modules("sidecar")}
    known = set(mods)
    return {name: imports(name, path, known) - {name} for name, path in mods.items()}


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected set of more than one module (Tarjan), as sorted lists."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def test_the_cycle_finder_finds_a_cycle() -> None:
    """The checker itself: a two-module and a three-module circle are found, a chain is not."""
    assert cycles({"a": {"b"}, "b": {"a"}, "c": {"a"}}) == [["a", "b"]]
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": {"c"}, "c": set()}) == []


def test_relative_and_submodule_imports_are_resolved(tmp_path: Path) -> None:
    """`from pkg import mod` and `from . import mod` name the module, so a cycle through them
    is seen, and a TYPE_CHECKING import counts like any other."""
    path = tmp_path / "m.py"
    path.write_text(
        "from typing import TYPE_CHECKING\nfrom . import b\n"
        "if TYPE_CHECKING:\n    from p.c import X\n"
    )
    assert imports("p.a", path, {"p", "p.a", "p.b", "p.c"}) == {"p.b", "p.c"}


def test_no_import_cycles_in_middleware_or_sidecar() -> None:
    """No module reaches itself through imports, type-only ones included."""
    assert cycles(graph()) == []


def test_middleware_never_imports_sidecar() -> None:
    """The dependency points one way: sidecar imports middleware, never the reverse."""
    offending = {
        name: sorted(m for m in deps if m.startswith("sidecar"))
        for name, deps in graph().items()
        if name.startswith("middleware")
    }
    assert {k: v for k, v in offending.items() if v} == {}


@pytest.mark.parametrize("module", CORE)
def test_the_guard_core_never_imports_telemetry(module: str) -> None:
    """Telemetry attaches through the cycle class it supplies; the core knows nothing of it
    (directly or through another core module)."""
    edges = graph()
    assert module in edges, f"{module} is not a module any more: update CORE"
    seen, todo = set(), [module]
    while todo:
        for dep in edges[todo.pop()]:
            if dep not in seen:
                seen.add(dep)
                todo.append(dep)
    assert sorted(m for m in seen if m.startswith("middleware.telemetry")) == []


LONGEST = 250  # lines: a class or function a reader can take in one sitting


def test_no_class_or_function_is_too_long_to_read_in_one_sitting() -> None:
    """No class or function in `middleware/` or `sidecar/` runs over LONGEST lines: one
    concern each, split when it grows (docstrings and comments count: they are read too)."""
    long = []
    for package in ("middleware", "sidecar"):
        for name, path in modules(package).items():
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
                    size = (node.end_lineno or node.lineno) - node.lineno + 1
                    if size > LONGEST:
                        long.append(f"{name}.{node.name}: {size} lines")
    assert long == []
