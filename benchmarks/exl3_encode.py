"""EXL3 encoder: tiles/s on the CPU and on CUDA against a plain numpy Viterbi measured in the same run, and the
error of quantize -> dequantize on N(0, 1) matrices.

    python benchmarks/exl3_encode.py [--bits 4] [--codebook mul1] [--cuda-rows 4096]
    python benchmarks/exl3_encode.py --calibrate    # the tile RMS table of formats/exl3.py (TILE_RMS)

The baseline is the straightforward numpy form of the same search (one tile at a time, each step a numpy
argmin over the 2^16 states, the way our first prototype ran: ~70 s per 128 tiles per K on one core), timed on
a few tiles and scaled per tile. Ours: `viterbi` on CPU threads (torch) and, with a GPU, the Triton kernel on a
batch of tiles, synchronized, best of 3. End to end: `quantize` of one [rows, rows] matrix on CUDA, and the time
a 1 B-parameter drafter (~4 M tiles) takes at that rate.
"""

from __future__ import annotations

import argparse
import math
import time
from pathlib import Path

import numpy as np
import torch

from specpair.formats import exl3

BASELINE_TILES = 2


def numpy_viterbi(tile: np.ndarray, bits: int, cb: np.ndarray) -> np.ndarray:
    """The same two-pass tail-biting search, one tile, float64, numpy argmin per step (states [256])."""
    edges, branches = exl3.STATES >> bits, 1 << bits
    sources = edges // branches

    def forward(roll: int, start: int | None) -> tuple[np.ndarray, np.ndarray]:
        costs = np.zeros(edges) if start is None else np.where(np.arange(edges) == start, 0.0, np.inf)
        back = np.empty((exl3.TILE_LEN, edges), dtype=np.int64)
        for step in range(exl3.TILE_LEN):
            position = (step + roll) % exl3.TILE_LEN
            candidates = costs.reshape(branches, sources, 1) + ((cb - tile[position]) ** 2).reshape(
                branches, sources, branches
            )
            back[position] = candidates.argmin(0).reshape(edges)
            costs = candidates.min(0).reshape(edges)
        return costs, back

    def trace(back: np.ndarray, edge: int, positions: range) -> tuple[int, np.ndarray]:
        states = np.empty(exl3.TILE_LEN, dtype=np.int64)
        for position in positions:
            state = (int(back[position, edge]) << (16 - bits)) | edge
            states[position] = state
            edge = state >> bits
        return edge, states

    costs, back = forward(exl3.TILE_LEN // 2, None)
    edge, _ = trace(back, int(costs.argmin()), range(exl3.TILE_LEN // 2 - 1, -1, -1))
    _, back = forward(0, edge)
    return trace(back, edge, range(exl3.TILE_LEN - 1, -1, -1))[1]


def seconds(run, repeats: int = 3, cuda: bool = False) -> float:
    best = math.inf
    for _ in range(repeats):
        if cuda:
            torch.cuda.synchronize()
        start = time.perf_counter()
        run()
        if cuda:
            torch.cuda.synchronize()
        best = min(best, time.perf_counter() - start)
    return best


LAUNCHES = ((4, 512, 4), (4, 1024, 4), (2, 512, 4), (8, 512, 8))


def sweep(tiles: torch.Tensor, bits: int, codebook: str) -> dict[tuple[int, int, int], float]:
    """Seconds per tile of each Triton launch shape (tiles per program, edges per block, warps); all must give
    the same states."""
    times, reference = {}, None
    for launch in LAUNCHES:
        exl3.GPU_LAUNCH = launch
        states = exl3.viterbi(tiles[:64], bits, codebook)  # compiles, and checks
        reference = states if reference is None else reference
        assert torch.equal(states, reference), f"launch {launch} gives other states"
        times[launch] = seconds(lambda: exl3.viterbi(tiles, bits, codebook), repeats=1, cuda=True) / tiles.shape[0]
        print(f"launch {launch}: {1 / times[launch]:,.0f} tiles/s", flush=True)
    return times


def relative_error(rows: int, cols: int, bits: int, codebook: str, device: str, seed: int = 0) -> float:
    w = torch.randn(rows, cols, generator=torch.Generator().manual_seed(seed)).to(device)
    w_hat = exl3.dequantize(exl3.quantize(w, bits, codebook), (rows, cols))
    return (torch.linalg.norm(w_hat - w) / torch.linalg.norm(w)).item()


def calibrate(tiles: int, codebooks: tuple[str, ...], device: str) -> None:
    """Per codebook and K: the tile RMS with the least relative error on N(0, τ²) tiles (a grid, then a finer one)."""
    unit = torch.randn(tiles, exl3.TILE_LEN, generator=torch.Generator().manual_seed(1)).to(device)
    for codebook in codebooks:
        cb = exl3.codebook_values(codebook).to(device).float()
        best_by_bits = []
        for bits in exl3.BITS:

            def error(rms: float, bits: int = bits, codebook: str = codebook, cb: torch.Tensor = cb) -> float:
                x = unit * rms
                states = exl3.viterbi(x, bits, codebook)
                return (torch.linalg.norm(cb[states] - x) / torch.linalg.norm(x)).item()

            grid = {rms: error(rms) for rms in np.arange(0.4, 1.75, 0.15)}
            center = min(grid, key=grid.get)
            grid.update({rms: error(rms) for rms in (center - 0.075, center + 0.075)})
            best = min(grid, key=grid.get)
            best_by_bits.append(round(float(best), 2))
            print(f"{codebook} K={bits}: tile rms {best:.2f} -> {grid[best]:.4f}", flush=True)
        print(f'    "{codebook}": {tuple(best_by_bits)},', flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bits", type=int, default=4)
    parser.add_argument("--codebook", default="mul1", choices=exl3.CODEBOOKS)
    parser.add_argument("--cpu-tiles", type=int, default=32)
    parser.add_argument("--cuda-tiles", type=int, default=8192)
    parser.add_argument("--cuda-rows", type=int, default=4096, help="end-to-end quantize of a [rows, rows] matrix")
    parser.add_argument("--calibrate", action="store_true")
    parser.add_argument("--calibrate-tiles", type=int, default=16)
    parser.add_argument(
        "--cpu-done",
        type=Path,
        help="touch this file once the CPU timings are taken (a caller may load the CPU after that)",
    )
    args = parser.parse_args()
    cuda = torch.cuda.is_available()
    if args.calibrate:
        calibrate(args.calibrate_tiles, exl3.CODEBOOKS, "cuda" if cuda else "cpu")
        return

    bits, codebook = args.bits, args.codebook
    generator = torch.Generator().manual_seed(0)
    cb = exl3.codebook_values(codebook).double().numpy()
    tiles = torch.randn(max(args.cpu_tiles, BASELINE_TILES), exl3.TILE_LEN, generator=generator)
    baseline = (
        seconds(lambda: [numpy_viterbi(t, bits, cb) for t in tiles[:BASELINE_TILES].double().numpy()], repeats=1)
        / BASELINE_TILES
    )
    rows = [("numpy Viterbi, one tile at a time, 1 core (baseline)", 1 / baseline, 1.0)]
    threads = torch.get_num_threads()
    for count in sorted({1, threads}):
        torch.set_num_threads(count)
        cpu = seconds(lambda: exl3.viterbi(tiles[: args.cpu_tiles], bits, codebook), repeats=1) / args.cpu_tiles
        rows.append(
            (
                f"ours, torch on the CPU ({count} thread{'s' * (count > 1)}, {args.cpu_tiles} tiles)",
                1 / cpu,
                baseline / cpu,
            )
        )
    torch.set_num_threads(threads)
    if args.cpu_done:
        args.cpu_done.touch()
    if cuda:
        gpu_tiles = torch.randn(args.cuda_tiles, exl3.TILE_LEN, generator=generator).cuda()
        launches = sweep(gpu_tiles, bits, codebook)
        exl3.GPU_LAUNCH = min(launches, key=launches.get)
        gpu = seconds(lambda: exl3.viterbi(gpu_tiles, bits, codebook), cuda=True) / args.cuda_tiles
        label = f"ours, Triton on {torch.cuda.get_device_name()} ({args.cuda_tiles} tiles, launch {exl3.GPU_LAUNCH})"
        rows.append((label, 1 / gpu, baseline / gpu))
        w = torch.randn(args.cuda_rows, args.cuda_rows, generator=generator).cuda()
        exl3.quantize(w[:128, :128], bits, codebook)  # 64 tiles: the same specialization as the whole
        whole = seconds(lambda: exl3.quantize(w, bits, codebook), repeats=1, cuda=True)
        matrix_tiles = args.cuda_rows**2 // exl3.TILE_LEN
        rows.append(
            (
                f"ours, quantize() of a {args.cuda_rows}x{args.cuda_rows} matrix on CUDA, end to end",
                matrix_tiles / whole,
                baseline * matrix_tiles / whole,
            )
        )
    print(f"EXL3 encode, K={bits}, codebook {codebook}: tiles/s (256 weights a tile), ratio to the baseline\n")
    print("| encoder | tiles/s | x baseline |\n|---|---|---|")
    for label, rate, ratio in rows:
        print(f"| {label} | {rate:,.1f} | {ratio:,.1f}x |")
    if cuda:
        print(
            f"\n1 B parameters = {1e9 / exl3.TILE_LEN / 1e6:.1f} M tiles: {1e9 / exl3.TILE_LEN / rows[-1][1]:.0f} s "
            "at the end-to-end rate"
        )
        print(f"\nTriton search by K ({codebook}, {args.cuda_tiles // 2} tiles): ", end="")
        for k in exl3.BITS:
            exl3.viterbi(gpu_tiles[:64], k, codebook)  # compiles (Triton specializes on count % 16)
            half = gpu_tiles[: args.cuda_tiles // 2]
            rate = half.shape[0] / seconds(lambda k=k, half=half: exl3.viterbi(half, k, codebook), repeats=1, cuda=True)
            print(f"K={k} {rate:,.0f}/s", end="  ", flush=True)
        print()
    device = "cuda" if cuda else "cpu"
    size = 1024 if cuda else 128
    print(f"\nRelative Frobenius error ||W'-W||/||W|| on N(0,1) [{size}, {size}] ({device}):")
    for name in exl3.CODEBOOKS:
        print(f"  {name}: " + "  ".join(f"K={k} {relative_error(size, size, k, name, device):.4f}" for k in (2, 3, 4)))


if __name__ == "__main__":
    main()
