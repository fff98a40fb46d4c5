"""The import order of specpair's layers, from every import statement of every package module (module level and
inside functions alike): bytes and layouts (formats/) -> metadata (checkpoint/) -> sources/ -> {compat/, the
converter (convert/), runtime/} -> the application layer (app/) -> cli/. A module imports its own layer and the
layers below it, never one above and never a sibling, so no cycle can form between layers. Within the package: no
import cycle between modules (a package's __init__ counts as a module), no private name (`_x`) imported from
another module, and no function in cli/ over CLI_FUNCTION_LINES lines (commands parse, call app/ and print).
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# package -> its layer; modules at the top (errors, __init__) sit below everything
LAYERS = {
    "errors": 0,
    "__init__": 0,
    "catalog": 0,
    "formats": 1,
    "checkpoint": 2,
    "sources": 3,
    "compat": 4,
    "convert": 4,
    "runtime": 4,
    "app": 5,
    "cli": 6,
    "__main__": 7,
}
CLI_FUNCTION_LINES = 80
# Imports across siblings allowed: none (what the runtime runs is in the family and drafter-kind tables, which
# compat and runtime/__init__.py both read).
ALLOWED: set[tuple[str, str]] = set()


def package_modules() -> list[Path]:
    return sorted(p for p in ROOT.rglob("*.py") if p.relative_to(ROOT).parts[0] in LAYERS or p.parent == ROOT)


def imported(path: Path, source: str | None = None) -> list[tuple[int, str]]:
    """(line, module) of every specpair import in `path` (or in `source`, placed at `path`), relative imports
    resolved."""
    tree = ast.parse(path.read_text() if source is None else source, str(path))
    package = ["specpair", *path.relative_to(ROOT).parent.parts]
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package[: len(package) - node.level + 1] + ([base] if base else []))
            found += [(node.lineno, f"{base}.{a.name}" if base == "specpair" else base) for a in node.names]
    return [(line, name) for line, name in found if name == "specpair" or name.startswith("specpair.")]


def layer_of(module: str) -> str:
    parts = module.split(".")
    if len(parts) == 1 or len(parts) == 2 and parts[1] not in LAYERS:  # specpair, or a name of its __init__
        return "__init__"
    return parts[1]


def test_every_package_module_is_scanned() -> None:
    names = {p.relative_to(ROOT).as_posix() for p in package_modules()}
    assert {
        "formats/codecs.py",
        "checkpoint/gguf_arch.py",
        "sources/model.py",
        "convert/converter.py",
        "runtime/loading.py",
        "cli/convert.py",
        "app/gate.py",
        "errors.py",
    } <= names
    assert not any(n.startswith(("tests/", "benchmarks/", "tools/")) for n in names)


@pytest.mark.parametrize("path", package_modules(), ids=lambda p: p.relative_to(ROOT).as_posix())
def test_imports_go_down_the_layers(path: Path) -> None:
    own = path.relative_to(ROOT).parts[0] if path.parent != ROOT else path.stem
    wrong = []
    for line, module in imported(path):
        other = layer_of(module)
        if other not in LAYERS:
            wrong.append(f"line {line}: {module} is in no layer")
        elif other != own and LAYERS[other] >= LAYERS[own] and (own, f"specpair.{other}") not in ALLOWED:
            wrong.append(f"line {line}: {own} (layer {LAYERS[own]}) imports {module} (layer {LAYERS[other]})")
    assert not wrong, "\n".join(wrong)


def test_the_scanner_sees_imports_in_functions_and_relative_ones() -> None:
    source = "def f():\n    from ..checkpoint import config\n    import specpair.cli\n"
    assert [m for _, m in imported(ROOT / "formats" / "codecs.py", source)] == ["specpair.checkpoint", "specpair.cli"]


def module_name(path: Path) -> str:
    parts = ["specpair", *path.relative_to(ROOT).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in package_modules()}


def import_edges(path: Path, source: str | None = None) -> list[tuple[int, str, str | None]]:
    """(line, module, name) for every specpair import of `path`: `from a.b import c` is an import of the module
    a.b.c when there is one (name None), else of a.b's name c; `import a.b` of a.b; names resolved to the module
    that defines them (the nearest existing module up the dotted path)."""
    tree = ast.parse(path.read_text() if source is None else source, str(path))
    package = module_name(path).split(".") if path.name == "__init__.py" else module_name(path).split(".")[:-1]
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name, None) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package[: len(package) - node.level + 1] + ([base] if base else []))
            found += [(node.lineno, base, a.name) for a in node.names]
    edges = []
    for line, base, name in found:
        if base != "specpair" and not base.startswith("specpair."):
            continue
        if name is not None and f"{base}.{name}" in MODULES:
            edges.append((line, f"{base}.{name}", None))
            continue
        while base not in MODULES:
            base = base.rsplit(".", 1)[0]
        edges.append((line, base, name))
    return edges


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan): each holds an import cycle."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        for other in sorted(graph[module]):
            if other not in index:
                visit(other)
                low[module] = min(low[module], low[other])
            elif other in stack:
                low[module] = min(low[module], index[other])
        if low[module] == index[module]:
            component = []
            while True:
                component.append(stack.pop())
                if component[-1] == module:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 10 * len(graph)))
    try:
        for module in sorted(graph):
            if module not in index:
                visit(module)
    finally:
        sys.setrecursionlimit(limit)
    return cycles


def test_no_import_cycle_between_modules() -> None:
    graph = {name: {m for _, m, _ in import_edges(path)} - {name} for name, path in MODULES.items()}
    assert import_cycles(graph) == []


def test_the_cycle_finder_finds_cycles_through_function_level_imports_and_package_inits() -> None:
    assert import_cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert import_cycles({"a": {"b"}, "b": set()}) == []
    source = "def f():\n    from specpair.cli import app\n    from specpair.cli._output import Output\n"
    edges = import_edges(ROOT / "cli" / "run.py", source)
    assert [(m, n) for _, m, n in edges] == [("specpair.cli", "app"), ("specpair.cli._output", "Output")]
    edges = import_edges(ROOT / "cli" / "__init__.py", "from specpair.cli import run\nfrom . import _output\n")
    assert [(m, n) for _, m, n in edges] == [("specpair.cli.run", None), ("specpair.cli._output", None)]


def test_no_private_name_is_imported_from_another_module() -> None:
    found = [
        f"{path.relative_to(ROOT)}:{line}: {module}.{name}"
        for own, path in MODULES.items()
        for line, module, name in import_edges(path)
        if name and name.startswith("_") and not name.startswith("__") and module != own
    ]
    assert found == []


def test_commands_are_registered_in_one_module_that_no_command_imports() -> None:
    back = [
        f"{path.relative_to(ROOT)}:{line}"
        for name, path in MODULES.items()
        if name.startswith("specpair.cli.")
        for line, module, _ in import_edges(path)
        if module == "specpair.cli"
    ]
    assert back == []


def long_functions(path: Path, limit: int) -> list[str]:
    tree = ast.parse(path.read_text(), str(path))
    return [
        f"{path.relative_to(ROOT)}:{node.lineno} {node.name}: {node.end_lineno - node.lineno + 1} lines"
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.end_lineno - node.lineno + 1 > limit
    ]


def test_no_cli_function_is_longer_than_the_limit() -> None:
    found = [line for path in sorted((ROOT / "cli").glob("*.py")) for line in long_functions(path, CLI_FUNCTION_LINES)]
    assert found == []
    assert long_functions(ROOT / "app" / "gate.py", 20)  # the measure sees long functions


def test_every_option_is_declared_once() -> None:
    """An option two commands take is one Annotated alias in cli/_options.py, so it reads the same everywhere."""
    declared: dict[str, list[str]] = {}
    for path in sorted((ROOT / "cli").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "Option":
                names = [a.value for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
                for name in (n for spelling in names for n in spelling.split("/") if n.startswith("--")):
                    declared.setdefault(name, []).append(f"{path.name}:{node.lineno}")
    assert {name: where for name, where in declared.items() if len(where) > 1} == {}
    assert {"--json", "--quiet", "--device", "--draft-gguf-file", "--mtp", "--graphs"} <= declared.keys()
