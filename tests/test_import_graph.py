"""tuner/'s imports run one way (issue 29): the module graph, read with ast from the source, has no loop.

Every import counts, those made inside functions too (a lazy import that closes a loop is still a loop);
those under `if TYPE_CHECKING:` only annotate and are left out. A package and its own submodules are not
a loop (an __init__ may import what it holds; a submodule runs its package's __init__ first)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent / "tuner"


def _modules(root: Path) -> dict[str, Path]:
    def name(p: Path) -> str:
        parts = p.relative_to(root.parent).with_suffix("").parts
        return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
    return {name(p): p for p in sorted(root.rglob("*.py"))}


def _typing_only(tree: ast.AST) -> set[int]:
    """The nodes under an `if TYPE_CHECKING:` (or `if typing.TYPE_CHECKING:`) block, by id."""
    return {id(x) for t in ast.walk(tree) if isinstance(t, ast.If) and "TYPE_CHECKING" in ast.unparse(t.test)
            for b in t.body for x in ast.walk(b)}


def _targets(node: ast.AST, module: str, is_package: bool, pkg: str) -> list[str]:
    """The dotted names `node` (an import) may load from package `pkg`, most specific first."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names if a.name.split(".")[0] == pkg]
    if not isinstance(node, ast.ImportFrom):
        return []
    if node.level:
        base = module.split(".") if is_package else module.split(".")[:-1]
        base = base[: len(base) - (node.level - 1)]
        target = ".".join(base + ([node.module] if node.module else []))
    elif node.module and node.module.split(".")[0] == pkg:
        target = node.module
    else:
        return []
    return [f"{target}.{a.name}" for a in node.names] + [target]


def import_graph(root: Path = ROOT) -> dict[str, set[str]]:
    """module -> the modules of the package it imports (anywhere in its body, TYPE_CHECKING left out)."""
    mods, pkg = _modules(root), root.name

    def resolve(name: str) -> str | None:
        while name and name not in mods:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {}
    for m, path in mods.items():
        tree = ast.parse(path.read_text(), str(path))
        skip, deps = _typing_only(tree), set()
        for node in ast.walk(tree):
            if id(node) in skip:
                continue
            names = _targets(node, m, path.name == "__init__.py", pkg)
            if isinstance(node, ast.ImportFrom):      # `from a import b`: module a.b if there is one, else a
                names = [n if n in mods else names[-1] for n in names[:-1]]
            deps |= {t for t in map(resolve, names) if t}
        graph[m] = {d for d in deps if d != m and not d.startswith(m + ".") and not m.startswith(d + ".")}
    return graph


_TUNER: dict[str, set[str]] = {}


def tuner_graph() -> dict[str, set[str]]:
    """import_graph() of tuner/ itself, parsed once for the three tests that read it (each gets its own copy)."""
    if not _TUNER:
        _TUNER.update(import_graph())
    return {m: set(deps) for m, deps in _TUNER.items()}


def loops(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's, iterative), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on.add(start)
        while work:
            v, children = work[-1]
            w = next(children, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(graph.get(w, ())))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    found.append(sorted(comp))
    return found


def describe(graph: dict[str, set[str]], comp: list[str]) -> str:
    return "; ".join(f"{a} -> {b}" for a in comp for b in sorted(graph[a]) if b in comp)


def test_tuner_has_no_import_loop():
    graph = tuner_graph()
    assert len(graph) > 50 and "tuner.config" in graph
    found = loops(graph)
    assert not found, "import loops in tuner/: " + " | ".join(describe(graph, c) for c in found)


def test_library_imports_nothing_from_the_cli():
    graph = tuner_graph()
    for m in ("tuner.api", "tuner.config", "tuner.study", "tuner.study_options"):
        assert not {d for d in graph[m] if d == "tuner.cli" or d.startswith("tuner.cli.")}, (m, graph[m])


def flat_graph(folder: Path) -> dict[str, set[str]]:
    """Scripts side by side (benchmarks/*.py import each other by file name): script -> the scripts it imports."""
    mods = {p.stem: p for p in sorted(folder.glob("*.py"))}
    graph: dict[str, set[str]] = {}
    for m, path in mods.items():
        deps = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                deps |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
                deps.add(node.module.split(".")[0])
        graph[m] = {d for d in deps if d in mods and d != m}
    return graph


def test_benchmarks_import_one_way():
    """indep_worlds -> indep_modern -> indep_physics; model_accuracy -> llama_accuracy -> accuracy_table."""
    graph = flat_graph(ROOT.parent / "benchmarks")
    assert "indep_modern" in graph["indep_worlds"] and "llama_accuracy" in graph["model_accuracy"]
    found = loops(graph)
    assert not found, "import loops in benchmarks/: " + " | ".join(describe(graph, c) for c in found)


def _package(tmp_path: Path, files: dict[str, str]) -> Path:
    root = tmp_path / "pkg"
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


def test_a_lazy_import_that_closes_a_loop_is_found(tmp_path):
    """The walk sees an import inside a function, relative and absolute spellings, `from pkg import mod`."""
    root = _package(tmp_path, {
        "__init__.py": "from pkg import a\n",
        "a.py": "from pkg.sub import b\n",
        "sub/__init__.py": "",
        "sub/b.py": "def f():\n    from .. import c\n    return c\n",
        "c.py": "import pkg.a\n",
        "d.py": "from pkg import a\n"})
    graph = import_graph(root)
    assert graph["pkg.sub.b"] == {"pkg.c"} and graph["pkg.d"] == {"pkg.a"} and graph["pkg"] == set()
    assert loops(graph) == [["pkg.a", "pkg.c", "pkg.sub.b"]]


def test_type_checking_imports_only_annotate(tmp_path):
    root = _package(tmp_path, {
        "__init__.py": "",
        "a.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.b import B\nx = 1\n",
        "b.py": "from pkg.a import x\n"})
    graph = import_graph(root)
    assert graph["pkg.a"] == set() and loops(graph) == []
    (root / "a.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    pass\nelse:\n"
                               "    from pkg.b import B\n")
    assert loops(import_graph(root)) == [["pkg.a", "pkg.b"]]   # an else branch runs


def architecture_layers() -> dict[str, int]:
    """docs/architecture.md's layer table: module (tuner.NAME, or tuner for `__init__`) -> layer number."""
    import re
    text = (ROOT.parent / "docs/architecture.md").read_text()
    layers: dict[str, int] = {}
    for number, modules in re.findall(r"^\| (\d+) [^|]*\| ([^|]*) \|", text, re.M):
        for name in re.findall(r"`([\w.]+)`", modules):
            layers["tuner" if name == "__init__" else f"tuner.{name}"] = int(number)
    return layers


def test_every_module_sits_in_a_layer_of_the_architecture_page_and_imports_only_downwards():
    layers = architecture_layers()
    assert len(set(layers.values())) >= 5, layers

    def layer(m: str) -> int | None:
        owner = max((k for k in layers if m == k or (k != "tuner" and m.startswith(k + "."))), key=len, default=None)
        return layers.get(owner)

    graph = tuner_graph()
    assert [m for m in graph if layer(m) is None] == [], "modules the architecture page places in no layer"
    upward = [f"{m} ({layer(m)}) -> {d} ({layer(d)})" for m in sorted(graph) for d in sorted(graph[m])
              if layer(d) > layer(m)]
    assert upward == [], "imports from a higher layer (docs/architecture.md): " + "; ".join(upward)
