"""Tile candidates for the matmuls of one Qwen3.6-35B-A3B NVFP4 + FP8 decode (and verify) step, timed on the GPU
against the tiles the runtime picks (linear.tiles_of), in the same run.

    PYTHONPATH=/tmp/pkgs:/tmp/site python3 benchmarks/tiles_sweep.py \
        [--candidates 'splits=1;block_n=32'] [--cases NAMES] [--layouts nvfp4-modelopt,gguf-Q4_K] [--out F]
    TRITON_INTERPRET=1 python benchmarks/tiles_sweep.py --smoke   # tiny shapes, no timing: the script's logic

The weights are the step's (benchmarks/results/step_profile.md's "matmuls of one step, by weight"): the routed
experts' gate|up (257 of [1024, 2048]) and down (257 of [2048, 512]) in NVFP4, each token naming 9 distinct experts
(top 8 and the shared one), down reading a row of x per pair; the FP8 per-tensor projections (the GDN's input
12288x2048, attention's q|gate|k|v 9216x2048, the mixers' outputs 2048x4096); the BF16 router|shared gate 257x2048
and the GDN's b|a 64x2048; the NVFP4 lm_head 248320x2048; the DFlash2 drafter's affine-4 projections (its round,
results/drafter_rounds_h100.md); and, beside them, Qwen3-8B's BF16 projections. Each call as the step makes it (the
products a consumer adds left as split partials), timed in a CUDA graph of calls that rotate over enough copies of
the weight (and, for experts, over different experts) to read from HBM, as kernels_gpu.py times its calls. Per
candidate and M (tokens): µs per call and the share of copy bandwidth of the bytes it reads (the weight, or the
touched experts). A candidate's products must match the runtime tiles' to float32 rounding of a different split
(checked: relative difference < 1e-2), which catches a candidate the kernel computes wrongly; its bits are the
kernel checks' business. `--layouts`: each case's weight also in these layouts (as loaders give them to the kernel,
`linear.to_kernel_layout`), with their own runtime tiles: what the layout, not the tiling, costs at that shape (a
layout's product is checked against x times its dequantized weight, relative difference < 2e-2).
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from kernels_gpu import Bench, clone, copies_for, dequantized, expert_stack, weight  # noqa: E402

from specpair.formats.packed import Packed  # noqa: E402
from specpair.runtime.kernels import linear  # noqa: E402

EXPERTS, TOUCHED, DISTINCT = 256, 9, 32
DEFAULT_CANDIDATES = (
    "splits=1;splits=2;splits=8;block_n=32;block_n=32,splits=1;block_n=32,splits=2;block_n=16,splits=1;"
    "block_n=128;block_n=128,splits=8;warps=2;warps=8;stages=2;stages=4"
)
# (case, layout, experts or 0, N, K, routed per pair, unsummed as the step calls it)
CASES = [
    ("experts gate|up", "nvfp4-modelopt", EXPERTS, 1024, 2048, False, True),
    ("experts down", "nvfp4-modelopt", EXPERTS, 2048, 512, True, True),
    ("GDN in_proj q|k|v|z", "fp8-tensor", 0, 12288, 2048, False, False),
    ("mixer out_proj|o_proj", "fp8-tensor", 0, 2048, 4096, False, True),
    ("attention q|gate|k|v", "fp8-tensor", 0, 9216, 2048, False, False),
    ("router|shared gate", "bf16", 0, 257, 2048, False, True),
    ("GDN b|a", "bf16", 0, 64, 2048, False, False),
    # the head (NVIDIA's checkpoint quantizes it): a decode step's last product, and an MTP round's three
    ("lm_head", "nvfp4-modelopt", 0, 248320, 2048, False, False),
    # incoai's DFlash2 drafter for it at affine-4 (--draft-bits 4): a round's products of 8 rows
    ("DFlash2 q|k|v", "affine4-g64", 0, 6144, 2048, False, True),
    ("DFlash2 gate|up", "affine4-g64", 0, 12288, 2048, False, False),
    ("DFlash2 down", "affine4-g64", 0, 2048, 6144, False, True),
    ("DFlash2 o_proj", "affine4-g64", 0, 2048, 4096, False, True),
    ("DFlash2 conv kernel projection", "affine4-g64", 0, 512, 2048, False, True),
    ("DFlash2 fc", "affine4-g64", 0, 2048, 16384, False, False),
    # Qwen3-8B in BF16, the dense target beside it
    ("8B q|k|v", "bf16", 0, 6144, 4096, False, False),
    ("8B o_proj", "bf16", 0, 4096, 4096, False, True),
    ("8B gate|up", "bf16", 0, 24576, 4096, False, False),
    ("8B down", "bf16", 0, 4096, 12288, False, True),
]
ROWS = (1, 4, 16)


def parse(candidates: str) -> list[dict[str, int]]:
    """'a=1,b=2;c=3' -> [{a: 1, b: 2}, {c: 3}]; spaces around the fields are ignored (a command wrapped in a
    quoted string keeps its indentation)."""
    fields = [[kv.strip() for kv in c.split(",") if kv.strip()] for c in candidates.split(";")]
    return [{k.strip(): int(v) for k, v in (kv.split("=") for kv in c)} for c in fields]


def label(overrides: dict[str, int]) -> str:
    return ",".join(f"{k}={v}" for k, v in overrides.items()) or "runtime"


def kernel_weight(layout: str, w: torch.Tensor) -> torch.Tensor | Packed:
    """w in `layout` as a loader hands it to the kernel (linear.to_kernel_layout: GGUF k-quants as planes)."""
    packed = weight(layout, w)
    return packed if isinstance(packed, torch.Tensor) else linear.to_kernel_layout(packed)


def case_calls(case: tuple, m: int, device: str):
    """(fn(i, tiles) -> the call's product, bytes a call reads, calls to rotate over, and for a dense weight the
    product x times its dequantized weight, made when asked) for one case at m tokens."""
    _, layout, experts, n, k, per_pair, unsummed = case
    gen = torch.Generator(device=device).manual_seed(0)
    if not experts:
        w = kernel_weight(layout, torch.randn(n, k, device=device, generator=gen) * 0.05)
        copies = [w] + [clone(w) for _ in range(copies_for(w.nbytes) - 1)]
        x = torch.randn(m, k, device=device, generator=gen).bfloat16()

        def dense(i: int, tiles: linear.Tiles | None):
            return linear.matmul_triton(x, copies[i % len(copies)], tiles=tiles, unsummed=unsummed)

        return dense, w.nbytes, len(copies), lambda: x.float() @ dequantized(w).T
    distinct = min(DISTINCT, experts)
    w = expert_stack(layout, torch.randn(distinct, n, k, device=device, generator=gen) * 0.05, experts)
    sets = 64  # rotate over different experts: a call's experts are seldom in L2 from the last
    # each token's 9 distinct experts drawn alone, as a router's are
    ids = torch.stack([torch.randperm(experts, device=device, generator=gen)[:TOUCHED] for _ in range(sets * m)])
    ids = ids.reshape(sets, m, TOUCHED).to(torch.int32)
    x = torch.randn(m * TOUCHED if per_pair else m, k, device=device, generator=gen).bfloat16()
    touched = w.nbytes / experts * sum(len(s.unique()) for s in ids) / sets

    def routed(i: int, tiles: linear.Tiles):
        return linear.matmul_experts_triton(x, w, ids[i % sets], tiles=tiles, per_pair=per_pair, unsummed=unsummed)

    return routed, touched, sets, None


def summed(y) -> torch.Tensor:
    y = y.summed() if isinstance(y, linear.SplitSums) else y
    return y.reshape(-1, y.shape[-1]).float()  # routed: [pairs, N] either way


def runtime_tiles(case: tuple, device: str) -> linear.Tiles:
    """The tiles the runtime picks for the case's weight: a function of its layout and [N, K] alone."""
    _, layout, experts, n, k, _, _ = case
    w = torch.randn(n, k, device=device) * 0.05
    return linear.tiles_of(expert_stack(layout, w[None], 1) if experts else kernel_weight(layout, w))


def tiles_text(t: linear.Tiles) -> str:
    return f"({t.block_n}x{t.step}/{t.splits} w{t.warps} s{t.stages})"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--candidates", default=DEFAULT_CANDIDATES, help="';'-separated linear.Tiles overrides")
    parser.add_argument("--cases", help="comma-separated case names (default: all)")
    parser.add_argument(
        "--layouts", default="", help="also each dense case's weight in these layouts (comma-separated)"
    )
    parser.add_argument("--smoke", action="store_true", help="tiny shapes, no timing (the CPU under TRITON_INTERPRET)")
    parser.add_argument("--out", help="also write the table as markdown here")
    args = parser.parse_args()
    device = "cpu" if args.smoke else "cuda"
    bench = Bench(device, timing=not args.smoke)
    candidates = [{}] + parse(args.candidates)
    cases = [c for c in CASES if not args.cases or c[0] in args.cases.split(",")]
    if args.smoke:  # every dimension / 16, 16 experts
        cases = [(c[0], c[1], c[2] and 16, max(16, c[3] // 16), c[4] // 16, *c[5:]) for c in cases]
    name = torch.cuda.get_device_name() if device == "cuda" else "cpu"
    lines = [
        f"# Tile candidates for the 35B-A3B step's matmuls ({name}, copy {bench.copy / 1e12:.2f} TB/s)",
        "",
        "| case | layout | tiles | " + " | ".join(f"M={m} µs | of copy" for m in ROWS) + " |",
        "|---|---|---|" + "---|---|" * len(ROWS),
    ]
    print("\n".join(lines), flush=True)
    failed = False
    for case in cases:
        runtime = runtime_tiles(case, device)
        calls = {m: case_calls(case, m, device) for m in ROWS}
        wants = {m: summed(calls[m][0](0, runtime)) for m in ROWS}
        rows = [(case[1], label(o), replace(runtime, **o), calls, wants, 1e-2) for o in candidates]
        for layout in [] if case[2] else [name for name in args.layouts.split(",") if name]:
            other = (case[0], layout, *case[2:])
            other_calls = {m: case_calls(other, m, device) for m in ROWS}
            exact = {m: other_calls[m][3]() for m in ROWS}
            rows.append((layout, "runtime", runtime_tiles(other, device), other_calls, exact, 2e-2))
        for layout, name, tiles, row_calls, row_wants, tolerance in rows:
            cells = []
            for m in ROWS:
                fn, read, rotate, _ = row_calls[m]
                got, want = summed(fn(0, tiles)), row_wants[m]
                wrong = ((got - want).abs().max() / want.abs().max().clamp_min(1e-30)).item() > tolerance
                failed |= wrong
                seconds = (
                    bench.seconds_per_call(lambda i, fn=fn, t=tiles: fn(i, t), max(16, rotate)) if bench.timing else 0
                )
                share = read / seconds / bench.copy if seconds else float("nan")
                cells.append(f"{seconds * 1e6:.1f}{' WRONG' if wrong else ''} | {share:.1%}")
            case_name = case[0].replace("|", "\\|")  # a fused weight's name, in a markdown cell
            lines.append(f"| {case_name} | {layout} | {name} {tiles_text(tiles)} | " + " | ".join(cells) + " |")
            print(lines[-1], flush=True)
    if args.out:
        Path(args.out).write_text("\n".join(lines) + "\n")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
