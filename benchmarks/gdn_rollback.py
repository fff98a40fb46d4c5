"""Rolling Gated DeltaNet state back after a verify step: per-position state slots vs replay (the runtime's
design, runtime/cache.py), memory and time, against a verify step that cannot roll back.

    OMP_NUM_THREADS=1 python benchmarks/gdn_rollback.py [--device cpu|cuda] [--scale 4] [--block 16] [--batch 1]

One round = a verify step of `--block` tokens through the recurrence of every GDN layer, then a commit that
keeps `accepted` of them, for accepted = 0, 1, T/2, T-1, T. Baseline: the same recurrence with no rollback
support. Slots: the recurrence also writes the state after every token (`step_states`, as vLLM keeps them),
plus a copy of the state before the step for accepted = 0; commit gathers slot accepted-1. Replay:
runtime/cache.py itself (Cache.begin / gdn_state, the Pending's commit): the step leaves the state unwritten;
commit reruns the recurrence over each sequence's kept tokens from it. Both end in the
same state, bit for bit (checked). The shape is Qwen3.6-35B-A3B's (30 GDN layers, 16 key / 32 value heads of
128) divided by `--scale` in heads and head size (1: the real shape). Memory is what each design adds to the
state the cache holds anyway.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import time
from pathlib import Path

import torch

from specpair.checkpoint.config import ModelConfig, parse_config
from specpair.runtime.cache import Cache, GDNInputs
from specpair.runtime.kernels import gdn

CONFIG = (
    Path(__file__).resolve().parent.parent
    / "catalog"
    / "sources"
    / "real-configs"
    / "nvidia__Qwen3.6-35B-A3B-NVFP4.json"
)
MiB = 2**20


def qwen36_shape(scale: int) -> ModelConfig:
    config = parse_config(json.loads(CONFIG.read_text()), str(CONFIG))
    return dataclasses.replace(
        config,
        linear_num_key_heads=config.linear_num_key_heads // scale,
        linear_num_value_heads=config.linear_num_value_heads // scale,
        linear_key_head_dim=config.linear_key_head_dim // scale,
        linear_value_head_dim=config.linear_value_head_dim // scale,
    )


@dataclasses.dataclass
class Inputs:
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    g: torch.Tensor
    beta: torch.Tensor
    columns: torch.Tensor  # conv window + the step's projections, as a verify step keeps them


def random_inputs(config: ModelConfig, batch: int, block: int, device: str, dtype: torch.dtype) -> Inputs:
    hk, hv = config.linear_num_key_heads, config.linear_num_value_heads
    dk, dv = config.linear_key_head_dim, config.linear_value_head_dim
    gen = torch.Generator(device).manual_seed(0)

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen, device=device)

    taps = config.linear_conv_kernel - 1
    return Inputs(
        randn(batch, block, hk, dk).to(dtype),
        randn(batch, block, hk, dk).to(dtype),
        randn(batch, block, hv, dv).to(dtype),
        -torch.rand(batch, block, hv, generator=gen, device=device),
        torch.rand(batch, block, hv, generator=gen, device=device),
        randn(batch, taps + block, config.linear_conv_dim).to(dtype),
    )


def layers(config: ModelConfig) -> list[int]:
    return [i for i, kind in enumerate(config.layer_types) if kind == "linear"]


def baseline_round(config: ModelConfig, cache: Cache, x: Inputs) -> None:
    for layer in layers(config):
        gdn.gdn_recurrent(x.q, x.k, x.v, x.g, x.beta, cache.state[layer])


def slots_round(
    config: ModelConfig,
    cache: Cache,
    x: Inputs,
    slots: dict[int, torch.Tensor],
    before: dict[int, torch.Tensor],
    accepted: torch.Tensor,
) -> None:
    batch = x.q.shape[0]
    rows = torch.arange(batch, device=accepted.device)
    for layer in layers(config):
        before[layer].copy_(cache.state[layer])
        gdn.gdn_recurrent(x.q, x.k, x.v, x.g, x.beta, cache.state[layer], slots[layer])
    for layer in layers(config):  # commit: the slot of the last kept token, or the state before the step
        picked = slots[layer][rows, (accepted - 1).clamp(min=0)]
        cache.state[layer].copy_(torch.where((accepted > 0)[:, None, None, None], picked, before[layer]))


def replay_round(config: ModelConfig, cache: Cache, x: Inputs, accepted: torch.Tensor) -> None:
    batch, block = x.q.shape[:2]
    pending = cache.begin(torch.arange(block, device=accepted.device).expand(batch, block), verify=True)
    for layer in layers(config):
        _, state = cache.gdn_state(layer, batch)
        pending.gdn[layer] = GDNInputs(x.columns, x.q, x.k, x.v, x.g, x.beta)
        gdn.gdn_recurrent(x.q, x.k, x.v, x.g, x.beta, state, write_state=False)
    pending.commit(accepted)


def seconds(runs: dict[str, tuple], device: str, repeats: int) -> dict[str, float]:
    """Best of `repeats` for each (setup, run), untimed setup first, the runs interleaved so that drift in the
    machine's speed reaches them alike: wall time, synchronized, on CUDA; on the CPU this process's CPU time (run
    it with one torch thread), which other work sharing the machine inflates less."""
    clock = time.perf_counter if device == "cuda" else time.process_time
    best = {name: math.inf for name in runs}
    for _ in range(repeats):
        for name, (setup, run) in runs.items():
            setup()
            if device == "cuda":
                torch.cuda.synchronize()
            start = clock()
            run()
            if device == "cuda":
                torch.cuda.synchronize()
            best[name] = min(best[name], clock() - start)
    return best


def measure(config: ModelConfig, device: str, batch: int, block: int, repeats: int) -> dict:
    """Per accepted count: seconds of a round for each design; bytes each design adds; bitwise agreement."""
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    x = random_inputs(config, batch, block, device, dtype)
    hv, dk, dv = config.linear_num_value_heads, config.linear_key_head_dim, config.linear_value_head_dim
    state_bytes = batch * hv * dk * dv * 4
    gdn_layers = layers(config)
    saved_inputs = sum(t.nbytes for t in (x.q, x.k, x.v, x.g, x.beta, x.columns))
    memory = {
        "state": state_bytes * len(gdn_layers),
        "slots": (block + 1) * state_bytes * len(gdn_layers),
        "replay": saved_inputs * len(gdn_layers),
    }
    cache_replay = Cache(config, batch, block, dtype, device)
    cache_slots = Cache(config, batch, block, dtype, device)
    slots = {i: torch.empty(batch, block, hv, dk, dv, device=device) for i in gdn_layers}
    before = {i: torch.empty(batch, hv, dk, dv, device=device) for i in gdn_layers}
    start = {
        i: torch.randn(batch, hv, dk, dv, generator=torch.Generator(device).manual_seed(i), device=device)
        for i in gdn_layers
    }

    def reset(cache: Cache) -> None:
        for i in gdn_layers:
            cache.state[i].copy_(start[i])

    runs = {"baseline": (lambda: reset(cache_slots), lambda: baseline_round(config, cache_slots, x))}
    counts = sorted({0, 1, block // 2, block - 1, block})
    for kept in counts:
        accepted = torch.full((batch,), kept, device=device)
        runs[f"slots {kept}"] = (
            lambda: reset(cache_slots),
            lambda a=accepted: slots_round(config, cache_slots, x, slots, before, a),
        )
        runs[f"replay {kept}"] = (
            lambda: reset(cache_replay),
            lambda a=accepted: replay_round(config, cache_replay, x, a),
        )
    best = seconds(runs, device, repeats)
    base, rounds = best["baseline"], {}
    for kept in counts:
        accepted = torch.full((batch,), kept, device=device)
        reset(cache_slots)
        slots_round(config, cache_slots, x, slots, before, accepted)
        reset(cache_replay)
        replay_round(config, cache_replay, x, accepted)
        same = all(torch.equal(cache_slots.state[i], cache_replay.state[i]) for i in gdn_layers)
        rounds[kept] = {
            "slots": best[f"slots {kept}"],
            "replay": best[f"replay {kept}"],
            "identical": same,
        }
    return {"baseline": base, "rounds": rounds, "memory": memory, "gdn_layers": len(gdn_layers)}


def report(result: dict, title: str) -> str:
    base, memory = result["baseline"], result["memory"]
    lines = [
        title,
        "",
        f"baseline (a verify step's recurrence, no rollback): {base * 1e3:.3f} ms",
        "",
        "| accepted | slots ms | x baseline | replay ms | x baseline | same state |",
        "|---|---|---|---|---|---|",
    ]
    for kept, r in result["rounds"].items():
        slots, replay = r["slots"], r["replay"]
        lines.append(
            f"| {kept} | {slots * 1e3:.3f} | {slots / base:.2f}x | {replay * 1e3:.3f} | "
            f"{replay / base:.2f}x | {'yes' if r['identical'] else 'NO'} |"
        )
    lines += [
        "",
        f"memory over the state held anyway ({memory['state'] / MiB:.1f} MiB): slots "
        f"{memory['slots'] / MiB:.1f} MiB, replay {memory['replay'] / MiB:.1f} MiB",
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--scale", type=int, default=4, help="divide heads and head size by this (1: real shape)")
    parser.add_argument("--block", type=int, default=16)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    config = qwen36_shape(args.scale)
    result = measure(config, args.device, args.batch, args.block, args.repeats)
    shape = (
        f"{result['gdn_layers']} GDN layers, {config.linear_num_key_heads}/{config.linear_num_value_heads} heads "
        f"of {config.linear_key_head_dim}"
    )
    print(report(result, f"GDN rollback on {args.device}: {shape}, block {args.block}, batch {args.batch}"))


if __name__ == "__main__":
    main()
