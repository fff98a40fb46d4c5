"""GGUF quantizers: relative error on N(0, 1), speed on this CPU, and (optional) bytes against llama.cpp's C.

    python benchmarks/kquant_errors.py [--rows 256 --cols 4096]
    python benchmarks/kquant_errors.py --ggml-src DIR   # DIR = llama.cpp's ggml/, e.g. from the llama-cpp-python
                                                        # sdist: vendor/llama.cpp/ggml

With --ggml-src, ggml/src/ggml-quants.c is compiled alone (gcc -O2 -DNDEBUG as in a release build, with a
few stub symbols, ~3 s), and its quantize_row_*_ref output is timed and compared block by block with ours
(numpy, and torch for the k-quants) over several value distributions.
Speed is MB/s of float32 input, the best of 3 runs. The numpy quantizers run on one core; for the k-quants
the other paths are timed against that in the same run, on the same input: numpy in one worker process per
core (quantize_in_processes), and the torch quantizer (quantize_kquant_torch, asserted to give the same bytes)
with 1 torch thread, with one per core, and in one Python thread per core over slices of rows, as the
converter's worker threads run it (numpy alike); with --device cuda, torch on the GPU instead.
"""

from __future__ import annotations

import argparse
import ctypes
import functools
import os
import subprocess
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import torch

from specpair.formats import gguf_quants
from specpair.formats.gguf_quants import BLOCK_SIZES, dequantize, quantize, quantize_kquant_torch

TYPES = ("F16", "BF16", "Q8_0", "Q4_0", "Q6_K", "Q5_K", "Q4_K")
C_TYPES = ("Q8_0", "Q4_0", "Q6_K", "Q5_K", "Q4_K")  # the ones with a quantize_row_*_ref
KQUANTS = ("Q6_K", "Q5_K", "Q4_K")
# What ggml-quants.c calls from the rest of ggml; none of it is reached by the reference quantizers.
STUBS = """
#include <stdint.h>
#include <stdlib.h>
void ggml_abort(const char *file, int line, const char *fmt, ...) { abort(); }
size_t ggml_row_size(int type, int64_t ne) { abort(); }
const char * ggml_type_name(int type) { return "?"; }
size_t ggml_type_size(int type) { abort(); }
"""


def best_seconds(run: Callable[[], object], repeats: int = 3) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return min(times)


def in_threads(quantizer: Callable[[np.ndarray], object], x: np.ndarray, threads: int) -> Callable[[], None]:
    """A run of `quantizer` over `threads` slices of x's rows at once, one Python thread each."""
    pieces = np.array_split(x, threads)

    def run() -> None:
        with ThreadPoolExecutor(threads) as pool:
            list(pool.map(quantizer, pieces))

    return run


def kquant_speeds(x: np.ndarray, qtype: str, method: str, device: str) -> list[float]:
    """MB/s of the k-quant paths besides one-core numpy: numpy in worker processes (quantize_in_processes, one
    per core), then torch on `device`: on the CPU with 1 torch thread, one per core, and in one Python thread per
    core with 1 torch thread each (as the converter's workers run it), then numpy in as many Python threads."""
    cores, default_threads = os.cpu_count() or 1, torch.get_num_threads()
    gguf_quants.PROCESS_POOL_MIN_CPUS = 1  # the pool, whatever the machine
    numpy_quantizer = functools.partial(quantize, qtype=qtype, method=method)

    def torch_quantizer(values: np.ndarray) -> torch.Tensor:
        out = quantize_kquant_torch(torch.from_numpy(values).to(device), qtype, method == "search")
        return out.cpu()  # waits for a GPU

    ours = torch_quantizer(x).numpy()
    assert np.array_equal(ours, quantize(x, qtype, method)), f"torch {qtype} {method} on {device}: not numpy's bytes"
    speeds = [x.nbytes / best_seconds(functools.partial(gguf_quants.quantize_in_processes, x, qtype, method)) / 1e6]
    if device != "cpu":
        return speeds + [x.nbytes / best_seconds(functools.partial(torch_quantizer, x)) / 1e6]
    for threads, run in (
        (1, functools.partial(torch_quantizer, x)),
        (cores, functools.partial(torch_quantizer, x)),
        (1, in_threads(torch_quantizer, x, cores)),
    ):
        torch.set_num_threads(threads)
        speeds.append(x.nbytes / best_seconds(run) / 1e6)
    torch.set_num_threads(default_threads)
    return speeds + [x.nbytes / best_seconds(in_threads(numpy_quantizer, x, cores)) / 1e6]


def build_reference(ggml: Path, workdir: Path) -> Callable[[np.ndarray, str], np.ndarray]:
    stubs = workdir / "stubs.c"
    stubs.write_text(STUBS)
    library = workdir / "libggml_quants_ref.so"
    subprocess.run(
        [
            "gcc",
            "-O2",
            "-DNDEBUG",
            "-shared",
            "-fPIC",
            f"-I{ggml / 'include'}",
            f"-I{ggml / 'src'}",
            str(ggml / "src" / "ggml-quants.c"),
            str(stubs),
            "-lm",
            "-o",
            str(library),
        ],
        check=True,
    )
    lib = ctypes.CDLL(str(library))

    def reference(x: np.ndarray, qtype: str) -> np.ndarray:
        values, nbytes = BLOCK_SIZES[qtype]
        out = np.zeros((x.shape[0], x.shape[1] // values * nbytes), np.uint8)
        x = np.ascontiguousarray(x, np.float32)
        row_ref = getattr(lib, f"quantize_row_{qtype[:2].lower()}{qtype[2:]}_ref")  # quantize_row_q4_K_ref
        row_ref(ctypes.c_void_p(x.ctypes.data), ctypes.c_void_p(out.ctypes.data), ctypes.c_int64(x.size))
        return out

    return reference


def distributions(rng: np.random.Generator) -> dict[str, np.ndarray]:
    shape = (64, 4096)
    edge = rng.standard_normal(shape)
    edge[:, :256] = 0
    edge[:, 600:616] = -1.5
    edge[:, 700:732] = 2.0
    edge[::7, 800] = 1e4
    edge[:, 1024:1280] *= 1e-20
    return {
        "normal": rng.standard_normal(shape),
        "normal x0.02": rng.standard_normal(shape) * 0.02,
        "student-t 2": rng.standard_t(2, shape),
        "sparse": rng.standard_normal(shape) * (rng.uniform(size=shape) < 0.1),
        "log-uniform": np.sign(rng.standard_normal(shape)) * np.exp(rng.uniform(-30, 3, shape)),
        "small integers": rng.integers(-3, 4, shape).astype(float),
        "edge cases": edge,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=256)
    parser.add_argument("--cols", type=int, default=4096)
    parser.add_argument("--ggml-src", type=Path, help="llama.cpp's ggml/ directory, to compare with its C quantizers")
    parser.add_argument("--device", default="cpu", help="where the torch k-quant quantizer runs (cpu, cuda)")
    args = parser.parse_args()

    x = np.random.default_rng(1234).standard_normal((args.rows, args.cols)).astype(np.float32)
    cores = os.cpu_count() or 1
    print(
        f"N(0,1) {args.rows}x{args.cols}, seed 1234: relative Frobenius error, MB/s of float32 input (x: over "
        f"numpy on one core); {cores} CPUs, torch {torch.__version__}, torch on {args.device}"
    )
    if args.device == "cpu":
        columns = [
            f"numpy {cores} procs",
            "torch 1 thread",
            f"torch {cores} threads",
            f"torch {cores} Py thr",
            f"numpy {cores} Py thr",
        ]
    else:
        columns = [f"numpy {cores} procs", f"torch {args.device}"]
    print(f"{'type':6} {'method':7} {'error':>8} {'numpy':>7} " + " ".join(f"{c:>16}" for c in columns))
    for qtype in TYPES:
        for method in ("search", "rtn") if qtype in KQUANTS else ("search",):
            raw = quantize(x, qtype, method)
            error = np.linalg.norm(dequantize(raw, qtype, x.shape) - x) / np.linalg.norm(x)
            speed = x.nbytes / best_seconds(functools.partial(quantize, x, qtype, method)) / 1e6
            line = f"{qtype:6} {method if qtype in KQUANTS else '-':7} {error:8.5f} {speed:7.1f}"
            if qtype in KQUANTS:
                line += "".join(f" {s:9.1f} {s / speed:5.2f}x" for s in kquant_speeds(x, qtype, method, args.device))
            print(line, flush=True)

    if args.ggml_src is None:
        return
    with tempfile.TemporaryDirectory() as workdir:
        reference = build_reference(args.ggml_src, Path(workdir))
        print("\nllama.cpp quantize_row_*_ref: C speed, and blocks where our bytes differ")
        for qtype in C_TYPES:
            speed = x.nbytes / best_seconds(functools.partial(reference, x, qtype)) / 1e6
            print(f"{qtype:6} C {speed:7.1f} MB/s")
        for label, values in distributions(np.random.default_rng(7)).items():
            values = values.astype(np.float32)
            counts = []
            for qtype in C_TYPES:
                nbytes = BLOCK_SIZES[qtype][1]
                ours = quantize(values, qtype).reshape(-1, nbytes)
                theirs = reference(values, qtype).reshape(-1, nbytes)
                counts.append(f"{qtype} {int((ours != theirs).any(axis=1).sum())}/{len(ours)}")
                if qtype in KQUANTS:
                    ours = quantize_kquant_torch(torch.from_numpy(values), qtype, True).numpy().reshape(-1, nbytes)
                    counts[-1] += f" (torch {int((ours != theirs).any(axis=1).sum())})"
            print(f"{label:15} " + "  ".join(counts))


if __name__ == "__main__":
    main()
