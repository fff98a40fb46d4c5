"""Whether a model fits the GPU the runtime is about to use: weights as loaded, the cache for the context, and
compat/memory.py's working memory per GPU (what `check` adds too); and, when it does not, what would."""

from __future__ import annotations

import math
import shlex
from typing import TYPE_CHECKING

from specpair.compat.fixes import destination
from specpair.compat.memory import OVERHEAD_PER_GPU, gb
from specpair.errors import BadInput

if TYPE_CHECKING:
    from specpair.runtime.loading import LoadPlan


def cache_bytes(plan: LoadPlan, context: int) -> int:
    from specpair.runtime.cache import Cache

    return Cache(plan.model.config, 1, context, plan.dtype, "meta").nbytes


def needs(plan: LoadPlan, context: int, weights: float | None = None) -> float:
    """Bytes running needs on the GPU: the weights as loaded (or `weights`) + the cache + working memory."""
    return (plan.resident_bytes if weights is None else weights) + cache_bytes(plan, context) + OVERHEAD_PER_GPU


def does_not_fit(plan: LoadPlan, context: int, free: float, why: str) -> str:
    """What running needs and why it does not fit; the smaller layout of the matmul weights that would fit
    `free` bytes, if there is one."""
    message = (
        f"needs {gb(needs(plan, context))} GB on the GPU ({gb(plan.resident_bytes)} GB of weights as loaded, "
        f"{gb(cache_bytes(plan, context))} GB of cache for {context} tokens, {gb(OVERHEAD_PER_GPU)} GB working "
        f"memory); {why}"
    )
    matmul = [n for n, need in plan.needs.items() if need.matmul]
    values = sum(math.prod(plan.needs[n].shape) for n in matmul)
    bits_now = 8 * sum(plan.resident[n] for n in matmul) / values
    other = plan.resident_bytes - sum(plan.resident[n] for n in matmul)
    for bits, layout in ((8.5, "fp8"), (4.5, "nvfp4")):
        if bits < bits_now and needs(plan, context, values * bits / 8 + other) <= free:
            return message + (
                f"; with its matmul weights at {bits:g} bits it would fit: "
                + shlex.join(
                    ["specpair", "convert", plan.model.ref, destination(plan.model.ref, layout), "--to", layout]
                )
            )
    return message + "; a smaller layout would not fit this GPU either (`specpair check` names multi-GPU stacks)"


def check_fits(plan: LoadPlan, context: int) -> None:
    """BadInput saying what is needed and what would fit, when `plan` on its CUDA device does not fit now."""
    import torch

    free, _ = torch.cuda.mem_get_info(plan.device)
    if needs(plan, context) > free:
        raise BadInput(
            plan.model.ref,
            does_not_fit(plan, context, free, f"{gb(free)} GB are free on {torch.cuda.get_device_name(plan.device)}"),
        )


def out_of_memory(plan: LoadPlan, context: int, when: str) -> BadInput:
    """The error for a CUDA out-of-memory while `when` ("while loading", "while generating")."""
    import torch

    free = torch.cuda.mem_get_info(plan.device)[0]
    return BadInput(plan.model.ref, does_not_fit(plan, context, free, f"ran out of GPU memory {when}"))
