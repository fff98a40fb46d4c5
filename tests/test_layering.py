"""The import order of specpair's layers, from every import statement of every package module (module level and
inside functions alike): bytes and layouts (formats/) -> metadata (checkpoint/) -> sources/ -> {compat/, the
converter (convert/), runtime/} -> cli/. A module imports its own layer and the layers below it, never one above
and never a sibling, so no cycle can form between layers.
"""

from __future__ import annotations

import ast
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
    "cli": 5,
    "__main__": 6,
}
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
