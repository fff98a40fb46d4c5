"""checkpoint/gguf_arch.py: HF <-> GGUF plans of hyper-parameters and tensors.

Checked against independent oracles that CI has: gguf-py's own HF -> GGUF name maps, the GGUFs our
fixtures write by hand from the spec, llama.cpp's converter formulas restated here (not imported),
transformers' loaders and config classes, and checkpoint/hf.py reading the result back. llama.cpp
itself is not run here: logit parity with llama-cpp-python 0.3.36 was measured by hand for all six
target archs (max |diff| <= 2.3e-3, argmax equal on every position).
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import gguf
import pytest
import torch
from fixtures import (
    DEFAULT_FLAVOUR,
    DFlash2,
    Dims,
    build_dflash,
    build_gguf_dflash,
    build_gguf_target,
    dflash_tensors,
    target_config,
    target_tensors,
    vocabulary,
)
from gguf.constants import MODEL_ARCH_NAMES, MODEL_TENSOR, TENSOR_NAMES, GGUFValueType
from safetensors.torch import save_file

from specpair.checkpoint.config import parse_config
from specpair.checkpoint.gguf_arch import from_gguf, to_gguf
from specpair.checkpoint.hf import HFMetadata
from specpair.checkpoint.hf import build as build_hf_checkpoint
from specpair.errors import BadInput
from specpair.formats import TensorInfo
from specpair.formats.gguf import read_local
from specpair.formats.transforms import TensorMap

FAMILIES = ("llama", "qwen3", "qwen3_moe", "qwen3_next", "qwen3_5", "qwen3_5_moe")
HYBRID = ("qwen3_next", "qwen3_5", "qwen3_5_moe")
DIMS = Dims(layers=4)  # hybrids: linear, linear, linear, full; linear heads 2 key / 4 value, so V heads reorder
GGUF_ARCH = {v: k for k, v in MODEL_ARCH_NAMES.items()}
# llama.cpp's converter renames these before its name map (conversion/qwen.py), or names them itself.
MTP_HEAD = {
    "fc": MODEL_TENSOR.NEXTN_EH_PROJ,
    "pre_fc_norm_embedding": MODEL_TENSOR.NEXTN_ENORM,
    "pre_fc_norm_hidden": MODEL_TENSOR.NEXTN_HNORM,
    "norm": MODEL_TENSOR.NEXTN_SHARED_HEAD_NORM,
}
SELF_NAMED = {
    "in_proj_qkvz": (MODEL_TENSOR.ATTN_QKV, MODEL_TENSOR.ATTN_GATE),
    "gate_up_proj": (MODEL_TENSOR.FFN_GATE_EXP, MODEL_TENSOR.FFN_UP_EXP),
}


def hf_target(family: str, dims: Dims = DIMS, **options: bool) -> tuple[dict, dict[str, tuple[int, ...]]]:
    """A fixture target's config.json and logical tensor shapes (BF16 on disk, float here)."""
    specs = target_tensors(family, dims, **options)
    return target_config(family, dims, vocabulary(DEFAULT_FLAVOUR[family])), {n: s for n, (_, s) in specs.items()}


def random_tensors(shapes: dict[str, tuple[int, ...]]) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    return {name: torch.randn(shape, generator=generator) for name, shape in sorted(shapes.items())}


def run(maps: list[TensorMap], tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    out = {}
    for tensor_map in maps:
        value = tensor_map.apply([tensors[s] for s in tensor_map.sources])
        assert tuple(value.shape) == tensor_map.shape, tensor_map.name
        out[tensor_map.name] = value
    return out


def header(plan) -> dict[str, object]:
    return {"general.architecture": plan.arch, **{key: value for key, value, _ in plan.fields}}


def rope_freqs_of(plan) -> list[float] | None:
    maps = [m for m in plan.tensors if m.name == "rope_freqs.weight"]
    return maps[0].apply([]).tolist() if maps else None


def text_only(name: str) -> str:
    """from_gguf writes Qwen3.5 as the text-only causal LM: `model.` where multimodal repos have `model.language_model.`."""
    return name.replace("model.language_model.", "model.")


# --------------------------------------------------------------------------------------------------
# names


def converter_names(hf_name: str, layers: int) -> list[str]:
    """What llama.cpp's converter calls the GGUF tensor(s) made from one HF tensor."""
    block = re.search(r"layers\.(\d+)\.", hf_name)
    bid = layers + int(block[1]) if hf_name.startswith("mtp.layers.") else int(block[1]) if block else layers
    for part, tensors in SELF_NAMED.items():
        if part in hf_name:
            return [TENSOR_NAMES[t].format(bid=bid) + ".weight" for t in tensors]
    head = re.fullmatch(r"mtp\.(\w+)\.weight", hf_name)
    if head:  # PyPI gguf 0.19.0 does not map the nextn tensors of these archs
        return [TENSOR_NAMES[MTP_HEAD[head[1]]].format(bid=bid) + ".weight"]
    name = text_only(hf_name).replace(".dt_bias", ".dt_proj.bias")
    name = re.sub(r"^mtp\.layers\.\d+\.", f"model.layers.{bid}.", name)
    name = re.sub(r"\.experts\.\d+\.(\w+)\.weight$", r".experts.\1.weight", name)  # stacked before mapping
    return [name + (".weight" if name.endswith("experts.down_proj") else "")]


@pytest.mark.parametrize("family", FAMILIES)
def test_gguf_names_are_gguf_py_s(family):
    config, shapes = hf_target(family)
    plan = to_gguf(config, shapes)
    fields = header(plan)
    blocks = fields[f"{plan.arch}.block_count"]
    name_map = gguf.get_tensor_name_map(GGUF_ARCH[plan.arch], blocks)
    expected = set()
    for hf_name in shapes:
        if hf_name.startswith("model.visual."):
            continue
        for name in converter_names(hf_name, DIMS.layers):
            expected.add(
                name if name.startswith("blk.") else name_map.get_name(name, try_suffixes=(".weight", ".bias"))
            )
    if family == "llama":  # Llama 3 rope scaling travels as llama.cpp's rope factors tensor
        expected.add(TENSOR_NAMES[MODEL_TENSOR.ROPE_FREQS] + ".weight")
    assert None not in expected
    assert {m.name for m in plan.tensors} == expected
    assert len(plan.tensors) == len(expected)


@pytest.mark.parametrize("dflash2", [None, DFlash2()], ids=["dflash", "dflash2"])
def test_dflash_tensors_and_keys_are_llama_cpp_s(tmp_path, dflash2):
    """Against the hand-written upstream DFlash GGUF of the fixtures (names from llama.cpp's llama-arch.cpp)."""
    drafter = build_dflash(tmp_path / "hf", dflash2=dflash2, target_layer_ids=[1, 3, 5])
    config = json.loads((drafter / "config.json").read_text())
    shapes = {
        n: s
        for n, (_, s) in dflash_tensors(
            64, 2, 4, 2, 16, 128, fc_inputs=3 * 64, vocab_size=config["vocab_size"], dflash2=dflash2
        ).items()
    }
    qwen3_5_target = target_config("qwen3_5_moe", DIMS, vocabulary("qwen3_5"))
    plan = to_gguf(config, shapes, target_config=qwen3_5_target)
    written = read_local(str(build_gguf_dflash(tmp_path / "d.gguf", target_layer_ids=[1, 3, 5], dflash2=dflash2)))
    assert plan.arch == "dflash"
    assert {m.name: m.shape for m in plan.tensors} == {t.name: t.shape for t in written.tensors}
    fields = {key: (value, vtype) for key, value, vtype in plan.fields}
    assert fields["dflash.target_layers"] == ([2, 4, 6], GGUFValueType.ARRAY)  # HF ids + 1
    assert fields["dflash.block_size"] == (16, GGUFValueType.UINT32)
    assert fields["tokenizer.ggml.mask_token_id"] == (config["dflash_config"]["mask_token_id"], GGUFValueType.UINT32)
    assert fields["dflash.attention.sliding_window"][0] == 4096
    assert fields["dflash.attention.sliding_window_pattern"][0] == [True, False]
    assert fields["dflash.rope.dimension_sections"][0] == [8, 0, 0, 0]
    for key in (
        "block_size",
        "target_layers",
        "attention.sliding_window",
        "attention.sliding_window_pattern",
        "rope.dimension_sections",
        "embedding_length",
        "block_count",
        "attention.head_count_kv",
    ):
        assert fields[f"dflash.{key}"][0] == written.fields[f"dflash.{key}"], key
    assert fields["tokenizer.ggml.mask_token_id"][0] == written.fields["tokenizer.ggml.mask_token_id"]
    if dflash2:
        assert {k: fields[f"dflash.{k}"][0] for k in vars(dflash2)} == vars(dflash2)
        assert fields["dflash.attention.causal"] == (False, GGUFValueType.BOOL)
    else:
        assert not any(k.startswith(("dflash.selector", "dflash.conv")) for k in fields)
    assert not any(f"dflash.{k}" in fields for k in ("rope.dimension_count", "vocab_size"))


def test_dflash_rope_sections_follow_the_target(tmp_path):
    drafter_config = _drafter_config(tmp_path)
    shapes = _drafter_shapes(drafter_config)
    qwen3 = target_config("qwen3", DIMS, vocabulary("qwen3"))
    keys = {k for k, _, _ in to_gguf(drafter_config, shapes, target_config=qwen3).fields}
    assert "dflash.rope.dimension_sections" not in keys
    qwen3_5 = target_config("qwen3_5", DIMS, vocabulary("qwen3_5"))
    keys = {k for k, _, _ in to_gguf(drafter_config, shapes, target_config=qwen3_5).fields}
    assert "dflash.rope.dimension_sections" in keys


def test_target_tensors_match_the_fixture_gguf(tmp_path):
    """The hand-written qwen35moe GGUF (MTP block after 4 decoder blocks) has our names and shapes."""
    dims = Dims(layers=4, head_dim=32)
    config, shapes = hf_target("qwen3_5_moe", dims)
    plan = to_gguf(config, shapes)
    written = read_local(
        str(build_gguf_target(tmp_path / "t.gguf", "qwen35moe", layers=4, head_dim=32, vocab_size=dims.vocab_size))
    )
    ours = {m.name: m.shape for m in plan.tensors}
    theirs = {t.name: t.shape for t in written.tensors}
    # llama.cpp's converter keeps shared_expert_gate [1, H]; the fixture writes [H]: one ggml tensor ({H, 1})
    assert {n for n in ours if ours[n] != theirs[n]} == {f"blk.{i}.ffn_gate_inp_shexp.weight" for i in range(5)}
    assert ours.keys() == theirs.keys() and all(ours[n] == (1, *theirs[n]) for n in ours if ours[n] != theirs[n])
    back = from_gguf(written.fields, theirs)  # and reads the [H] form
    assert next(m for m in back.tensors if m.name.endswith("layers.0.mlp.shared_expert_gate.weight")).shape == (1, 64)


# --------------------------------------------------------------------------------------------------
# values: exact inverses, and llama.cpp's converter formulas restated


@pytest.mark.parametrize("family", FAMILIES)
def test_hf_gguf_hf_is_the_identity(family):
    config, shapes = hf_target(family)
    plan = to_gguf(config, shapes)
    hf = random_tensors(shapes)
    gguf_tensors = run(plan.tensors, hf)
    back_plan = from_gguf(
        header(plan), {n: tuple(t.shape) for n, t in gguf_tensors.items()}, rope_freqs=rope_freqs_of(plan)
    )
    back = run(back_plan.tensors, gguf_tensors)
    kept = {text_only(n): n for n in hf if not n.startswith("model.visual.")}
    assert set(back) == set(kept)
    value_changed = {s for m in plan.tensors if m.kind == "value" for s in m.sources}
    for name, source in kept.items():
        assert back[name].shape == hf[source].shape, name
        if source in value_changed:
            assert torch.allclose(back[name], hf[source], rtol=0, atol=1e-6), name
        else:
            assert torch.equal(back[name], hf[source]), name
    assert bool(value_changed) == (family in HYBRID)  # zero-centred norms, A_log
    # and the HF side from_gguf wrote converts to the same GGUF again
    again = to_gguf(back_plan.config, {n: tuple(t.shape) for n, t in back.items()})
    assert again.fields == plan.fields
    for name, value in run(again.tensors, back).items():
        assert torch.allclose(value, gguf_tensors[name], rtol=0, atol=1e-6), name


def test_qwen3_5_values_follow_llama_cpp():
    """conversion/qwen.py: zero-centred norms + 1 (not linear_attn.norm), ssm_a = -exp(A_log), conv1d
    squeezed, and value heads grouped by key head (v = k * r + j) -> tiled (v = j * Hk + k)."""
    config, shapes = hf_target("qwen3_5")
    hf = random_tensors(shapes)
    out = run(to_gguf(config, shapes).tensors, hf)
    p, k_heads, v_heads, dim = "model.language_model.layers.0.", DIMS.linear_key_heads, DIMS.linear_value_heads, 16
    per_k = v_heads // k_heads

    def tiled(x: torch.Tensor, head_dim: int, axis: int = 0) -> torch.Tensor:
        x = x.movedim(axis, 0)
        x = x.reshape(k_heads, per_k, head_dim, *x.shape[1:]).transpose(0, 1).reshape(x.shape)
        return x.movedim(0, axis)

    keys = 2 * k_heads * dim
    assert torch.equal(out["blk.0.attn_norm.weight"], hf[f"{p}input_layernorm.weight"] + 1)
    assert torch.equal(out["blk.0.post_attention_norm.weight"], hf[f"{p}post_attention_layernorm.weight"] + 1)
    assert torch.equal(out["output_norm.weight"], hf["model.language_model.norm.weight"] + 1)
    assert torch.equal(out["blk.3.attn_q_norm.weight"], hf["model.language_model.layers.3.self_attn.q_norm.weight"] + 1)
    assert torch.equal(out["blk.0.ssm_norm.weight"], hf[f"{p}linear_attn.norm.weight"])
    assert torch.equal(out["blk.0.ssm_a"], tiled(-torch.exp(hf[f"{p}linear_attn.A_log"])[:, None], 1)[:, 0])
    assert torch.equal(out["blk.0.ssm_dt.bias"], tiled(hf[f"{p}linear_attn.dt_bias"][:, None], 1)[:, 0])
    qkv = hf[f"{p}linear_attn.in_proj_qkv.weight"]
    assert torch.equal(out["blk.0.attn_qkv.weight"], torch.cat([qkv[:keys], tiled(qkv[keys:], dim)]))
    conv = hf[f"{p}linear_attn.conv1d.weight"][:, 0, :]
    assert torch.equal(out["blk.0.ssm_conv1d.weight"], torch.cat([conv[:keys], tiled(conv[keys:], dim)]))
    assert torch.equal(out["blk.0.attn_gate.weight"], tiled(hf[f"{p}linear_attn.in_proj_z.weight"], dim))
    assert torch.equal(out["blk.0.ssm_alpha.weight"], tiled(hf[f"{p}linear_attn.in_proj_a.weight"], 1))
    assert torch.equal(out["blk.0.ssm_beta.weight"], tiled(hf[f"{p}linear_attn.in_proj_b.weight"], 1))
    assert torch.equal(out["blk.0.ssm_out.weight"], tiled(hf[f"{p}linear_attn.out_proj.weight"], dim, axis=1))
    assert torch.equal(out[f"blk.{DIMS.layers}.nextn.eh_proj.weight"], hf["mtp.fc.weight"])
    assert torch.equal(out[f"blk.{DIMS.layers}.nextn.enorm.weight"], hf["mtp.pre_fc_norm_embedding.weight"] + 1)
    assert torch.equal(out[f"blk.{DIMS.layers}.attn_q.weight"], hf["mtp.layers.0.self_attn.q_proj.weight"])


def test_qwen3_next_qkvz_split_follows_llama_cpp():
    """Per key head [q, k, v, z] -> attn_qkv [all q; all k; all v] and attn_gate [all z]; no V-head reorder."""
    config, shapes = hf_target("qwen3_next")
    hf = random_tensors(shapes)
    out = run(to_gguf(config, shapes).tensors, hf)
    k_heads, dim, per_k = DIMS.linear_key_heads, 16, DIMS.linear_value_heads // DIMS.linear_key_heads
    qkvz = hf["model.layers.0.linear_attn.in_proj_qkvz.weight"].reshape(k_heads, 2 * dim + 2 * per_k * dim, -1)
    q, k, v, z = qkvz.split([dim, dim, per_k * dim, per_k * dim], dim=1)
    flat = [t.reshape(-1, qkvz.shape[-1]) for t in (q, k, v, z)]
    assert torch.equal(out["blk.0.attn_qkv.weight"], torch.cat(flat[:3]))
    assert torch.equal(out["blk.0.attn_gate.weight"], flat[3])
    assert torch.equal(out["blk.0.ssm_ba.weight"], hf["model.layers.0.linear_attn.in_proj_ba.weight"])
    assert torch.equal(out["blk.0.ssm_dt.bias"], hf["model.layers.0.linear_attn.dt_bias"])
    experts = torch.stack([hf[f"model.layers.0.mlp.experts.{e}.down_proj.weight"] for e in range(DIMS.experts)])
    assert torch.equal(out["blk.0.ffn_down_exps.weight"], experts)


def test_llama_rope_rows_and_factors_follow_llama_cpp():
    """conversion/llama.py: q/k rows per head from halves to interleaved pairs; Llama 3 scaling as rope_freqs."""
    config, shapes = hf_target("llama")
    hf = random_tensors(shapes)
    plan = to_gguf(config, shapes)
    out = run(plan.tensors, hf)
    q = hf["model.layers.0.self_attn.q_proj.weight"]
    assert torch.equal(
        out["blk.0.attn_q.weight"], q.reshape(DIMS.heads, 2, DIMS.head_dim // 2, -1).swapaxes(1, 2).reshape(q.shape)
    )
    k = hf["model.layers.0.self_attn.k_proj.weight"]
    assert torch.equal(
        out["blk.0.attn_k.weight"], k.reshape(DIMS.kv_heads, 2, DIMS.head_dim // 2, -1).swapaxes(1, 2).reshape(k.shape)
    )
    scaling = config["rope_scaling"]
    theta, dim = config["rope_theta"], DIMS.head_dim
    expected = []
    for i in range(dim // 2):
        wavelength = 2 * math.pi * theta ** (2 * i / dim)
        low, high = (
            scaling["original_max_position_embeddings"] / scaling["low_freq_factor"],
            scaling["original_max_position_embeddings"] / scaling["high_freq_factor"],
        )
        smooth = (scaling["original_max_position_embeddings"] / wavelength - scaling["low_freq_factor"]) / (
            scaling["high_freq_factor"] - scaling["low_freq_factor"]
        )
        expected.append(
            1.0
            if wavelength < high
            else scaling["factor"]
            if wavelength > low
            else 1 / ((1 - smooth) / scaling["factor"] + smooth)
        )
    assert torch.allclose(out["rope_freqs.weight"], torch.tensor(expected), rtol=1e-6, atol=0)
    assert not any(".rope.scaling." in key for key, _, _ in plan.fields)  # llama.cpp reads only the tensor
    back = from_gguf(header(plan), {n: tuple(t.shape) for n, t in out.items()}, rope_freqs=expected)
    assert back.config["rope_parameters"] == {
        "rope_type": "llama3",
        "rope_theta": theta,
        **{
            k: scaling[k] for k in ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")
        },
    }
    with pytest.raises(BadInput, match="rope_freqs"):
        from_gguf(header(plan), {n: tuple(t.shape) for n, t in out.items()})
    with pytest.raises(BadInput, match="rope_freqs.weight.*not Llama 3"):
        from_gguf(header(plan), {n: tuple(t.shape) for n, t in out.items()}, rope_freqs=[1.0, 3.0] * (dim // 4))


def test_fused_and_per_expert_storage_make_one_gguf():
    """Qwen3.5 BF16 repos fuse experts 3-D (gate rows first); quantized exports keep one tensor per expert."""
    config, shapes = hf_target("qwen3_5_moe")
    fused = random_tensors(shapes)
    per_expert = {}
    for name, value in fused.items():
        if name.endswith("mlp.experts.gate_up_proj"):
            for e in range(value.shape[0]):
                half = value.shape[1] // 2
                per_expert[name.replace("gate_up_proj", f"{e}.gate_proj.weight")] = value[e, :half]
                per_expert[name.replace("gate_up_proj", f"{e}.up_proj.weight")] = value[e, half:]
        elif name.endswith("mlp.experts.down_proj"):
            for e in range(value.shape[0]):
                per_expert[name.replace("down_proj", f"{e}.down_proj.weight")] = value[e]
        else:
            per_expert[name] = value
    from_fused = run(to_gguf(config, shapes).tensors, fused)
    from_per_expert = run(to_gguf(config, {n: tuple(t.shape) for n, t in per_expert.items()}).tensors, per_expert)
    assert from_fused.keys() == from_per_expert.keys()
    assert all(torch.equal(from_fused[n], from_per_expert[n]) for n in from_fused)
    gate = from_fused["blk.0.ffn_gate_exps.weight"]
    assert torch.equal(
        gate, fused["model.language_model.layers.0.mlp.experts.gate_up_proj"][:, : DIMS.moe_intermediate]
    )


def test_llama_cpp_fused_gate_up_experts_are_read():
    """llama.cpp may store ffn_gate_up_exps (gate rows first); from_gguf reads it into either HF form."""
    config, shapes = hf_target("qwen3_5_moe")
    hf = random_tensors(shapes)
    plan = to_gguf(config, shapes)
    separate = run(plan.tensors, hf)
    fused = dict(separate)
    for i in range(DIMS.layers + 1):
        gate, up = fused.pop(f"blk.{i}.ffn_gate_exps.weight"), fused.pop(f"blk.{i}.ffn_up_exps.weight")
        fused[f"blk.{i}.ffn_gate_up_exps.weight"] = torch.cat([gate, up], dim=1)
    back_fused = run(from_gguf(header(plan), {n: tuple(t.shape) for n, t in fused.items()}).tensors, fused)
    back_separate = run(from_gguf(header(plan), {n: tuple(t.shape) for n, t in separate.items()}).tensors, separate)
    assert back_fused.keys() == back_separate.keys()
    assert all(torch.equal(back_fused[n], back_separate[n]) for n in back_fused)
    assert "mtp.layers.0.mlp.experts.3.up_proj.weight" in back_fused  # the MTP layer stays per expert


# --------------------------------------------------------------------------------------------------
# configs: transformers loads them, checkpoint/hf.py reads the same shapes


@pytest.mark.parametrize("family", FAMILIES)
def test_transformers_loads_the_hf_side(tmp_path, family):
    from transformers import AutoModelForCausalLM

    config, shapes = hf_target(family)
    plan = to_gguf(config, shapes)
    gguf_tensors = run(plan.tensors, random_tensors(shapes))
    back = from_gguf(header(plan), {n: tuple(t.shape) for n, t in gguf_tensors.items()}, rope_freqs=rope_freqs_of(plan))
    tensors = run(back.tensors, gguf_tensors)
    save_file({n: t.contiguous() for n, t in tensors.items()}, str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text(json.dumps(back.config))
    model, info = AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32, output_loading_info=True)
    assert type(model).__name__ == back.config["architectures"][0]
    assert not info["missing_keys"]
    assert all(k.startswith("mtp.") for k in info["unexpected_keys"])
    assert torch.equal(model.get_input_embeddings().weight, tensors["model.embed_tokens.weight"])
    layer = model.model.layers[0]
    if family in HYBRID:
        assert torch.equal(layer.linear_attn.A_log, tensors["model.layers.0.linear_attn.A_log"])
    if family in ("qwen3_moe", "qwen3_next", "qwen3_5_moe"):
        up = tensors.get("model.layers.0.mlp.experts.1.up_proj.weight")
        fused = tensors.get("model.layers.0.mlp.experts.gate_up_proj")
        expected = up if up is not None else fused[1, DIMS.moe_intermediate :]
        assert torch.equal(layer.mlp.experts.gate_up_proj[1, DIMS.moe_intermediate :], expected)

    def shapes_of(config_json: dict, tensor_shapes: dict[str, tuple[int, ...]]):
        infos = [TensorInfo(n, "F32", tuple(s), 4 * math.prod(s), "x") for n, s in tensor_shapes.items()]
        return build_hf_checkpoint(HFMetadata(config_json, "config.json", tensors=infos), "x", "local").shapes

    assert shapes_of(back.config, {n: tuple(t.shape) for n, t in tensors.items()}) == shapes_of(config, shapes)


@pytest.mark.parametrize("dflash2", [None, DFlash2()], ids=["dflash", "dflash2"])
def test_dflash_round_trip(tmp_path, dflash2):
    config = _drafter_config(tmp_path, dflash2)
    shapes = _drafter_shapes(config, dflash2)
    plan = to_gguf(config, shapes)
    gguf_tensors = run(plan.tensors, random_tensors(shapes))
    fields = {**header(plan), "tokenizer.ggml.tokens": [f"t{i}" for i in range(config["vocab_size"])]}
    back = from_gguf(fields, {n: tuple(t.shape) for n, t in gguf_tensors.items()})
    assert back.config["dflash_config"] == config["dflash_config"]
    assert back.config["architectures"] == config["architectures"]
    for key in (
        "layer_types",
        "sliding_window",
        "hidden_size",
        "num_hidden_layers",
        "head_dim",
        "vocab_size",
        "intermediate_size",
        "num_key_value_heads",
        "rms_norm_eps",
    ):
        assert back.config[key] == config[key], key
    assert back.config.get("is_causal") == config.get("is_causal")
    assert back.config["rope_parameters"]["rope_theta"] == config["rope_parameters"]["rope_theta"]
    tensors = run(back.tensors, gguf_tensors)
    assert {n: tuple(t.shape) for n, t in tensors.items()} == shapes

    def drafter_of(config_json: dict, tensor_shapes: dict[str, tuple[int, ...]]):
        infos = [TensorInfo(n, "F32", tuple(s), 4 * math.prod(s), "x") for n, s in tensor_shapes.items()]
        checkpoint = build_hf_checkpoint(HFMetadata(config_json, "config.json", tensors=infos), "x", "local")
        return (
            checkpoint.shapes,
            checkpoint.drafter.taps.layers,
            checkpoint.drafter.mask_token_id,
            checkpoint.drafter.block_size,
            checkpoint.drafter.kind,
            checkpoint.rope.sliding_window,
        )

    assert drafter_of(back.config, shapes) == drafter_of(config, shapes)


def test_fork_header_maps_like_upstream(tmp_path):
    """A `dflash-draft` fork GGUF (HF tap ids, dflash_fc / dflash_hidden_norm) gives the upstream HF config."""
    options = {"target_layer_ids": [1, 3, 5], "mask_token_id": 300, "block_size": 8}
    upstream = read_local(str(build_gguf_dflash(tmp_path / "up.gguf", "dflash", **options)))
    fork = read_local(str(build_gguf_dflash(tmp_path / "fork.gguf", "dflash-draft", **options)))
    assert "dflash_fc.weight" in {t.name for t in fork.tensors}
    from_upstream = from_gguf(upstream.fields, {t.name: t.shape for t in upstream.tensors})
    from_fork = from_gguf(fork.fields, {t.name: t.shape for t in fork.tensors})
    assert from_fork.config == from_upstream.config
    assert from_fork.config["dflash_config"] == {"block_size": 8, "mask_token_id": 300, "target_layer_ids": [1, 3, 5]}
    assert [(m.name, m.shape) for m in from_fork.tensors] == [(m.name, m.shape) for m in from_upstream.tensors]
    written_back = to_gguf(from_fork.config, {m.name: m.shape for m in from_fork.tensors})
    assert dict((k, v) for k, v, _ in written_back.fields)["dflash.target_layers"] == [2, 4, 6]
    assert {m.name for m in written_back.tensors} == {t.name for t in upstream.tensors}


def test_fork_post_attention_norm_is_read_as_upstream_ffn_norm(tmp_path):
    fork = read_local(str(build_gguf_dflash(tmp_path / "fork.gguf", "dflash-draft", target_layer_ids=[1, 3])))
    renamed = {re.sub(r"\.ffn_norm\.", ".post_attention_norm.", t.name): t.shape for t in fork.tensors}
    plan = from_gguf(fork.fields, renamed)
    assert any(m.name == "layers.0.post_attention_layernorm.weight" for m in plan.tensors)


def test_tied_embeddings_write_no_output_tensor():
    config, shapes = hf_target("qwen3", tie_embeddings=True)
    assert "lm_head.weight" not in shapes
    plan = to_gguf(config, shapes)
    assert "output.weight" not in {m.name for m in plan.tensors}
    back = from_gguf(header(plan), {m.name: m.shape for m in plan.tensors})
    assert back.config["tie_word_embeddings"] is True
    assert {m.name for m in back.tensors} == set(shapes)


def test_mtp_and_vision_are_dropped_with_notes():
    config, shapes = hf_target("qwen3_5_moe")
    with_mtp = to_gguf(config, shapes)
    without = to_gguf(config, shapes, mtp=False)
    assert dict((k, v) for k, v, _ in with_mtp.fields)["qwen35moe.nextn_predict_layers"] == 1
    assert dict((k, v) for k, v, _ in without.fields)["qwen35moe.block_count"] == DIMS.layers
    assert "qwen35moe.nextn_predict_layers" not in {k for k, _, _ in without.fields}
    assert not any(m.name.startswith(f"blk.{DIMS.layers}.") for m in without.tensors)
    assert any("model.visual." in note for note in with_mtp.notes)
    assert any("mtp.*" in note and "mtp=False" in note for note in without.notes)
    back = from_gguf(header(without), {m.name: m.shape for m in without.tensors})
    assert back.config["mtp_num_hidden_layers"] == 0 and not any(m.name.startswith("mtp.") for m in back.tensors)


# --------------------------------------------------------------------------------------------------
# bad input


def _drafter_config(tmp_path: Path, dflash2: DFlash2 | None = None) -> dict:
    return json.loads((build_dflash(tmp_path / "drafter", dflash2=dflash2) / "config.json").read_text())


def _drafter_shapes(config: dict, dflash2: DFlash2 | None = None) -> dict[str, tuple[int, ...]]:
    taps = len(config["dflash_config"]["target_layer_ids"])
    specs = dflash_tensors(64, 2, 4, 2, 16, 128, fc_inputs=taps * 64, vocab_size=config["vocab_size"], dflash2=dflash2)
    return {n: s for n, (_, s) in specs.items()}


def _without(config: dict, key: str) -> dict:
    config = json.loads(json.dumps(config))
    holder = config.get("text_config", config)
    del holder[key]
    return config


@pytest.mark.parametrize(
    "family,key",
    [
        ("qwen3", "hidden_size"),
        ("qwen3_5_moe", "num_experts"),
        ("qwen3_next", "linear_num_value_heads"),
        ("llama", "rms_norm_eps"),
    ],
)
def test_missing_config_key_is_named(family, key):
    config, shapes = hf_target(family)
    with pytest.raises(BadInput, match=f"'{key}'"):
        to_gguf(_without(config, key), shapes)


def test_unknown_architectures_are_refused():
    config, shapes = hf_target("qwen3")
    with pytest.raises(BadInput, match="MistralForCausalLM.*no GGUF mapping"):
        to_gguf({**config, "architectures": ["MistralForCausalLM"]}, shapes)
    plan = to_gguf(config, shapes)
    with pytest.raises(BadInput, match="'gemma3'.*no HF mapping"):
        from_gguf({**header(plan), "general.architecture": "gemma3"}, {m.name: m.shape for m in plan.tensors})


def test_tensor_that_does_not_fit_the_config_is_named():
    config, shapes = hf_target("qwen3_5")
    bad = {**shapes, "model.language_model.layers.0.linear_attn.in_proj_z.weight": (16, 64)}
    z = r"'model\.language_model\.layers\.0\.linear_attn\.in_proj_z\.weight' has shape \[16, 64\]"
    with pytest.raises(BadInput, match=z):
        to_gguf(config, bad)
    with pytest.raises(BadInput, match="'model.language_model.layers.0.mlp.up_proj.weight'"):
        to_gguf(config, {n: s for n, s in shapes.items() if n != "model.language_model.layers.0.mlp.up_proj.weight"})
    with pytest.raises(BadInput, match="'model.language_model.layers.0.self_attn.q_proj.bias' has no place"):
        to_gguf(config, {**shapes, "model.language_model.layers.0.self_attn.q_proj.bias": (64,)})
    plan = to_gguf(config, shapes)
    gguf_shapes = {m.name: m.shape for m in plan.tensors}
    with pytest.raises(BadInput, match=r"'blk\.0\.ssm_a' has shape \[3\]"):
        from_gguf(header(plan), {**gguf_shapes, "blk.0.ssm_a": (3,)})


def test_bad_gguf_headers_name_the_key():
    config, shapes = hf_target("qwen3_moe")
    plan = to_gguf(config, shapes)
    gguf_shapes = {m.name: m.shape for m in plan.tensors}
    fields = header(plan)
    with pytest.raises(BadInput, match="missing required key 'qwen3moe.block_count'"):
        from_gguf({k: v for k, v in fields.items() if k != "qwen3moe.block_count"}, gguf_shapes)
    with pytest.raises(BadInput, match="'qwen3moe.expert_count' is 'eight'"):
        from_gguf({**fields, "qwen3moe.expert_count": "eight"}, gguf_shapes)
    with pytest.raises(BadInput, match="general.architecture"):
        from_gguf({k: v for k, v in fields.items() if k != "general.architecture"}, gguf_shapes)


def test_bad_drafter_configs_and_headers_name_the_key(tmp_path):
    config = _drafter_config(tmp_path)
    shapes = _drafter_shapes(config)
    no_taps = json.loads(json.dumps(config))
    del no_taps["dflash_config"]["target_layer_ids"]
    with pytest.raises(BadInput, match="target_layer_ids"):
        to_gguf(no_taps, shapes)
    scaled = json.loads(json.dumps(config))
    scaled["dflash_config"]["output_multiplier"] = 0.2
    with pytest.raises(BadInput, match="'output_multiplier' has no GGUF mapping"):
        to_gguf(scaled, shapes)
    half_dflash2 = json.loads(json.dumps(config))
    half_dflash2["dflash_config"]["selector_rank"] = 32
    with pytest.raises(BadInput, match="DFlash-2 needs all of"):
        to_gguf(half_dflash2, shapes)
    plan = to_gguf(config, shapes)
    gguf_shapes = {m.name: m.shape for m in plan.tensors}
    fields = {**header(plan), "tokenizer.ggml.tokens": ["t"] * config["vocab_size"]}
    with pytest.raises(BadInput, match="dflash.target_layers"):
        from_gguf({k: v for k, v in fields.items() if k != "dflash.target_layers"}, gguf_shapes)
    with pytest.raises(BadInput, match="tokenizer.ggml.mask_token_id"):
        from_gguf({k: v for k, v in fields.items() if k != "tokenizer.ggml.mask_token_id"}, gguf_shapes)
    with pytest.raises(BadInput, match=r"'fc\.weight' has shape"):
        to_gguf(config, {**shapes, "fc.weight": (64, 5 * 64)})


def test_semantics_llama_cpp_cannot_express_are_refused():
    config, shapes = hf_target("qwen3_moe")
    with pytest.raises(BadInput, match="norm_topk_prob"):
        to_gguf({**config, "norm_topk_prob": False}, shapes)
    with pytest.raises(BadInput, match="hidden_act"):
        to_gguf({**config, "hidden_act": "gelu"}, shapes)
    config, shapes = hf_target("qwen3")
    with pytest.raises(BadInput, match="rope_type 'longrope'"):
        to_gguf({**config, "rope_scaling": {"rope_type": "longrope", "factor": 4.0}}, shapes)
    yarn = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}
    plan = to_gguf({**config, "rope_scaling": yarn}, shapes)
    fields = {key: value for key, value, _ in plan.fields}
    assert (fields["qwen3.rope.scaling.type"], fields["qwen3.rope.scaling.factor"]) == ("yarn", 4.0)
    assert fields["qwen3.rope.scaling.original_context_length"] == 32768
    back = from_gguf(header(plan), {m.name: m.shape for m in plan.tensors})
    assert back.config["rope_parameters"] == {"rope_theta": 1000000.0, **yarn}
    with pytest.raises(BadInput, match="YaRN parameters beta_fast"):
        to_gguf({**config, "rope_scaling": {**yarn, "beta_fast": 32.0}}, shapes)


def test_a_modelopt_swa_drafter_converts_with_its_window_on_every_layer(tmp_path):
    """ModelOpt's export (Model-Optimizer#1960: layer_types all full, dflash_config.use_swa + swa_window_size,
    causal false) converts with the window on every layer and in-block attention non-causal, and reads back so."""
    config = _drafter_config(tmp_path)
    config["layer_types"] = ["full_attention"] * 2
    config["dflash_config"].update(use_swa=True, swa_window_size=512, causal=False)
    shapes = _drafter_shapes(config)
    plan = to_gguf(config, shapes, target_config=target_config("qwen3", DIMS, vocabulary("qwen3")))
    fields = {key: value for key, value, _ in plan.fields}
    assert fields["dflash.attention.sliding_window"] == 512
    assert fields["dflash.attention.sliding_window_pattern"] == [True, True]
    assert fields["dflash.attention.causal"] is False
    read_back = from_gguf(
        header(plan), {m.name: tuple(m.shape) for m in plan.tensors}, target_vocab=config["vocab_size"]
    )
    back = parse_config(read_back.config, "back")
    assert (back.layer_types, back.sliding_window, back.drafter.is_causal) == (("sliding",) * 2, 512, False)


@pytest.mark.parametrize(
    ("declaration", "pattern"),
    [
        ({"layer_types": ["sliding_attention", "full_attention"]}, [True, False]),
        # no layer_types: transformers' Qwen3Config slides layers from max_window_layers on
        ({"layer_types": None, "use_sliding_window": True, "max_window_layers": 1}, [False, True]),
        ({"layer_types": None, "use_sliding_window": True}, None),  # max_window_layers 28: all full
    ],
)
def test_the_converter_windows_the_layers_the_reader_does(tmp_path, declaration, pattern):
    """The converter writes the window keys from the drafter's config as parse_config reads it, whichever way the
    config declares the window, so the GGUF runs the attention the HF checkpoint runs in specpair and the stacks."""
    config = _drafter_config(tmp_path)
    config.update({"sliding_window": 256, **declaration})
    config = {k: v for k, v in config.items() if v is not None}
    plan = to_gguf(config, _drafter_shapes(config), target_config=target_config("qwen3", DIMS, vocabulary("qwen3")))
    fields = {key: value for key, value, _ in plan.fields}
    assert fields.get("dflash.attention.sliding_window_pattern") == pattern
    assert fields.get("dflash.attention.sliding_window") == (256 if pattern else None)
    sliding = [t == "sliding" for t in parse_config(config, "config.json").layer_types]
    assert sliding == (pattern or [False, False])


def test_a_drafter_with_sliding_layers_and_no_window_is_refused_by_the_converter(tmp_path):
    config = _drafter_config(tmp_path)
    config.pop("sliding_window")
    with pytest.raises(BadInput, match="the drafter has sliding layers but no window size"):
        to_gguf(config, _drafter_shapes(config), target_config=target_config("qwen3", DIMS, vocabulary("qwen3")))
