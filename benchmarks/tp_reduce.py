"""The cost of tensor parallelism's exact reduce (runtime/parallel.py `Parallel.reduce`: all_gather of every rank's
partial, then a float32 sum in rank order) against the baseline `dist.all_reduce`, in the same run, on gloo (CPU).

    PYTHONPATH=<a directory holding the repository as specpair> python3 benchmarks/tp_reduce.py \
        [--sizes 2,4] [--hidden 576,1024,2048,4096] [--rows 1,8,16] [--iters 200] [--out FILE.md]

Messages are [rows, hidden] float32 (the CPU runtime's dtype): 1 row is a decode step's, 8 and 16 a verify step's.
Each size starts its ranks with runtime/parallel.py's `launch`; for every message the ranks time `iters` calls of each
operation (after a barrier and 20 warm-up calls) five times, alternating the two, and rank 0 prints the median
microseconds per call and their ratio. NCCL on GPUs is not measured here: it needs 2 GPUs on one host.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

from specpair.runtime.parallel import Parallel, launch

REPEATS = 5
WARMUP = 20


def timed(operation, x: torch.Tensor, iters: int) -> float:
    """Microseconds per call of `operation(x)` over `iters` calls, every rank starting together."""
    dist.barrier()
    start = time.perf_counter()
    for _ in range(iters):
        operation(x)
    return (time.perf_counter() - start) / iters * 1e6


def worker(args: argparse.Namespace) -> None:
    torch.set_num_threads(1)
    parallel = Parallel.from_environment("cpu")
    ordered = parallel.reduce

    def all_reduce(x: torch.Tensor) -> torch.Tensor:
        y = x.clone()  # the runtime's partial stays as it was, as with `reduce`
        dist.all_reduce(y)
        return y

    rows = []
    for hidden in args.hidden:
        for count in args.rows:
            x = torch.randn(count, hidden, generator=torch.Generator().manual_seed(parallel.rank))
            for operation in (ordered, all_reduce):
                for _ in range(WARMUP):
                    operation(x)
            times: dict[str, list[float]] = {"ordered": [], "all_reduce": []}
            for _ in range(REPEATS):
                times["ordered"].append(timed(ordered, x, args.iters))
                times["all_reduce"].append(timed(all_reduce, x, args.iters))
            row = {"hidden": hidden, "rows": count, **{k: statistics.median(v) for k, v in times.items()}}
            rows.append(row)
    if parallel.rank == 0:
        print(json.dumps(rows))
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="2,4")
    parser.add_argument("--hidden", default="576,1024,2048,4096")
    parser.add_argument("--rows", default="1,8,16")
    parser.add_argument("--iters", type=int, default=200)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    args.hidden = [int(h) for h in args.hidden.split(",")]
    args.rows = [int(r) for r in args.rows.split(",")]
    if args.worker:
        worker(args)
        return
    lines = [
        "# Tensor parallelism: the rank-order reduce against all_reduce (gloo, CPU)",
        "",
        f"`python benchmarks/tp_reduce.py --sizes {args.sizes} --iters {args.iters}` on {os.cpu_count()} CPU cores "
        "(shared with other work: absolute times are noisy, the ratio is measured alternating in the same run). "
        "Microseconds per call, median of 5; float32 messages [rows, hidden]. ordered = `Parallel.reduce` "
        "(all_gather + float32 sum in rank order), baseline = `dist.all_reduce`.",
        "",
        "| ranks | hidden | rows | all_reduce us | ordered us | ordered / all_reduce |",
        "| ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for size in (int(s) for s in args.sizes.split(",")):
        command = [sys.executable, __file__, "--worker", "--hidden", ",".join(map(str, args.hidden))]
        command += ["--rows", ",".join(map(str, args.rows)), "--iters", str(args.iters)]
        read, write = os.pipe()
        saved = os.dup(1)
        os.dup2(write, 1)  # rank 0 keeps this process's stdout: catch its JSON line
        try:
            code, _, failure = launch(command, size)
        finally:
            os.dup2(saved, 1)
            os.close(write)
        output = os.read(read, 1 << 20).decode()
        os.close(read)
        if code:
            raise SystemExit(failure)
        for row in json.loads(output.strip().splitlines()[-1]):
            ratio = row["ordered"] / row["all_reduce"]
            lines.append(
                f"| {size} | {row['hidden']} | {row['rows']} | {row['all_reduce']:.1f} | {row['ordered']:.1f} "
                f"| {ratio:.2f}x |"
            )
            print(lines[-1], flush=True)
    lines += [
        "",
        "NCCL (GPU) figures need 2 GPUs of one host (`nvidia-h200-x2`), not lent to this session: not measured.",
    ]
    text = "\n".join(lines) + "\n"
    if args.out:
        args.out.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
