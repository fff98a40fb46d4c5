"""Which config field each weight's dimensions must equal, as rows: a config that contradicts its own tensors
(an `intermediate_size` the MLP weights do not have) is refused before `convert` writes it beside them, since
every loader of the result (`specpair run`, transformers, llama.cpp) would refuse or misread it.
"""

from __future__ import annotations

import re

from specpair.checkpoint.config import ModelConfig

LAYER = r"^(mtp\.)?layers\.\d+\.mlp\."

# (canonical weight name, axis, ModelConfig field that axis equals)
CONFIG_DIMS: list[tuple[re.Pattern[str], int, str]] = [
    (re.compile(pattern), axis, field)
    for pattern, axis, field in [
        (r"^embed_tokens\.weight$", -1, "hidden_size"),
        (LAYER + r"(gate|up)_proj\.weight$", 0, "intermediate_size"),
        (LAYER + r"down_proj\.weight$", -1, "intermediate_size"),
        (LAYER + r"experts\.(gate|up)_proj\.weight$", 1, "moe_intermediate_size"),
        (LAYER + r"experts\.down_proj\.weight$", -1, "moe_intermediate_size"),
        (LAYER + r"experts\.(gate|up|down)_proj\.weight$", 0, "num_experts"),
        (LAYER + r"shared_expert\.(gate|up)_proj\.weight$", 0, "shared_expert_intermediate_size"),
        (LAYER + r"shared_expert\.down_proj\.weight$", -1, "shared_expert_intermediate_size"),
    ]
]


def contradiction(config: ModelConfig, shapes: dict[str, tuple[int, ...]]) -> str | None:
    """The first config field a weight's shape contradicts, said in one line; None when they agree (a field the
    config leaves out is not checked)."""
    for name, shape in shapes.items():
        for pattern, axis, field in CONFIG_DIMS:
            declared = getattr(config, field)
            if declared is None or not pattern.search(name) or len(shape) <= max(axis, -1 - axis):
                continue
            if shape[axis] != declared:
                return f"{field} {declared} contradicts the tensors: {name} is {list(shape)}"
    return None
