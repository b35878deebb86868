"""The layers, read from the source: the core and the charge service never import the lab, the bench or
the CLI; the bench takes from the lab only its harness, invariants, ledger, process and wait helpers
and the kill -9 and failover stories; and no module imports itself back through others. Imports are
parsed with `ast` (function-level ones included, the usual way to hide a cycle), never executed."""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("reliableq", "stages")  # folders at the repository's top
# A folder installed under another name (pyproject.toml): its modules are named as they are imported.
IMPORTED_AS = {"stages": "reliableq_stages"}

# Which layers each layer may import (its own included). The core knows no job kind: whoever builds the
# API gives it the kinds (`charge.handler.STANDARD_KINDS` for the stock one), and a job's key is its row's.
MAY_IMPORT = {
    "core": {"core"},
    "charge": {"core", "charge"},
    "lab": {"core", "charge", "lab"},
    "stages": {"core", "charge", "lab", "stages"},
    # The exercises grade a learner's code with the stages' own scenarios, so they sit above the stages.
    "exercises": {"core", "charge", "lab", "stages", "exercises"},
    "bench": {"core", "charge", "bench"},
    "cli": {"core", "charge", "lab", "stages", "exercises", "bench", "cli"},
}
# Single modules a layer may import beyond its layers: the bench runs on the lab's one harness (its
# servers and workers as real processes), gates with the lab's invariants, counts A/H/C/F with its
# ledger, and times the kill -9 story the demo tells and the failover chaos runs (one telling of each).
ALSO_MAY_IMPORT = {"bench": {"reliableq.lab.harness", "reliableq.lab.invariants", "reliableq.lab.ledger",
                             "reliableq.lab.processes", "reliableq.lab.waiting", "reliableq.lab.demo",
                             "reliableq.lab.failover_chaos"}}


@dataclass(frozen=True)
class Import:
    importer: str  # module name
    imported: str  # module name
    where: str  # path:line


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    parts[0] = IMPORTED_AS.get(parts[0], parts[0])
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(root: Path, packages: tuple[str, ...] = PACKAGES) -> list[Import]:
    """Every import between modules of `packages` under `root`, wherever in a module it sits."""
    paths = sorted(p for package in packages for p in (root / package).rglob("*.py"))
    modules = {module_name(p, root): p for p in paths}
    found = []
    for name, path in modules.items():
        is_package = path.name == "__init__.py"
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:  # relative: from the importer's package
                    package = name.split(".") if is_package else name.split(".")[:-1]
                    base = ".".join(package[:len(package) - node.level + 1] + ([base] if base else []))
                # `from package import module` imports the module; `from module import name`, the module.
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
            for target in targets:
                # `import reliableq.lab.faults` names a module; an attribute path resolves to its module.
                while target and target not in modules and "." in target:
                    target = target.rsplit(".", 1)[0]
                edge = Import(name, target, f"{path.relative_to(root)}:{node.lineno}")
                if target in modules and target != name and edge not in found:
                    found.append(edge)
    return found


def layer_of(module: str) -> str:
    parts = module.split(".")
    if parts[0] == IMPORTED_AS["stages"]:
        return "stages"
    if parts[:3] == ["reliableq", "lab", "exercises"]:
        return "exercises"
    if len(parts) > 1 and parts[1] in ("charge", "lab", "bench", "cli"):
        return parts[1]
    return "cli" if module == "reliableq.__main__" else "core"


def violations(found: list[Import]) -> list[str]:
    """One line per import that crosses the layers the wrong way."""
    wrong = []
    for i in found:
        layer, target = layer_of(i.importer), layer_of(i.imported)
        if target not in MAY_IMPORT[layer] and i.imported not in ALSO_MAY_IMPORT.get(layer, set()):
            wrong.append(f"{i.where}: {i.importer} ({layer}) imports {i.imported} ({target}); "
                         f"{layer} may import {', '.join(sorted(MAY_IMPORT[layer]))}")
    return wrong


def cycles(found: list[Import]) -> list[str]:
    """One line per cycle of imports between modules, naming each import on it."""
    graph: dict[str, dict[str, Import]] = {}
    for i in found:
        graph.setdefault(i.importer, {}).setdefault(i.imported, i)
    reported, lines = set(), []

    def visit(module: str, path: list[Import], on_path: list[str]) -> None:
        for target, edge in sorted(graph.get(module, {}).items()):
            if target in on_path:
                loop = path[on_path.index(target):] + [edge]
                key = frozenset((e.importer, e.imported) for e in loop)
                if key not in reported:
                    reported.add(key)
                    lines.append(" -> ".join(f"{e.importer} ({e.where})" for e in loop) + f" -> {target}")
            elif target not in done:
                visit(target, [*path, edge], [*on_path, target])
        done.add(module)

    done: set[str] = set()
    for module in sorted(graph):
        if module not in done:
            visit(module, [], [module])
    return lines


def test_no_layer_imports_a_layer_above_it():
    """The core and charge never import the lab, the bench or the CLI; the lab never the bench or the CLI."""
    assert violations(imports_of(ROOT)) == []


def test_no_module_imports_itself_back_through_others():
    assert cycles(imports_of(ROOT)) == []


def test_the_walk_sees_every_layer():
    """The checks above pass for a reason: the walk found imports from modules of every layer."""
    found = imports_of(ROOT)
    assert {layer_of(i.importer) for i in found} == set(MAY_IMPORT)


def _package(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def test_the_checker_names_a_core_module_that_imports_the_lab(tmp_path):
    """The checker failing: a core module importing the lab (inside a function) is named, with its line."""
    root = _package(tmp_path, {"reliableq/__init__.py": "", "reliableq/lab/__init__.py": "",
                               "reliableq/lab/faults.py": "",
                               "reliableq/queue.py": "def f():\n    from reliableq.lab import faults\n"})
    (line,) = violations(imports_of(root, ("reliableq",)))
    assert line.startswith("reliableq/queue.py:2: reliableq.queue (core) imports reliableq.lab.faults (lab)")


def test_the_checker_names_each_import_of_a_cycle(tmp_path):
    """The checker failing: two modules importing each other (one of them lazily) make one cycle."""
    root = _package(tmp_path, {"reliableq/__init__.py": "", "reliableq/bench/__init__.py": "",
                               "reliableq/bench/report.py": "from reliableq.bench.run import SCENARIOS\n",
                               "reliableq/bench/run.py": "def run():\n    from reliableq.bench import report\n"})
    assert cycles(imports_of(root, ("reliableq",))) == [
        "reliableq.bench.report (reliableq/bench/report.py:1) -> reliableq.bench.run (reliableq/bench/run.py:2)"
        " -> reliableq.bench.report"]
