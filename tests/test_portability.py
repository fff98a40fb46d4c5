"""A fresh clone passes its tests on any x86-64 machine: a portable llama.cpp build, no data read from outside the
repository, help that promises only what exists."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# Instruction sets a build for the native CPU enables on a recent Xeon and a CPU without them dies on
# (ggml_backend_amx_mul_mat: "Illegal instruction").
NATIVE_ONLY = ("AMX", "AVX512", "AVX_VNNI", "AVX512_BF16")


def test_scripts_test_builds_llama_cpp_for_any_cpu() -> None:
    script = (ROOT / "scripts" / "test").read_text()
    (build,) = re.findall(r'CMAKE_ARGS="([^"]*)"', script)
    assert "-DGGML_NATIVE=OFF" in build.split() and "-DLLAVA_BUILD=OFF" in build.split()


def test_installed_llama_cpp_uses_no_instruction_set_of_the_build_machine_only() -> None:
    """The library the tests load reports what it was compiled with: nothing beyond what every x86-64 CPU that
    CI or a user may have runs (a native build on an AMX Xeon reports AMX_INT8 and AVX512 here)."""
    code = "import llama_cpp; print(llama_cpp.llama_print_system_info().decode())"
    info = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    enabled = {name for name, on in re.findall(r"(\w+) = (\d)", info) if on == "1"}
    assert not {name for name in enabled if name.startswith(NATIVE_ONLY)}, info


def test_no_test_tool_or_benchmark_reads_outside_the_repository() -> None:
    outside = re.compile(
        r"""\.\./shared|parents?\[?\d*\]?\s*/\s*["']shared["']|/work/shared|\.parent\s*/\s*["']shared"""
    )
    readers = [
        p
        for folder in ("tests", "tools", "benchmarks", "scripts")
        for p in (ROOT / folder).rglob("*")
        if p.is_file() and p.suffix in (".py", ".sh", "") and p != Path(__file__)
    ]
    found = [
        f"{p.relative_to(ROOT)}:{n}"
        for p in readers
        for n, line in enumerate(p.read_text(errors="replace").splitlines(), 1)
        if outside.search(line)
    ]
    assert found == []
    assert (
        ROOT / "catalog" / "sources" / "real-configs" / "nvidia__Qwen3.6-35B-A3B-NVFP4.hf_quant_config.json"
    ).is_file()


def test_help_names_only_commands_that_exist() -> None:
    from specpair.cli import app

    registered = {c.name or c.callback.__name__ for c in app.registered_commands}
    helptext = subprocess.run([sys.executable, "-m", "specpair", "--help"], capture_output=True, text=True).stdout
    description = helptext.split("Options:")[0]
    named = set(re.findall(r"\b(check|download|convert|verify|inspect|catalog|run|serve|bench)\b", description))
    assert named <= registered, named - registered
    listed = set(re.findall(r"^  (\w+)  ", helptext.split("Commands:")[1], re.M))
    assert listed == registered
