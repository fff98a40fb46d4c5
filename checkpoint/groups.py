"""Tensor groups: which part of a model a tensor belongs to, from its name (HF, MLX or GGUF).

First match wins; the order puts the narrow patterns (vision, MTP, norms) before the broad ones.
"""

from __future__ import annotations

import functools
import re
from collections import defaultdict

from specpair.checkpoint import TensorGroup
from specpair.formats import TensorInfo

GROUP_PATTERNS: list[tuple[str, re.Pattern[str]]] = [
    (group, re.compile(pattern))
    for group, pattern in [
        ("vision", r"(^|\.)(visual|vision_tower|vision_model|multi_modal_projector|mm_projector)\."),
        ("mtp", r"(^|\.)mtp\.|\.nextn\."),
        ("embedding", r"embed_tokens|^token_embd\.|(^|\.)wte\."),
        ("lm_head", r"(^|\.)lm_head\.|^output\."),
        ("selector", r"candidate_selector|selector"),
        ("drafter_io", r"^(encoder\.)?fc\.|hidden_norm|output_norm_enc|^enc\.|^dflash[._]|^d2t$|^t2d$|mask_embedding"),
        ("conv", r"_conv\.|_conv_(base|proj)"),
        ("norm", r"norm"),
        ("router", r"mlp\.gate\.|shared_expert_gate|ffn_gate_inp"),
        ("shared_expert", r"shared_expert|_shexp"),
        ("experts", r"experts|_exps|switch_mlp"),
        ("linear_attention", r"linear_attn|ssm_|attn_qkv|attn_gate"),
        ("attention", r"self_attn|attn_"),
        ("mlp", r"mlp|ffn_"),
        ("other", r""),
    ]
]


NUMBER_COMPONENT = re.compile(r"(?<=\.)\d+(?=\.|$)")  # layer and expert indices: "layers.12." -> "layers.0."


def group_of(name: str) -> str:
    # Names differ mostly in layer and expert numbers: classify each numbering-free shape once.
    return _group_of_shape(NUMBER_COMPONENT.sub("0", name))


@functools.lru_cache(maxsize=4096)
def _group_of_shape(name: str) -> str:
    for group, pattern in GROUP_PATTERNS:
        if pattern.search(name):
            return group
    return "other"


def summarize(tensors: list[TensorInfo], layouts: dict[str, str], group_for=group_of) -> list[TensorGroup]:
    """Count tensors and bytes per (group, layout), in a stable order."""
    totals: dict[tuple[str, str], list[int]] = defaultdict(lambda: [0, 0])
    for t in tensors:
        entry = totals[(group_for(t.name), layouts[t.name])]
        entry[0] += 1
        entry[1] += t.nbytes
    return [TensorGroup(g, layout, n, b) for (g, layout), (n, b) in sorted(totals.items())]
