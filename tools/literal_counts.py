"""How many package files hold each table name as a string literal: a measure of knowledge restated outside its row.

    python tools/literal_counts.py [ROOT] [--json] [--files | --lines]

A name counts in a file when some string constant of the file's syntax tree equals it exactly (docstrings and
f-string fragments are string constants too; a name inside a longer string does not count). Package code is
every module of specpair's layers (tests/, benchmarks/, docs/, tools/, scripts/ and catalog data left out).
The names: every drafter kind, every family, and the layout names a user or a rule writes (layout kinds, labels
and `convert --to` names, ggml types).
"""

from __future__ import annotations

import argparse
import ast
import json
import sys
from collections.abc import Iterable
from pathlib import Path

PACKAGES = ("formats", "checkpoint", "sources", "compat", "convert", "runtime", "cli", "catalog")

DRAFTER_KINDS = ("dflash", "dflash2", "eagle3", "mtp", "draft_model")
FAMILIES = ("llama", "qwen3", "qwen3_moe", "qwen3_next", "qwen3_5", "qwen3_5_moe")
# Layout kinds and labels (formats/layouts.py), `convert --to` names, and ggml types specpair writes or reads by
# name; float dtype names (bf16, f16, f32) are left out: they name torch and numpy dtypes as much as layouts.
LAYOUTS = (
    "fp8",
    "fp8-tensor",
    "fp8-block",
    "nvfp4",
    "nvfp4-modelopt",
    "nvfp4-ct",
    "nvfp4-mlx",
    "nvfp4-gguf",
    "mxfp4",
    "mxfp4-mlx",
    "int4",
    "int4-ct",
    "int8",
    "affine",
    "affine4",
    "exl3",
    "gguf",
    "Q4_0",
    "Q8_0",
    "Q4_K",
    "Q5_K",
    "Q6_K",
    "NVFP4",
)
GROUPS = {"drafter kind": DRAFTER_KINDS, "family": FAMILIES, "layout": LAYOUTS}


def package_files(root: Path) -> list[Path]:
    """Every module of the package: its top-level .py files and those of its layer packages."""
    top = [p for p in root.glob("*.py")]
    nested = [p for package in PACKAGES for p in (root / package).rglob("*.py")]
    return sorted(top + nested)


def string_constants(path: Path) -> dict[str, list[int]]:
    """Each string constant of the module -> the lines it is written on."""
    lines: dict[str, list[int]] = {}
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            lines.setdefault(node.value, []).append(node.lineno)
    return lines


def occurrences(root: Path, names: Iterable[str]) -> dict[str, dict[str, list[int]]]:
    """name -> {package file (relative to `root`) -> the sorted lines where it is a string literal}."""
    constants = {p.relative_to(root).as_posix(): string_constants(p) for p in package_files(root)}
    return {name: {f: sorted(found[name]) for f, found in sorted(constants.items()) if name in found} for name in names}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("root", nargs="?", type=Path, default=Path(__file__).resolve().parent.parent)
    parser.add_argument("--json", action="store_true", help="name -> files, as JSON")
    parser.add_argument("--files", action="store_true", help="list the files beside each count")
    parser.add_argument("--lines", action="store_true", help="list the files and lines beside each count")
    args = parser.parse_args(argv)
    if not (args.root / "checkpoint" / "families.py").is_file():
        parser.error(f"{args.root} is not a specpair tree (no checkpoint/families.py)")
    found = {group: occurrences(args.root, names) for group, names in GROUPS.items()}
    if args.json:
        print(json.dumps(found, indent=1))
        return 0
    for group, by_name in found.items():
        print(f"{group}:")
        for name, files in by_name.items():
            listed = ""
            if args.lines:
                listed = "  " + " ".join(f"{f}:{','.join(map(str, lines))}" for f, lines in files.items())
            elif args.files:
                listed = "  " + " ".join(files)
            print(f"  {name:16} {len(files):3}{listed}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
