"""Memory: target and draft weights, KV cache, recurrent state and draft KV against the GPUs given."""

from __future__ import annotations

from collections.abc import Iterable

from specpair.compat.memory import TP_SIZES, MemoryPlan, estimate, plan
from specpair.compat.pair import Pair
from specpair.compat.rules.table import (
    ALL_KINDS,
    ALL_STACKS,
    Values,
    rule,
)
from specpair.compat.stacks import STACKS

OFFLOADING_STACKS = tuple(s.name for s in STACKS.values() if s.expert_offload)


def memory_plan(p: Pair, stack: str) -> MemoryPlan | None:
    """The pair's memory on this stack at the deployment asked for; None when there is nothing to size (no
    tensor headers, or an MTP pair whose target has no MTP head)."""
    if not p.target.groups or p.head_missing:
        return None
    serves, stack_row = p.serves(stack), STACKS[stack]
    max_tp = 1 if serves is None else max(TP_SIZES) if serves.tensor_parallel is None else serves.tensor_parallel
    # only the sizes that split the pair's heads the stack's way: a pair no size above 1 splits is not splittable
    splits = tuple(n for n in TP_SIZES if n <= max_tp and not stack_row.unsplit(p, n))
    e = estimate(p.target, p.draft, p.kind_row.head_group, p.context, p.deployment.concurrency)
    deployment = p.deployment
    return plan(
        e,
        p.context,
        deployment.concurrency,
        deployment.gpu,
        deployment.gpus,
        max(splits),
        stack_row.expert_offload,
        stack_row.draft_whole,
        splits,
    )


def _breakdown(p: Pair, m: MemoryPlan) -> str:
    """'target 70.2 + draft 0.8 + KV 0.7 + recurrent state 0.1 + draft KV 0.2 = 72.0 GB' (rounded parts, their sum)."""
    parts = m.parts
    if not p.separate:
        head = p.kind_row.title
        terms = [
            f"target {parts['target_weights']:.1f} (its {head} head included)",
            f"KV {parts['kv']:.1f}",
            f"recurrent state {parts['recurrent_state']:.1f}",
            f"{head} KV {parts['draft_kv']:.1f}",
        ]
    else:
        terms = [
            f"target {parts['target_weights']:.1f}",
            f"draft {parts['draft_weights']:.1f}",
            f"KV {parts['kv']:.1f}",
            f"recurrent state {parts['recurrent_state']:.1f}",
            f"draft KV {parts['draft_kv']:.1f}",
        ]
    return " + ".join(terms) + f" = {m.total:.1f} GB"


def _tensor_parallel_needed(m: MemoryPlan) -> str:
    tp = m.smallest_fitting_tensor_parallel
    return f"; it needs tensor parallelism {tp} (pass --gpus {tp})"


def _on(m: MemoryPlan) -> str:
    return "on one GPU" if m.tensor_parallel == 1 else f"per GPU at tensor parallelism {m.tensor_parallel}"


@rule(
    "memory.fit",
    "error",
    ALL_STACKS,
    ALL_KINDS,
    title="Target + draft weights, KV cache, recurrent state and draft KV fit the GPUs given (--gpu, --gpus, --context).",
    message="{target} with {draft} needs {per_gpu:.1f} GB {on} ({breakdown}, plus {overhead:.1f} GB runtime overhead per GPU) at {context} tokens x {concurrency} sequence(s); the {gpus} x {gpu} given have {usable:.1f} GB usable each, so it does not fit on {stack}{needed}.",
    example={
        "per_gpu": 73.9,
        "on": "on one GPU",
        "breakdown": "target 70.2 + draft 0.8 + KV 0.7 + recurrent state 0.1 + draft KV 0.2 = 72.0 GB",
        "overhead": 2.0,
        "context": 32768,
        "concurrency": 1,
        "gpus": 1,
        "gpu": "A100 80GB",
        "usable": 72.0,
        "needed": "; it needs tensor parallelism 2 (pass --gpus 2)",
    },
)
def _memory_fit(p: Pair, stack: str) -> Iterable[Values]:
    m = memory_plan(p, stack)
    if m is None or m.fits is not False or m.experts_on_cpu:  # memory.offload says how it fits
        return
    if m.smallest_fitting_tensor_parallel is not None:
        needed = _tensor_parallel_needed(m)
    elif m.max_tensor_parallel == 1:
        needed = f"; {stack} cannot split this pair across GPUs"
    else:
        needed = f"; not even at tensor parallelism {m.max_tensor_parallel}"
    yield {
        "per_gpu": m.per_gpu,
        "on": _on(m),
        "breakdown": _breakdown(p, m),
        "overhead": m.overhead_per_gpu,
        "context": m.context,
        "concurrency": m.concurrency,
        "gpus": p.deployment.gpus,
        "gpu": m.gpu,
        "usable": m.usable_per_gpu,
        "needed": needed,
    }


@rule(
    "memory.plan",
    "info",
    ALL_STACKS,
    ALL_KINDS,
    title="The memory estimate and the tensor parallelism that fits.",
    message="Memory at {context} tokens x {concurrency} sequence(s): {breakdown}, plus {overhead:.1f} GB runtime overhead per GPU; {verdict}.",
    example={
        "context": 32768,
        "concurrency": 1,
        "overhead": 2.0,
        "breakdown": "target 20.8 + draft 0.9 + KV 0.7 + recurrent state 0.1 + draft KV 0.0 = 22.5 GB",
        "verdict": "24.5 GB on one GPU fits the 126.9 GB usable on an H200",
    },
)
def _memory_plan(p: Pair, stack: str) -> Iterable[Values]:
    m = memory_plan(p, stack)
    if m is None or m.fits is False:  # memory.fit reports it
        return
    if m.fits is None:
        verdict = f"{m.per_gpu:.1f} GB {_on(m)}; pass --gpu (h100, h200, b200, gb10, rtx4090, ...) to check the fit"
    else:
        verdict = f"{m.per_gpu:.1f} GB {_on(m)} fits the {m.usable_per_gpu:.1f} GB usable on each {m.gpu}"
    yield {
        "context": m.context,
        "concurrency": m.concurrency,
        "breakdown": _breakdown(p, m),
        "overhead": m.overhead_per_gpu,
        "verdict": verdict,
    }


@rule(
    "memory.offload",
    "warn",
    OFFLOADING_STACKS,
    ALL_KINDS,
    title="A MoE pair too large for the GPUs given fits with the routed experts of some layers in CPU memory (llama.cpp --n-cpu-moe N, in the launch line).",
    message="{target} with {draft} needs {per_gpu:.1f} GB {on} ({breakdown}, plus {overhead:.1f} GB runtime overhead per GPU), over the {usable:.1f} GB usable on each {gpu}; with the routed experts of the first {layers} of its {of_layers} layers in CPU memory ({flag} {layers}, in the launch line) a GPU holds {offloaded:.1f} GB and host RAM {cpu:.1f} GB. Decoding then reads those experts in host memory, slower than on the GPU{alternative}.",
    example={
        "per_gpu": 25.4,
        "on": "on one GPU",
        "breakdown": "target 22.0 + draft 0.4 + KV 0.7 + recurrent state 0.1 + draft KV 0.2 = 23.4 GB",
        "overhead": 2.0,
        "usable": 21.6,
        "gpu": "RTX 4090",
        "layers": 8,
        "of_layers": 40,
        "flag": "--n-cpu-moe",
        "offloaded": 21.5,
        "cpu": 3.9,
        "alternative": "; or keep every weight on GPUs at tensor parallelism 2 (pass --gpus 2)",
    },
)
def _memory_offload(p: Pair, stack: str) -> Iterable[Values]:
    m = memory_plan(p, stack)
    if m is None or m.experts_on_cpu is None:
        return
    offload = m.experts_on_cpu
    tensor_parallel = m.smallest_fitting_tensor_parallel
    yield {
        "per_gpu": m.per_gpu,
        "on": _on(m),
        "breakdown": _breakdown(p, m),
        "overhead": m.overhead_per_gpu,
        "usable": m.usable_per_gpu,
        "gpu": m.gpu,
        "layers": offload.layers,
        "of_layers": offload.of_layers,
        "flag": offload.flag,
        "offloaded": offload.per_gpu,
        "cpu": offload.cpu,
        "alternative": (
            f"; or keep every weight on GPUs at tensor parallelism {tensor_parallel} (pass --gpus {tensor_parallel})"
            if tensor_parallel
            else ""
        ),
    }
