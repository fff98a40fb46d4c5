"""What tensor parallelism of N GPUs can split, stated once per way of splitting (a stack's row names its way,
compat/stacks.py `head_split`): runtime/parallel.py refuses a shard by GROUPS, and `check` reports either way before
any download (rule hw.tensor_parallel_split) and sizes memory only at splits that work."""

from __future__ import annotations

from collections.abc import Callable

from specpair.checkpoint import Shapes

GROUPS = "groups"  # specpair's: whole KV groups a rank, as evenly as they go (Gated DeltaNet key heads likewise),
# the vocabulary evenly; drafters are held whole on every GPU
EVEN = "even"  # SGLang's and vLLM's QKVParallelLinear: query and Gated DeltaNet heads evenly, KV heads evenly or
# copied to whole shares where fewer than the GPUs; a separate drafter is split too


def unsplittable(vocab_size: int, kv_heads: int, linear_key_heads: int | None, size: int) -> list[str]:
    """Why `size` ranks cannot each hold a GROUPS shard of a model with these counts; [] where they can."""
    if size == 1:
        return []
    reasons = []
    if vocab_size % size:
        reasons.append(f"vocab_size {vocab_size} does not split over tensor parallelism {size}")
    for key, total in (("num_kv_heads", kv_heads), ("linear_num_key_heads", linear_key_heads)):
        if total is not None and total < size:
            reasons.append(f"{key} {total} leaves a rank of tensor parallelism {size} without one")
    return reasons


def _grouped(shapes: Shapes, size: int) -> list[str]:
    return unsplittable(shapes.vocab_size or size, shapes.num_kv_heads, shapes.linear_key_heads, size)


def _even(shapes: Shapes, size: int) -> list[str]:
    found = [f"{shapes.num_heads} attention heads"] if shapes.num_heads % size else []
    kv = shapes.num_kv_heads
    if (kv >= size and kv % size) or (kv < size and size % kv):
        found.append(f"{kv} KV heads")
    for heads, what in (
        (shapes.linear_key_heads, "Gated DeltaNet key heads"),
        (shapes.linear_value_heads, "value heads"),
    ):
        if heads and heads % size:
            found.append(f"{heads} {what}")
    return [f"{' and '.join(found)} do not divide by {size}"] if found else []


# way -> (why `size` GPUs cannot split a model of these shapes, whether a separate drafter is split too)
SPLITS: dict[str, tuple[Callable[[Shapes, int], list[str]], bool]] = {GROUPS: (_grouped, False), EVEN: (_even, True)}
