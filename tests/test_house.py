"""The shape of the package, read from its source with `ast`: layers that import only downward, no cycles
(imports inside functions count), and no source file over 450 lines.

    1 core        minimega/*.py, comm/, parallel/, zero/, pipeline/, checkpoint/, train/, run/   the training stack
    2 analysis    minimega/analysis/                              estimators, time model, planner, calibration
    3 figures     minimega/figures/                               plots, palette, recordings
    4 classroom   minimega/classroom/                             quizzes, exam, credentials, the service
    5 tools       minimega/tools/, __main__                       the command line, export-config, peers

The package's front door (`minimega/__init__.py`) is core: it names the public API and imports each name on
first use; `minimega/estimate.py` (the estimators under the course's name) is analysis.
"""
import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"
LIMIT = 450
LAYERS = {"analysis": 2, "figures": 3, "classroom": 4, "tools": 5}
NAMES = {1: "core", 2: "analysis", 3: "figures", 4: "classroom", 5: "tools"}


def modules(src: Path = SRC) -> dict[str, Path]:
    out = {}
    for p in (src / "minimega").rglob("*.py"):
        parts = list(p.relative_to(src).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = p
    return out


def imports(name: str, path: Path, known) -> set[str]:
    """Every minimega module `name` imports, at any depth of the file (functions and branches included)."""
    pkg = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = pkg.split(".")[: len(pkg.split(".")) - node.level + 1] if node.level else []
            mod = ".".join(base + ([node.module] if node.module else []))
            for a in node.names:                    # `from . import comm` imports minimega.comm, not the package
                found.add(f"{mod}.{a.name}" if f"{mod}.{a.name}" in known else mod)
    out = set()
    for f in found:
        while f and f not in known:
            f = f.rpartition(".")[0]
        if f and f != name and not f.startswith(name + "."):       # a package naming its own children
            out.add(f)
    return out


def layer(name: str) -> int:
    parts = name.split(".")
    if name == "minimega.estimate":           # the estimators under their course name: analysis itself
        return 2
    if len(parts) == 1:                       # the front door: public names, each imported on first use
        return 1
    if parts[1] == "__main__":
        return 5
    return LAYERS.get(parts[1], 1)


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on, found, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
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

    for v in graph:
        if v not in index:
            visit(v)
    return found


@pytest.fixture(scope="module")
def graph():
    known = modules()
    return {name: imports(name, path, known) for name, path in known.items()}


def test_no_import_cycles_even_through_imports_inside_functions(graph):
    assert cycles(graph) == []


def test_every_import_runs_down_the_layers(graph):
    upward = sorted(f"{a} ({NAMES[layer(a)]}) imports {b} ({NAMES[layer(b)]})"
                    for a, deps in graph.items() for b in deps if layer(b) > layer(a))
    assert upward == []


def test_the_core_imports_nothing_outside_itself(graph):
    core = {name for name in graph if layer(name) == 1}
    assert len(core) > 30
    assert {(a, b) for a in core for b in graph[a] if b not in core} == set()


def test_the_core_shows_its_architecture_in_folders():
    """At most 12 modules loose in minimega/; the rest of the core lives in packages named for what they do."""
    loose = sorted(p.name for p in (SRC / "minimega").glob("*.py"))
    assert len(loose) <= 12, loose
    for package in ("comm", "parallel", "parallel/moe", "train", "run", "zero", "pipeline", "checkpoint"):
        assert (SRC / "minimega" / package / "__init__.py").is_file(), package


def test_no_source_file_over_450_lines():
    long = {str(p.relative_to(SRC)): n for p in (SRC / "minimega").rglob("*.py")
            if (n := len(p.read_text().splitlines())) > LIMIT}
    assert long == {}


def test_the_checks_see_what_they_look_for(tmp_path):
    """A cycle through a function-level import, and a core module reaching up, are both found."""
    pkg = tmp_path / "minimega"
    (pkg / "analysis").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "analysis" / "__init__.py").write_text("")
    (pkg / "comm.py").write_text("def f():\n    from .engine import x\n")
    (pkg / "engine.py").write_text("from . import comm\nfrom .analysis import memory\n")
    (pkg / "analysis" / "memory.py").write_text("")
    known = modules(tmp_path)
    g = {name: imports(name, path, known) for name, path in known.items()}
    assert cycles(g) == [["minimega.comm", "minimega.engine"]]
    assert "minimega.analysis.memory" in g["minimega.engine"] and layer("minimega.analysis.memory") > layer("minimega.engine")
