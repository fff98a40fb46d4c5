"""Where a decode step's time goes, kernel by kernel, on one GPU, beside the baselines measured in the same run.

    PYTHONPATH=<a directory holding the repository as specpair> python3 benchmarks/step_profile.py \
        [--only check-8b-f32,check-35b-f32,8b,35b-nvfp4,35b-bf16] [--out DIR] [--hf-tokens 32] [--tokens 4,16] \
        [--gpt-fast DIR]

Targets, random weights at real shape built in GPU memory through the runtime's own blocks (no checkpoint: a BF16
35B-A3B is 70 GB, more than the GPU machine's disk holds):
- 8b: Qwen/Qwen3-8B's config in BF16. The weights are those of a transformers Qwen3ForCausalLM built on the GPU,
  whose eager `generate` (greedy, batch 1, its own KV cache) on the same weights is the baseline.
- 35b-bf16: Qwen3.6-35B-A3B (nvidia/Qwen3.6-35B-A3B-NVFP4's config.json) in BF16, the weights and the baseline
  those of transformers' Qwen3_5MoeForCausalLM.
- 35b-nvfp4: the same model in NVIDIA's layout, module by module as its hf_quant_config.json says (routed and
  shared experts NVFP4; attention and the GDN's qkv, z and out projections FP8 per tensor; the rest BF16), encoded
  here with specpair's quantizers. Modules that read one input share their per-tensor scale, as ModelOpt's
  export makes them (it syncs q/k/v's and gate/up's amax for fused serving), so they fuse as they would in the
  published checkpoint.
For each: a decode step of batch 1 after a 32-token prompt, captured into a CUDA graph (runtime/graphs.py) and
replayed: ms per step, tok/s, and the ratio to the weights roofline (the bytes a step reads: every weight but the
embedding table, the top-k share of the routed experts; over the copy bandwidth measured in this run, and over
the nominal 4.8 TB/s). Then torch.profiler over 20 replays: per kernel, its launches and µs per step, and the gap
(step time less the time some kernel ran, the union of their intervals: the graph's launch latency between
kernels; "kernel ms" sums the kernels' own µs, which under programmatic dependent launch count a kernel's wait
for the one before it too). Checks, bitwise: the graph's logits
are the eager step's; a token decoded alone is the same inside a verify block of 8.
`--tokens T,...`: also a step of T tokens of one sequence (a verify step's shape), graphed and profiled the same
way, after the decode step (its kernels: a section of their own).
`--gpt-fast DIR`: the 8b's second baseline, gpt-fast (a checkout of pytorch-labs/gpt-fast; BSD-3, run beside, not
shipped): its model.py at Qwen3-8B's shape (it has no q/k norms: 147 KB fewer a step) with random BF16 weights, its
decode step compiled as its generate.py compiles it, timed in the same run against the same copy bandwidth.
Correctness first (check-8b-f32, check-35b-f32: the 8B, and the 35B-A3B's first four layers, in float32, against
transformers in float32 on the same weights: bf16 rounding would hide a wrong kernel among rounding differences).
Writes step_profile.md and step_profile.json to --out (default $OUT, else the working directory).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
import traceback
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import torch

from specpair.checkpoint.config import parse_config
from specpair.formats.codecs import codec
from specpair.formats.packed import Packed
from specpair.runtime.generate import prefill
from specpair.runtime.graphs import ForwardGraph
from specpair.runtime.kernels import linear
from specpair.runtime.model import Transformer
from specpair.runtime.models import FAMILIES

CONFIGS = Path(__file__).resolve().parents[1] / "catalog" / "sources" / "real-configs"
NOMINAL = 4.8e12  # H200 HBM, bytes/s
PROMPT = 32
REPLAYS = 200
PROFILED = 20
AMAX = 4.0  # one per-tensor amax for every quantized weight (values ~N(0, 1)): the shared scales of a fused export
MATMUL_KERNELS = ("_matmul_kernel", "_planes_kernel")  # one launch per linear.matmul / matmul_experts call
LAYOUTS = {"FP8": "fp8-tensor", "W4A16_NVFP4": "nvfp4-modelopt", "NVFP4": "nvfp4-modelopt"}


def copy_bandwidth() -> float:
    """Bytes read + written per second by torch's copy_ of 1 GiB, best of 20."""
    a = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    b = torch.empty_like(a)
    best = float("inf")
    for _ in range(20):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        b.copy_(a)
        end.record()
        end.synchronize()
        best = min(best, start.elapsed_time(end) / 1e3)
    return 2 * a.numel() / best


# ------------------------------------------------------------------------------------------------ weights


def hf_fetch(hf: torch.nn.Module, config) -> callable:
    """The runtime's canonical names (checkpoint/names.py) read from a transformers model's parameters: views,
    no copies; fused expert stacks ([E, 2I, H] gate_up_proj) give their halves."""
    params = dict(hf.named_parameters())

    def fetch(name: str, shape: tuple[int, ...], matmul: bool = False, fp32: bool = False):
        if name == "lm_head.weight":
            w = params["lm_head.weight"]
        elif ".mlp.experts." in name:
            layer, proj = re.match(r"layers\.(\d+)\.mlp\.experts\.(\w+)\.weight", name).groups()
            stack = f"model.layers.{layer}.mlp.experts."
            width = config.moe_intermediate_size
            if proj == "down_proj":
                w = params[stack + "down_proj"]
            else:
                w = (
                    params[stack + "gate_up_proj"][:, :width]
                    if proj == "gate_proj"
                    else params[stack + "gate_up_proj"][:, width:]
                )
        else:
            w = params["model." + name]
        w = w.detach()
        assert tuple(w.shape) == tuple(shape), (name, tuple(w.shape), shape)
        return w.float() if fp32 else w

    return fetch


def random_fetch(layouts: dict[str, str], gen: torch.Generator) -> callable:
    """Weights drawn here, matmul weights encoded in the layout `layouts` names for their module (BF16 otherwise);
    a stack of experts as one Packed with the expert axis in front."""

    def fetch(name: str, shape: tuple[int, ...], matmul: bool = False, fp32: bool = False):
        module = "model.language_model." + name.removesuffix(".weight")
        layout = layouts.get(re.sub(r"\.experts\.\w+$", ".experts", module), "bf16") if matmul else "bf16"
        if name.endswith("A_log"):
            return torch.empty(shape, device="cuda").uniform_(1, 16, generator=gen).log()
        if not matmul:  # zero-centred norms start at 0, the GDN's plain output gain and dt_bias at 1
            plain = name.endswith(("linear_attn.norm.weight", "dt_bias"))
            scale = 0.1 if "conv1d" in name else (0.0 if "norm" in name or plain else 0.02)
            w = torch.randn(shape, device="cuda", generator=gen) * scale + (1.0 if plain else 0.0)
            return w if fp32 else w.bfloat16()
        w = torch.randn(shape, device="cuda", generator=gen)
        if layout == "bf16":
            return (w * 0.02).bfloat16()
        c = codec(layout)
        parts = c.encode(w.reshape(-1, shape[-1]), name, AMAX if c.tensor_amax else None)
        if len(shape) == 3:  # one encode for the stack, every part given its expert axis
            parts = {
                k: p.expand(shape[0]).contiguous() if p.ndim == 0 else p.reshape(shape[0], -1, *p.shape[1:])
                for k, p in parts.items()
            }
        return Packed(name, layout, tuple(shape), parts)

    return fetch


def step_bytes(model: Transformer, tokens: int = 1) -> float:
    """Bytes a step of `tokens` tokens reads: every weight once but the embedding table (a row a token, left
    out) and, of the routed experts, the share its tokens touch (ModelConfig.experts_touched; a shared expert
    kept as the last of a stack, wholly)."""
    config = model.config
    touched = config.experts_touched(tokens) if config.num_experts else 1.0
    seen: set[int] = set()
    total = 0.0

    def nbytes(w) -> int:
        tensors = list(w.parts.values()) if isinstance(w, Packed) else [w]
        fresh = [t for t in tensors if t.data_ptr() not in seen]
        seen.update(t.data_ptr() for t in fresh)
        return sum(t.nbytes for t in fresh)

    def walk(obj, share: float = 1.0) -> None:
        nonlocal total
        if isinstance(obj, (torch.Tensor, Packed)):
            total += nbytes(obj) * share
        elif isinstance(obj, (list, tuple)):
            for x in obj:
                walk(x, share)
        elif hasattr(obj, "__dict__") and not isinstance(obj, torch.nn.Module):
            # a MoE's stacks: the touched share of E experts, of E + 1 where the shared expert is the last of them
            extra = int(getattr(obj, "shared_id", None) is not None)
            for key, x in vars(obj).items():
                routed = key in ("gate_up", "down_proj") and hasattr(obj, "router")
                walk(x, (config.num_experts * touched + extra) / (config.num_experts + extra) if routed else share)

    seen.add(model.embed_tokens.data_ptr())
    walk(model.layers)
    walk(model.norm)
    walk(model.lm_head)
    return total


def matmul_call(w, expert_ids: torch.Tensor | None) -> dict:
    """A matmul call's weight (layout and shape) and the bytes it reads: the whole weight, or of a stack of
    experts the distinct experts its tokens name."""
    layout = w.layout if isinstance(w, Packed) else str(w.dtype).removeprefix("torch.")
    n, k = w.shape[-2:]
    if expert_ids is None:
        return {"weight": f"{layout} {n}x{k}", "bytes": w.nbytes}
    experts, touched = w.shape[0], int(expert_ids.unique().numel())
    return {
        "weight": f"{layout} {experts} experts of {n}x{k}, {touched} touched",
        "bytes": w.nbytes * touched / experts,
    }


@contextmanager
def recorded_matmuls() -> Iterator[list[dict]]:
    """The matmul calls made inside, in order (matmul_call of each); each is one launch of a MATMUL_KERNELS
    kernel, so they pair with a profiled step's launches of those kernels in order."""
    calls: list[dict] = []
    plain, routed = linear.matmul, linear.matmul_experts

    def plain_call(x, w, unsummed=False):
        calls.append(matmul_call(w, None))
        return plain(x, w, unsummed=unsummed)

    def routed_call(x, w, expert_ids, **options):
        calls.append(matmul_call(w, expert_ids))
        return routed(x, w, expert_ids, **options)

    linear.matmul, linear.matmul_experts = plain_call, routed_call
    try:
        yield calls
    finally:
        linear.matmul, linear.matmul_experts = plain, routed


def matmuls_by_weight(calls: list[dict], launch_us: list[float], bandwidth: float) -> list[dict]:
    """Each kind of weight's calls in one step (paired in order with the step's matmul launches): µs, bytes read
    and the share of copy bandwidth they reach, the slowest in all first."""
    groups: dict[str, dict] = {}
    for call, us in zip(calls, launch_us, strict=True):
        g = groups.setdefault(call["weight"], {"weight": call["weight"], "calls": 0, "us": 0.0, "bytes": 0.0})
        g["calls"] += 1
        g["us"] += us
        g["bytes"] += call["bytes"]
    for g in groups.values():
        g["of_copy"] = g["bytes"] / (g["us"] * 1e-6) / bandwidth
    return sorted(groups.values(), key=lambda g: -g["us"])


# ------------------------------------------------------------------------------------------------ runs


def hf_rate(hf: torch.nn.Module, prompt: list[int], tokens: int) -> float:
    ids = torch.tensor([prompt], device="cuda")
    with torch.no_grad():
        hf.generate(ids, max_new_tokens=4, do_sample=False)
        torch.cuda.synchronize()
        start = time.perf_counter()
        out = hf.generate(ids, max_new_tokens=tokens, min_new_tokens=tokens, do_sample=False)
        torch.cuda.synchronize()
    return (out.shape[1] - len(prompt)) / (time.perf_counter() - start)


def seconds_per_replay(step: ForwardGraph) -> float:
    """A captured step replayed REPLAYS times back to back: seconds a replay."""
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(REPLAYS):
        step.graph.graph.replay()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / REPLAYS


def profile_graph(step: ForwardGraph) -> dict:
    """ms a replay of a captured step, and per kernel its launches and µs per replay under torch.profiler."""
    step_s = seconds_per_replay(step)
    return {"step_ms": step_s * 1e3, **profiled(step.graph.graph.replay, PROFILED)}


def kernel_name(event) -> str:
    """A profiled kernel's name without its argument list."""
    return re.sub(r"\(.*", "", event.name)


def kernel_totals(prof: torch.profiler.profile) -> dict[str, tuple[int, float]]:
    """Per kernel of a finished profile (its name up to the template arguments): launches and device µs, summed."""
    kernels: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            name = kernel_name(event)[:60]
            kernels[name][0] += 1
            kernels[name][1] += event.device_time_total
    return {n: (int(c), us) for n, (c, us) in kernels.items()}


def busy_us(intervals: list[tuple[float, float]]) -> float:
    """µs some interval covers: the union's length. Under programmatic dependent launch a kernel starts before the
    one it follows has ended and waits in place, so the kernels' own µs, summed, count the overlap twice."""
    busy, reach = 0.0, float("-inf")
    for start, end in sorted(intervals):
        if end > reach:
            busy += end - max(start, reach)
            reach = end
    return busy


def device_intervals(prof: torch.profiler.profile) -> list[tuple[float, float]]:
    """(start, end) µs of every kernel and copy of a finished profile."""
    return [
        (event.time_range.start, event.time_range.end)
        for event in prof.events()
        if event.device_type == torch.autograd.DeviceType.CUDA
    ]


def profiled(run: Callable[[], object], times: int) -> dict:
    """`run` called `times` times under torch.profiler: per kernel its launches and µs a call, and each matmul
    launch of a call in order, averaged over the calls."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(times):
            run()
        torch.cuda.synchronize()
    matmuls: list[tuple[float, float]] = []  # (start, µs) of each matmul launch
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA and kernel_name(event) in MATMUL_KERNELS:
            matmuls.append((event.time_range.start, event.device_time_total))
    per_call = {n: (c / times, us / times) for n, (c, us) in kernel_totals(prof).items()}
    matmuls.sort()
    launches = len(matmuls) // times
    matmul_us = [sum(us for _, us in matmuls[i::launches]) / times for i in range(launches)] if launches else []
    return {
        "kernels": {n: {"launches": c, "us": us} for n, (c, us) in sorted(per_call.items(), key=lambda kv: -kv[1][1])},
        "kernel_us": sum(us for _, us in per_call.values()),
        "busy_us": busy_us(device_intervals(prof)) / times,
        "launches": sum(c for c, _ in per_call.values()),
        "matmul_us": matmul_us,
    }


def profile_step(model: Transformer, prompt: list[int], bandwidth: float, tokens: list[int]) -> dict:
    cache = model.new_cache(1, 256)
    token = model.head(prefill(model, cache, [prompt])).argmax(-1)[:, None]
    position = torch.tensor([[len(prompt)]], device="cuda")
    # the eager step as a verify step rolled back to nothing: the graph's step then starts from the same state
    with recorded_matmuls() as calls:
        out = model.forward(token, position, cache, verify=True)
    eager = out.logits.clone()
    out.pending.discard()
    decode = ForwardGraph(model, cache, 1, 1)
    decode.prepare(token, position)
    graphed = decode(token, position).logits.clone()
    profiled = profile_graph(decode)
    del decode
    wider = {}
    for t in tokens:  # steps of t tokens, as a verify step of t, each replay from the same cache
        block = torch.randint(0, model.config.vocab_size, (1, t), device="cuda")
        rows = torch.arange(len(prompt), len(prompt) + t, device="cuda")[None]
        step = ForwardGraph(model, cache, 1, t)
        step.prepare(block, rows)
        step(block, rows)
        wider[t] = profile_graph(step) | {"bytes_per_step": step_bytes(model, t)}
        del step

    # a token decoded alone vs inside a verify block of 8 (same cache contents before both)
    follow = torch.randint(0, model.config.vocab_size, (1, 8), device="cuda")
    block_cache = model.new_cache(1, 256)
    prefill(model, block_cache, [prompt])
    block = model.forward(follow, torch.arange(len(prompt), len(prompt) + 8, device="cuda")[None], block_cache).logits
    alone_cache = model.new_cache(1, 256)
    prefill(model, alone_cache, [prompt])
    alone = torch.cat(
        [
            model.forward(follow[:, t : t + 1], torch.tensor([[len(prompt) + t]], device="cuda"), alone_cache).logits
            for t in range(8)
        ],
        dim=1,
    )
    read = step_bytes(model)
    if len(calls) != len(profiled["matmul_us"]):
        raise RuntimeError(f"the eager step made {len(calls)} matmul calls, the graph {len(profiled['matmul_us'])}")
    return {
        **profiled,
        "matmuls": matmuls_by_weight(calls, profiled["matmul_us"], bandwidth),
        "tokens_per_s": 1e3 / profiled["step_ms"],
        "bytes_per_step": read,
        "roofline_copy": bandwidth / read,
        "roofline_nominal": NOMINAL / read,
        "steps_of_tokens": wider,
        "graph_equals_eager": torch.equal(graphed, eager),
        "alone_equals_block_of_8": torch.equal(alone, block),
    }


def gpt_fast_rate(checkout: Path, config, prompt: list[int], steps: int = 100) -> dict:
    """gpt-fast's decode at a dense target's shape: its model.py from `checkout`, random BF16 weights, its decode
    step compiled as its generate.py compiles it (inductor's coordinate-descent tuning, mode="reduce-overhead",
    fullgraph), the next token by argmax (its greedy pick; its sampler draws). tok/s over `steps` steps after a
    warm-up of three, and the bytes a step reads (every parameter but the embedding table, and the K/V cache it
    attends over: all of max_seq_length under its mask)."""
    import importlib.util

    import torch._inductor.config as inductor

    spec = importlib.util.spec_from_file_location("gpt_fast_model", checkout / "model.py")
    gf = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = gf  # dynamo imports a traced function's module by name
    spec.loader.exec_module(gf)
    inductor.coordinate_descent_tuning = True
    inductor.triton.unique_kernel_names = True
    length = len(prompt) + steps + 8
    args = gf.ModelArgs(
        block_size=length,
        n_layer=config.num_layers,
        n_head=config.num_heads,
        n_local_heads=config.num_kv_heads,
        dim=config.hidden_size,
        intermediate_size=config.intermediate_size,
        vocab_size=config.vocab_size,
        rope_base=config.rope_theta,
        norm_eps=config.rms_norm_eps,
    )
    if args.head_dim != config.head_dim:
        raise ValueError(f"gpt-fast's head_dim {args.head_dim} (dim / heads) is not the target's {config.head_dim}")
    with torch.device("cuda"):
        model = gf.Transformer(args).to(torch.bfloat16).eval()
        model.setup_caches(max_batch_size=1, max_seq_length=length)
    weights = sum(p.nbytes for n, p in model.named_parameters() if not n.startswith("tok_embeddings"))
    caches = sum(b.nbytes for n, b in model.named_buffers() if n.endswith(("k_cache", "v_cache")))

    def decode_one_token(model: torch.nn.Module, x: torch.Tensor, input_pos: torch.Tensor) -> torch.Tensor:
        return model(x, input_pos)[:, -1].argmax(-1, keepdim=True)

    decode = torch.compile(decode_one_token, mode="reduce-overhead", fullgraph=True)
    with torch.no_grad():
        token = model(torch.tensor([prompt], device="cuda"), torch.arange(len(prompt), device="cuda"))
        token = token[:, -1].argmax(-1, keepdim=True)
        position = torch.tensor([len(prompt)], device="cuda")
        start = time.perf_counter()
        for _ in range(3):  # compiles, then records its CUDA graph
            token = decode(model, token, position).clone()
            position += 1
        torch.cuda.synchronize()
        compile_s = time.perf_counter() - start
        start = time.perf_counter()
        for _ in range(steps):
            token = decode(model, token, position).clone()
            position += 1
        torch.cuda.synchronize()
        step_s = (time.perf_counter() - start) / steps
    del model, decode
    torch.cuda.empty_cache()
    return {
        "step_ms": step_s * 1e3,
        "tokens_per_s": 1 / step_s,
        "bytes_per_step": weights + caches,
        "weight_bytes": weights,
        "compile_s": compile_s,
        "torch": torch.__version__,
    }


def check_float32(which: str, prompt: list[int]) -> dict:
    """Ours against transformers in float32 on the GPU, on the same weights: every kernel's arithmetic (the fused
    projections, rotary and cache write, MoE routing and combination, GDN conv and gates) against theirs, where
    bf16 rounding would hide a wrong result among rounding differences. The prompt's logits, and 8 more tokens
    decoded through the CUDA graph, each against transformers' forward of the whole sequence."""
    import transformers

    if which == "check-8b-f32":
        raw, hf_cls = json.loads((CONFIGS / "Qwen__Qwen3-8B.json").read_text()), "Qwen3ForCausalLM"
    else:  # the 35B-A3B's first four layers: three GDN layers and one full-attention layer, MoE in each
        raw, hf_cls = json.loads((CONFIGS / "nvidia__Qwen3.6-35B-A3B-NVFP4.json").read_text()), "Qwen3_5MoeForCausalLM"
        text = raw["text_config"]
        text["num_hidden_layers"], text["layer_types"] = 4, text["layer_types"][:4]
    text = raw.get("text_config", raw)
    config = parse_config(raw, which)
    hf_config = getattr(transformers, hf_cls).config_class(**{k: v for k, v in text.items() if k != "architectures"})
    hf_config._attn_implementation = "eager"
    with torch.device("cuda"):
        hf = getattr(transformers, hf_cls)(hf_config).eval()
    follow = torch.randint(0, 150000, (8,), generator=torch.Generator().manual_seed(3)).tolist()
    with torch.no_grad():
        theirs = hf(torch.tensor([prompt + follow], device="cuda")).logits
    model = Transformer.build(
        config, FAMILIES[config.family].decoder_layer, hf_fetch(hf, config), torch.float32, torch.device("cuda")
    )
    cache = model.new_cache(1, 64)
    ours = [model.head(prefill(model, cache, [prompt]))[:, None]]
    decode = ForwardGraph(model, cache, 1, 1)
    for t, token in enumerate(follow):
        ids, position = torch.tensor([[token]], device="cuda"), torch.tensor([[len(prompt) + t]], device="cuda")
        if t == 0:
            decode.prepare(ids, position)
        ours.append(decode(ids, position).logits.clone())
    ours = torch.cat(ours, dim=1)[:, :-1]
    expected = theirs[:, len(prompt) - 1 : len(prompt) - 1 + len(follow)]
    result = {
        "target": which,
        "max_abs_diff": float((ours - expected).abs().max()),
        "logit_scale": float(expected.abs().max()),
        "top1_agreement": float((ours.argmax(-1) == expected.argmax(-1)).float().mean()),
        "prompt_max_abs_diff": float(
            (
                model.forward(
                    torch.tensor([prompt], device="cuda"),
                    torch.arange(len(prompt), device="cuda")[None],
                    model.new_cache(1, 64),
                ).logits
                - theirs[:, : len(prompt)]
            )
            .abs()
            .max()
        ),
    }
    del model, hf
    torch.cuda.empty_cache()
    return result


def target(
    which: str, prompt: list[int], hf_tokens: int, bandwidth: float, tokens: list[int], gpt_fast: Path | None
) -> dict:
    gen = torch.Generator("cuda").manual_seed(0)
    if which == "8b":
        raw = json.loads((CONFIGS / "Qwen__Qwen3-8B.json").read_text())
        hf_cls = "Qwen3ForCausalLM"
    else:
        raw = json.loads((CONFIGS / "nvidia__Qwen3.6-35B-A3B-NVFP4.json").read_text())
        hf_cls = "Qwen3_5MoeForCausalLM"
    config = parse_config(raw, which)
    result: dict = {"target": which, "family": config.family}
    if which == "35b-nvfp4":
        quant = json.loads((CONFIGS / "nvidia__Qwen3.6-35B-A3B-NVFP4.hf_quant_config.json").read_text())
        layouts = {m: LAYOUTS[q["quant_algo"]] for m, q in quant["quantization"]["quantized_layers"].items()}
        fetch = random_fetch(layouts, gen)
    else:
        import transformers

        text = raw.get("text_config", raw)
        hf_config = getattr(transformers, hf_cls).config_class(
            **{k: v for k, v in text.items() if k != "architectures"}
        )
        hf_config._attn_implementation = "eager"
        with torch.device("cuda"):
            torch.set_default_dtype(torch.bfloat16)
            hf = getattr(transformers, hf_cls)(hf_config).eval()
            torch.set_default_dtype(torch.float32)
        result["transformers"] = {"version": transformers.__version__, "tokens_per_s": hf_rate(hf, prompt, hf_tokens)}
        with torch.no_grad():
            hf_logits = hf(torch.tensor([prompt], device="cuda")).logits.float()
        fetch = hf_fetch(hf, config)
    model = Transformer.build(
        config, FAMILIES[config.family].decoder_layer, fetch, torch.bfloat16, torch.device("cuda")
    )
    if which != "35b-nvfp4":
        del hf
        if gpt_fast is not None and which == "8b":  # a dense model: gpt-fast's model.py runs its shape
            torch.cuda.empty_cache()
            result["gpt_fast"] = gpt_fast_rate(gpt_fast, config, prompt)
        cache = model.new_cache(1, PROMPT)
        ours = model.forward(torch.tensor([prompt], device="cuda"), torch.arange(PROMPT, device="cuda")[None], cache)
        ours = ours.logits.float()
        result["vs_transformers_logits"] = {  # the same weights: what the fused kernels compute, against theirs
            "max_abs_diff": float((ours - hf_logits).abs().max()),
            "logit_scale": float(hf_logits.abs().max()),
            "top1_agreement": float((ours.argmax(-1) == hf_logits.argmax(-1)).float().mean()),
        }
    torch.cuda.empty_cache()
    result.update(profile_step(model, prompt, bandwidth, tokens))
    result["peak_gpu_gb"] = torch.cuda.max_memory_allocated() / 1e9
    if "transformers" in result:
        result["vs_transformers"] = result["tokens_per_s"] / result["transformers"]["tokens_per_s"]
    if "gpt_fast" in result:
        result["vs_gpt_fast"] = result["tokens_per_s"] / result["gpt_fast"]["tokens_per_s"]
    del model
    torch.cuda.empty_cache()
    return result


def kernel_rows(step: dict) -> list[str]:
    return [
        f"| `{name}` | {k['launches']:.0f} | {k['us']:.1f} | {k['us'] / (step['step_ms'] * 1e3):.1%} |"
        for name, k in step["kernels"].items()
    ]


def report(results: list[dict], checks: list[dict], bandwidth: float) -> str:
    lines = [
        "# One decode step, kernel by kernel (benchmarks/step_profile.py)",
        "",
        f"GPU: {torch.cuda.get_device_name()} · torch {torch.__version__} · copy bandwidth measured here "
        f"{bandwidth / 1e12:.2f} TB/s (nominal {NOMINAL / 1e12:.1f}) · batch 1, position {PROMPT}, CUDA graph",
        "",
        "| target | tok/s | step ms | GB read/step | of roofline (copy) | of roofline (nominal) | launches | kernel ms | gap ms | transformers tok/s | × transformers | graph = eager | alone = block |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        hf = r.get("transformers")
        lines.append(
            f"| {r['target']} | {r['tokens_per_s']:.1f} | {r['step_ms']:.3f} | {r['bytes_per_step'] / 1e9:.2f} | "
            f"{r['tokens_per_s'] / r['roofline_copy']:.1%} | {r['tokens_per_s'] / r['roofline_nominal']:.1%} | "
            f"{r['launches']:.0f} | {r['kernel_us'] / 1e3:.3f} | {r['step_ms'] - r['busy_us'] / 1e3:.3f} | "
            f"{hf['tokens_per_s']:.1f} | {r['vs_transformers']:.1f}× | {r['graph_equals_eager']} | {r['alone_equals_block_of_8']} |"
            if hf
            else f"| {r['target']} | {r['tokens_per_s']:.1f} | {r['step_ms']:.3f} | {r['bytes_per_step'] / 1e9:.2f} | "
            f"{r['tokens_per_s'] / r['roofline_copy']:.1%} | {r['tokens_per_s'] / r['roofline_nominal']:.1%} | "
            f"{r['launches']:.0f} | {r['kernel_us'] / 1e3:.3f} | {r['step_ms'] - r['busy_us'] / 1e3:.3f} | - | - | "
            f"{r['graph_equals_eager']} | {r['alone_equals_block_of_8']} |"
        )
    beside = [r for r in results if "gpt_fast" in r]
    if beside:  # each against its own bytes a step, at the copy bandwidth of this run
        lines += [
            "",
            "Beside gpt-fast (its model.py at the target's shape, compiled as its generate.py compiles it):",
            "",
            "| target | tok/s | of roofline (copy) | gpt-fast tok/s | its GB read/step | its share of copy | × gpt-fast |",
            "|---|---|---|---|---|---|---|",
        ]
        for r in beside:
            g = r["gpt_fast"]
            lines.append(
                f"| {r['target']} | {r['tokens_per_s']:.1f} | {r['tokens_per_s'] / r['roofline_copy']:.1%} | "
                f"{g['tokens_per_s']:.1f} | {g['bytes_per_step'] / 1e9:.2f} | "
                f"{g['bytes_per_step'] / bandwidth * g['tokens_per_s']:.1%} | {r['vs_gpt_fast']:.2f}× |"
            )
    wider = [(r, t, step) for r in results for t, step in r.get("steps_of_tokens", {}).items()]
    if wider:  # a verify step against its own roofline, beside the decode step's share of its roofline
        lines += [
            "",
            "Steps of T tokens of one sequence (a verify step's shape), each against the bytes its tokens read:",
            "",
            "| target | T | step ms | × decode step | GB read/step | × decode bytes | of roofline (copy) | ÷ decode's share |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for r, t, step in wider:
            share = step["bytes_per_step"] / bandwidth / (step["step_ms"] / 1e3)
            decode_share = r["bytes_per_step"] / bandwidth / (r["step_ms"] / 1e3)
            lines.append(
                f"| {r['target']} | {t} | {step['step_ms']:.3f} | {step['step_ms'] / r['step_ms']:.2f} | "
                f"{step['bytes_per_step'] / 1e9:.2f} | {step['bytes_per_step'] / r['bytes_per_step']:.2f} | "
                f"{share:.1%} | {share / decode_share:.2f} |"
            )
    for r in results:
        lines += [
            "",
            f"## {r['target']}: kernels of one step",
            "",
            "| kernel | launches | µs | share |",
            "|---|---|---|---|",
        ]
        lines += kernel_rows(r)
        lines += [
            "",
            f"## {r['target']}: the matmuls of one step, by weight (bytes: the weight, or the experts touched)",
            "",
            "| weight | calls | µs | share of step | MB read | of copy bandwidth |",
            "|---|---|---|---|---|---|",
        ]
        lines += [
            f"| {g['weight']} | {g['calls']} | {g['us']:.1f} | {g['us'] / (r['step_ms'] * 1e3):.1%} | "
            f"{g['bytes'] / 1e6:.1f} | {g['of_copy']:.1%} |"
            for g in r["matmuls"]
        ]
        for t, step in r.get("steps_of_tokens", {}).items():
            lines += [
                "",
                f"## {r['target']}: kernels of a step of {t} tokens ({step['step_ms']:.3f} ms, "
                f"{step['launches']:.0f} launches)",
                "",
                "| kernel | launches | µs | share |",
                "|---|---|---|---|",
            ]
            lines += kernel_rows(step)
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="check-8b-f32,check-35b-f32,8b,35b-nvfp4,35b-bf16")
    parser.add_argument("--out", default=os.environ.get("OUT", "."))
    parser.add_argument("--hf-tokens", type=int, default=32)
    parser.add_argument("--tokens", default="", help="also steps of these many tokens (a verify step's shape)")
    parser.add_argument("--gpt-fast", type=Path, help="a checkout of pytorch-labs/gpt-fast: the 8b beside it")
    args = parser.parse_args()
    bandwidth = copy_bandwidth()
    prompt = torch.randint(0, 150000, (PROMPT,), generator=torch.Generator().manual_seed(1)).tolist()
    tokens = [int(t) for t in args.tokens.split(",") if t]
    results, checks = [], []
    for which in args.only.split(","):
        start = time.perf_counter()
        try:
            if which.startswith("check-"):
                checks.append(check_float32(which, prompt))
                print(json.dumps(checks[-1]), file=sys.stderr, flush=True)
                continue
            results.append(target(which, prompt, args.hf_tokens, bandwidth, tokens, args.gpt_fast))
        except Exception:  # report it and go on to the next target: one run of the GPU machine serves them all
            traceback.print_exc()
            continue
        results[-1]["wall_s"] = time.perf_counter() - start
        print(
            json.dumps(
                {
                    k: v
                    for k, v in results[-1].items()
                    if k not in ("kernels", "steps_of_tokens", "matmuls", "matmul_us")
                }
            ),
            file=sys.stderr,
            flush=True,
        )
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    document = {"copy_bandwidth": bandwidth, "results": results, "float32_checks": checks}
    (out / "step_profile.json").write_text(json.dumps(document, indent=1))
    (out / "step_profile.md").write_text(report(results, checks, bandwidth))
    print(report(results, checks, bandwidth))


if __name__ == "__main__":
    main()
