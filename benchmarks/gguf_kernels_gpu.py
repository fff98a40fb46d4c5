"""GGUF matmul kernels on one GPU at Qwen3.6-35B-A3B's shapes: the planes kernel (weights re-laid at load,
formats/gguf_planes.py) against the kernel that reads GGUF blocks as stored, in one run.

    mkdir -p /tmp/pkgs && ln -sfn "$PWD" /tmp/pkgs/specpair       # the repository root is the package
    OUT=/tmp/out PYTHONPATH=/tmp/pkgs:/tmp/site python3 benchmarks/gguf_kernels_gpu.py
    TRITON_INTERPRET=1 python benchmarks/gguf_kernels_gpu.py --smoke   # tiny shapes, no timing: the script's logic

Baselines measured in the same run: the device's copy bandwidth ((bytes read + written) / time of a 1 GiB
device-to-device copy, the better of torch's copy_ and a Triton copy kernel: benchmarks/kernels_gpu.py), and
the GGUF-bytes kernel ("old") on the same weights. Speeds are bytes of weights read per call (the touched
experts' for routed calls) over the time per call, from CUDA graphs of calls rotating over enough copies of
the weights (or routings over 256 experts) to defeat the L2; shares are of the copy bandwidth.

1. Compiling: every binary the run needs is compiled first by worker processes in parallel, each launching
   its variants once on small weights of the same alignments (Triton's cache then serves the main process).
2. Sweep: for each type (Q8_0, Q4_K, Q5_K, Q6_K), every candidate tiling of the planes kernel
   (linear.PlanesTiling: rows per program, tokens per tile, warps, pipeline stages, programs K is split to
   reach) on the attention q|k|v projection [9216, 2048] and the routed experts' gate|up (256 of
   [1024, 2048], top-8) at T = 1 and 16, each checked (error bound, bitwise rows) on q|k|v.
3. Full: for each type, the old kernel, the planes kernel as linear.PLANES_TILES has it ("table"), and the
   sweep's best at T = 1 ("best": the highest geometric mean of the two shapes' shares at T = 1), on every
   shape of a decode step at T = 1, 4, 8 and 16; each checked against the float64 product with the weight's
   dequantized values (err: worst error over 1e-5·Σ|x||w| + 2^-7·|y|, <= 1 passes) and for bitwise batch
   invariance (rows alone, and prefixes of 1, 4 and 8 rows, equal to their rows among 16; experts: each token
   alone and the sorted tile table equal to the in-kernel window). A step row sums one decode step's GGUF
   matmul bytes over their times (40 MoE layers, 30 Gated DeltaNet and 10 attention layers, lm_head).
The last lines printed are the tables; $OUT (or --out) gets gguf_kernels_gpu.md and .json with every number.
To adopt a tiling, copy its row from the sweep table into linear.PLANES_TILES.
"""

from __future__ import annotations

import argparse
import datetime
import itertools
import json
import math
import multiprocessing
import os
import sys
import time
import traceback
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import triton

from specpair.formats.packed import Packed
from specpair.runtime.kernels import linear

sys.path.insert(0, str(Path(__file__).parent))
from kernels_gpu import Bench, clone, copies_for, encoder, error_over_bound  # noqa: E402

TYPES = ("Q8_0", "Q4_K", "Q5_K", "Q6_K")
TOKENS = (1, 4, 8, 16)
EXPERTS, TOP_K, DISTINCT = 256, 8, 16


@dataclass(frozen=True)
class Shape:
    """One matmul of a Qwen3.6-35B-A3B decode step: [n, k] (per expert), how many a step runs."""

    name: str
    n: int
    k: int
    per_step: int
    experts: int = 0  # routed: a stack of this many, top-8 of them per token


FULL = [
    Shape("attn q|k|v", 9216, 2048, 10),
    Shape("attn o", 2048, 4096, 10),
    Shape("gdn qkv|z", 12288, 2048, 30),
    Shape("gdn out", 2048, 4096, 30),
    Shape("experts gate|up", 1024, 2048, 40, EXPERTS),
    Shape("experts down", 2048, 512, 40, EXPERTS),
    Shape("shared gate|up", 1024, 2048, 40),
    Shape("shared down", 2048, 512, 40),
    Shape("lm_head", 248320, 2048, 1),
]
SWEEP = ("attn q|k|v", "experts gate|up")
SMOKE = [Shape("dense", 96, 512, 1), Shape("experts", 64, 512, 1, 6)]
CANDIDATES = [
    linear.PlanesTiling(block_n, 256, block_m, warps, stages, programs)
    for (block_n, warps), block_m, stages, programs in itertools.product(
        [(64, 4), (128, 4), (128, 8)], (8, 16), (3, 4), (132, 264, 528)
    )
]
SMOKE_CANDIDATES = [linear.PlanesTiling(32, 256, 8, 2, 2, 8), linear.PlanesTiling(64, 256, 16, 4, 3, 8)]


def tiling_row(t: linear.PlanesTiling) -> str:
    return (
        f"PlanesTiling(block_n={t.block_n}, step={t.step}, block_m={t.block_m}, warps={t.warps}, "
        f"stages={t.stages}, programs={t.programs})"
    )


def gguf_weight(qtype: str, shape: Shape, device: str) -> Packed:
    """GGUF bytes of random weights (std 0.02): at most 8192 distinct rows (or DISTINCT experts) quantized
    and repeated to the full shape, every row its own bytes in memory."""
    layout, name = f"gguf-{qtype}", "model.layers.0.mlp.up_proj.weight"
    if shape.experts:
        w = torch.randn(min(DISTINCT, shape.experts), shape.n, shape.k, device=device) * 0.02
        data = encoder(layout).encode(w.reshape(-1, shape.k), name)[""].reshape(w.shape[0], shape.n, -1)
        data = data.repeat(triton.cdiv(shape.experts, w.shape[0]), 1, 1)[: shape.experts].contiguous()
        return Packed(name, layout, (shape.experts, shape.n, shape.k), {"": data})
    rows = min(shape.n, 8192)
    data = encoder(layout).encode(torch.randn(rows, shape.k, device=device) * 0.02, name)[""].reshape(rows, -1)
    data = data.repeat(triton.cdiv(shape.n, rows), 1)[: shape.n].contiguous()
    return Packed(name, layout, (shape.n, shape.k), {"": data})


def routes(tokens: int, shape: Shape, count: int, device: str) -> list[torch.Tensor]:
    """expert ids as the runtime passes them: gate|up [T, 8]; down per (token, slot) pair [8T, 1]."""
    ids = [torch.rand(tokens, shape.experts, device=device).argsort(-1)[:, :TOP_K].int() for _ in range(count)]
    return [i.reshape(-1, 1).contiguous() for i in ids] if shape.k < shape.n else ids


def call(w: Packed, x: torch.Tensor, ids: torch.Tensor | None, tiles: linear.Tiles | None) -> torch.Tensor:
    if ids is None:
        return linear.matmul_triton(x, w, tiles)
    return linear.matmul_experts_triton(x, w, ids, tiles)


def rows_of(shape: Shape, tokens: int) -> int:
    """Rows of x for T tokens: the down projection of experts takes one row per (token, slot) pair."""
    return tokens * TOP_K if shape.experts and shape.k < shape.n else tokens


@dataclass
class Result:
    qtype: str
    shape: str
    kernel: str  # old | table | best | a candidate's row
    tiles: str
    err: float = float("nan")
    bits: bool | None = None
    seconds: dict[int, float] = field(default_factory=dict)  # per T
    nbytes: dict[int, float] = field(default_factory=dict)
    error: str = ""

    def share(self, tokens: int, copy: float) -> float:
        s = self.seconds.get(tokens)
        return self.nbytes[tokens] / s / copy if s else float("nan")

    def gbps(self, tokens: int) -> float:
        s = self.seconds.get(tokens)
        return self.nbytes[tokens] / s / 1e9 if s else float("nan")


def check(w: Packed, shape: Shape, tiles: linear.Tiles | None, device: str) -> tuple[float, bool]:
    """(worst error over its bound, bitwise batch invariance) of 16 tokens."""
    torch.manual_seed(shape.n + shape.k)
    m = rows_of(shape, 16)
    x = torch.randn(m, shape.k, device=device).bfloat16()
    ids = routes(16, shape, 1, device)[0] if shape.experts else None
    y = call(w, x, ids, tiles)
    if ids is None:
        err = error_over_bound(y, x, w.dequantize())
        bits = all(torch.equal(call(w, x[r : r + 1].clone(), None, tiles)[0], y[r]) for r in (0, 7, m - 1))
        bits = bits and all(torch.equal(call(w, x[:r].clone(), None, tiles), y[:r]) for r in (1, 4, 8))
        return err, bits
    used = {int(e) for e in ids.unique()}
    dense = {e: w.expert(e).dequantize() for e in used}
    err = max(
        error_over_bound(y[t, s : s + 1], x[t : t + 1], dense[int(ids[t, s])])
        for t in range(m)
        for s in range(ids.shape[1])
    )
    bits = all(torch.equal(call(w, x[t : t + 1].clone(), ids[t : t + 1], tiles)[0], y[t]) for t in (0, m - 1))
    if m <= (tiles or linear.tiles_of(w)).block_m:  # the in-kernel window served the call: the sorted table too
        bits = bits and torch.equal(linear.matmul_experts_triton(x, w, ids, tiles, window=False), y)
    return err, bits


def measure(bench: Bench, w: Packed, shape: Shape, tiles: linear.Tiles | None, tokens: tuple[int, ...], result: Result):
    """Seconds per call and bytes read per call for each T, into result."""
    device = bench.device
    per_expert = w.nbytes / shape.experts if shape.experts else 0
    copies = [w] + ([] if shape.experts else [clone(w) for _ in range(copies_for(w.nbytes) - 1)])
    for t in tokens:
        x = torch.randn(rows_of(shape, t), shape.k, device=device).bfloat16()
        if shape.experts:
            rs = routes(t, shape, 16, device)
            touched = sum(r.unique().numel() for r in rs) / len(rs)
            result.nbytes[t] = touched * per_expert
            fn = lambda i, x=x, rs=rs: call(w, x, rs[i % len(rs)], tiles)  # noqa: E731
            calls = 16
        else:
            result.nbytes[t] = w.nbytes
            fn = lambda i, x=x: call(copies[i % len(copies)], x, None, tiles)  # noqa: E731
            calls = max(16, len(copies))
        result.seconds[t] = bench.seconds_per_call(fn, calls) if bench.timing else float("nan")


def attempt(result: Result, fn) -> Result:
    """Run fn; a failure is recorded in the result and printed, and the run goes on."""
    try:
        fn()
    except Exception as e:  # a variant that fails to compile or run: report it, measure the others
        result.error = f"{type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}"
        print(f"  FAILED {result.qtype} {result.shape} {result.kernel}: {result.error}", flush=True)
        traceback.print_exc(limit=3, file=sys.stdout)
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return result


# ---- compiling in parallel ---------------------------------------------------------------------------------


def _warm(jobs: list[tuple[str, linear.PlanesTiling | None, bool]]) -> list[str]:
    """Worker: launch each (type, tiling or None for the old kernel, experts?) once on small weights with the
    benchmark's alignments, so that Triton compiles and caches its binary."""
    failures = []
    for qtype, tiling, experts in jobs:
        try:
            shape = Shape("warm", 512, 2048, 1, 16 if experts else 0)
            w = gguf_weight(qtype, shape, "cuda")
            tiles = None
            if tiling is not None:
                w = linear.to_kernel_layout(w)
                tiles = linear.planes_tiles(w.shape[-2], w.shape[-1], tiling)
            x = torch.randn(2, shape.k, device="cuda").bfloat16()
            call(w, x, routes(2, shape, 1, "cuda")[0] if experts else None, tiles)
            torch.cuda.synchronize()
        except Exception as e:  # reported again, with its context, when the main process runs the variant
            failures.append(f"{qtype} {tiling} experts={experts}: {type(e).__name__}: {str(e)[:200]}")
    return failures


def compile_all(candidates: list[linear.PlanesTiling], workers: int) -> None:
    binaries = {(t.block_n, t.step, t.block_m, t.warps, t.stages): t for t in candidates}  # programs: same binary
    jobs = [(q, None, e) for q in TYPES for e in (False, True)]
    jobs += [(q, t, e) for q in TYPES for t in binaries.values() for e in (False, True)]
    chunks = [jobs[i::workers] for i in range(workers)]
    began = time.perf_counter()
    with multiprocessing.get_context("spawn").Pool(workers) as pool:
        failures = [f for part in pool.map(_warm, chunks) for f in part]
    print(f"compiled {len(jobs)} variants in {workers} processes: {time.perf_counter() - began:.0f} s", flush=True)
    for f in failures:
        print(f"  warm-up failed: {f}", flush=True)


# ---- the run -----------------------------------------------------------------------------------------------


def geometric_mean(values: list[float]) -> float:
    values = [v for v in values if v == v and v > 0]
    return math.exp(sum(map(math.log, values)) / len(values)) if values else float("nan")


def sweep(
    bench: Bench, qtype: str, shapes: list[Shape], candidates, tokens
) -> tuple[list[Result], linear.PlanesTiling]:
    results = []
    for shape in shapes:
        stored = gguf_weight(qtype, shape, bench.device)
        w = linear.to_kernel_layout(stored)
        del stored
        for t in candidates:
            result = Result(qtype, shape.name, tiling_row(t), "")

            def run(t=t, result=result, w=w, shape=shape) -> None:
                tiles = linear.planes_tiles(w.shape[-2], w.shape[-1], t)
                result.tiles = str(tiles)
                if shape is shapes[0]:
                    result.err, result.bits = check(w, shape, tiles, bench.device)
                measure(bench, w, shape, tiles, tokens, result)

            results.append(attempt(result, run))
        del w, run
        torch.cuda.empty_cache() if torch.cuda.is_available() else None
    score = {
        t: geometric_mean(
            [r.share(tokens[0], bench.copy) for r in results if r.kernel == tiling_row(t) and not r.error]
        )
        for t in candidates
    }
    ok = [
        t for t in candidates if all(r.bits is not False and r.err <= 1 for r in results if r.kernel == tiling_row(t))
    ]
    best = max(ok or candidates, key=lambda t: score[t] if score[t] == score[t] else -1.0)
    return results, best


def full(bench: Bench, qtype: str, shapes: list[Shape], best: linear.PlanesTiling, tokens) -> list[Result]:
    results = []
    table = linear.PLANES_TILES[qtype]
    for shape in shapes:
        stored = gguf_weight(qtype, shape, bench.device)
        planes = linear.to_kernel_layout(stored)
        kernels = [("old", stored, None), ("table", planes, table)] + [("best", planes, best)] * (best != table)
        for kind, w, tiling in kernels:
            result = Result(qtype, shape.name, kind, tiling_row(tiling) if tiling else "GGUF blocks")

            def run(w=w, tiling=tiling, result=result, shape=shape) -> None:
                tiles = linear.planes_tiles(w.shape[-2], w.shape[-1], tiling) if tiling else None
                result.err, result.bits = check(w, shape, tiles, bench.device)
                measure(bench, w, shape, tiles, tokens, result)

            r = attempt(result, run)
            results.append(r)
            shares = " ".join(f"T={t} {r.gbps(t):6.0f} GB/s {r.share(t, bench.copy):.2f}" for t in tokens)
            print(f"{qtype} {shape.name:<16} {kind:<5} err {r.err:.3f} bits {r.bits} {shares}", flush=True)
        del stored, planes, kernels, run
        torch.cuda.empty_cache() if torch.cuda.is_available() else None
    return results


def step_share(results: list[Result], shapes: list[Shape], qtype: str, kind: str, tokens: int, copy: float) -> float:
    """One decode step's bytes of this type's matmuls over their time: Σ per_step·bytes / Σ per_step·seconds."""
    total_bytes = total_seconds = 0.0
    for shape in shapes:
        rows = [r for r in results if r.qtype == qtype and r.shape == shape.name and r.kernel == kind and not r.error]
        if not rows or tokens not in rows[0].seconds:
            return float("nan")
        total_bytes += shape.per_step * rows[0].nbytes[tokens]
        total_seconds += shape.per_step * rows[0].seconds[tokens]
    return total_bytes / total_seconds / copy if total_seconds else float("nan")


def tables(sweeps: list[Result], fulls: list[Result], shapes, copy: float, tokens) -> list[str]:
    lines = ["## Sweep: planes kernel candidates (shares of copy bandwidth; checks on the first shape)", ""]
    head = ["type", "shape", "tiling (a PLANES_TILES row)", "err", "bits"] + [f"T={t}" for t in tokens]
    lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in sweeps:
        cells = (
            [f"{r.share(t, copy):.3f}" for t in tokens] if not r.error else [r.error[:60]] + [""] * (len(tokens) - 1)
        )
        lines.append(f"| {r.qtype} | {r.shape} | `{r.kernel}` | {r.err:.3f} | {r.bits} | " + " | ".join(cells) + " |")
    lines += ["", "## Full: old kernel, PLANES_TILES, the sweep's best (GB/s, share of copy, new/old per T)", ""]
    head = ["type", "shape", "kernel", "err", "bits"]
    for t in tokens:
        head += [f"T={t} GB/s", "share", "/old"]
    lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in fulls:
        old = next((o for o in fulls if o.qtype == r.qtype and o.shape == r.shape and o.kernel == "old"), None)
        cells = []
        for t in tokens:
            ratio = old.seconds.get(t, float("nan")) / r.seconds[t] if old and r.seconds.get(t) else float("nan")
            cells += [f"{r.gbps(t):.0f}", f"{r.share(t, copy):.3f}", f"{ratio:.2f}"]
        flag = " **FAIL**" if r.error or r.bits is False or not r.err <= 1 else ""
        lines.append(
            f"| {r.qtype} | {r.shape} | {r.kernel} | {r.err:.3f} | {r.bits} | " + " | ".join(cells) + f" |{flag}"
        )
    lines += ["", "## One decode step's GGUF matmuls, all of one type (share of copy bandwidth)", ""]
    lines += ["| type | kernel | " + " | ".join(f"T={t}" for t in tokens) + " |", "|---|---|" + "---|" * len(tokens)]
    for qtype in sorted({r.qtype for r in fulls}):
        for kind in ("old", "table", "best"):
            shares = [step_share(fulls, shapes, qtype, kind, t, copy) for t in tokens]
            if any(s == s for s in shares):
                lines.append(f"| {qtype} | {kind} | " + " | ".join(f"{s:.3f}" for s in shares) + " |")
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--smoke", action="store_true", help="tiny shapes and two candidates, no timing")
    parser.add_argument("--types", default=",".join(TYPES), help="comma-separated GGUF types")
    parser.add_argument("--workers", type=int, default=min(12, os.cpu_count() or 1), help="compiling processes")
    parser.add_argument("--out", default=os.environ.get("OUT", "."), help="directory for the .md and .json")
    args = parser.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    timing = device == "cuda" and not args.smoke
    shapes = SMOKE if args.smoke else FULL
    candidates = SMOKE_CANDIDATES if args.smoke else CANDIDATES
    tokens = (1, 16) if args.smoke else TOKENS
    types = args.types.split(",")
    began = time.perf_counter()
    if timing and args.workers > 1:
        compile_all(candidates, args.workers)
    bench = Bench(device, timing)
    name = torch.cuda.get_device_name() if device == "cuda" else "cpu"
    copies = ", ".join(f"{k} {v / 1e12:.2f} TB/s" for k, v in bench.copies.items()) or "not measured"
    header = f"{name}: torch {torch.__version__}, triton {triton.__version__}; copy bandwidth: {copies}"
    print(f"# {header}", flush=True)
    copy = bench.copy if timing else 1.0
    sweeps, fulls = [], []
    for qtype in types:
        sweep_shapes = [s for s in shapes if s.name in SWEEP] or shapes
        results, best = sweep(bench, qtype, sweep_shapes, candidates, (tokens[0], tokens[-1]))
        sweeps += results
        print(f"{qtype}: best at T={tokens[0]}: {tiling_row(best)}  [{time.perf_counter() - began:.0f} s]", flush=True)
        fulls += full(bench, qtype, shapes, best, tokens)
    failed = sum(bool(r.error) or r.bits is False or not r.err <= 1 for r in fulls) + sum(
        bool(r.error) or r.bits is False or r.err > 1 for r in sweeps
    )
    lines = [
        "# GGUF matmul kernels on one GPU (benchmarks/gguf_kernels_gpu.py)",
        "",
        f"{datetime.date.today()}, {header}; {len(candidates)} candidates; "
        f"{'all checks passed' if not failed else f'{failed} FAILED'}; {time.perf_counter() - began:.0f} s.",
        "",
        *tables(sweeps, fulls, shapes, copy, tokens),
        "",
    ]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "gguf_kernels_gpu.md").write_text("\n".join(lines))
    record = {"header": header, "copy": copy, "sweep": [asdict(r) for r in sweeps], "full": [asdict(r) for r in fulls]}
    (out / "gguf_kernels_gpu.json").write_text(json.dumps(record, indent=1, default=str))
    print("\n".join(lines[4:]))
    print(f"\n{'all checks passed' if not failed else f'{failed} FAILED'} in {time.perf_counter() - began:.0f} s")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
