"""The model layer (sources/model.py): one typed config and one set of canonical weights, whatever the source.

The same tiny model written by `specpair convert` in every layout and file format must give an equal
`ModelConfig`, the same canonical names and shapes, and `load` values within the layout's error of the float
source; `load_packed(...).dequantize()` must equal `load` bit for bit; `stream` reads every stored byte once.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch
from fixtures import DFlash2, build_dflash, build_eagle3, build_target, save, tiny_model

from specpair.checkpoint.config import ModelConfig, parse_config
from specpair.convert import converter as conv
from specpair.errors import BadInput
from specpair.formats import safetensors
from specpair.sources.model import open_model

FAMILIES = ["llama", "qwen3", "qwen3_moe", "qwen3_next", "qwen3_5", "qwen3_5_moe"]
# relative Frobenius error of the whole model's weights against the float32 source, per layout
LAYOUTS = {
    "bf16": 0.005,
    "gguf:F32": 1e-7,  # F32: (1 + w) - 1 rounds
    "gguf:Q8_0": 0.008,
    "gguf:Q4_K": 0.08,
    "nvfp4": 0.11,
    "affine4": 0.11,
    "fp8": 0.035,
}
TOKEN_FIELDS = ("bos_token_id", "eos_token_ids", "pad_token_id")


def convert(source: Path, destination: Path, to: str, donor: Path | None = None) -> Path:
    p = conv.plan(
        conv.open_source(str(source)), conv.parse_target(to), [], conv.open_source(str(donor)) if donor else None
    )
    conv.execute(p, str(destination))
    return destination


def structure(config: ModelConfig) -> ModelConfig:
    """A config without its stop ids (a GGUF keeps one eos id where generation_config lists several) and a
    drafter's informational num_target_layers (llama.cpp's dflash arch has no key for it)."""
    drafter = dataclasses.replace(config.drafter, num_target_layers=None) if config.drafter else None
    return dataclasses.replace(
        config, drafter=drafter, **{f: ModelConfig.__dataclass_fields__[f].default for f in TOKEN_FIELDS}
    )


def relative_error(reference: open_model, other: open_model) -> float:
    error = norm = 0.0
    for name in reference.names:
        a, b = reference.load(name), other.load(name)
        error += float((a - b).square().sum())
        norm += float(a.square().sum())
    return (error / norm) ** 0.5


@pytest.fixture(scope="module", params=FAMILIES)
def family_source(request, tmp_path_factory) -> tuple[str, Path]:
    family = request.param
    directory = tmp_path_factory.mktemp(family)
    model = tiny_model(family, hidden=256 if family in ("llama", "qwen3") else 64)  # Q4_K rows need 256
    return family, save(model, directory / "hf", "llama3" if family == "llama" else "qwen3")


@pytest.mark.parametrize("to", list(LAYOUTS))
def test_every_layout_gives_the_same_model(family_source, tmp_path, to):
    family, source = family_source
    if to == "gguf:Q4_K" and family not in ("llama", "qwen3"):
        to = "gguf:Q8_0"  # k-quant rows are 256 values: only the 256-wide models have them
    reference = open_model(str(source))
    other = open_model(str(convert(source, tmp_path / ("out.gguf" if to.startswith("gguf") else "out"), to)))
    assert structure(other.config) == structure(reference.config)
    assert reference.config.family == family
    assert set(other.names) == set(reference.names)
    assert {n: other.shape(n) for n in other.names} == {n: reference.shape(n) for n in reference.names}
    assert relative_error(reference, other) <= LAYOUTS[to]
    unpacked = set()
    for name in other.names:
        weight = other.load_packed(name)
        if weight is None:
            unpacked.add(name)
        else:
            assert torch.equal(weight.dequantize(), other.load(name)), name
    quantized = {n for n in other.names if other.layout(n) not in ("bf16", "f16", "f32")}
    # Every quantized weight has its exact packed form, but where Qwen3-Next's fused projections are taken
    # apart by single rows, which FP8's 128x128 scale tiles cannot follow.
    fp8_splits = {n for n in quantized if family == "qwen3_next" and to == "fp8" and ".in_proj_" in n}
    assert unpacked & quantized == fp8_splits


def test_canonical_names_drop_prefixes_and_stack_experts(family_source):
    family, source = family_source
    model = open_model(str(source))
    names = set(model.names)
    assert "embed_tokens.weight" in names and "norm.weight" in names and "layers.0.input_layernorm.weight" in names
    assert not any(n.startswith(("model.", "language_model.")) for n in names)
    if model.config.is_moe:
        experts = model.shape("layers.0.mlp.experts.gate_proj.weight")
        assert experts == (model.config.num_experts, model.config.moe_intermediate_size, model.config.hidden_size)
        assert not any(".experts.0." in n for n in names)
    if model.config.layer_types[0] == "linear":  # Qwen3-Next's fused projections come apart like Qwen3.5's
        assert {f"layers.0.linear_attn.in_proj_{p}.weight" for p in ("qkv", "z", "a", "b")} <= names


def test_qwen3_next_split_rows_are_the_fused_ones(tmp_path):
    """in_proj_qkvz [per key head: q, k, v heads, z heads] gives in_proj_qkv = [all q | all k | all v]."""
    from safetensors.torch import load_file

    model = tiny_model("qwen3_next")
    source = save(model, tmp_path / "hf", "qwen3")
    opened = open_model(str(source))
    c = opened.config
    fused = load_file(str(source / "model.safetensors"))["model.layers.0.linear_attn.in_proj_qkvz.weight"]
    per_key = fused.reshape(c.linear_num_key_heads, -1, fused.shape[-1])
    r = c.linear_num_value_heads // c.linear_num_key_heads
    dk, dv = c.linear_key_head_dim, c.linear_value_head_dim
    q, k, v, z = torch.split(per_key, [dk, dk, r * dv, r * dv], dim=1)
    expected = torch.cat([q.flatten(0, 1), k.flatten(0, 1), v.flatten(0, 1)])
    assert torch.equal(opened.load("layers.0.linear_attn.in_proj_qkv.weight"), expected)
    assert torch.equal(opened.load("layers.0.linear_attn.in_proj_z.weight"), z.flatten(0, 1))


def test_gguf_value_transforms_are_undone(tmp_path):
    """Qwen3.5 GGUFs store norms as 1 + w, -exp(A_log), squeezed conv1d and tiled value heads: load undoes all."""
    source = save(tiny_model("qwen3_5_moe"), tmp_path / "hf", "qwen3")
    reference = open_model(str(source))
    gguf = open_model(str(convert(source, tmp_path / "m.gguf", "gguf:F32")))
    for name in (
        "norm.weight",
        "layers.0.linear_attn.A_log",
        "layers.0.linear_attn.conv1d.weight",
        "layers.0.linear_attn.in_proj_qkv.weight",
        "layers.0.linear_attn.out_proj.weight",
        "layers.0.linear_attn.dt_bias",
        "layers.3.self_attn.q_norm.weight",
    ):
        assert torch.allclose(gguf.load(name), reference.load(name), rtol=0, atol=1e-6), name


def test_packed_gguf_out_proj_keeps_its_columns_as_data(tmp_path):
    """Tiled value heads permute out_proj's columns: no stored-row move undoes that, so the packed weight
    carries the column order and its matmul with the permuted input equals the logical one."""
    source = save(tiny_model("qwen3_5"), tmp_path / "hf", "qwen3")
    gguf = open_model(str(convert(source, tmp_path / "m.gguf", "gguf:Q8_0")))
    packed = gguf.load_packed("layers.0.linear_attn.out_proj.weight")
    assert packed is not None and packed.col_order is not None
    x = torch.randn(3, packed.shape[1])
    stored = packed.dequantize()[:, torch.argsort(packed.col_order)]  # the stored matrix
    assert torch.allclose(
        packed.inputs(x) @ stored.T, x @ gguf.load("layers.0.linear_attn.out_proj.weight").T, atol=1e-5
    )


def test_stream_reads_every_stored_byte_once(tmp_path, monkeypatch):
    """Fused gate_up experts feed two canonical weights each and per-expert tensors stack into one: still one
    read per stored tensor, in file order."""
    source = build_target(
        tmp_path / "t", "qwen3_5_moe", layers=4, experts=4, mtp=True, vision=False, quant="nvfp4-modelopt", shards=2
    )
    model = open_model(str(source))
    reads: list[tuple[str, int, int]] = []
    original = safetensors.read_bytes

    def recording(path, info):
        reads.append((path, info.offset, info.nbytes))
        return original(path, info)

    monkeypatch.setattr(safetensors, "read_bytes", recording)
    seen = dict(model.stream(packed=True))
    assert set(seen) == set(model.names)
    stored = {(str(source / i.file), i.offset, i.nbytes) for w in model.weights.values() for i in w.parts.values()}
    assert len(reads) == len(set(reads)) == len(stored)
    assert set(reads) == stored


def test_fused_experts_split_into_gate_and_up(tmp_path):
    source = build_target(tmp_path / "t", "qwen3_5_moe", layers=4, experts=4, mtp=False, vision=False)
    model = open_model(str(source))
    from safetensors.torch import load_file

    stored = load_file(str(source / "model.safetensors"))
    fused = stored["model.language_model.layers.0.mlp.experts.gate_up_proj"].float()
    half = fused.shape[1] // 2
    assert torch.equal(model.load("layers.0.mlp.experts.gate_proj.weight"), fused[:, :half])
    assert torch.equal(model.load("layers.0.mlp.experts.up_proj.weight"), fused[:, half:])


def test_mtp_head_is_named_once(tmp_path):
    source = build_target(tmp_path / "t", "qwen3_5_moe", layers=4, experts=4, mtp=True, vision=True)
    model = open_model(str(source))
    assert model.config.mtp_layers == 1
    mtp = {n for n in model.names if n.startswith("mtp.")}
    assert {
        "mtp.fc.weight",
        "mtp.pre_fc_norm_embedding.weight",
        "mtp.pre_fc_norm_hidden.weight",
        "mtp.norm.weight",
        "mtp.layers.0.mlp.experts.gate_proj.weight",
    } <= mtp
    assert not any("visual" in n for n in model.names)


@pytest.mark.parametrize("kind", ["dflash", "dflash2"])
def test_dflash_drafters_from_safetensors_and_gguf(tmp_path, kind):
    target = build_target(tmp_path / "target", "qwen3_5", layers=8, mtp=False, vision=False)
    draft = build_dflash(tmp_path / "draft", num_target_layers=8, dflash2=DFlash2() if kind == "dflash2" else None)
    hf = open_model(str(draft))
    gguf = open_model(str(convert(draft, tmp_path / "d.gguf", "gguf:F32", donor=target)))
    c = hf.config.drafter
    assert c is not None and c.kind == kind and c.target_layer_ids and c.block_size == 16
    assert structure(gguf.config) == structure(hf.config)
    assert set(gguf.names) == set(hf.names)
    assert {"fc.weight", "hidden_norm.weight", "norm.weight"} <= set(hf.names)
    if kind == "dflash2":
        assert "candidate_selector.predecessor_codebook" in hf.names
    for name in hf.names:
        assert torch.allclose(gguf.load(name), hf.load(name), rtol=0, atol=1e-3 * hf.load(name).abs().max()), name


def test_dflash_drafter_quantized_to_affine4_keeps_its_config(tmp_path):
    """TensorFold quantizes DFlash drafters to affine-4 at load; the converted copy opens with the same config."""
    draft = build_dflash(tmp_path / "draft", num_target_layers=8)
    hf = open_model(str(draft))
    affine = open_model(str(convert(draft, tmp_path / "a", "affine4")))
    assert affine.config == hf.config
    assert affine.layout("layers.0.self_attn.q_proj.weight") == "affine4-g64"


def test_eagle3_config_and_names(tmp_path):
    head = open_model(str(build_eagle3(tmp_path / "e", num_target_layers=8)))
    c = head.config
    assert c.drafter is not None and c.drafter.kind == "eagle3"
    assert c.drafter.target_layer_ids == (1, 3, 4)  # vLLM aux ids (2, 4, 5) are inputs of those layers
    assert c.drafter.draft_vocab_size == 128
    assert {"fc.weight", "d2t", "lm_head.weight"} <= set(head.names)


def test_one_parser_for_hf_and_gguf_defaults(tmp_path):
    """The defaults both sources used to disagree on: tie_word_embeddings of a drafter, rope theta, partial
    rotary of Qwen3.5, layer types from the GGUF's recurrent-layer flags."""
    source = save(tiny_model("qwen3_5"), tmp_path / "hf", "qwen3")
    gguf = open_model(str(convert(source, tmp_path / "m.gguf", "gguf:F32")))
    assert gguf.config.partial_rotary_factor == 0.25
    assert gguf.config.layer_types == ("linear", "linear", "linear", "full")
    target = build_target(tmp_path / "target", "qwen3_5", layers=8, mtp=False, vision=False)
    draft = build_dflash(tmp_path / "draft", num_target_layers=8)
    drafted = open_model(str(convert(draft, tmp_path / "d.gguf", "gguf:F32", donor=target)))
    assert drafted.config.tie_word_embeddings is False
    assert drafted.config.rope_theta == 1e7


@pytest.mark.parametrize(
    "config, problem",
    [
        ({"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2"}, "is not a family specpair models"),
        (
            {
                "architectures": ["Qwen3ForCausalLM"],
                "hidden_size": 64,
                "num_hidden_layers": True,
                "num_attention_heads": 4,
                "vocab_size": 8,
            },
            "'num_hidden_layers' is True, not a positive integer",
        ),
        (
            {
                "architectures": ["Qwen3ForCausalLM"],
                "hidden_size": 64,
                "num_hidden_layers": 2,
                "num_attention_heads": 4,
                "vocab_size": 8,
                "layer_types": ["full_attention"],
            },
            "'layer_types' is",
        ),
        (
            {
                "architectures": ["Qwen3ForCausalLM"],
                "hidden_size": 64,
                "num_hidden_layers": 2,
                "num_attention_heads": 4,
                "vocab_size": 8,
                "rope_parameters": {"rope_theta": -1},
            },
            "'rope_theta' is -1, not a positive number",
        ),
    ],
)
def test_bad_configs_name_the_file_and_the_key(config, problem):
    with pytest.raises(BadInput) as e:
        parse_config(config, "/x/config.json")
    assert e.value.where == "/x/config.json" and problem in e.value.problem
