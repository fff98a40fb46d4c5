"""Reading each fixture family and drafter kind gives the right normalized Checkpoint.

Expected values are written out from the builder arguments and the spec (never read back from the
builder), so a reader that mislabels a layout, a tap convention or a vocabulary size fails here.
"""

from __future__ import annotations

import json
import pickle
import runpy
import shutil
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest
from fixtures import (
    TRAP_MARKER,
    DFlash2,
    build_dflash,
    build_draft_model,
    build_eagle3,
    build_gguf_dflash,
    build_gguf_target,
    build_target,
    vocabulary,
    write_tokenizer,
)
from safetensors import safe_open

from specpair.checkpoint import Checkpoint, Mtp
from specpair.formats import safetensors as safetensors_format
from specpair.sources import open_checkpoint

HYBRID_8 = ["linear", "linear", "linear", "full"] * 2  # full attention every 4th layer
TOKENS = {"qwen3": 482, "qwen3_5": 529, "llama3": 512}  # 256 bytes + merges + added tokens
ROWS = {"qwen3": 512, "qwen3_5": 576, "llama3": 512}  # Qwen pads the rows past the tokenizer, Llama 3 does not
FLAVOUR = {
    "llama": "llama3",
    "qwen3": "qwen3",
    "qwen3_moe": "qwen3",
    "qwen3_next": "qwen3",
    "qwen3_5": "qwen3_5",
    "qwen3_5_moe": "qwen3_5",
}


def read(path: Path) -> Checkpoint:
    return open_checkpoint(str(path))


def layouts(checkpoint: Checkpoint) -> dict[str, set[str]]:
    found: dict[str, set[str]] = defaultdict(set)
    for g in checkpoint.groups:
        found[g.group].add(g.layout)
    return dict(found)


def group_tensors(checkpoint: Checkpoint, group: str) -> int:
    return sum(g.tensors for g in checkpoint.groups if g.group == group)


# ---------------------------------------------------------------------------------------------------
# targets

TARGETS = {
    # family: architecture, model_type, layer types, head_dim, theta, rope schema, vocabulary flavour, groups
    "llama": (
        "LlamaForCausalLM",
        "llama",
        ["full"] * 8,
        16,
        500000.0,
        "rope_theta",
        "llama3",
        {"attention", "embedding", "lm_head", "mlp", "norm"},
    ),
    "qwen3": (
        "Qwen3ForCausalLM",
        "qwen3",
        ["full"] * 8,
        16,
        1e6,
        "rope_theta",
        "qwen3",
        {"attention", "embedding", "lm_head", "mlp", "norm"},
    ),
    "qwen3_moe": (
        "Qwen3MoeForCausalLM",
        "qwen3_moe",
        ["full"] * 8,
        16,
        1e6,
        "rope_theta",
        "qwen3",
        {"attention", "embedding", "experts", "lm_head", "norm", "router"},
    ),
    "qwen3_next": (
        "Qwen3NextForCausalLM",
        "qwen3_next",
        HYBRID_8,
        32,
        1e7,
        "rope_theta",
        "qwen3",
        {"attention", "embedding", "experts", "linear_attention", "lm_head", "mtp", "norm", "router", "shared_expert"},
    ),
    "qwen3_5": (
        "Qwen3_5ForConditionalGeneration",
        "qwen3_5_text",
        HYBRID_8,
        32,
        1e7,
        "rope_parameters",
        "qwen3_5",
        {"attention", "embedding", "linear_attention", "lm_head", "mlp", "mtp", "norm", "vision"},
    ),
    "qwen3_5_moe": (
        "Qwen3_5MoeForConditionalGeneration",
        "qwen3_5_moe_text",
        HYBRID_8,
        32,
        1e7,
        "rope_parameters",
        "qwen3_5",
        {
            "attention",
            "embedding",
            "experts",
            "linear_attention",
            "lm_head",
            "mtp",
            "norm",
            "router",
            "shared_expert",
            "vision",
        },
    ),
}
# mtp.fc + 3 norms + one layer: 2 norms, 6 attention tensors, then the MLP: dense 3; MoE router,
# 4 experts x 3 (the MTP layer stores experts one by one), 3 shared-expert projections, shared gate.
MTP_TENSORS = {"qwen3_next": 29, "qwen3_5": 15, "qwen3_5_moe": 29}


@pytest.mark.parametrize("family", list(TARGETS))
def test_target_family(tmp_path: Path, family: str) -> None:
    architecture, model_type, layer_types, head_dim, theta, schema, flavour, groups = TARGETS[family]
    c = read(build_target(tmp_path / family, family))
    assert (c.family, c.architecture, c.model_type) == (family, architecture, model_type)
    assert (c.format, c.source) == ("safetensors", "local")
    s = c.shapes
    assert (s.hidden_size, s.num_layers, s.num_heads, s.num_kv_heads, s.head_dim) == (64, 8, 4, 2, head_dim)
    assert s.layer_types == layer_types
    assert (s.vocab_size, s.embedding_rows, s.tie_word_embeddings) == (ROWS[flavour], ROWS[flavour], False)
    assert (c.rope.theta, c.rope.schema) == (theta, schema)
    assert c.tokenizer is not None and (c.tokenizer.length, c.tokenizer.source) == (TOKENS[flavour], "tokenizer.json")
    assert set(layouts(c)) == groups
    assert all(layout == {"bf16"} for layout in layouts(c).values())
    assert c.drafter is None and c.quantization is None and c.notes == []
    if family in MTP_TENSORS:
        assert c.role == "both"
        assert (c.mtp.layers, c.mtp.tensors) == (1, MTP_TENSORS[family])
    else:
        assert c.role == "target" and c.mtp is None


def test_target_family_details(tmp_path: Path) -> None:
    llama = read(build_target(tmp_path / "llama", "llama"))
    assert (llama.rope.rope_type, llama.rope.trained_context, llama.rope.scaling["factor"]) == ("llama3", 8192, 32.0)
    moe = read(build_target(tmp_path / "moe", "qwen3_moe"))
    assert (moe.shapes.num_experts, moe.shapes.experts_per_token, moe.shapes.moe_intermediate_size) == (4, 2, 64)
    assert group_tensors(moe, "experts") == 8 * 4 * 3  # one tensor per expert and projection
    fused = read(build_target(tmp_path / "fused", "qwen3_5_moe"))
    assert group_tensors(fused, "experts") == 8 * 2  # gate_up_proj + down_proj per layer, 3-D
    assert fused.bytes_of("experts") == 8 * 2 * (4 * 128 * 64 + 4 * 64 * 64)
    assert fused.rope.mrope and fused.rope.partial_rotary_factor == 0.25
    assert fused.shapes.shared_expert_intermediate_size == 64
    nxt = read(build_target(tmp_path / "next", "qwen3_next"))
    s = nxt.shapes
    assert (s.linear_key_heads, s.linear_value_heads, s.linear_conv_kernel) == (2, 4, 4)
    assert (s.linear_key_head_dim, s.linear_value_head_dim) == (16, 16)
    assert nxt.rope.partial_rotary_factor == 0.25 and not nxt.rope.mrope


def test_mtp_declared_but_absent_is_a_plain_target(tmp_path: Path) -> None:
    c = read(build_target(tmp_path / "t", "qwen3_5_moe", mtp=False))
    assert c.role == "target" and c.mtp == Mtp(1, 0, 0)
    # Qwen3-Next configs declare no MTP layers: only the tensors tell.
    c = read(build_target(tmp_path / "n", "qwen3_next", mtp=False))
    assert c.role == "target" and c.mtp is None


def test_padding_rows_and_tied_embeddings(tmp_path: Path) -> None:
    base = read(build_target(tmp_path / "base", "qwen3"))
    padded = read(build_target(tmp_path / "padded", "qwen3", vocab_size=640))
    assert (padded.shapes.vocab_size, padded.shapes.rows, padded.tokenizer.length) == (640, 640, 482)
    assert padded.tokenizer.fingerprint == base.tokenizer.fingerprint
    tied = read(build_target(tmp_path / "tied", "qwen3", tie_embeddings=True))
    assert tied.shapes.tie_word_embeddings and tied.shapes.embedding_rows == 512
    assert "lm_head" not in layouts(tied)


def test_sharded_checkpoint_reads_like_one_file(tmp_path: Path) -> None:
    single = read(build_target(tmp_path / "single", "qwen3_5_moe"))
    sharded = read(build_target(tmp_path / "sharded", "qwen3_5_moe", shards=3))
    files = {f.path for f in sharded.files}
    assert {
        "model.safetensors.index.json",
        "model-00001-of-00003.safetensors",
        "model-00003-of-00003.safetensors",
    } <= files
    one, many = single.to_json(), sharded.to_json()
    for key in ("ref", "files"):
        del one[key], many[key]
    assert one == many


# ---------------------------------------------------------------------------------------------------
# quantized targets

QUANTIZED = [
    (
        "qwen3_5_moe",
        "nvfp4-modelopt",
        {
            "experts": {"nvfp4-modelopt"},
            "shared_expert": {"nvfp4-modelopt"},
            "lm_head": {"nvfp4-modelopt"},
            "attention": {"fp8-tensor"},
            "linear_attention": {"fp8-tensor", "bf16"},
            "router": {"bf16"},
            "embedding": {"bf16"},
            "mtp": {"bf16"},
            "vision": {"bf16"},
        },
        ("modelopt", "MIXED_PRECISION"),
    ),
    (
        "qwen3_5_moe",
        "nvfp4-ct",
        {
            "experts": {"nvfp4-ct"},
            "shared_expert": {"nvfp4-ct"},
            "attention": {"nvfp4-ct"},
            "linear_attention": {"bf16"},
            "lm_head": {"bf16"},
            "router": {"bf16"},
        },
        ("compressed-tensors", "nvfp4-pack-quantized"),
    ),
    (
        "qwen3_5_moe",
        "fp8-block",
        {
            "experts": {"fp8-block"},
            "attention": {"fp8-block"},
            "linear_attention": {"fp8-block", "bf16"},
            "lm_head": {"bf16"},
            "router": {"bf16"},
            "norm": {"bf16"},
        },
        ("fp8", "block128x128"),
    ),
    (
        "qwen3_moe",
        "mlx-affine4",
        {
            "experts": {"affine4-g64"},
            "attention": {"affine4-g64"},
            "embedding": {"affine4-g64"},
            "lm_head": {"affine4-g64"},
            "router": {"affine8-g64"},
            "norm": {"bf16"},
        },
        ("mlx", "affine"),
    ),
    (
        "qwen3",
        "exl3",
        {
            "attention": {"exl3-4bpw"},
            "mlp": {"exl3-4bpw"},
            "lm_head": {"exl3-6bpw"},
            "embedding": {"bf16"},
            "norm": {"bf16"},
        },
        ("exl3", "mul1"),
    ),
    (
        "llama",
        "nvfp4-modelopt",
        {"mlp": {"nvfp4-modelopt"}, "lm_head": {"nvfp4-modelopt"}, "attention": {"fp8-tensor"}, "embedding": {"bf16"}},
        ("modelopt", "MIXED_PRECISION"),
    ),
]


@pytest.mark.parametrize(
    ("family", "scheme", "expected", "method"), QUANTIZED, ids=[f"{f}-{s}" for f, s, _, _ in QUANTIZED]
)
def test_quantized_layouts(
    tmp_path: Path, family: str, scheme: str, expected: dict[str, set[str]], method: tuple[str, str]
) -> None:
    c = read(build_target(tmp_path / "q", family, quant=scheme))
    found = layouts(c)
    assert {group: found.get(group) for group in expected} == expected
    assert (c.quantization.method, c.quantization.algo) == method
    assert c.shapes.rows == ROWS[FLAVOUR[family]]


def test_quantization_details(tmp_path: Path) -> None:
    modelopt = read(build_target(tmp_path / "mo", "qwen3_5_moe", quant="nvfp4-modelopt")).quantization
    assert (modelopt.kv_cache, modelopt.producer, modelopt.exclude) == (
        "FP8",
        "modelopt 0.37.0",
        ["mtp.layers.0*", "mtp*"],
    )
    mlx = read(build_target(tmp_path / "mlx", "qwen3_5_moe", quant="mlx-affine4"))
    assert (mlx.quantization.bits, mlx.quantization.group_size) == (4.0, 64)
    assert mlx.role == "target" and mlx.mtp == Mtp(1, 0, 0)  # mlx-lm drops the MTP head
    assert mlx.shapes.embedding_rows == 576  # from the packed U32 embedding's rows
    exl3 = read(build_target(tmp_path / "exl3", "qwen3_next", quant="exl3", exl3_bits=3))
    assert exl3.quantization.bits == 3.0
    assert layouts(exl3)["experts"] == {"exl3-3bpw"} and layouts(exl3)["lm_head"] == {"exl3-6bpw"}
    tied = read(build_target(tmp_path / "tied", "qwen3", quant="exl3", tie_embeddings=True))
    assert not tied.shapes.tie_word_embeddings and layouts(tied)["lm_head"] == {"exl3-6bpw"}


def test_fixture_files_agree_with_the_safetensors_library(tmp_path: Path) -> None:
    """The hand-written files parse with the reference parser, and specpair's header reader sees the
    same names, dtypes and shapes in them."""
    checkpoints = [
        build_target(tmp_path / s, "qwen3_5_moe", quant=s) for s in ("nvfp4-modelopt", "nvfp4-ct", "fp8-block")
    ]
    checkpoints += [
        build_target(tmp_path / "mlx", "qwen3_moe", quant="mlx-affine4"),
        build_target(tmp_path / "exl3", "qwen3", quant="exl3"),
        build_target(tmp_path / "sharded", "qwen3_next", shards=2),
        build_dflash(tmp_path / "dflash2", dflash2=DFlash2()),
        build_eagle3(tmp_path / "eagle3"),
    ]
    files = [f for directory in checkpoints for f in sorted(directory.glob("*.safetensors"))]
    assert len(files) == 9
    for path in files:
        ours, _ = safetensors_format.read_local(str(path))
        with safe_open(str(path), framework="numpy") as reference:
            theirs = {
                name: (reference.get_slice(name).get_dtype(), tuple(reference.get_slice(name).get_shape()))
                for name in reference.keys()
            }
        assert {t.name: (t.dtype, t.shape) for t in ours} == theirs


# ---------------------------------------------------------------------------------------------------
# HF drafters


def test_dflash(tmp_path: Path) -> None:
    c = read(build_dflash(tmp_path / "d", target_layer_ids=[1, 5], target_hidden=64))
    d = c.drafter
    assert (c.role, c.family, c.architecture, c.model_type) == ("drafter", "qwen3", "DFlashDraftModel", "qwen3")
    assert d.kind == "dflash"
    assert (d.taps.layers, d.taps.raw, d.taps.source) == ([1, 5], [1, 5], "dflash_config.target_layer_ids")
    assert (d.block_size, d.block_size_source) == (16, "dflash_config.block_size")
    assert (d.mask_token_id, d.mask_token_source) == (529, "dflash_config.mask_token_id")  # first padded row
    assert (d.num_target_layers, d.fc_shape, d.missing_keys) == (8, [64, 128], [])
    assert not (d.has_embeddings or d.has_d2t) and d.head_rows is None
    assert c.shapes.layer_types == ["sliding", "full"] and c.rope.sliding_window == 4096
    assert (c.rope.theta, c.rope.schema) == (1e7, "rope_parameters")
    assert (c.shapes.vocab_size, c.shapes.embedding_rows) == (576, None)
    assert set(layouts(c)) == {"attention", "drafter_io", "mlp", "norm"}


def _edit_config(path: Path, **changes: object) -> Path:
    """`path`'s config.json with `changes` (None drops a key)."""
    config = json.loads((path / "config.json").read_text())
    config.update(changes)
    (path / "config.json").write_text(json.dumps({k: v for k, v in config.items() if v is not None}))
    return path


def test_dflash_modelopt_swa_slides_every_layer(tmp_path: Path) -> None:
    """ModelOpt's export (Model-Optimizer#1960): layer_types all full, the window in dflash_config.use_swa +
    swa_window_size, causal false: every layer is trained, and served by vLLM, as a non-causal window."""
    path = build_dflash(tmp_path / "d", layers=3, layer_types=["full_attention"] * 3, sliding_window=1024)
    config = json.loads((path / "config.json").read_text())
    swa = {"use_swa": True, "swa_window_size": 512, "causal": False}
    c = read(_edit_config(path, dflash_config={**config["dflash_config"], **swa}))
    assert c.shapes.layer_types == ["sliding"] * 3 and c.rope.sliding_window == 512
    assert c.drafter.is_causal is False and c.rope.window_source == "dflash_config.use_swa"
    off = read(_edit_config(path, dflash_config={**config["dflash_config"], **swa, "use_swa": False}))
    assert off.shapes.layer_types == ["full"] * 3 and off.rope.sliding_window is None
    assert off.rope.window_source is None


@pytest.mark.parametrize(
    ("max_window_layers", "expected", "source"),
    [(None, ["full"] * 3, None), (1, ["full", "sliding", "sliding"], "use_sliding_window")],
)
def test_sliding_window_without_layer_types_follows_transformers(
    tmp_path: Path, max_window_layers: int | None, expected: list[str], source: str | None
) -> None:
    """No layer_types: transformers' Qwen3Config slides layers i >= max_window_layers, default 28, so a 3-layer
    drafter that leaves max_window_layers out runs full attention (model-serving-minefield#107)."""
    path = build_dflash(tmp_path / "d", layers=3, sliding_window=16)
    c = read(_edit_config(path, layer_types=None, use_sliding_window=True, max_window_layers=max_window_layers))
    assert c.shapes.layer_types == expected and c.rope.window_source == source


def test_dflash_fc_shape_comes_from_the_header(tmp_path: Path) -> None:
    c = read(build_dflash(tmp_path / "d", target_layer_ids=[1, 9, 17], target_hidden=96, hidden=32, layers=3))
    assert c.drafter.fc_shape == [32, 288] and c.drafter.target_hidden_size is None
    assert c.shapes.layer_types == ["sliding", "sliding", "full"] and c.rope.window_source == "layer_types"


def test_dflash_legacy_top_level_keys(tmp_path: Path) -> None:
    d = read(build_dflash(tmp_path / "d", schema="legacy", target_layer_ids=[1, 10, 19, 28, 37], layers=5)).drafter
    assert (d.taps.layers, d.taps.source) == ([1, 10, 19, 28, 37], "target_layer_ids")
    assert (d.block_size_source, d.mask_token_source, d.missing_keys) == ("block_size", "mask_token_id", [])


@pytest.mark.parametrize(
    ("key", "field"), [("target_layer_ids", "taps"), ("mask_token_id", "mask_token_id"), ("block_size", "block_size")]
)
@pytest.mark.parametrize("schema", ["nested", "legacy"])
def test_dflash_missing_keys(tmp_path: Path, key: str, field: str, schema: str) -> None:
    d = read(build_dflash(tmp_path / "d", schema=schema, omit=[key])).drafter
    assert getattr(d, field) is None
    assert d.missing_keys == [f"dflash_config.{key}"]


def test_dflash2(tmp_path: Path) -> None:
    extras = DFlash2(conv_kernel_size=2, conv_group_size=16, selector_rank=32, selector_top_k=4)
    c = read(build_dflash(tmp_path / "d", dflash2=extras))
    d = c.drafter
    assert (c.architecture, d.kind, d.is_causal) == ("DFlash2DraftModel", "dflash2", False)
    assert (d.conv_kernel_size, d.conv_group_size, d.selector_rank, d.selector_top_k) == (2, 16, 32, 4)
    assert d.missing_keys == []
    assert group_tensors(c, "conv") == 2 * 2 * 2  # 2 layers x (attention_conv, mlp_conv) x (base, projection)
    assert group_tensors(c, "selector") == 3
    partial = read(build_dflash(tmp_path / "p", dflash2=DFlash2(), omit=["selector_rank", "selector_top_k"])).drafter
    assert partial.missing_keys == ["dflash_config.selector_rank", "dflash_config.selector_top_k"]


def test_eagle3(tmp_path: Path) -> None:
    c = read(build_eagle3(tmp_path / "e", aux_layer_ids=[2, 4, 5], target_hidden=64, draft_vocab_size=128))
    d = c.drafter
    assert (c.role, c.family, c.architecture, d.kind) == ("drafter", "llama", "LlamaForCausalLMEagle3", "eagle3")
    # vLLM's aux id j is the residual stream entering layer j = the output of layer j - 1.
    assert (d.taps.layers, d.taps.raw, d.taps.source) == (
        [1, 3, 4],
        [2, 4, 5],
        "eagle_config.eagle_aux_hidden_state_layer_ids",
    )
    assert (d.draft_vocab_size, d.target_hidden_size, d.fc_shape) == (128, 64, [64, 192])
    assert d.has_d2t and d.head_rows is not None and not d.has_embeddings
    assert c.shapes.vocab_size == 512
    assert read(build_eagle3(tmp_path / "own", embeddings=True)).drafter.has_embeddings


def test_eagle31_norms_are_read_and_shown(tmp_path: Path) -> None:
    """EAGLE-3.1's switches, at the top level or in eagle_config, reach the checkpoint and `inspect`'s lines."""
    path = build_eagle3(tmp_path / "e")
    config = json.loads((path / "config.json").read_text())
    config["norm_output"] = True
    config.setdefault("eagle_config", {})["fc_norm"] = True
    (path / "config.json").write_text(json.dumps(config))
    assert read(path).drafter.eagle_norms == ["fc_norm", "norm_output"]
    shown = subprocess.run(
        [sys.executable, "-m", "specpair", "inspect", str(path)], capture_output=True, text=True, timeout=60
    )
    assert shown.returncode == 0 and "EAGLE-3.1    fc_norm, norm_output" in shown.stdout, shown.stdout


def test_plain_draft_model_shares_the_target_tokenizer(tmp_path: Path) -> None:
    target = read(build_target(tmp_path / "target", "qwen3"))
    draft = read(build_draft_model(tmp_path / "draft", "qwen3"))
    assert (draft.role, draft.family, draft.drafter, draft.shapes.num_layers) == ("target", "qwen3", None, 2)
    assert draft.tokenizer.fingerprint == target.tokenizer.fingerprint


def test_custom_code_and_pickles_are_reported_never_run(tmp_path: Path) -> None:
    path = build_dflash(tmp_path / "d", auto_map=True, mask_embedding=True)
    marker = path / TRAP_MARKER
    c = read(path)
    assert c.notes == [
        "auto_map names custom code (AutoModel=dflash.DFlashDraftModel): reported, never run",
        "pickle file mask_embedding.pt: reported, never loaded",
    ]
    assert c.drafter.mask_embedding_file == "mask_embedding.pt"
    for extra in ([], ["--json"]):
        done = subprocess.run(
            [sys.executable, "-m", "specpair", "inspect", str(path), *extra], capture_output=True, text=True, timeout=60
        )
        assert done.returncode == 0, done.stderr
    assert not marker.exists()
    # The traps are live: loading the pickle, or running the code, does create the marker.
    pickle.loads((path / "mask_embedding.pt").read_bytes())
    assert marker.exists()
    marker.unlink()
    runpy.run_path(str(path / "dflash.py"))
    assert marker.exists()


# ---------------------------------------------------------------------------------------------------
# GGUF


@pytest.mark.parametrize(("qtype", "weights", "algo"), [("F32", "f32", "ALL_F32"), ("Q8_0", "gguf-Q8_0", "Q8_0")])
def test_gguf_llama(tmp_path: Path, qtype: str, weights: str, algo: str) -> None:
    c = read(build_gguf_target(tmp_path / "llama.gguf", "llama", layers=4, qtype=qtype))
    assert (c.family, c.role, c.format, c.architecture) == ("llama", "target", "gguf", "llama")
    s = c.shapes
    assert (s.hidden_size, s.num_layers, s.num_heads, s.num_kv_heads, s.head_dim) == (64, 4, 4, 2, 16)
    assert (s.vocab_size, s.embedding_rows, s.tie_word_embeddings) == (512, 512, False)
    assert (c.rope.theta, c.rope.schema) == (500000.0, "gguf")
    assert (c.tokenizer.length, c.tokenizer.source) == (512, "gguf")
    assert layouts(c) == {
        "attention": {weights},
        "mlp": {weights},
        "embedding": {weights},
        "lm_head": {weights},
        "norm": {"f32"},
    }
    assert (c.quantization.method, c.quantization.algo) == ("gguf", algo)
    if qtype == "Q8_0":  # 34 bytes per 32 weights
        assert c.bytes_of("attention") == 4 * (64 + 32 + 32 + 64) * 64 // 32 * 34


def test_gguf_qwen35moe_with_nextn(tmp_path: Path) -> None:
    c = read(build_gguf_target(tmp_path / "q.gguf", "qwen35moe", layers=8, nextn=1))
    assert (c.family, c.role) == ("qwen3_5_moe", "both")
    s = c.shapes
    assert (s.num_layers, s.layer_types, s.head_dim) == (8, HYBRID_8, 32)  # block_count 9 = 8 layers + 1 NextN
    assert (s.num_experts, s.experts_per_token, s.moe_intermediate_size, s.shared_expert_intermediate_size) == (
        4,
        2,
        64,
        64,
    )
    assert (s.linear_key_heads, s.linear_value_heads, s.linear_conv_kernel) == (2, 4, 4)
    assert (s.linear_key_head_dim, s.linear_value_head_dim) == (16, 16)
    assert (s.vocab_size, c.tokenizer.length) == (576, 529)
    assert c.rope.mrope and c.rope.partial_rotary_factor == 0.25
    # block 8: 7 attention tensors, post-attention norm, 8 MoE tensors, 4 nextn.* tensors
    assert (c.mtp.layers, c.mtp.tensors) == (1, 20)
    assert layouts(c)["linear_attention"] == {"f32"}
    plain = read(build_gguf_target(tmp_path / "p.gguf", "qwen35moe", layers=8, nextn=0))
    assert (plain.role, plain.mtp, plain.shapes.num_layers) == ("target", None, 8)


@pytest.mark.parametrize("ids", [[1, 5], [1, 6, 11, 16, 22]])
def test_gguf_dflash_upstream_taps_are_shifted_back(tmp_path: Path, ids: list[int]) -> None:
    c = read(build_gguf_dflash(tmp_path / "d.gguf", "dflash", target_layer_ids=ids, layers=len(ids)))
    d = c.drafter
    assert (c.family, c.role, c.architecture, d.kind) == ("qwen3", "drafter", "dflash", "dflash")
    assert (d.taps.layers, d.taps.raw, d.taps.source) == (ids, [i + 1 for i in ids], "dflash.target_layers")
    assert (d.block_size, d.block_size_source) == (16, "dflash.block_size")
    assert (d.mask_token_id, d.mask_token_source) == (529, "tokenizer.ggml.mask_token_id")
    assert (d.fc_shape, d.missing_keys, d.has_embeddings, d.head_rows) == ([64, 64 * len(ids)], [], False, None)
    assert c.shapes.layer_types == ["sliding"] * (len(ids) - 1) + ["full"] and c.rope.sliding_window == 4096
    assert (c.shapes.vocab_size, c.tokenizer.length) == (576, 529)


@pytest.mark.parametrize("ids", [[1, 5], [1, 6, 11, 16, 22]])
def test_gguf_dflash_fork_taps_stay(tmp_path: Path, ids: list[int]) -> None:
    d = read(build_gguf_dflash(tmp_path / "f.gguf", "dflash-draft", target_layer_ids=ids)).drafter
    assert (d.kind, d.taps.layers, d.taps.raw, d.taps.source) == (
        "dflash",
        ids,
        ids,
        "dflash-draft.dflash.target_layer_ids",
    )
    assert (d.mask_token_id, d.mask_token_source) == (529, "dflash-draft.dflash.mask_token_id")
    assert (d.block_size, d.fc_shape, d.missing_keys) == (16, [64, 64 * len(ids)], [])


def test_gguf_dflash2(tmp_path: Path) -> None:
    c = read(build_gguf_dflash(tmp_path / "d2.gguf", dflash2=DFlash2(selector_rank=32, selector_top_k=4)))
    d = c.drafter
    assert (d.kind, d.is_causal, d.missing_keys) == ("dflash2", False, [])
    assert (d.conv_kernel_size, d.conv_group_size, d.selector_rank, d.selector_top_k) == (2, 16, 32, 4)
    assert {"conv", "selector"} <= set(layouts(c))


# ---------------------------------------------------------------------------------------------------
# tokenizer identity across formats


@pytest.mark.parametrize(
    ("family", "flavour", "arch"),
    [("llama", "llama3", "llama"), ("qwen3_5_moe", "qwen3_5", "qwen35moe"), ("qwen3", "qwen3", "llama")],
)
def test_tokenizer_fingerprint_is_the_same_in_tokenizer_json_and_gguf(
    tmp_path: Path, family: str, flavour: str, arch: str
) -> None:
    hf = read(build_target(tmp_path / "hf", family, flavour=flavour)).tokenizer
    gguf = read(build_gguf_target(tmp_path / "t.gguf", arch, flavour=flavour, vocab_size=ROWS[flavour] + 64)).tokenizer
    assert (hf.source, gguf.source) == ("tokenizer.json", "gguf")
    assert hf.fingerprint == gguf.fingerprint  # [PAD{i}] rows of the GGUF are not tokens
    assert (hf.length, hf.merges, hf.special_ids) == (gguf.length, gguf.merges, gguf.special_ids)
    assert hf.chat_template_sha256 == gguf.chat_template_sha256


def test_tokenizer_fingerprint_tells_vocabularies_apart(tmp_path: Path) -> None:
    qwen3_5 = read(build_target(tmp_path / "a", "qwen3_5")).tokenizer
    dflash_gguf = read(build_gguf_dflash(tmp_path / "d.gguf", flavour="qwen3_5")).tokenizer
    qwen3_gguf = read(build_gguf_dflash(tmp_path / "q.gguf", flavour="qwen3")).tokenizer
    assert dflash_gguf.fingerprint == qwen3_5.fingerprint
    assert qwen3_gguf.fingerprint != qwen3_5.fingerprint
    assert len({vocabulary(f).tokens[:256] for f in ("qwen3", "qwen3_5", "llama3")}) == 1  # same bytes, other merges


def test_merges_as_strings_or_pairs_fingerprint_alike(tmp_path: Path) -> None:
    pairs = build_target(tmp_path / "pairs", "qwen3")
    strings = tmp_path / "strings"
    shutil.copytree(pairs, strings)
    write_tokenizer(strings, "qwen3", merges_as_pairs=False)
    assert isinstance(json.loads((strings / "tokenizer.json").read_text())["model"]["merges"][0], str)
    assert read(pairs).tokenizer.fingerprint == read(strings).tokenizer.fingerprint


def test_metadata_only_copy_of_a_sharded_model_is_judged_from_its_config(tmp_path: Path) -> None:
    root = build_target(tmp_path / "target", "qwen3_next", shards=3)
    for shard in root.glob("*.safetensors"):
        shard.unlink()
    c = open_checkpoint(str(root))
    assert c.format == "config-only" and c.groups == [] and c.family == "qwen3_next"
    assert any("metadata-only" in note for note in c.notes)
