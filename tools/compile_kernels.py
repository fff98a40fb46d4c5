"""Compile every Triton kernel launch the kernel checks make for a GPU this machine need not have (sm_90 by default),
in every PDL mode (runtime/kernels/triton_common.py), with the Triton installed here: what a GPU machine would
compile first, checked on a CPU.

    python3 tools/compile_kernels.py [--arch 90] [--modes 0,1,2] [--checks tests/kernel_checks] [-k EXPR] [--sample]
        [--sass DIR]

Two processes. The first runs the kernel checks (tests/kernel_checks/check_*.py, pytest, `-k`) under Triton's
interpreter, recording each distinct launch: the kernel, its arguments' types, its constexprs, num_warps and
num_stages. Without --sample it runs the kernels too, so every launch of every check is reached (the checks' own
time); with it, launches are recorded and not run (a check stops at its first kernel's missing result) and only the
first of each kernel and layout is compiled (CI's test: tests/test_kernels.py). The second process, without the
interpreter, compiles each launch for the target in each mode (triton.compile with ptxas from Triton's wheel: PTX,
then SASS), and prints one line per kernel: launches compiled, failures with their first error line; exit status 1
on any failure. A launch compiles as Triton's JIT would compile it: an integer argument equal to 1 as the constant
1, and a divisibility hint on a 16-byte-aligned pointer and an integer that is a multiple of 16, as the JIT
specialises them; once more with the GPU's values of the constexprs the interpreter is given stand-ins for
(triton_common.GPU_CONSTEXPRS: bf16 dots, which the interpreter never runs); and once with every integer argument
the constant 1, since any of them may be 1 at run time. `--sass DIR` writes the SASS of each launch's first mode
(and of its GPU variant) to DIR.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DTYPES = {  # torch dtype name -> Triton pointer element type
    "bfloat16": "bf16",
    "float16": "fp16",
    "float32": "fp32",
    "float64": "fp64",
    "int8": "i8",
    "int16": "i16",
    "int32": "i32",
    "int64": "i64",
    "uint8": "u8",
    "bool": "i1",
    "float8_e4m3fn": "fp8e4nv",
    "float8_e5m2": "fp8e5",
}
TL_DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}  # a recorded tl.dtype constexpr's name


def record(checks: str, expression: str | None, out: Path, execute: bool) -> None:
    """Run the checks under the interpreter, writing each distinct launch to `out` (JSON lines); `execute`: run
    each kernel too, so that a check goes on past its first kernel's result to its later launches."""
    import inspect

    import pytest
    import torch
    from triton.runtime.interpreter import InterpretedFunction

    interpreted = InterpretedFunction.run
    seen: set[str] = set()

    def describe(value) -> str | None:
        if isinstance(value, torch.Tensor):
            return "*" + DTYPES[str(value.dtype).removeprefix("torch.")]
        if isinstance(value, bool):
            return "i1"
        if isinstance(value, int):
            return "i32" if -(2**31) <= value < 2**31 else "i64"
        if isinstance(value, float):
            return "fp32"
        return None

    def constant(value):
        name = getattr(value, "name", None)  # a tl.dtype
        return {"dtype": name} if name is not None and not isinstance(value, (bool, int, float, str)) else value

    def run(self, *args, grid, warmup, **kwargs):
        parameters = inspect.signature(self.fn).parameters
        names = list(parameters)
        bound = dict(zip(names, args)) | {k: v for k, v in kwargs.items() if k in parameters}
        constexprs = {n for n, p in parameters.items() if "constexpr" in str(p.annotation)}
        # Triton's JIT compiles an integer argument equal to 1 as the constant 1 (a Python int in the kernel, with
        # no .to or .dtype), unless the kernel names it in do_not_specialize: compiled so here too
        unspecialised = set(self.kwargs.get("do_not_specialize") or ())
        constexprs |= {n for n in names if n not in unspecialised and type(bound[n]) is int and bound[n] == 1}
        # and gives it a divisibility hint where an integer is a multiple of 16 or a pointer 16-byte aligned
        unaligned = unspecialised | set(self.kwargs.get("do_not_specialize_on_alignment") or ())
        divisible = [
            n
            for n in names
            if n not in constexprs | unaligned
            and (
                (isinstance(bound[n], torch.Tensor) and bound[n].data_ptr() % 16 == 0)
                or (type(bound[n]) is int and bound[n] % 16 == 0)
            )
        ]
        launch = {
            "module": self.fn.__module__,
            "kernel": self.fn.__name__,
            "signature": {n: "constexpr" if n in constexprs else describe(bound[n]) for n in names},
            "constexprs": {n: constant(bound[n]) for n in names if n in constexprs},
            "options": {k: kwargs[k] for k in ("num_warps", "num_stages") if k in kwargs},
            "divisible": divisible,
            "specialisable": sorted(
                n for n in names if n not in constexprs | unspecialised and describe(bound[n]) in ("i32", "i64")
            ),
        }
        key = json.dumps(launch, sort_keys=True)
        if key not in seen:
            seen.add(key)
            stream.write(key + "\n")
        if execute:
            interpreted(self, *args, grid=grid, warmup=warmup, **kwargs)

    InterpretedFunction.run = run
    files = sorted(str(f) for f in Path(checks).glob("check_*.py"))  # not test_*.py: named, they are collected
    arguments = [*files, "-q", "-p", "no:cacheprovider", "-o", "addopts="]
    if expression:
        arguments += ["-k", expression]
    with out.open("w") as stream:
        pytest.main(arguments)  # only the launches matter here (without `execute` the checks fail)


def compile_all(launches: Path, arch: int, modes: list[int], sample: bool = False, sass: Path | None = None) -> int:
    import importlib

    import triton
    import triton.language as tl
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from specpair.runtime.kernels.triton_common import GPU_CONSTEXPRS

    target = GPUTarget("cuda", arch, 32)
    done: dict[str, int] = defaultdict(int)
    failed: dict[str, list[str]] = defaultdict(list)
    sampled: set[tuple] = set()
    for line in launches.read_text().splitlines():
        launch = json.loads(line)
        key = (launch["kernel"], launch["constexprs"].get("LAYOUT"), launch["constexprs"].get("SCALES"))
        if sample and key in sampled:
            continue
        sampled.add(key)
        kernel = getattr(importlib.import_module(launch["module"]), launch["kernel"])
        recorded = {
            n: getattr(tl, TL_DTYPES[v["dtype"]]) if isinstance(v, dict) else v for n, v in launch["constexprs"].items()
        }
        # each mode as launched; plainly with the GPU's values of the interpreter's stand-ins (GPU_CONSTEXPRS:
        # bf16 dots), the code the GPU runs for bf16 operands; and with every integer argument the constant 1 (any
        # of them may be 1 at run time, which the JIT compiles as a Python int: `n.to(...)` on one fails only then)
        gpu = {n: getattr(tl, v) if isinstance(v, str) else v for n, v in GPU_CONSTEXPRS.items() if n in recorded}
        gpu = {n: v for n, v in gpu.items() if v != recorded[n]}
        ones = {n: 1 for n in launch["specialisable"]}
        variants = [(mode, {}, "") for mode in modes] + [(modes[0], gpu, "bf16")] * bool(gpu)
        variants += [(modes[0], ones, "integers as 1")] * bool(ones)
        for mode, specialised, label in variants:
            constexprs = recorded | specialised | ({"PDL": mode} if "PDL" in recorded else {})
            signature = launch["signature"] | {n: "constexpr" for n in specialised if n in ones}
            hinted = [n for n in launch["divisible"] if signature[n] != "constexpr"]
            attrs = {(kernel.arg_names.index(n),): [["tt.divisibility", 16]] for n in hinted}
            source = ASTSource(kernel, signature, constexprs, attrs)
            options = dict(launch["options"]) | ({"launch_pdl": True} if mode else {})
            try:
                compiled = triton.compile(source, target=target, options=options)
                done[launch["kernel"]] += 1
            except Exception as error:  # every failure is reported, the rest still compile
                first = next((s for s in str(error).splitlines() if s.strip()), type(error).__name__)
                failed[launch["kernel"]].append(f"PDL {mode}{label and ', ' + label}, {launch['constexprs']}: {first}")
                continue
            if sass and mode == modes[0] and label != "integers as 1":
                name = f"{launch['kernel']}-{done[launch['kernel']]:03d}{label and '-' + label}.sass"
                header = f"// {json.dumps(launch['constexprs'] | specialised, default=str)}\n"
                (sass / name).write_text(header + compiled.asm["sass"])
    for name in sorted(set(done) | set(failed)):
        print(
            f"{name}: {done[name]} compiled for sm_{arch}" + (f", {len(failed[name])} failed" if failed[name] else "")
        )
        for message in failed[name][:5]:
            print(f"  {message}")
    print(f"triton {triton.__version__}: {sum(done.values())} compiled, {sum(map(len, failed.values()))} failed")
    return 1 if any(failed.values()) else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", type=int, default=90)
    parser.add_argument("--modes", default="0,1,2")
    parser.add_argument("--checks", default=str(ROOT / "tests" / "kernel_checks"))
    parser.add_argument("-k", dest="expression", default=None)
    parser.add_argument("--sample", action="store_true", help="the first launch of each kernel and layout only")
    parser.add_argument("--sass", type=Path, help="write each launch's SASS (the first mode; bf16 too) to this folder")
    parser.add_argument("--record", type=Path, default=None, help=argparse.SUPPRESS)  # the first process
    parser.add_argument("--launches", type=Path, default=None, help=argparse.SUPPRESS)  # the second
    args = parser.parse_args()
    modes = [int(m) for m in args.modes.split(",")]
    if args.record:
        record(args.checks, args.expression, args.record, execute=not args.sample)
        return 0
    if args.launches:
        if args.sass:
            args.sass.mkdir(parents=True, exist_ok=True)
        return compile_all(args.launches, args.arch, modes, args.sample, args.sass)
    with tempfile.TemporaryDirectory() as scratch:
        launches = Path(scratch) / "launches.jsonl"
        recorder = [sys.executable, __file__, "--record", str(launches), "--checks", args.checks]
        recorder += (["-k", args.expression] if args.expression else []) + (["--sample"] if args.sample else [])
        env = {**os.environ, "TRITON_INTERPRET": "1"}
        subprocess.run(recorder, env=env, cwd=ROOT, stdout=subprocess.DEVNULL, check=True)
        print(f"{len(launches.read_text().splitlines())} distinct launches recorded", flush=True)
        env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
        compiler = [sys.executable, __file__, "--launches", str(launches), "--arch", str(args.arch)]
        compiler += ["--modes", args.modes] + (["--sample"] if args.sample else [])
        compiler += ["--sass", str(args.sass.resolve())] if args.sass else []
        return subprocess.run(compiler, env=env, cwd=ROOT).returncode


if __name__ == "__main__":
    sys.exit(main())
