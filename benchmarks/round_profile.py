"""A drafter's round at real shape, kernel by kernel, on one GPU: the bytes it must read and where its time goes.

    PYTHONPATH=<a directory holding the repository as specpair> python3 benchmarks/round_profile.py TARGET \
        [--draft DIR [--draft-bits 4]] [--block 8] [--out DIR] [--loop [--users 1,4] [--tokens 16,48]]

TARGET and --draft: checkpoint directories (benchmarks/seed_pairs_gpu.py --only build --keep writes the seed pairs';
without --draft, the target's own MTP head). A round is what bench's `draft` step times (runtime/speculative.py
step_times): the drafter's proposal of block - 1 tokens and its observation of a verify step's rows, under CUDA
graphs, after a prefill of one 78-token prompt. Prints step_times' decode step (the baseline, in the same run),
verify step and round; the round's wall time over ROUNDS back to back; the bytes its matmuls read (each call's
weight, recorded from an eager round: the graphed round launches the same matmuls in the same order) and the
roofline they give at the copy bandwidth measured in the run; per kernel, its launches and µs a round under
torch.profiler; per kind of weight, the matmuls' µs and share of copy bandwidth. Writes round_profile.md and .json
to --out (default $OUT, else the working directory).

--loop: where the speculative loop's rounds spend what its steps alone do not (bench's speedup / predicted), at each
--users count: a round of the loop (runtime/speculative.py speculative_generate, greedy, CUDA graphs) against the
same round's steps alone (`round_steps`: the verify step with its commit, then the drafter's round), both after a
prefill of the same prompts. Two runs of the loop, of --tokens a and b tokens a sequence: the wall time a round is
the difference of their CUDA-event phases (draft + verify) over the difference of their rounds, and so are the
kernels a round, each run profiled from its first emitted token on (the graphs' capture and the prefill left out;
what the first and last rounds do alone cancels). GPU busy a round: the time some kernel or copy ran (the union
of their intervals; under programmatic dependent launch a kernel starts before the one it follows has ended and
waits in place, so the kernels' own µs, summed, exceed the wall); idle = wall - busy, the time the GPU waited for
the host. Then kernel by kernel, the loop's launches and µs a round beside the steps', largest difference first (a
kernel's µs include such a wait: a PDL kernel's figure moves with what runs before it). Writes loop_profile.md and
.json.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from step_profile import (
    busy_us,
    copy_bandwidth,
    device_intervals,
    kernel_totals,
    matmuls_by_weight,
    profiled,
    recorded_matmuls,
)  # noqa: E402

from specpair.runtime.drafters import Committed, Drafter, Drafting  # noqa: E402
from specpair.runtime.drafters.loading import load_drafter  # noqa: E402
from specpair.runtime.loading import load, plan_load  # noqa: E402
from specpair.runtime.model import Transformer  # noqa: E402
from specpair.runtime.sampling import TOKEN_STREAM, Sampling  # noqa: E402
from specpair.runtime.speculative import round_steps, speculative_generate, step_times  # noqa: E402
from specpair.sources.model import open_model  # noqa: E402

PROMPT_TOKENS = 78
ROUNDS = 50  # timed back to back
PROFILED = 20  # under torch.profiler


def prompt_of(target: Transformer, user: int = 0) -> list[int]:
    """A prompt of PROMPT_TOKENS ids inside the target's vocabulary, one per user."""
    return [1 + (31 * i + 7 * user) % (target.config.vocab_size - 2) for i in range(PROMPT_TOKENS)]


def round_of(target: Transformer, drafter: Drafter, block: int, graphs: bool) -> Callable[[], None]:
    """One round after a prefill-sized start: the observation of a verify step that kept nothing (its rows are random
    features and distinct tokens: a dense observation's cost does not depend on their values), then a proposal at
    the prompt's end (a DFlash drafter stores that observation with the proposal's products: from the second round
    on, each round is the steady state's)."""
    device = target.device
    drafter.start(1, PROMPT_TOKENS + 2 * block, graphs)
    anchors = torch.tensor([prompt_of(target)[-1]], device=device)
    positions = torch.tensor([PROMPT_TOKENS - 1], device=device)
    rows = positions[:, None] + torch.arange(block, device=device)
    # distinct tokens, as a round's verified block holds: a MoE drafter (an MTP head) routes a repeated token's
    # rows to the same experts, fewer than a round's rows reach
    tokens = (anchors[:, None] + 7919 * torch.arange(block, device=device)) % target.config.vocab_size
    width = target.config.hidden_size
    taps = torch.randn(1, block, len(drafter.taps) * width, device=device).to(target.dtype) if drafter.taps else None
    hidden = torch.randn(1, block, width, device=device).to(target.dtype) if drafter.hidden else None
    nothing = torch.zeros(1, dtype=torch.int64, device=device)
    drafting = Drafting(Sampling(), False, TOKEN_STREAM)
    committed = Committed(tokens, rows, tokens, nothing, taps, hidden)

    def one_round() -> None:
        drafter.observe(committed)
        drafter.propose(anchors, positions, block - 1, drafting)

    return one_round


def round_matmuls(target: Transformer, drafter: Drafter, block: int) -> list[dict]:
    """The matmul calls of one eager round in the steady state (the second), in order (step_profile.matmul_call of
    each: its weight and bytes)."""
    one_round = round_of(target, drafter, block, graphs=False)
    one_round()
    with recorded_matmuls() as calls:
        one_round()
    return calls


def profile_round(one_round: Callable[[], None]) -> dict:
    """ms a round (ROUNDS back to back), and step_profile.profiled's figures of PROFILED rounds."""
    for _ in range(3):  # the graphs are captured at the second call of each shape
        one_round()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(ROUNDS):
        one_round()
    torch.cuda.synchronize()
    round_s = (time.perf_counter() - start) / ROUNDS
    return {"round_ms": round_s * 1e3, **profiled(one_round, PROFILED)}


def report(figures: dict) -> str:
    steps, profile = figures["step_ms"], figures["profile"]
    lines = [
        f"# A drafter's round: {figures['drafter']} on {figures['target']} ({figures['gpu']})",
        "",
        f"block {figures['block']} ({figures['block'] - 1} drafts); copy bandwidth {figures['bandwidth'] / 1e12:.2f} TB/s",
        "",
        "| decode step (baseline) | verify step | round | round / decode | round, wall of "
        f"{ROUNDS} | kernels a round | matmul bytes a round | roofline | round / roofline |",
        "|---|---|---|---|---|---|---|---|---|",
        f"| {steps['decode']:.3f} ms | {steps['verify']:.3f} | {steps['round']:.3f} | "
        f"{steps['round'] / steps['decode']:.2f} | {profile['round_ms']:.3f} | {profile['launches']:.0f} | "
        f"{figures['round_bytes'] / 1e9:.3f} GB | {figures['roofline_ms']:.3f} ms | "
        f"{profile['round_ms'] / figures['roofline_ms']:.2f}× |",
        "",
        "| kernel | launches a round | µs a round |",
        "|---|---|---|",
    ]
    lines += [f"| `{n}` | {k['launches']:.1f} | {k['us']:.1f} |" for n, k in list(profile["kernels"].items())[:20]]
    lines += ["", "| matmul weight | calls | µs | GB | of copy |", "|---|---|---|---|---|"]
    lines += [
        f"| {g['weight']} | {g['calls']} | {g['us']:.1f} | {g['bytes'] / 1e9:.4f} | {g['of_copy']:.0%} |"
        for g in figures["matmuls"]
    ]
    return "\n".join(lines) + "\n"


def loop_run(target: Transformer, drafter: Drafter, prompts: list[list[int]], block: int, tokens: int) -> dict:
    """One greedy run of the loop profiled from its first emitted token on (each kernel's launches and µs), then
    one unprofiled (its rounds and their wall seconds, from the loop's CUDA events): the first also warms up."""
    prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA])
    started: list[bool] = []

    def start_profiling(sequence: int, token: int) -> None:
        if not started:
            started.append(True)
            prof.start()

    _, profiled_timing = speculative_generate(
        target, drafter, prompts, tokens, Sampling(), block_size=block, on_token=start_profiling
    )
    torch.cuda.synchronize()
    prof.stop()
    _, timing = speculative_generate(target, drafter, prompts, tokens, Sampling(), block_size=block)
    if profiled_timing.rounds != timing.rounds:
        raise RuntimeError(
            f"two greedy runs of {tokens} tokens took {profiled_timing.rounds} and {timing.rounds} rounds"
        )
    return {
        "rounds": timing.rounds,
        "wall_s": timing.draft_s + timing.verify_s,
        "busy_us": busy_us(device_intervals(prof)),
        "kernels": kernel_totals(prof),
    }


def per_round(short: dict, long: dict) -> tuple[float, float, dict[str, list[float]]]:
    """(wall ms, busy ms, each kernel's [launches, µs]) a round of the loop from two of its runs (loop_run's
    figures): their difference over the difference of their rounds, so what both runs do once cancels."""
    rounds = long["rounds"] - short["rounds"]
    if rounds < 1:
        raise RuntimeError(f"runs of {short['rounds']} and {long['rounds']} rounds: the second must take more")
    names = set(short["kernels"]) | set(long["kernels"])
    kernels = {
        n: [(long["kernels"].get(n, (0, 0.0))[i] - short["kernels"].get(n, (0, 0.0))[i]) / rounds for i in (0, 1)]
        for n in names
    }
    wall_ms = (long["wall_s"] - short["wall_s"]) / rounds * 1e3
    return wall_ms, (long["busy_us"] - short["busy_us"]) / rounds / 1e3, kernels


def loop_against_steps(target: Transformer, drafter: Drafter, users: int, block: int, tokens: tuple[int, int]) -> dict:
    """A round of the loop against its steps alone at `users` sequences (the module docstring's --loop)."""
    prompts = [prompt_of(target, u) for u in range(users)]
    short, long = (loop_run(target, drafter, prompts, block, n) for n in tokens)
    round_ms, busy_ms, loop = per_round(short, long)
    steps = round_steps(target, drafter, prompts, block)

    def one_round() -> None:
        steps.verify()
        steps.draft()

    alone = profile_round(one_round)
    figures = {
        "users": users,
        "rounds": [short["rounds"], long["rounds"]],
        "loop_round_ms": round_ms,
        "loop_busy_ms": busy_ms,
        "loop_kernel_us": sum(us for _, us in loop.values()),
        "loop_launches": sum(c for c, _ in loop.values()),
        "steps_round_ms": alone["round_ms"],
        "steps_busy_ms": alone["busy_us"] / 1e3,
        "steps_kernel_us": alone["kernel_us"],
        "steps_launches": alone["launches"],
    }
    by_kernel = {
        n: {
            "loop_launches": loop.get(n, [0, 0.0])[0],
            "loop_us": loop.get(n, [0, 0.0])[1],
            "steps_launches": alone["kernels"].get(n, {}).get("launches", 0),
            "steps_us": alone["kernels"].get(n, {}).get("us", 0.0),
        }
        for n in set(loop) | set(alone["kernels"])
    }
    figures["kernels"] = dict(sorted(by_kernel.items(), key=lambda kv: -abs(kv[1]["loop_us"] - kv[1]["steps_us"])))
    return figures


def loop_report(target: str, drafter: str, gpu: str, block: int, runs: list[dict]) -> str:
    lines = [
        f"# The loop's round against its steps alone: {drafter} on {target} ({gpu})",
        "",
        f"block {block}, greedy, CUDA graphs; ms and µs a round; busy: some kernel or copy running (the union of "
        "their intervals); idle: wall - busy (the GPU waiting for the host); kernels: their own µs summed (under "
        "programmatic dependent launch, waits included)",
        "",
        "| users | loop wall | busy | idle | kernels | launches | steps alone wall | busy | idle | kernels "
        "| launches | loop / steps (wall) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for f in runs:
        lines.append(
            f"| {f['users']} | {f['loop_round_ms']:.3f} ms | {f['loop_busy_ms']:.3f} | "
            f"{f['loop_round_ms'] - f['loop_busy_ms']:.3f} | {f['loop_kernel_us'] / 1e3:.3f} | "
            f"{f['loop_launches']:.1f} | {f['steps_round_ms']:.3f} ms | {f['steps_busy_ms']:.3f} | "
            f"{f['steps_round_ms'] - f['steps_busy_ms']:.3f} | {f['steps_kernel_us'] / 1e3:.3f} | "
            f"{f['steps_launches']:.1f} | {f['loop_round_ms'] / f['steps_round_ms']:.3f}× |"
        )
    for f in runs:
        lines += [
            "",
            f"## users {f['users']}: kernels, largest difference first (rounds {f['rounds'][0]} and {f['rounds'][1]})",
            "",
            "| kernel | loop launches | loop µs | steps' launches | steps' µs | loop - steps µs |",
            "|---|---|---|---|---|---|",
        ]
        lines += [
            f"| `{n}` | {k['loop_launches']:.1f} | {k['loop_us']:.1f} | {k['steps_launches']:.1f} | "
            f"{k['steps_us']:.1f} | {k['loop_us'] - k['steps_us']:+.1f} |"
            for n, k in list(f["kernels"].items())[:25]
        ]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("target")
    parser.add_argument("--draft", help="a drafter checkpoint (default: the target's MTP head)")
    parser.add_argument("--draft-bits", type=int, help="quantize the drafter to affine-N at load")
    parser.add_argument("--block", type=int, default=8)
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", ".")))
    parser.add_argument("--loop", action="store_true", help="the loop's round against its steps alone")
    parser.add_argument("--users", default="1,4", help="with --loop: concurrent sequences, comma-separated")
    parser.add_argument("--tokens", default="16,48", help="with --loop: the two runs' tokens a sequence")
    args = parser.parse_args()
    target_model = open_model(args.target)
    target = load(plan_load(target_model, "cuda"))
    draft_model = open_model(args.draft) if args.draft else None
    drafter = load_drafter(draft_model, target_model, target, args.draft_bits)
    name = f"{drafter.kind} ({args.draft or 'its MTP head'}" + (
        f", affine-{args.draft_bits}" if args.draft_bits else ""
    )
    args.out.mkdir(parents=True, exist_ok=True)
    if args.loop:
        tokens = tuple(int(n) for n in args.tokens.split(","))
        if len(tokens) != 2 or tokens[0] >= tokens[1]:
            raise SystemExit(f"--tokens takes two counts, the smaller first: got {args.tokens}")
        runs = [loop_against_steps(target, drafter, int(u), args.block, tokens) for u in args.users.split(",")]
        text = loop_report(args.target, name + ")", torch.cuda.get_device_name(), args.block, runs)
        print(text, flush=True)
        (args.out / "loop_profile.md").write_text(text)
        (args.out / "loop_profile.json").write_text(json.dumps(runs, indent=1) + "\n")
        return
    times = step_times(target, drafter, [prompt_of(target)], args.block)
    calls = round_matmuls(target, drafter, args.block)
    profile = profile_round(round_of(target, drafter, args.block, graphs=True))
    bandwidth = copy_bandwidth()
    round_bytes = sum(c["bytes"] for c in calls)
    paired = len(calls) == len(profile["matmul_us"])
    figures = {
        "target": args.target,
        "drafter": name + ")",
        "gpu": torch.cuda.get_device_name(),
        "block": args.block,
        "bandwidth": bandwidth,
        "step_ms": {"decode": times.decode_s * 1e3, "verify": times.verify_s * 1e3, "round": times.draft_s * 1e3},
        "round_bytes": round_bytes,
        "roofline_ms": round_bytes / bandwidth * 1e3,
        "profile": profile,
        # a matmul launch per call, paired in order; if the counts differ the pairing is unknown and not shown
        "matmuls": matmuls_by_weight(calls, profile["matmul_us"], bandwidth) if paired else [],
    }
    text = report(figures)
    print(text, flush=True)
    (args.out / "round_profile.md").write_text(text)
    (args.out / "round_profile.json").write_text(json.dumps(figures, indent=1) + "\n")


if __name__ == "__main__":
    main()
