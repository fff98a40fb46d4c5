"""Canonical logical weight names: one name per tensor a model computes with, whatever the source.

From HF names (sources in other namings are first mapped to HF names by checkpoint/gguf_arch.py and
checkpoint/mlx_names.py), the canonical form:
  - no language-model prefix: `embed_tokens.weight`, `layers.3.self_attn.q_proj.weight`, `norm.weight`,
    `lm_head.weight` (absent when tied), `mtp.fc.weight`, `mtp.layers.0.mlp.gate.weight`, drafter tensors
    as drafters name them (`fc.weight`, `hidden_norm.weight`, `candidate_selector.*`, `midlayer.*`, `d2t`;
    MuseGlimmer assistants' `encoder.fc` / `encoder.output_norm_enc` are DFlash's `fc` / `hidden_norm`);
  - routed experts always stacked and split: `layers.N.mlp.experts.{gate,up,down}_proj.weight`
    [E, out, in] (from per-expert tensors, or from a fused [E, 2I, H] gate_up_proj, gate rows first);
  - Gated DeltaNet always split as Qwen3.5 stores it: `linear_attn.in_proj_qkv` [Q | K | V, value heads
    grouped by key head], `in_proj_z`, `in_proj_b`, `in_proj_a` (Qwen3-Next's fused in_proj_qkvz / in_proj_ba
    are taken apart by rows);
  - values as HF stores them (zero-centred norm gains as w, A_log, conv1d [C, 1, K]); vision towers dropped.
"""

from __future__ import annotations

import re

from specpair.checkpoint.config import ModelConfig
from specpair.errors import BadInput
from specpair.formats.transforms import Step, TensorMap

LM_PREFIXES = ("model.language_model.", "model.", "language_model.model.", "language_model.")
DROPPED = re.compile(r"^(model\.)?(visual|vision_tower|vision_model|multi_modal_projector|mm_projector)\.")
PER_EXPERT = re.compile(r"(?P<mlp>.*\.mlp\.)experts\.(?P<e>\d+)\.(?P<proj>gate_proj|up_proj|down_proj)\.weight$")
FUSED_EXPERTS = re.compile(r"(?P<mlp>.*\.mlp\.)experts\.(?P<proj>gate_up_proj|down_proj)$")
QKVZ = re.compile(r"(?P<attn>.*\.linear_attn\.)in_proj_qkvz\.weight$")
BA = re.compile(r"(?P<attn>.*\.linear_attn\.)in_proj_ba\.weight$")
DRAFTER_ALIASES = {"encoder.fc.weight": "fc.weight", "encoder.output_norm_enc.weight": "hidden_norm.weight"}


def canonical_name(hf_name: str) -> str:
    if hf_name in DRAFTER_ALIASES:
        return DRAFTER_ALIASES[hf_name]
    for prefix in LM_PREFIXES:
        if hf_name.startswith(prefix):
            return hf_name[len(prefix) :]
    return hf_name


def canonical_maps(config: ModelConfig, hf: dict[str, tuple[int, ...]]) -> list[TensorMap]:
    """Maps from the HF-named tensors `hf` (name -> logical shape) to canonical names, in `hf` order (a stack
    of per-expert tensors where its first expert is)."""
    maps: list[TensorMap | tuple[str, str]] = []
    experts: dict[tuple[str, str], dict[int, tuple[str, tuple[int, ...]]]] = {}
    for name, shape in hf.items():
        if DROPPED.match(name):
            continue
        if m := PER_EXPERT.match(name):
            key = (canonical_name(m["mlp"]), m["proj"])
            if key not in experts:
                experts[key] = {}
                maps.append(key)
            experts[key][int(m["e"])] = (name, shape)
            continue
        out = canonical_name(name)
        if m := FUSED_EXPERTS.match(out):
            if m["proj"] == "down_proj":
                maps.append(TensorMap(f"{m['mlp']}experts.down_proj.weight", shape, (name,)))
            else:
                count, rows, cols = shape
                half = rows // 2
                maps.append(
                    TensorMap(
                        f"{m['mlp']}experts.gate_proj.weight", (count, half, cols), (name,), (Step("rows", (0, half)),)
                    )
                )
                maps.append(
                    TensorMap(
                        f"{m['mlp']}experts.up_proj.weight", (count, half, cols), (name,), (Step("rows", (half, rows)),)
                    )
                )
        elif m := QKVZ.match(out):
            maps += _split_qkvz(config, m["attn"], name, shape)
        elif m := BA.match(out):
            maps += _split_ba(config, m["attn"], name, shape)
        else:
            maps.append(TensorMap(out, shape, (name,)))
    return [m if isinstance(m, TensorMap) else _stack(*m, experts[m]) for m in maps]


def _stack(mlp: str, proj: str, by_expert: dict[int, tuple[str, tuple[int, ...]]]) -> TensorMap:
    name = f"{mlp}experts.{proj}.weight"
    if sorted(by_expert) != list(range(len(by_expert))):
        raise BadInput(name, f"is stacked from experts {sorted(by_expert)[:4]}..., not 0..{len(by_expert) - 1}")
    shapes = {shape for _, shape in by_expert.values()}
    if len(shapes) != 1:
        raise BadInput(name, f"is stacked from experts of different shapes {sorted(shapes)[:2]}")
    sources = tuple(by_expert[e][0] for e in range(len(by_expert)))
    return TensorMap(name, (len(sources), *shapes.pop()), sources, (Step("stack"),))


def _split_qkvz(config: ModelConfig, attn: str, name: str, shape: tuple[int, ...]) -> list[TensorMap]:
    """Qwen3-Next's in_proj_qkvz holds, per key head, [q (dk), k (dk), v (r value heads), z (r value heads)]."""
    k_heads, k_dim = config.linear_num_key_heads, config.linear_key_head_dim
    v_per_k = config.linear_num_value_heads // k_heads * config.linear_value_head_dim
    block = 2 * k_dim + 2 * v_per_k
    spans = {
        "q": (0, k_dim),
        "k": (k_dim, 2 * k_dim),
        "v": (2 * k_dim, 2 * k_dim + v_per_k),
        "z": (2 * k_dim + v_per_k, block),
    }

    def gather(*parts: str) -> tuple[int, ...]:
        return tuple(g * block + r for part in parts for g in range(k_heads) for r in range(*spans[part]))

    qkv, z = gather("q", "k", "v"), gather("z")
    hidden = shape[1]
    return [
        TensorMap(f"{attn}in_proj_qkv.weight", (len(qkv), hidden), (name,), (Step("take_rows", (qkv,)),)),
        TensorMap(f"{attn}in_proj_z.weight", (len(z), hidden), (name,), (Step("take_rows", (z,)),)),
    ]


def _split_ba(config: ModelConfig, attn: str, name: str, shape: tuple[int, ...]) -> list[TensorMap]:
    """Qwen3-Next's in_proj_ba holds, per key head, [b (r value heads), a (r value heads)]."""
    k_heads = config.linear_num_key_heads
    per_k = config.linear_num_value_heads // k_heads
    b = tuple(g * 2 * per_k + r for g in range(k_heads) for r in range(per_k))
    a = tuple(g * 2 * per_k + per_k + r for g in range(k_heads) for r in range(per_k))
    hidden = shape[1]
    return [
        TensorMap(f"{attn}in_proj_b.weight", (len(b), hidden), (name,), (Step("take_rows", (b,)),)),
        TensorMap(f"{attn}in_proj_a.weight", (len(a), hidden), (name,), (Step("take_rows", (a,)),)),
    ]
