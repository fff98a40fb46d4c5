"""Programmatic dependent launch, with and without the weight prefetch, against plain launches
(runtime/kernels/triton_common.py PDL_MODES), on one GPU, in one run.

    PYTHONPATH=<a directory holding the repository as specpair> python3 benchmarks/pdl_gpu.py \
        [--only 8b,35b-nvfp4,35b-bf16] [--tokens 1,4,8,16] [--passes 4] [--out DIR]

Targets as benchmarks/step_profile.py builds them, random weights at real shape in GPU memory (8b: Qwen3-8B in
BF16; 35b-nvfp4: Qwen3.6-35B-A3B in NVIDIA's NVFP4 + FP8 layout; 35b-bf16: the same model in BF16). For each, after a
32-token prompt, steps of batch 1 and T tokens (T = 1: the decode step; T > 1: the forward of a verify block of T),
each captured into a CUDA graph and replayed 200 times, in each mode (plain launches; PDL; PDL and the matmuls'
weight prefetch) in passes that alternate the order (0 1 2, then 2 1 0: the GPU's clocks drift), a fresh capture
per pass. Prints ms per step (median of the passes), each mode's ratio to plain launches, and whether every mode
gave the plain launches' logits bit for bit. Writes pdl_gpu.md and pdl_gpu.json to --out (default $OUT, else the working directory).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from step_profile import CONFIGS, LAYOUTS, PROMPT, REPLAYS, random_fetch, seconds_per_replay  # noqa: E402

from specpair.checkpoint.config import parse_config  # noqa: E402
from specpair.runtime.generate import prefill  # noqa: E402
from specpair.runtime.graphs import ForwardGraph  # noqa: E402
from specpair.runtime.kernels import triton_common  # noqa: E402
from specpair.runtime.model import Transformer  # noqa: E402
from specpair.runtime.models import FAMILIES  # noqa: E402

CONFIG_FILES = {"8b": "Qwen__Qwen3-8B.json", "35b-nvfp4": "nvidia__Qwen3.6-35B-A3B-NVFP4.json"}
CONFIG_FILES["35b-bf16"] = CONFIG_FILES["35b-nvfp4"]


def build(which: str) -> Transformer:
    raw = json.loads((CONFIGS / CONFIG_FILES[which]).read_text())
    config = parse_config(raw, which)
    layouts: dict[str, str] = {}
    if which == "35b-nvfp4":
        quant = json.loads((CONFIGS / "nvidia__Qwen3.6-35B-A3B-NVFP4.hf_quant_config.json").read_text())
        layouts = {m: LAYOUTS[q["quant_algo"]] for m, q in quant["quantization"]["quantized_layers"].items()}
    fetch = random_fetch(layouts, torch.Generator("cuda").manual_seed(0))
    return Transformer.build(config, FAMILIES[config.family].decoder_layer, fetch, torch.bfloat16, torch.device("cuda"))


def timed(model: Transformer, prompt: list[int], tokens: int, mode: int) -> tuple[float, torch.Tensor]:
    """(seconds per replay, the step's logits) of a T-token step captured with launches of PDL mode `mode`."""
    triton_common.use_pdl(mode)
    try:
        cache = model.new_cache(1, PROMPT + tokens)
        prefill(model, cache, [prompt])
        ids = torch.arange(tokens, device="cuda")[None] % model.config.vocab_size
        positions = torch.arange(PROMPT, PROMPT + tokens, device="cuda")[None]
        step = ForwardGraph(model, cache, 1, tokens)
        step.prepare(ids, positions)
        logits = step(ids, positions).logits.clone()
        return seconds_per_replay(step), logits
    finally:
        triton_common.use_pdl(0)


def measure(which: str, tokens: list[int], passes: int) -> dict:
    model = build(which)
    prompt = torch.randint(0, 150000, (PROMPT,), generator=torch.Generator().manual_seed(1)).tolist()
    modes = sorted(triton_common.PDL_MODES)
    times: dict[tuple[int, int], list[float]] = {(t, m): [] for t in tokens for m in modes}
    same = {(t, m): True for t in tokens for m in modes}
    plain_logits: dict[int, torch.Tensor] = {}
    for n in range(passes):
        for mode in modes if n % 2 == 0 else modes[::-1]:
            for t in tokens:
                seconds, logits = timed(model, prompt, t, mode)
                times[t, mode].append(seconds)
                if t not in plain_logits:  # the first pass runs plain launches first
                    plain_logits[t] = logits
                same[t, mode] &= torch.equal(logits, plain_logits[t])
        print(f"{which}: pass {n + 1} of {passes}", file=sys.stderr, flush=True)
    del model
    torch.cuda.empty_cache()
    rows = []
    for t in tokens:
        ms = {m: statistics.median(times[t, m]) * 1e3 for m in modes}
        rows.append(
            {
                "tokens": t,
                "ms": {triton_common.PDL_MODES[m]: ms[m] for m in modes},
                "over_plain": {triton_common.PDL_MODES[m]: ms[m] / ms[0] for m in modes[1:]},
                "same_logits": all(same[t, m] for m in modes),
            }
        )
    return {"target": which, "rows": rows}


def markdown(results: list[dict], device: str) -> str:
    names = list(triton_common.PDL_MODES.values())
    lines = [
        f"# Programmatic dependent launch against plain launches (benchmarks/pdl_gpu.py)\n\nGPU: {device} · "
        f"torch {torch.__version__} · batch 1 after a {PROMPT}-token prompt, CUDA graphs, {REPLAYS} replays a pass\n",
        "| target | tokens a step | "
        + " | ".join(f"{n} ms" for n in names)
        + " | "
        + " | ".join(f"{n} / plain" for n in names[1:])
        + " | same logits |",
        "|---" * (3 + 2 * len(names) - 1) + "|",
    ]
    for r in results:
        for row in r["rows"]:
            cells = [f"{row['ms'][n]:.3f}" for n in names] + [f"{row['over_plain'][n]:.3f}" for n in names[1:]]
            lines.append(f"| {r['target']} | {row['tokens']} | " + " | ".join(cells) + f" | {row['same_logits']} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="8b,35b-nvfp4,35b-bf16")
    parser.add_argument("--tokens", default="1,4,8,16")
    parser.add_argument("--passes", type=int, default=4)
    parser.add_argument("--out", default=os.environ.get("OUT", "."))
    args = parser.parse_args()
    tokens = [int(t) for t in args.tokens.split(",")]
    results = []
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    device = torch.cuda.get_device_name()
    for which in args.only.split(","):
        results.append(measure(which, tokens, args.passes))
        (out / "pdl_gpu.json").write_text(json.dumps({"device": device, "results": results}, indent=1))
        (out / "pdl_gpu.md").write_text(markdown(results, device))
    print(markdown(results, device))


if __name__ == "__main__":
    main()
