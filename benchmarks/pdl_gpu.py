"""Programmatic dependent launch against plain launches (runtime/kernels/triton_common.py), on one GPU, in one run.

    PYTHONPATH=<a directory holding the repository as specpair> python3 benchmarks/pdl_gpu.py \
        [--only 8b,35b-nvfp4,35b-bf16] [--tokens 1,4,8,16] [--passes 4] [--out DIR]

Targets as benchmarks/step_profile.py builds them, random weights at real shape in GPU memory (8b: Qwen3-8B in
BF16; 35b-nvfp4: Qwen3.6-35B-A3B in NVIDIA's NVFP4 + FP8 layout; 35b-bf16: the same model in BF16). For each, after a
32-token prompt, steps of batch 1 and T tokens (T = 1: the decode step; T > 1: the forward of a verify block of T),
each captured into a CUDA graph and replayed 200 times, with the kernels launched plainly and with PDL in passes
that alternate the order (plain, PDL, then PDL, plain: the GPU's clocks drift), a fresh capture per pass. Prints
ms per step (median of the passes), PDL's ratio to plain launches, and whether both launches gave the same logits
bit for bit. Writes pdl_gpu.md and pdl_gpu.json to --out (default $OUT, else the working directory).
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

sys.path.insert(0, str(Path(__file__).resolve().parent))
from step_profile import CONFIGS, LAYOUTS, PROMPT, REPLAYS, random_fetch  # noqa: E402

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


def timed(model: Transformer, prompt: list[int], tokens: int, pdl: bool) -> tuple[float, torch.Tensor]:
    """(seconds per replay, the step's logits) of a T-token step captured with `pdl` launches."""
    triton_common.use_pdl(pdl)
    try:
        cache = model.new_cache(1, PROMPT + tokens)
        prefill(model, cache, [prompt])
        ids = torch.arange(tokens, device="cuda")[None] % model.config.vocab_size
        positions = torch.arange(PROMPT, PROMPT + tokens, device="cuda")[None]
        step = ForwardGraph(model, cache, 1, tokens)
        step.prepare(ids, positions)
        logits = step(ids, positions).logits.clone()
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(REPLAYS):
            step.graph.graph.replay()
        torch.cuda.synchronize()
        return (time.perf_counter() - start) / REPLAYS, logits
    finally:
        triton_common.use_pdl(False)


def measure(which: str, tokens: list[int], passes: int) -> dict:
    model = build(which)
    prompt = torch.randint(0, 150000, (PROMPT,), generator=torch.Generator().manual_seed(1)).tolist()
    times: dict[tuple[int, bool], list[float]] = {(t, p): [] for t in tokens for p in (False, True)}
    same = {t: True for t in tokens}
    plain_logits: dict[int, torch.Tensor] = {}
    for n in range(passes):
        for pdl in (False, True) if n % 2 == 0 else (True, False):
            for t in tokens:
                seconds, logits = timed(model, prompt, t, pdl)
                times[t, pdl].append(seconds)
                if pdl:  # the first pass runs plain first
                    same[t] &= torch.equal(logits, plain_logits[t])
                else:
                    plain_logits[t] = logits
        print(f"{which}: pass {n + 1} of {passes}", file=sys.stderr, flush=True)
    del model
    torch.cuda.empty_cache()
    rows = []
    for t in tokens:
        plain, pdl = (statistics.median(times[t, p]) * 1e3 for p in (False, True))
        rows.append({"tokens": t, "plain_ms": plain, "pdl_ms": pdl, "pdl_over_plain": pdl / plain, "same": same[t]})
    return {"target": which, "rows": rows}


def markdown(results: list[dict], device: str) -> str:
    lines = [
        f"# Programmatic dependent launch against plain launches (benchmarks/pdl_gpu.py)\n\nGPU: {device} · "
        f"torch {torch.__version__} · batch 1 after a {PROMPT}-token prompt, CUDA graphs, {REPLAYS} replays a pass\n",
        "| target | tokens a step | plain ms | PDL ms | PDL / plain | same logits |",
        "|---|---|---|---|---|---|",
    ]
    for r in results:
        for row in r["rows"]:
            lines.append(
                f"| {r['target']} | {row['tokens']} | {row['plain_ms']:.3f} | {row['pdl_ms']:.3f} | "
                f"{row['pdl_over_plain']:.3f} | {row['same']} |"
            )
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
