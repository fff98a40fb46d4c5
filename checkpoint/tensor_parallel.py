"""What tensor parallelism of N ranks can split, stated once: runtime/parallel.py refuses a shard by it and `check`'s
rule runtime.tensor_parallel reports it before any download. Heads split in whole KV groups (Gated DeltaNet key
heads likewise), so every rank needs one; the vocabulary (embedding and lm_head rows) splits evenly."""

from __future__ import annotations


def unsplittable(vocab_size: int, kv_heads: int, linear_key_heads: int | None, size: int) -> list[str]:
    """Why `size` ranks cannot each hold a shard of a model with these counts; [] where they can."""
    if size == 1:
        return []
    reasons = []
    if vocab_size % size:
        reasons.append(f"vocab_size {vocab_size} does not split over tensor parallelism {size}")
    for key, total in (("num_kv_heads", kv_heads), ("linear_num_key_heads", linear_key_heads)):
        if total is not None and total < size:
            reasons.append(f"{key} {total} leaves a rank of tensor parallelism {size} without one")
    return reasons
