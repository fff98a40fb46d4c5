"""HF <-> MLX tensor names and values: what mlx-lm's `sanitize` does, as tensor maps (mlx-lm 0.32.2).

MLX checkpoints (mlx-community, and TensorFold's affine targets) store weights the way mlx-lm's models
hold them: Qwen3.5/3.6 under `language_model.model.` with the head at `language_model.lm_head`, routed
experts stacked as `mlp.switch_mlp.{gate,up,down}_proj` [E, out, in], GatedDeltaNet conv1d channels-last
[C, K, 1], the zero-centred norms of Qwen3.5/3.6 and Qwen3-Next stored as 1 + w, MTP and vision dropped.
Qwen3, Qwen3-MoE (stacked experts aside) and Llama keep their HF names.
"""

from __future__ import annotations

import re

from specpair.checkpoint.families import FAMILIES
from specpair.formats.transforms import Step, TensorMap

SHIFTED_NORMS = (
    ".input_layernorm.weight",
    ".post_attention_layernorm.weight",
    "model.norm.weight",
    ".q_norm.weight",
    ".k_norm.weight",
)
NORM_SHIFT_FAMILIES = tuple(f.name for f in FAMILIES.values() if f.zero_centred_norms)
WRAPPED_FAMILIES = tuple(f.name for f in FAMILIES.values() if f.mlx_wrapped)  # the LM sits under language_model.
DROPPED = ("mtp.", "model.visual.", "vision_tower.")
PER_EXPERT = re.compile(r"(?P<mlp>.*\.mlp\.)experts\.(?P<e>\d+)\.(?P<proj>gate_proj|up_proj|down_proj)\.weight$")
STACKED = re.compile(r"(?P<mlp>.*\.mlp\.)switch_mlp\.(?P<proj>gate_proj|up_proj|down_proj)\.weight$")


def to_mlx(
    family: str | None, tensors: dict[str, tuple[int, ...]], tie_embeddings: bool
) -> tuple[list[TensorMap], list[str]]:
    """Maps from HF names to MLX names, and notes on what was dropped."""
    maps: list[TensorMap] = []
    experts: dict[tuple[str, str], dict[int, tuple[str, tuple[int, ...]]]] = {}
    dropped = sorted({prefix.rstrip(".") for name in tensors for prefix in DROPPED if name.startswith(prefix)})
    for name, shape in tensors.items():
        if name.startswith(DROPPED) or (tie_embeddings and name == "lm_head.weight"):
            continue
        if m := PER_EXPERT.match(name):
            experts.setdefault((m["mlp"], m["proj"]), {})[int(m["e"])] = (name, shape)
            continue
        out = _mlx_name(family, name)
        if name.endswith("mlp.experts.gate_up_proj"):  # fused [E, 2I, H], gate rows first
            mlp = out.removesuffix("experts.gate_up_proj")
            experts_, rows, hidden = shape
            half = rows // 2
            maps.append(
                TensorMap(
                    f"{mlp}switch_mlp.gate_proj.weight", (experts_, half, hidden), (name,), (Step("rows", (0, half)),)
                )
            )
            maps.append(
                TensorMap(
                    f"{mlp}switch_mlp.up_proj.weight", (experts_, half, hidden), (name,), (Step("rows", (half, rows)),)
                )
            )
        elif name.endswith("mlp.experts.down_proj"):
            maps.append(
                TensorMap(out.removesuffix("experts.down_proj") + "switch_mlp.down_proj.weight", shape, (name,))
            )
        elif name.endswith("conv1d.weight") and len(shape) == 3 and shape[1] == 1:
            maps.append(TensorMap(out, (shape[0], shape[2], 1), (name,), (Step("transpose", (1, 2)),)))
        elif family in NORM_SHIFT_FAMILIES and out.endswith(SHIFTED_NORMS) and len(shape) == 1:  # mlx-lm's test
            maps.append(TensorMap(out, shape, (name,), (Step("add", (1.0,)),)))
        else:
            maps.append(TensorMap(out, shape, (name,)))
    for (mlp, proj), by_expert in experts.items():
        ordered = [by_expert[e] for e in sorted(by_expert)]
        maps.append(
            TensorMap(
                _mlx_name(family, f"{mlp}switch_mlp.{proj}.weight"),
                (len(ordered), *ordered[0][1]),
                tuple(n for n, _ in ordered),
                (Step("stack"),),
            )
        )
    notes = [f"{d}.* tensors dropped: mlx-lm's text models do not load them" for d in dropped]
    return maps, notes


def from_mlx(family: str | None, tensors: dict[str, tuple[int, ...]]) -> list[TensorMap]:
    """Maps from MLX names back to HF names (per-expert routed experts, HF conv1d and norm values)."""
    maps: list[TensorMap] = []
    for name, shape in tensors.items():
        out = _hf_name(family, name)
        if m := STACKED.match(out):
            for e in range(shape[0]):
                maps.append(
                    TensorMap(f"{m['mlp']}experts.{e}.{m['proj']}.weight", shape[1:], (name,), (Step("select", (e,)),))
                )
        elif name.endswith("conv1d.weight") and len(shape) == 3 and shape[2] == 1:
            maps.append(TensorMap(out, (shape[0], 1, shape[1]), (name,), (Step("transpose", (1, 2)),)))
        elif family in NORM_SHIFT_FAMILIES and name.endswith(SHIFTED_NORMS) and len(shape) == 1:
            maps.append(TensorMap(out, shape, (name,), (Step("add", (-1.0,)),)))
        else:
            maps.append(TensorMap(out, shape, (name,)))
    return maps


def is_mlx_layout(family: str | None, names: list[str]) -> bool:
    """Whether HF-family tensors are already in MLX form (stacked experts, or the language_model. prefix)."""
    if any(STACKED.match(n) for n in names):
        return True
    return family in WRAPPED_FAMILIES and any(n.startswith("language_model.") for n in names)


def _mlx_name(family: str | None, name: str) -> str:
    if family not in WRAPPED_FAMILIES:
        return name
    if name.startswith("model.language_model."):
        return "language_model.model." + name.removeprefix("model.language_model.")
    return "language_model." + name


def _hf_name(family: str | None, name: str) -> str:
    if family not in WRAPPED_FAMILIES:
        return name
    if name.startswith("language_model.model."):
        return "model.language_model." + name.removeprefix("language_model.model.")
    return name.removeprefix("language_model.")
