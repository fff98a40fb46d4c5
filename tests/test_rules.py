"""Each rule of the table fires on its failure case and stays silent on a good pair.

Checkpoints are built in memory through the real config parser (`checkpoint.hf.build`) from scaled-down
configs and synthetic tensor headers, then altered one fact at a time.
"""

from __future__ import annotations

import copy
import shlex
import tempfile
from collections.abc import Callable
from pathlib import Path

import pytest
from fixtures import build_gguf_dflash

from specpair.checkpoint import Checkpoint, FileEntry, Taps, TensorGroup, hf, speculators
from specpair.checkpoint.config import parse_config
from specpair.checkpoint.families import DRAFTER_KINDS
from specpair.checkpoint.speculators import Verifier
from specpair.checkpoint.tokenizer import Tokenizer, fingerprint
from specpair.compat.memory import GPUS
from specpair.compat.pair import Deployment
from specpair.compat.rules import RULES
from specpair.compat.rules.memory import memory_plan
from specpair.compat.verdict import judge
from specpair.errors import BadInput
from specpair.formats import TensorInfo
from specpair.runtime.parallel import Parallel
from specpair.sources import open_checkpoint

HIDDEN, LAYERS, ROWS, TOKENS = 64, 8, 256, 240
GB = 10**9


def tokenizer(length: int = TOKENS, flavour: str = "a", pre: str = "pipeline:x") -> Tokenizer:
    tokens = [f"{flavour}{i}" if i >= 100 else f"t{i}" for i in range(length)]
    return Tokenizer(
        length=length,
        source="tokenizer.json",
        fingerprint=fingerprint(tokens, ["t1 t2"]),
        merges=1,
        eos_ids=[TOKENS - 2],
        pad_id=TOKENS - 1,
        pre=pre,
        tokens=tokens,
    )


def build(
    config: dict,
    tensors: list[tuple[str, str, tuple[int, ...]]],
    ref: str,
    tok: Tokenizer | None = None,
    quant_files: dict | None = None,
) -> Checkpoint:
    infos = [TensorInfo(name, dtype, shape, 2 * _numel(shape), "model.safetensors") for name, dtype, shape in tensors]
    meta = hf.HFMetadata(
        config=config,
        config_where=f"{ref}/config.json",
        tokenizer=tok,
        tensors=infos,
        quant_files=quant_files or {},
        files=[FileEntry("config.json"), FileEntry("model.safetensors")],
    )
    return hf.build(meta, ref, "local")


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def qwen3_target(layers: int = LAYERS, rows: int = ROWS, ref: str = "target", kv_heads: int = 2) -> Checkpoint:
    return build(*qwen3_target_files(layers, rows, kv_heads), ref, tokenizer())


def qwen3_target_files(layers: int = LAYERS, rows: int = ROWS, kv_heads: int = 2) -> tuple[dict, list]:
    """The config and tensor headers of a Qwen3 target."""
    config = {
        "architectures": ["Qwen3ForCausalLM"],
        "model_type": "qwen3",
        "hidden_size": HIDDEN,
        "num_hidden_layers": layers,
        "num_attention_heads": 4,
        "num_key_value_heads": kv_heads,
        "head_dim": 16,
        "intermediate_size": 128,
        "vocab_size": rows,
        "max_position_embeddings": 40960,
        "rope_theta": 1e6,
    }
    tensors = [("model.embed_tokens.weight", "BF16", (rows, HIDDEN)), ("lm_head.weight", "BF16", (rows, HIDDEN))]
    tensors += [(f"model.layers.{i}.self_attn.q_proj.weight", "BF16", (HIDDEN, HIDDEN)) for i in range(layers)]
    return config, tensors


def qwen35_target(mtp: bool = True, ref: str = "hybrid-target") -> Checkpoint:
    text = {
        "model_type": "qwen3_5_moe_text",
        "hidden_size": HIDDEN,
        "num_hidden_layers": LAYERS,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "vocab_size": ROWS,
        "layer_types": ["linear_attention"] * 3 + ["full_attention"] + ["linear_attention"] * 3 + ["full_attention"],
        "linear_num_key_heads": 2,
        "linear_num_value_heads": 4,
        "linear_key_head_dim": 16,
        "linear_value_head_dim": 16,
        "linear_conv_kernel_dim": 4,
        "num_experts": 8,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 32,
        "max_position_embeddings": 262144,
        "mtp_num_hidden_layers": 1,
        "rope_parameters": {"rope_type": "default", "rope_theta": 1e7, "partial_rotary_factor": 0.25},
    }
    config = {"architectures": ["Qwen3_5MoeForConditionalGeneration"], "model_type": "qwen3_5_moe", "text_config": text}
    tensors = [
        ("model.language_model.embed_tokens.weight", "BF16", (ROWS, HIDDEN)),
        ("lm_head.weight", "BF16", (ROWS, HIDDEN)),
        ("model.language_model.layers.0.linear_attn.in_proj_qkv.weight", "BF16", (128, HIDDEN)),
        ("model.language_model.layers.3.self_attn.q_proj.weight", "BF16", (128, HIDDEN)),
    ]
    if mtp:
        tensors.append(("mtp.fc.weight", "BF16", (HIDDEN, 2 * HIDDEN)))
    return build(config, tensors, ref, tokenizer())


# the decoder config of the block drafters below: two layers at the test target's width
DRAFTER_DECODER = {
    "model_type": "qwen3",
    "hidden_size": HIDDEN,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "intermediate_size": 128,
    "vocab_size": ROWS,
    "max_position_embeddings": 40960,
}


def dflash_draft(
    taps: list[int] | None = None,
    dflash2: dict | None = None,
    pin: Verifier | None = None,
    block: dict | None = None,
    **changes: object,
) -> Checkpoint:
    """A DFlash drafter for qwen3_target; `pin`: in the speculators format, pinning that verifier; `block`: more keys
    of its dflash_config."""
    taps = [1, 3, 5] if taps is None else taps
    dflash_config = {
        "target_layer_ids": taps,
        "mask_token_id": 250,
        "block_size": 16,
        **(dflash2 or {}),
        **(block or {}),
    }
    config = {
        "architectures": ["DFlashDraftModel"],
        **DRAFTER_DECODER,
        "num_target_layers": LAYERS,
        "layer_types": ["sliding_attention", "full_attention"],
        "sliding_window": 2048,
        "rope_parameters": {"rope_type": "default", "rope_theta": 1e6},
        "dflash_config": dflash_config,
    }
    for key, value in changes.items():
        if key in dflash_config:
            dflash_config[key] = value
            if value is None:
                del dflash_config[key]
        else:
            config[key] = value
    fc_width = len(taps) * HIDDEN
    tensors = [
        ("fc.weight", "BF16", (config["hidden_size"], fc_width)),
        ("hidden_norm.weight", "BF16", (HIDDEN,)),
        ("layers.0.self_attn.q_proj.weight", "BF16", (HIDDEN, HIDDEN)),
        ("norm.weight", "BF16", (HIDDEN,)),
    ]
    if pin is not None:
        config = speculators.write(config, parse_config(config, "config.json").drafter, 16, pin)
    return build(config, tensors, "dflash-draft")


DFLASH2 = {"conv_kernel_size": 2, "conv_group_size": 16, "selector_rank": 32, "selector_top_k": 4}
PIN = Verifier("target", ("Qwen3ForCausalLM",))  # qwen3_target, as a speculators drafter pins it


def dflash2_draft(**params: int) -> Checkpoint:
    dflash2 = {**DFLASH2, **params}
    draft = dflash_draft(dflash2=dflash2, architectures=["DFlash2DraftModel"])
    assert draft.drafter.kind == "dflash2" and not draft.drafter.missing_keys
    return draft


def eagle3_draft(**changes: object) -> Checkpoint:
    config = {
        "architectures": ["LlamaForCausalLMEagle3"],
        "model_type": "llama",
        "hidden_size": HIDDEN,
        "num_hidden_layers": 1,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "vocab_size": ROWS,
        "draft_vocab_size": 128,
        "max_position_embeddings": 40960,
        "rope_theta": 1e6,
        "eagle_config": {"eagle_aux_hidden_state_layer_ids": [2, 4, 6], "use_aux_hidden_state": True},
    }
    config.update(changes)
    tensors = [
        ("fc.weight", "BF16", (HIDDEN, 3 * HIDDEN)),
        ("midlayer.hidden_norm.weight", "BF16", (HIDDEN,)),
        ("lm_head.weight", "BF16", (128, HIDDEN)),
        ("d2t", "I64", (128,)),
    ]
    return build(config, tensors, "eagle3-draft")


def draft_model(rows: int = ROWS, tok: Tokenizer | None = None) -> Checkpoint:
    config = {
        "architectures": ["Qwen3ForCausalLM"],
        "model_type": "qwen3",
        "hidden_size": 32,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "head_dim": 16,
        "intermediate_size": 64,
        "vocab_size": rows,
        "max_position_embeddings": 40960,
        "rope_theta": 1e6,
    }
    tensors = [("model.embed_tokens.weight", "BF16", (rows, 32))]
    return build(config, tensors, "small-draft", tok or tokenizer())


def findings(target: Checkpoint, draft: Checkpoint | None, stack: str, **deployment: object) -> dict[str, list[str]]:
    _, verdicts = judge(target, draft, Deployment(**deployment), [stack])
    found: dict[str, list[str]] = {}
    for f in verdicts[stack].reasons:
        found.setdefault(f.rule, []).append(f.message)
    return found


def with_(checkpoint: Checkpoint, change: Callable[[Checkpoint], None]) -> Checkpoint:
    changed = copy.deepcopy(checkpoint)
    change(changed)
    return changed


def _set_drafter(**values: object) -> Callable[[Checkpoint], None]:
    def change(c: Checkpoint) -> None:
        for key, value in values.items():
            setattr(c.drafter, key, value)

    return change


def _gguf_dflash_draft(arch: str = "dflash", tokenizer_present: bool = True) -> Checkpoint:
    def change(c: Checkpoint) -> None:
        c.format, c.architecture = "gguf", arch
        c.tokenizer = tokenizer() if tokenizer_present else None
        c.groups = [TensorGroup("drafter_io", "f16", 2, 1000)]

    return with_(dflash_draft(), change)


def _gguf_target(layout: str = "gguf-Q8_0") -> Checkpoint:
    def change(c: Checkpoint) -> None:
        c.format = "gguf"
        c.groups = [TensorGroup("attention", layout, 8, 10**6)]

    return with_(qwen3_target(), change)


# The layout of z-lab/Qwen3.6-35B-A3B-DFlash at c69b185 in the built-in catalog: 5 of 6 layers slide (window 4096).
SWA_DRAFTER = {
    "target_layer_ids": [1, 6, 11, 16, 22, 27, 32, 37],
    "target_hidden": 2048,
    "hidden": 2048,
    "layers": 6,
    "heads": 32,
    "kv_heads": 8,
    "head_dim": 128,
    "intermediate": 6144,
}


def _gguf_written(directory: Path, file: str, **options: object) -> Checkpoint:
    """A DFlash GGUF the fixtures write (sparse: its header alone is real), read back as `check` reads it."""
    return open_checkpoint(str(build_gguf_dflash(directory / file, sparse=True, **options)))


def _keyless_swa_gguf() -> Checkpoint:
    """z-lab's sliding-window drafter converted without the window keys, under the name llama.cpp's converter gives."""
    with tempfile.TemporaryDirectory() as directory:
        return _gguf_written(
            Path(directory), "draft.gguf", sliding_window=None, name="Qwen3.6 35B A3B DFlash", **SWA_DRAFTER
        )


def _modelopt_target() -> Checkpoint:
    def change(c: Checkpoint) -> None:
        c.groups = [
            TensorGroup("experts", "nvfp4-modelopt", 8, 10**6),
            TensorGroup("attention", "fp8-tensor", 8, 10**6),
        ]
        c.quantization = hf.Quantization(method="modelopt", algo="MIXED_PRECISION")

    return with_(qwen35_target(), change)


def _modelopt_target_quantized_head() -> Checkpoint:
    return with_(_modelopt_target(), lambda c: c.groups.append(TensorGroup("lm_head", "nvfp4-modelopt", 1, 10**5)))


def _big(c: Checkpoint) -> None:
    c.groups = [TensorGroup("experts", "bf16", 100, 71 * GB)]


def _gguf_experts(c: Checkpoint) -> None:
    """24 GB of Q4_K routed experts: too big for one 24 GB GPU, fine with some in CPU memory."""
    c.shapes.num_experts = 8
    c.groups.append(TensorGroup("experts", "gguf-Q4_K", 24, 24 * GB))


def _note(note: str) -> Callable[[Checkpoint], None]:
    return lambda c: c.notes.append(note)


def _source(source: str, ref: str) -> Callable[[Checkpoint], None]:
    def change(c: Checkpoint) -> None:
        c.source, c.ref, c.revision = source, ref, "c69b185"

    return change


T, H = qwen3_target, qwen35_target
# rule id -> (target, draft, stack, deployment): a pair on which the rule must fire.
FAILING: dict[str, tuple[Callable[[], Checkpoint], Callable[[], Checkpoint | None], str, dict]] = {
    "drafter.kind": (H, eagle3_draft, "tensorfold", {}),
    "drafter.arch": (T, lambda: dflash_draft(architectures=["DFlash3DraftModel"]), "sglang", {}),
    "drafter.required_keys": (T, lambda: dflash_draft(mask_token_id=None), "vllm", {}),
    "drafter.defaulted_keys": (T, lambda: dflash_draft(mask_token_id=None), "sglang", {}),
    "drafter.layer_types": (T, lambda: dflash_draft(layer_types=["full_attention"]), "sglang", {}),
    "drafter.dflash2_params": (T, lambda: dflash2_draft(conv_group_size=48), "sglang", {}),
    "drafter.tensor_parallel": (T, dflash_draft, "exllamav3", {"gpus": 2}),
    "runtime.runs": (T, dflash_draft, "specpair", {}),
    "runtime.draft_family": (T, lambda: with_(draft_model(), lambda c: setattr(c, "family", "gemma3")), "specpair", {}),
    "taps.range": (T, lambda: dflash_draft([1, 3, 9]), "vllm", {}),
    "taps.unique": (T, lambda: dflash_draft([1, 3, 3]), "exllamav3", {}),
    "taps.fc_width": (T, lambda: with_(dflash_draft(), _set_drafter(fc_shape=[HIDDEN, 2 * HIDDEN])), "sglang", {}),
    "taps.fc_unknown": (T, lambda: with_(dflash_draft(), _set_drafter(fc_shape=None)), "sglang", {}),
    "taps.convention": (T, dflash_draft, "exllamav3", {}),
    "taps.layout": (T, eagle3_draft, "vllm", {}),
    "hidden.match": (T, lambda: dflash_draft(hidden_size=128), "sglang", {}),
    "hidden.target_hidden_size": (T, lambda: eagle3_draft(target_hidden_size=128), "vllm", {}),
    "vocab.tokens": (T, lambda: draft_model(tok=tokenizer(flavour="b")), "sglang", {}),
    "vocab.extended": (T, lambda: draft_model(tok=tokenizer(length=TOKENS - 4)), "sglang", {}),
    "vocab.pretokenizer": (T, lambda: draft_model(tok=tokenizer(pre="pipeline:y")), "sglang", {}),
    "vocab.rows": (T, lambda: dflash_draft(vocab_size=200), "sglang", {}),
    "vocab.padding": (T, lambda: dflash_draft(vocab_size=248), "sglang", {}),
    "vocab.rows_equal": (T, lambda: draft_model(rows=248), "vllm", {}),
    "mask.range": (T, lambda: dflash_draft(mask_token_id=300), "sglang", {}),
    "mask.padded_row": (T, dflash_draft, "sglang", {}),
    "mask.special": (T, lambda: dflash_draft(mask_token_id=TOKENS - 2), "sglang", {}),
    "vocab.d2t": (T, lambda: with_(eagle3_draft(), _set_drafter(has_d2t=False)), "vllm", {}),
    "hw.tensor_parallel_split": (T, dflash_draft, "vllm", {"gpus": 8}),
    "speed.moe_verify": (lambda: moe_target(experts=10**9), dflash_draft, "sglang", {}),
    "vocab.draft_head": (T, lambda: with_(dflash_draft(), _set_drafter(head_rows=100, has_d2t=True)), "sglang", {}),
    "base.lineage": (T, lambda: dflash_draft(vocab_size=200), "sglang", {}),
    "base.num_target_layers": (T, lambda: dflash_draft(num_target_layers=20), "sglang", {}),
    "base.num_target_layers_strict": (H, lambda: dflash_draft(num_target_layers=LAYERS + 1), "tensorfold", {}),
    "mtp.present": (T, lambda: None, "vllm", {}),
    "draft_model.size": (T, lambda: qwen3_target(ref="same-size-draft"), "vllm", {}),
    "rope.context": (T, lambda: dflash_draft(max_position_embeddings=4096), "sglang", {"context": 8192}),
    "rope.target_context": (T, dflash_draft, "sglang", {"context": 100000}),
    "rope.scaling": (T, lambda: eagle3_draft(rope_theta=5e5), "sglang", {}),
    "rope.schema": (H, lambda: dflash_draft(rope_parameters=None, rope_theta=1e7), "tensorfold", {}),
    "format.target": (T, dflash_draft, "llama.cpp", {}),
    "format.draft": (_gguf_target, dflash_draft, "llama.cpp", {}),
    "format.family": (T, dflash_draft, "tensorfold", {}),
    "format.quant_inherit": (_modelopt_target, dflash_draft, "sglang", {}),
    "tensorfold.single_file": (
        H,
        lambda: with_(
            dflash_draft(),
            lambda c: setattr(
                c,
                "files",
                [FileEntry("model-00001-of-00002.safetensors"), FileEntry("model-00002-of-00002.safetensors")],
            ),
        ),
        "tensorfold",
        {},
    ),
    "gguf.dflash2_build": (_gguf_target, dflash2_draft, "llama.cpp", {}),
    "gguf.dflash2_split": (_gguf_target, dflash2_draft, "llama.cpp", {"gpus": 2}),
    "trust.field_report": (
        T,
        lambda: with_(dflash_draft(), _published_as("z-lab/Qwen3.8-27B-DFlash2")),
        "llama.cpp",
        {},
    ),
    "gguf.image_prompts": (lambda: with_(_gguf_target(), _mrope), dflash2_draft, "llama.cpp", {}),
    "gguf.draft_tokenizer": (_gguf_target, lambda: _gguf_dflash_draft(tokenizer_present=False), "llama.cpp", {}),
    "gguf.draft_swa": (_gguf_target, _keyless_swa_gguf, "llama.cpp", {}),
    "gguf.nvfp4_build": (lambda: _gguf_target("nvfp4-gguf"), lambda: _gguf_dflash_draft(), "llama.cpp", {}),
    "hw.capability": (_modelopt_target, dflash_draft, "sglang", {"gpu": GPUS["h100"]}),
    "hw.kernels": (_modelopt_target, dflash_draft, "vllm", {"gpu": GPUS["h100"]}),
    "memory.fit": (lambda: with_(qwen3_target(), _big), dflash_draft, "vllm", {"gpu": GPUS["rtx4090"]}),
    "memory.plan": (T, dflash_draft, "vllm", {}),
    "memory.offload": (
        lambda: with_(_gguf_target(), _gguf_experts),
        _gguf_dflash_draft,
        "llama.cpp",
        {"gpu": GPUS["rtx4090"]},
    ),
    "hybrid.rollback": (H, dflash_draft, "sglang", {}),
    "hybrid.rollback_build": (H, dflash_draft, "llama.cpp", {}),
    "revision.pinned": (T, lambda: with_(dflash_draft(), _source("hub", "z-lab/drafter")), "vllm", {}),
    "revision.tensorfold": (
        lambda: with_(qwen35_target(), _source("hub", "Qwen/target@c69b185")),
        dflash_draft,
        "tensorfold",
        {},
    ),
    "trust.remote_code": (
        T,
        lambda: with_(dflash_draft(), _note("auto_map names custom code (AutoModel=x): reported, never run")),
        "vllm",
        {},
    ),
    "trust.pickle": (
        T,
        lambda: with_(dflash_draft(), _note("pickle file mask_embedding.pt: reported, never loaded")),
        "sglang",
        {},
    ),
    "mask.embedding_unread": (
        T,
        lambda: with_(dflash_draft(), _set_drafter(mask_embedding_file="mask_embedding.pt")),
        "specpair",
        {},
    ),
    "mask.embedding": (T, lambda: with_(dflash_draft(), _set_drafter(mask_embedding_shape=[HIDDEN])), "specpair", {}),
    "mask.embedding_shape": (
        T,
        lambda: with_(dflash_draft(), _set_drafter(mask_embedding_shape=[2, HIDDEN])),
        "exllamav3",
        {},
    ),
    "trust.pickle_weights": (
        T,
        lambda: with_(eagle3_draft(), _note("pickle weights only (pytorch_model.bin): no .safetensors weights")),
        "specpair",
        {},
    ),
    "trust.catalog": (T, lambda: with_(dflash_draft(), _source("catalog", "z-lab/drafter")), "sglang", {}),
    "trust.incomplete": (
        lambda: with_(
            qwen3_target(), _note("incomplete download model.safetensors.incomplete: a transfer was interrupted here")
        ),
        dflash_draft,
        "vllm",
        {},
    ),
    "drafter.sample_from_anchor": (T, lambda: dflash_draft(block={"sample_from_anchor": True}), "vllm", {}),
    "drafter.anchor_layout": (T, lambda: dflash_draft(markov_rank=0), "vllm", {}),
    "drafter.window_source": (T, lambda: modelopt_swa_draft(), "sglang", {}),
    "drafter.eagle_norms": (T, lambda: eagle3_draft(norm_output=True), "llama.cpp", {}),
    "vllm.quantized_context_kv": (T, lambda: with_(dflash_draft(), _fp8_attention), "vllm", {}),
    "vllm.runner": (T, dflash_draft, "vllm", {}),
    "vllm.token_budget": (T, dflash_draft, "vllm", {}),
    "speculators.verifier": (
        T,
        lambda: dflash_draft(pin=Verifier("Qwen/Qwen3-8B", ("Qwen3ForCausalLM",))),
        "specpair",
        {},
    ),
    "speculators.format": (T, lambda: dflash_draft(pin=PIN), "sglang", {}),
    "sglang.dflash2_head": (_modelopt_target_quantized_head, dflash2_draft, "sglang", {}),
}


def test_every_rule_has_a_failing_case():
    assert {r.id for r in RULES} == set(FAILING), "each rule of the table needs a case here"
    assert len({r.id for r in RULES}) == len(RULES), "rule ids are unique"


@pytest.mark.parametrize("rule_id", sorted(FAILING))
def test_rule_fires_on_its_failure_case(rule_id: str):
    target, draft, stack, deployment = FAILING[rule_id]
    found = findings(target(), draft(), stack, **deployment)
    assert rule_id in found, f"{rule_id} did not fire; found {sorted(found)}"
    for message in found[rule_id]:
        assert "{" not in message and "}" not in message, message


def test_a_block_drafter_whose_theta_is_not_its_targets_is_flagged():
    """A DFlash drafter computes its block's rotary embedding with its own theta over the target's features; a GGUF
    converter that read only a top-level rope_theta bakes a default in (lucebox#447: 1e6 where the drafter's
    rope_parameters say 1e7). Its rope type may differ from the target's (positions are its own)."""
    (message,) = findings(H(), dflash_draft(), "llama.cpp")["rope.scaling"]
    assert "target uses default (theta 1e+07) RoPE but dflash-draft uses default (theta 1e+06)" in message, message
    assert "lucebox#447" in message
    assert "rope.scaling" not in findings(T(), dflash_draft(), "llama.cpp")
    yarn = {"rope_type": "yarn", "rope_theta": 1e6, "factor": 4.0, "original_max_position_embeddings": 32768}
    assert "rope.scaling" not in findings(T(), dflash_draft(rope_parameters=yarn), "llama.cpp")


def _published_as(ref: str) -> Callable[[Checkpoint], None]:
    return lambda c: setattr(c, "ref", ref)


def test_a_field_report_is_noted_for_its_checkpoint_on_its_stack_only():
    """compat/field_reports.py: acceptance reported for a published drafter on one stack, matched on the repo (any
    of its forms, any case, at any revision), said on that stack alone."""
    pinned = with_(dflash_draft(), _published_as("Z-LAB/qwen3.8-27b-dflash2-gguf@" + "a" * 40))
    (message,) = findings(T(), pinned, "llama.cpp")["trust.field_report"]
    assert message.startswith("Z-LAB/qwen3.8-27b-dflash2-gguf on llama.cpp: 2.2-3.3 tokens a round"), message
    assert message.endswith("(z-lab/dflash#170, open as of 2026-09)."), message
    assert "trust.field_report" not in findings(T(), pinned, "vllm")
    other = with_(dflash_draft(), _published_as("z-lab/Qwen3.6-35B-A3B-DFlash"))
    assert "trust.field_report" not in findings(T(), other, "llama.cpp")


def _mrope(c: Checkpoint) -> None:
    c.rope.mrope = True


def test_image_prompts_are_noted_on_llama_cpp_for_a_target_with_mrope_positions():
    """Qwen3.5/3.6 targets take images (M-RoPE positions); llama.cpp drafted wrongly after an image until PR #28715.
    A text-only target gets no note."""
    (message,) = findings(with_(_gguf_target(), _mrope), _gguf_dflash_draft(), "llama.cpp")["gguf.image_prompts"]
    assert "DFlash drafting on image prompts needs" in message and "#28715" in message, message
    assert "gguf.image_prompts" not in findings(_gguf_target(), _gguf_dflash_draft(), "llama.cpp")


def test_sglang_is_said_to_misread_a_quantized_block_drafter_it_loads_anyway():
    """SGLang serves DFlash drafters unquantized, but loads a quantized one without a word and drafts garbage
    (sglang#39087): format.draft says so for the kinds whose row says so, and only the refusal for others."""

    def int4(c: Checkpoint) -> None:
        c.groups = [TensorGroup("attention", "int4-ct", 8, 10**6)]

    (dflash2,) = findings(T(), with_(dflash2_draft(), int4), "sglang")["format.draft"]
    assert dflash2.endswith(
        "drafts garbage (sglang#39087: 3.7 to 1.0 tokens a round with a W4A16 DFlash2, slower than no drafter)."
    )
    (eagle3,) = findings(T(), with_(eagle3_draft(), int4), "sglang")["format.draft"]
    assert eagle3.endswith("is safetensors with int4-ct weights."), eagle3


def _fp8_attention(c: Checkpoint) -> None:
    c.groups = [TensorGroup("attention", "fp8-block", 8, 10**6), TensorGroup("mlp", "bf16", 6, 10**6)]


def test_a_dflash_drafter_with_quantized_attention_is_converted_for_vllm():
    """vLLM's DFlash reads qkv_proj.weight raw for the context K/V (vllm#51581): a DFlash drafter quantized there is
    refused on vLLM with the convert to bf16 as its fix; vLLM loads it otherwise (format.draft passes), as it does an
    EAGLE-3 head quantized the same way; float attention with a quantized MLP passes."""
    quantized = with_(dflash_draft(), _fp8_attention)
    _, verdicts = judge(T(), quantized, Deployment(), ["vllm", "sglang"])
    vllm = verdicts["vllm"]
    assert vllm.blocked_by == [] and [f.rule for f in vllm.reasons if f.severity == "error"] == [
        "vllm.quantized_context_kv"
    ]
    assert "in fp8-block: vLLM's DFlash projects" in vllm.reasons[0].message
    assert vllm.fix.endswith("specpair convert dflash-draft dflash-draft-bf16 --to bf16"), vllm.fix
    assert "vllm.quantized_context_kv" not in {f.rule for f in verdicts["sglang"].reasons}
    mlp_only = with_(dflash_draft(), lambda c: setattr(c, "groups", [TensorGroup("mlp", "fp8-block", 6, 10**6)]))
    assert "vllm.quantized_context_kv" not in findings(T(), mlp_only, "vllm")
    assert "vllm.quantized_context_kv" not in findings(T(), with_(eagle3_draft(), _fp8_attention), "vllm")


def test_eagle31_norms_are_flagged_where_the_stack_is_not_known_to_apply_them():
    """EAGLE-3.1's norms, turned on at the top level (speculators) or in eagle_config (NVIDIA's heads, vllm#42143):
    vLLM and specpair apply all three; SGLang norm_before_fc and norm_output; upstream llama.cpp none. The pair of
    exclusive norms is refused as speculators refuses it."""
    fc_norm = {"eagle_aux_hidden_state_layer_ids": [2, 4, 6], "fc_norm": True}
    head = eagle3_draft(norm_output=True, eagle_config=fc_norm)
    assert head.drafter.eagle_norms == ["fc_norm", "norm_output"]
    unapplied = {stack: findings(T(), head, stack).get("drafter.eagle_norms") for stack in ("specpair", "vllm")}
    assert unapplied == {"specpair": None, "vllm": None}
    (sglang,) = findings(T(), head, "sglang")["drafter.eagle_norms"]
    assert "turns on fc_norm, norm_output (" in sglang and "not known to apply fc_norm:" in sglang, sglang
    (llama_cpp,) = findings(T(), head, "llama.cpp")["drafter.eagle_norms"]
    assert "not known to apply fc_norm, norm_output:" in llama_cpp, llama_cpp
    assert "drafter.eagle_norms" not in findings(T(), eagle3_draft(norm_before_fc=True), "sglang")
    with pytest.raises(BadInput, match="both norm_before_fc and fc_norm"):
        eagle3_draft(norm_before_fc=True, fc_norm=True)


def modelopt_swa_draft(**changes: object) -> Checkpoint:
    """A DFlash drafter as NVIDIA ModelOpt exports one trained with a window (Model-Optimizer#1960): layer_types all
    full, the window in dflash_config.use_swa + swa_window_size, causal false; `changes` as dflash_draft's."""
    block = {"use_swa": True, "swa_window_size": 2048, "causal": False}
    return dflash_draft(block=block, layer_types=["full_attention"] * 2, sliding_window=4096, **changes)


def test_a_window_declared_through_use_swa_is_flagged_where_only_layer_types_are_read():
    """vLLM reads dflash_config.use_swa (every layer windowed), for DFlash2 too (its decoder layer is DFlash's);
    SGLang windows only what layer_types name, DFlash2 alike, so it runs ModelOpt's drafter with full attention.
    ExLlamaV3 reads layer_types from config.json itself, so it also misses a window that use_sliding_window with
    max_window_layers declares. specpair's runtime reads all three. A drafter whose layer_types name the sliding
    layers, or that has none, is read alike everywhere."""
    dflash2 = {"dflash2": DFLASH2, "architectures": ["DFlash2DraftModel"]}
    for changes in ({}, dflash2):
        draft = modelopt_swa_draft(**changes)
        assert (draft.rope.window_source, draft.rope.sliding_window) == ("dflash_config.use_swa", 2048)
        assert draft.shapes.layer_types == ["sliding", "sliding"]
        for stack in ("sglang", "exllamav3"):
            ((severity, message),) = _reasons(draft, stack, "drafter.window_source")
            assert severity == "warn"
            assert "declares a 2048-token sliding window on 2 of 2 layers through dflash_config.use_swa" in message
            assert f"{stack} windows a drafter's layers only from layer_types naming" in message, message
        for stack in ("vllm", "specpair"):
            assert _reasons(draft, stack, "drafter.window_source") == [], (stack, changes)
    for changes in ({}, dflash2):
        derived = dflash_draft(layer_types=None, use_sliding_window=True, max_window_layers=1, **changes)
        assert derived.rope.window_source == "use_sliding_window", derived.rope
        ((severity, message),) = _reasons(derived, "exllamav3", "drafter.window_source")
        assert "through use_sliding_window with max_window_layers" in message, message
        for stack in ("sglang", "vllm", "specpair"):
            assert _reasons(derived, stack, "drafter.window_source") == [], (stack, changes)
    named = dflash_draft(layer_types=["sliding_attention", "full_attention"], sliding_window=2048)
    assert named.rope.window_source == "layer_types"
    assert _reasons(dflash_draft(block={"use_swa": False}), "sglang", "drafter.window_source") == []
    for plain in (named, dflash_draft(), dflash_draft(**dflash2)):
        for stack in ("sglang", "vllm", "exllamav3", "specpair"):
            assert _reasons(plain, stack, "drafter.window_source") == [], (stack, plain.rope)


def dspark_draft(**changes: object) -> Checkpoint:
    """A drafter as DeepSeek's DeepSpec writes one (deepspec/modeling/dspark/qwen3/config.py): its target's config,
    the drafter's keys at the top level, architectures Qwen3DSparkModel and markov_rank (0: its DFlash drafters)."""
    config = {
        "architectures": ["Qwen3DSparkModel"],
        **DRAFTER_DECODER,
        "rope_theta": 1e6,
        "layer_types": ["full_attention", "full_attention"],
        "num_target_layers": LAYERS,
        "block_size": 7,
        "mask_token_id": 250,
        "target_layer_ids": [1, 3, 5],
        "num_anchors": 512,
        "enable_confidence_head": False,
        "markov_rank": 0,
        **changes,
    }
    tensors = [("fc.weight", "BF16", (HIDDEN, 3 * HIDDEN)), ("hidden_norm.weight", "BF16", (HIDDEN,))]
    return build(config, tensors, "dspark-draft")


def _reasons(draft: Checkpoint, stack: str, rule: str) -> list[tuple[str, str]]:
    """(severity, message) of each finding of `rule` for qwen3_target and `draft` on `stack`."""
    _, verdicts = judge(T(), draft, Deployment(), [stack])
    return [(f.severity, f.message) for f in verdicts[stack].reasons if f.rule == rule]


@pytest.mark.parametrize(
    ("draft", "marker"),
    [
        (dspark_draft, "architectures Qwen3DSparkModel"),
        (lambda: dflash_draft(markov_rank=0), "markov_rank"),  # DeepSpec's Markov-less drafters write 0
        (lambda: dflash_draft(block={"markov_rank": 256}), "dflash_config.markov_rank"),  # SpecForge's exports
    ],
)
def test_a_dspark_lineage_drafter_that_does_not_say_where_it_drafts_from_is_warned_everywhere(draft, marker):
    """A config showing DSpark's lineage without sample_from_anchor (llm-scaler#620, sglang-jax#1619): every stack
    serves it as DFlash, from the rows after the anchor; the warning names the marker and the stack's DSpark path."""
    checkpoint = draft()
    assert (checkpoint.drafter.dspark_marker, checkpoint.drafter.sample_from_anchor) == (marker, None)
    paths = {
        "vllm": 'serve it with method "dspark" in --speculative-config, which reads the key',
        "sglang": "serve it with --speculative-algorithm DSPARK, which reads the key",
        "llama.cpp": "serve it with --spec-type draft-dspark, which reads the key",
        "specpair": "specpair has no known path that reads it",
        "exllamav3": "exllamav3 has no known path that reads it",
        "tensorfold": "tensorfold has no known path that reads it",
    }
    for stack, path in paths.items():
        ((severity, message),) = _reasons(checkpoint, stack, "drafter.anchor_layout")
        assert severity == "warn", (stack, severity)
        assert f"shows DSpark's lineage ({marker}) but does not declare sample_from_anchor" in message, message
        assert f"{stack} serves it as DFlash, drafting from the rows after the anchor" in message, message
        assert "llm-scaler#620" in message and f"if true, {path}" in message, message


@pytest.mark.parametrize("stack", ["specpair", "sglang", "vllm", "llama.cpp", "exllamav3", "tensorfold"])
def test_a_dspark_lineage_drafter_that_declares_its_layout_or_a_plain_dflash_is_not_warned(stack: str):
    for declared in (
        dspark_draft(sample_from_anchor=False),  # top level, where SGLang's DSpark reads it
        dflash_draft(block={"markov_rank": 256, "sample_from_anchor": False}),
        dflash_draft(),
    ):
        assert _reasons(declared, stack, "drafter.anchor_layout") == [], (stack, declared.drafter)


def test_sample_from_anchor_is_refused_by_vllm_where_it_reads_it_and_warned_where_a_stack_drafts_past_it():
    """vLLM's DFlash reads dflash_config.sample_from_anchor and refuses it; a top-level key it does not read, so it
    drafts from the rows after the anchor, as specpair's runtime and llama.cpp's draft-dflash do whatever the key
    says. SGLang's reading of the key is not established: nothing is said there."""
    nested, top = dflash_draft(block={"sample_from_anchor": True}), dflash_draft(sample_from_anchor=True)
    assert (nested.drafter.sample_from_anchor_source, top.drafter.sample_from_anchor_source) == (
        "dflash_config.sample_from_anchor",
        "sample_from_anchor",
    )
    assert [s for s, _ in _reasons(nested, "vllm", "drafter.sample_from_anchor")] == ["error"]
    assert _reasons(nested, "vllm", "drafter.anchor_layout") == []
    assert _reasons(top, "vllm", "drafter.sample_from_anchor") == []
    ((severity, message),) = _reasons(top, "vllm", "drafter.anchor_layout")
    assert severity == "warn" and "sets sample_from_anchor (DSpark's readout" in message, message
    assert message.endswith('; serve it with method "dspark" in --speculative-config, which reads the key.'), message
    ((_, own),) = _reasons(nested, "specpair", "drafter.anchor_layout")
    assert "sets dflash_config.sample_from_anchor" in own and own.endswith("specpair has no known path that reads it.")
    for stack in ("sglang", "exllamav3", "tensorfold"):
        assert _reasons(nested, stack, "drafter.anchor_layout") == [], stack
    both = dspark_draft(dflash_config={"sample_from_anchor": False}, sample_from_anchor=True)
    assert (both.drafter.sample_from_anchor, both.drafter.sample_from_anchor_source) == (
        False,
        "dflash_config.sample_from_anchor",
    )


def test_a_dspark_architecture_is_named_for_what_it_is_with_vllms_registry_note():
    """vLLM 0.28's registry builds DSparkDraftModel as DeepSeek-V4's class ('hc_mult', syv-ai/qwen38-27b-rtx3090#25):
    drafter.arch says so on vLLM, and elsewhere names the stack's DSpark path, or none."""
    radixark = dspark_draft(architectures=["DSparkDraftModel"], markov_rank=256)
    (vllm,) = findings(T(), radixark, "vllm")["drafter.arch"]
    assert (
        "'DSparkDraftModel'" in vllm
        and ': DSparkDraftModel names a DSpark drafter, which vllm serves with method "dspark"' in vllm
    )
    assert "'hc_mult' (syv-ai/qwen38-27b-rtx3090#25): name it Qwen3DSparkModel" in vllm, vllm
    (sglang,) = findings(T(), radixark, "sglang")["drafter.arch"]
    assert (
        "which sglang serves with --speculative-algorithm DSPARK, not as DFlash" in sglang and "hc_mult" not in sglang
    )
    (own,) = findings(T(), dspark_draft(), "specpair")["drafter.arch"]
    assert own.endswith(": Qwen3DSparkModel names a DSpark drafter, which specpair is not known to serve."), own


def test_a_block_drafters_own_head_is_refused_or_flagged_where_the_stack_drafts_through_the_targets():
    """A DFlash drafter's own head (field failure vllm-ascend#11374): vLLM and llama.cpp draft through it; SGLang skips
    it for the target's, which is surely wrong for a reduced head (rows not the target's, or d2t) and maybe right for
    a full one (a copy of the target's); specpair's runtime refuses any but a speculators drafter's verifier copy."""
    rows = T().shapes.rows
    reduced = with_(dflash_draft(), _set_drafter(head_rows=100, has_d2t=True))
    reduced_no_map = with_(dflash_draft(), _set_drafter(head_rows=rows // 2))
    full = with_(dflash_draft(), _set_drafter(head_rows=rows))
    verifier_copy = with_(dflash_draft(), _set_drafter(head_rows=rows, verifier="Qwen/Qwen3-8B"))
    expected = {  # stack -> (reduced, reduced without d2t, full, speculators' verifier copy) fire
        "specpair": (True, True, True, False),
        "sglang": (True, True, False, False),
        "vllm": (False, False, False, False),
        "llama.cpp": (False, False, False, False),
    }
    for stack, fires in expected.items():
        for draft, fire in zip((reduced, reduced_no_map, full, verifier_copy), fires):
            found = findings(T(), draft, stack)
            assert ("vocab.draft_head" in found) == fire, (stack, draft.drafter.head_rows, found)
    (message,) = findings(T(), reduced, "sglang")["vocab.draft_head"]
    assert f"lm_head of 100 rows and d2t, where {T().ref} has {rows}" in message
    assert "vllm, llama.cpp draft through it" in message
    (message,) = findings(T(), full, "specpair")["vocab.draft_head"]
    assert "`run` refuses to load it" in message


@pytest.mark.parametrize("kv_heads", [1, 2, 4])
@pytest.mark.parametrize("rows", [256, 250])
def test_check_refuses_the_tensor_parallel_sizes_the_runtime_refuses(kv_heads, rows):
    """`check --gpus N` on specpair and `run --tp N`'s shard agree, N by N: whole KV groups for every rank, an even
    vocabulary; where N does not split, the largest size below it that does is named."""
    config, tensors = qwen3_target_files(rows=rows, kv_heads=kv_heads)
    model = parse_config(config, "target")
    for gpus in (2, 4, 8):
        found = findings(build(config, tensors, "target", tokenizer()), dflash_draft(), "specpair", gpus=gpus)
        try:
            Parallel(0, gpus).config(model, "target")
            splits = True
        except BadInput:
            splits = False
        assert ("hw.tensor_parallel_split" not in found) == splits, (kv_heads, rows, gpus, found)
        assert "drafter.tensor_parallel" not in found
    (message,) = findings(qwen3_target(kv_heads=2), dflash_draft(), "specpair", gpus=4)["hw.tensor_parallel_split"]
    assert message.endswith(
        "target: num_kv_heads 2 leaves a rank of tensor parallelism 4 without one over --gpus 4; --gpus 2 splits it."
    )


def test_sglang_and_vllm_need_the_gpus_to_divide_every_models_heads():
    """Their tensor parallelism splits query heads evenly and KV heads evenly or copies them to whole shares (SGLang's
    DFlashAttention asserts it for the drafter; their QKVParallelLinear for the target): each model's heads are
    checked, and the largest size below that splits both is named. specpair splits its own way (above)."""

    def split(gpus: int, target: Checkpoint, draft: Checkpoint, stack: str = "vllm") -> list[str]:
        return findings(target, draft, stack, gpus=gpus).get("hw.tensor_parallel_split", [])

    assert split(2, T(), dflash_draft()) == split(4, T(), dflash_draft()) == []  # 4 heads, 2 KV heads
    (message,) = split(8, T(), dflash_draft(), "sglang")  # each model with 4 heads
    assert message.endswith(
        "target: 4 attention heads do not divide by 8; dflash-draft: 4 attention heads do not divide by 8 over "
        "--gpus 8; --gpus 4 splits it."
    )
    (message,) = split(2, qwen3_target(kv_heads=3), dflash_draft())
    assert message.endswith("target: 3 KV heads do not divide by 2 over --gpus 2; serve it on one GPU.")
    (message,) = split(4, T(), dflash_draft(num_attention_heads=6))
    assert message.endswith("dflash-draft: 6 attention heads do not divide by 4 over --gpus 4; --gpus 2 splits it.")
    (message,) = split(8, T(), dflash_draft(), "specpair")  # its own way: the target's KV groups only
    assert message.endswith(
        "target: num_kv_heads 2 leaves a rank of tensor parallelism 8 without one over --gpus 8; --gpus 2 splits it."
    )


def test_specpair_holds_the_drafter_whole_on_every_gpu_where_sglang_splits_it():
    """runtime/parallel.py replicates drafters (each rank drafts the same tokens), so at tensor parallelism 2 a GPU
    holds half the target and the whole drafter; SGLang and vLLM split both."""
    target = with_(T(), lambda c: setattr(c, "groups", [TensorGroup("attention", "bf16", 8, 40 * 10**9)]))
    draft = with_(dflash_draft(), lambda c: setattr(c, "groups", [TensorGroup("attention", "bf16", 8, 4 * 10**9)]))
    pair, _ = judge(target, draft, Deployment(gpus=2), [])
    ours, theirs = memory_plan(pair, "specpair"), memory_plan(pair, "sglang")
    parts, overhead = ours.parts, ours.overhead_per_gpu
    assert ours.tensor_parallel == theirs.tensor_parallel == 2 and parts["draft_weights"] == 4.0
    target_gb, kv, draft_gb, draft_kv = (parts[k] for k in ("target_weights", "kv", "draft_weights", "draft_kv"))
    kv += parts["recurrent_state"]
    assert ours.per_gpu == round((target_gb + kv) / 2 + draft_gb + draft_kv + overhead, 1)
    assert theirs.per_gpu == round((target_gb + kv) / 2 + (draft_gb + draft_kv) / 2 + overhead, 1)


def test_a_dflash2_drafter_over_several_gpus_on_llama_cpp_is_told_its_split_mode():
    assert "gguf.dflash2_split" not in findings(_gguf_target(), dflash2_draft(), "llama.cpp")  # one GPU: no split
    assert "gguf.dflash2_split" not in findings(_gguf_target(), dflash_draft(), "llama.cpp", gpus=2)  # no selector
    (message,) = findings(_gguf_target(), dflash2_draft(), "llama.cpp", gpus=2)["gguf.dflash2_split"]
    assert "--gpus 2 splits" in message and "PR #27858" in message


def test_the_memory_plan_asks_only_for_sizes_that_split():
    """A pair too big for one GPU is told the smallest tensor parallelism that fits among the sizes that split its
    heads the stack's way, so the size `memory.fit` names clears hw.tensor_parallel_split too."""
    big = [TensorGroup("attention", "bf16", 8, 100 * 10**9)]
    target = with_(T(), lambda c: setattr(c, "groups", big))
    (message,) = findings(target, dflash_draft(), "vllm", gpu=GPUS["h100"])["memory.fit"]
    assert message.endswith("it needs tensor parallelism 2 (pass --gpus 2).")
    target = with_(qwen3_target(kv_heads=3), lambda c: setattr(c, "groups", big))
    (message,) = findings(target, dflash_draft(), "vllm", gpu=GPUS["h100"])["memory.fit"]
    assert message.endswith("so it does not fit on vllm; vllm cannot split this pair across GPUs.")  # 3 KV heads


def test_vllms_line_samples_the_drafts_of_the_kinds_that_sample():
    """vLLM drafts every kind's argmax unless draft_sample_method says otherwise, so at a temperature the drafts of a
    DFlash2 selector or a draft model are one-hot proposals (syv-ai/qwen38-27b-rtx3090#73: τ 3.19 to 2.66); the
    kinds that draft their argmax by design (the rows' `samples`, which specpair's runtime drafts by too) keep the
    default."""
    sampled = {"dflash": False, "dflash2": True, "eagle3": False, "draft_model": True}
    drafts = {"dflash": dflash_draft, "dflash2": dflash2_draft, "eagle3": eagle3_draft, "draft_model": draft_model}
    for kind, samples in sampled.items():
        assert DRAFTER_KINDS[kind].samples == samples
        _, verdicts = judge(T(), drafts[kind](), Deployment(), ["vllm"])
        assert ('"draft_sample_method":"probabilistic"' in verdicts["vllm"].launch) == samples, kind


def test_llama_cpps_line_stops_a_draft_models_drafts_where_it_is_unsure():
    """llama.cpp b9235 dropped its draft-model p-min default from 0.75 to 0.0, so every round drafts the full block
    and acceptance fell 0.94 to 0.30 (llama.cpp#25792); the launch line passes the old value, in the --spec-* names
    that builds since the rename read (they refuse the removed --draft-max). A block drafter drafts its block in one
    pass and has no such cut-off on the line."""
    plain = with_(draft_model(), lambda c: setattr(c, "format", "gguf"))
    _, verdicts = judge(_gguf_target(), plain, Deployment(), ["llama.cpp"])
    argv = shlex.split(verdicts["llama.cpp"].launch)
    assert argv[argv.index("--spec-type") + 1] == "draft-simple", argv
    assert argv[argv.index("--spec-draft-p-min") + 1] == "0.75" and argv[argv.index("--spec-draft-n-max") + 1] == "4"
    assert not {"--draft-max", "--draft"} & set(argv)  # removed in the --spec-* rename: such a line would not start
    _, verdicts = judge(_gguf_target(), _gguf_dflash_draft(), Deployment(), ["llama.cpp"])
    assert verdicts["llama.cpp"].status == "ok" and "p-min" not in verdicts["llama.cpp"].launch


def test_llama_cpps_line_names_each_kinds_speculative_type():
    """llama-server drafts by --spec-type (common_speculative_type_from_name_map: draft-simple, draft-eagle3,
    draft-mtp, draft-dflash); each kind's row names its type, so a separate drafter is not read as another kind."""

    def gguf_eagle3(c: Checkpoint) -> None:
        c.format, c.architecture = "gguf", "eagle3"

    heads = {
        "draft-simple": with_(draft_model(), lambda c: setattr(c, "format", "gguf")),
        "draft-eagle3": with_(eagle3_draft(), gguf_eagle3),
        "draft-dflash": _gguf_dflash_draft(),
    }
    for spec_type, draft in heads.items():
        _, verdicts = judge(_gguf_target(), draft, Deployment(), ["llama.cpp"])
        argv = shlex.split(verdicts["llama.cpp"].launch)
        assert argv[argv.index("--spec-type") + 1] == spec_type and "-md" in argv, argv
    served = [k for k in DRAFTER_KINDS.values() if "llama.cpp" in k.serving]
    assert all(k.serving["llama.cpp"].method for k in served), "the launch line passes every row's --spec-type"


def test_specpairs_launch_line_splits_the_pair_over_the_gpus_given():
    """Every kind runs under `run --tp N` (runtime/parallel.py), with the drafter whole on every GPU."""
    (_, split), (_, whole) = (judge(T(), dflash_draft(), Deployment(gpus=n), ["specpair"]) for n in (2, 1))
    assert split["specpair"].launch.endswith("--block-size 16 --tp 2"), split["specpair"].launch
    assert whole["specpair"].launch.endswith("--block-size 16"), whole["specpair"].launch


def moe_target(experts: int, dense: int = 10**8, embedding: int = 10**7) -> Checkpoint:
    """The hybrid MoE target (8 experts, 2 a token) with these bytes of routed experts, other weights and embedding."""
    target = H(mtp=False)
    target.groups = [
        TensorGroup("experts", "bf16", 3, experts),
        TensorGroup("attention", "bf16", 8, dense),
        TensorGroup("embedding", "bf16", 1, embedding),
    ]
    return target


def test_a_moe_verify_step_is_priced_against_a_decode_step():
    """A verify step of B tokens reads the experts B tokens touch (uniform routing, 1 - (1 - k/E)^B of them) and the
    dense weights once, the embedding a row a token (not counted); the finding prices the pair's block and block 4,
    and says nothing where the two steps read about alike (many sequences touch most experts already)."""
    target = moe_target(experts=10**9)
    (message,) = findings(target, dflash_draft(), "sglang")["speed.moe_verify"]
    decode, verify, small = (1 - 0.75**tokens for tokens in (1, 16, 4))
    ratio = (10**8 + verify * 10**9) / (10**8 + decode * 10**9)
    assert (
        f"reads about {round(8 * verify)} experts a layer against {round(8 * decode)} at decode, {ratio:.1f}x"
        in message
    )
    assert f"a block of 4 reads {(10**8 + small * 10**9) / (10**8 + decode * 10**9):.1f}x" in message
    assert "speed.moe_verify" not in findings(moe_target(experts=10**6), dflash_draft(), "sglang")  # dense-bound
    assert "speed.moe_verify" not in findings(target, dflash_draft(), "sglang", concurrency=16)  # all touched already
    assert "speed.moe_verify" not in findings(T(), dflash_draft(), "sglang")  # no experts


def test_shipped_mask_embedding_is_read_or_warned_per_stack():
    """Which stacks draft with a drafter's shipped mask embedding (families.py Serves.mask_embedding): the tensor
    specpair and ExLlamaV3's DFlash read, the pickle SGLang and vLLM load; any other stack is warned that it drafts
    with the target's row, and specpair's warning names the conversion that writes the pickle as the tensor."""
    tensor = with_(dflash_draft(), _set_drafter(mask_embedding_shape=[HIDDEN]))
    pickled = with_(dflash_draft(), _set_drafter(mask_embedding_file="mask_embedding.pt"))
    reads = {"specpair": "tensor", "exllamav3": "tensor", "sglang": "pickle", "vllm": "pickle", "llama.cpp": None}
    for stack, form in reads.items():
        for draft, shipped in ((tensor, "tensor"), (pickled, "pickle")):
            found = findings(qwen3_target(), draft, stack)
            read = form == shipped
            assert ("mask.embedding" in found) == read and ("mask.embedding_unread" in found) != read, (stack, found)
    (message,) = findings(qwen3_target(), pickled, "specpair")["mask.embedding_unread"]
    assert (
        "`specpair convert dflash-draft dflash-draft-safetensors --from-pickle` writes it as 'mask_embedding'"
        in message
    )
    (message,) = findings(qwen3_target(), pickled, "exllamav3")["mask.embedding_unread"]
    assert "(it reads 'mask_embedding')" in message and "convert" not in message
    # ExLlamaV3 1.6.5 builds its DFlash2 input layer without the tensor
    dflash2 = with_(dflash2_draft(), _set_drafter(mask_embedding_shape=[HIDDEN]))
    assert "mask.embedding_unread" in findings(qwen3_target(), dflash2, "exllamav3")
    assert "mask.embedding" in findings(qwen3_target(), dflash2, "specpair")


@pytest.mark.parametrize("stack", ["sglang", "vllm"])
def test_good_dflash_pair_is_ok(stack: str):
    found = findings(qwen3_target(), dflash_draft(), stack)
    assert {
        r for r in found if r not in ("mask.padded_row", "memory.plan", "vllm.runner", "vllm.token_budget")
    } == set(), found


def test_good_pair_silences_every_pair_rule():
    """Rules that fire only on a defect stay silent on a well-matched DFlash pair, on every stack."""
    always = {
        "runtime.runs",
        "taps.convention",
        "memory.plan",
        "mask.padded_row",
        "format.family",
        "vllm.runner",
        "vllm.token_budget",
        "format.target",
        "format.draft",
        "rope.schema",
        "base.num_target_layers_strict",
        "vocab.rows_equal",
    }
    for stack in ("specpair", "sglang", "vllm", "llama.cpp", "exllamav3", "tensorfold"):
        found = set(findings(qwen3_target(), dflash_draft(), stack)) - always
        assert found == set(), (stack, found)


def test_padding_only_vocabulary_is_a_warning_with_numbers():
    found = findings(qwen3_target(), dflash_draft(vocab_size=248), "sglang")
    assert "vocab.rows" not in found and "base.lineage" not in found
    (message,) = found["vocab.padding"]
    assert "248" in message and "256" in message and "240" in message and "(8)" in message


def test_draft_model_with_padded_rows_warns_but_vllm_refuses():
    assert "vocab.padding" in findings(qwen3_target(), draft_model(rows=248), "sglang")
    assert "vocab.rows" not in findings(qwen3_target(), draft_model(rows=248), "sglang")
    assert "vocab.rows_equal" in findings(qwen3_target(), draft_model(rows=248), "vllm")


def test_llama_cpp_taps_from_gguf_are_normalized():
    draft = with_(dflash_draft(), _set_drafter(taps=Taps([1, 3, 5], [2, 4, 6], "dflash.target_layers", "input")))
    assert "taps.range" not in findings(qwen3_target(), draft, "llama.cpp")


def test_mtp_pair_uses_the_targets_head():
    _, verdicts = judge(qwen35_target(), None, Deployment(), ["vllm", "sglang"])
    assert verdicts["vllm"].status in ("ok", "warn")
    assert '"method":"mtp"' in verdicts["vllm"].launch
    assert "NEXTN" in verdicts["sglang"].launch and "extra_buffer" in verdicts["sglang"].launch


def test_launch_flags_follow_each_stacks_block_semantics():
    _, verdicts = judge(qwen3_target(), dflash_draft(), Deployment(), ["sglang", "vllm"])
    assert "--speculative-num-draft-tokens 16" in verdicts["sglang"].launch
    assert '"num_speculative_tokens":15' in verdicts["vllm"].launch


def test_failing_stack_has_no_launch_but_a_fix():
    _, verdicts = judge(qwen3_target(), dflash_draft(), Deployment(), ["llama.cpp"])
    v = verdicts["llama.cpp"]
    assert v.status == "fail" and v.launch is None
    assert v.fix.startswith("specpair convert target")


def test_dflash_draft_gguf_fork_gets_the_upstream_conversion_fix():
    _, verdicts = judge(_gguf_target(), _gguf_dflash_draft("dflash-draft"), Deployment(), ["llama.cpp"])
    v = verdicts["llama.cpp"]
    assert [f.rule for f in v.reasons if f.severity == "error"] == ["drafter.arch"]
    assert "--to gguf:BF16" in v.fix


def test_a_gguf_drafter_converted_without_its_window_is_flagged_where_it_runs_with_full_attention(tmp_path):
    """ik_llama.cpp#2021: a DFlash GGUF whose converter left out the window keys runs every layer with full attention,
    on llama.cpp (src/models/dflash.cpp reads dflash.attention.sliding_window as optional) and on specpair (its GGUF
    reader reads the same key). The evidence that it slid: the built-in catalog's drafter of the file's general.name
    with its kind, shapes and taps."""
    keyless = _keyless_swa_gguf()
    assert keyless.shapes.layer_types == ["full"] * 6  # what both stacks run
    for stack in ("llama.cpp", "specpair"):
        (message,) = findings(_gguf_target(), keyless, stack)["gguf.draft_swa"]
        assert "has no dflash.attention.sliding_window, but the published drafter of its name and shapes " in message
        assert "(modal-labs/Qwen3.6-35B-A3B-DFlash, z-lab/Qwen3.6-35B-A3B-DFlash)" in message
        assert "a 4096-token sliding window on 5 of 6 layers" in message
        assert f"{stack} then runs every layer with full attention" in message and "ik_llama.cpp#2021" in message
    (message,) = findings(_gguf_target(), keyless, "llama.cpp")["gguf.draft_swa"]
    assert message.endswith(
        "Convert modal-labs/Qwen3.6-35B-A3B-DFlash again with `specpair download modal-labs/Qwen3.6-35B-A3B-DFlash "
        "--no-lock && specpair convert modal-labs/Qwen3.6-35B-A3B-DFlash Qwen3.6-35B-A3B-DFlash-bf16.gguf "
        "--to gguf:BF16 --target target`: specpair's converter keeps the window."
    ), message

    # general.organization names one of the two repos; a fork's file names its own key
    named = _gguf_written(
        tmp_path, "org.gguf", sliding_window=None, name="Qwen3.6 35B A3B DFlash", organization="Z Lab", **SWA_DRAFTER
    )
    (message,) = findings(_gguf_target(), named, "llama.cpp")["gguf.draft_swa"]
    assert "(z-lab/Qwen3.6-35B-A3B-DFlash)" in message and "Convert z-lab/Qwen3.6-35B-A3B-DFlash again" in message
    fork = _gguf_written(
        tmp_path,
        "fork.gguf",
        arch="dflash-draft",
        sliding_window=None,
        name="z-lab/Qwen3.6-35B-A3B-DFlash",
        **SWA_DRAFTER,
    )
    (message,) = findings(_gguf_target(), fork, "specpair")["gguf.draft_swa"]
    assert "has no dflash-draft.attention.sliding_window" in message

    # silent: the keys written; a name the catalog does not know; other shapes; drafters trained with full attention
    # (z-lab's legacy revision of the same repo, chutesai's drafter)
    legacy = {**SWA_DRAFTER, "layers": 8, "kv_heads": 4, "target_layer_ids": [1, 10, 19, 28, 37]}
    chutes = {**SWA_DRAFTER, "target_hidden": 5120, "hidden": 5120, "layers": 5, "intermediate": 9728}
    chutes["target_layer_ids"] = [1, 16, 31, 46, 61]
    silent = {
        "keys written": ({"name": "Qwen3.6 35B A3B DFlash", **SWA_DRAFTER}),
        "unknown name": ({"sliding_window": None, "name": "my drafter", **SWA_DRAFTER}),
        "other shapes": (
            {"sliding_window": None, "name": "Qwen3.6 35B A3B DFlash", **SWA_DRAFTER, "intermediate": 4096}
        ),
        "legacy revision": ({"sliding_window": None, "name": "Qwen3.6 35B A3B DFlash", **legacy}),
        "full attention": ({"sliding_window": None, "name": "Qwen3 32B FP8 DFLASH", **chutes}),
    }
    for case, options in silent.items():
        draft = _gguf_written(tmp_path, f"{case}.gguf", **options)
        for stack in ("llama.cpp", "specpair"):
            assert "gguf.draft_swa" not in findings(_gguf_target(), draft, stack), (case, stack)


def test_memory_fit_suggests_tensor_parallelism():
    found = findings(with_(qwen3_target(), _big), dflash_draft(), "vllm", gpu=GPUS["h100"])
    assert "tensor parallelism 2" in found["memory.fit"][0]
    found = findings(with_(qwen3_target(), _big), dflash_draft(), "vllm", gpu=GPUS["h100"], gpus=2)
    assert "memory.fit" not in found and "tensor parallelism 2" in found["memory.plan"][0]


def test_draft_size_warning_follows_the_figure():
    """A draft model at 138%, 100% or 62% of its target's weight bytes is told so in those words, not one
    sentence for all three."""

    def message(draft_layers: int) -> str:
        draft = qwen3_target(layers=draft_layers, ref="draft")
        (found,) = findings(qwen3_target(), draft, "vllm")["draft_model.size"]
        return found

    assert message(14) == (
        "draft is 138% of target's weight bytes: each drafted token costs more than the target step it is to "
        "save, so drafting slows decoding."
    )
    assert message(LAYERS).endswith(
        "100% of target's weight bytes: each drafted token costs about as much as the target step it is to save."
    )
    assert message(2).endswith(
        "62% of target's weight bytes: each drafted token costs about 62% of a target step, so drafting gains little."
    )


def test_swapped_arguments_are_bad_input():
    from specpair.errors import BadInput

    with pytest.raises(BadInput, match="give the target first"):
        judge(dflash_draft(), qwen3_target(), Deployment(), ["vllm"])


@pytest.mark.parametrize("stack", ["sglang", "vllm", "llama.cpp", "exllamav3"])
@pytest.mark.parametrize("kind", ["eagle3", "draft_model", "mtp", "dflash2"])
def test_good_pairs_of_every_kind_raise_no_error(kind: str, stack: str):
    target = qwen35_target() if kind == "mtp" else qwen3_target()
    draft = {"eagle3": eagle3_draft, "draft_model": draft_model, "mtp": lambda: None, "dflash2": dflash2_draft}[kind]()
    found = findings(target, draft, stack)
    # Only a stack that cannot serve the kind, or cannot load safetensors, may object to a well-matched pair.
    expected = set()
    if stack == "llama.cpp":
        expected |= {"format.target", "format.draft"}
    if stack == "exllamav3" and kind == "eagle3":
        expected |= {"drafter.kind"}
    errors = {r for r in found if next(x for x in RULES if x.id == r).severity == "error"}
    assert errors <= expected, (kind, stack, {r: found[r] for r in errors - expected})
    assert "base.lineage" not in found and "vocab.tokens" not in found and "taps.range" not in found


def test_quantized_only_stack_takes_float_norms_but_not_float_weights():
    assert "format.target" not in findings(_modelopt_target(), dflash_draft(), "tensorfold")
    (message,) = findings(qwen35_target(), dflash_draft(), "tensorfold")["format.target"]
    assert "bf16 weights" in message
    (message,) = findings(_modelopt_target(), dflash_draft(), "exllamav3")["format.target"]
    assert "nvfp4-modelopt" in message and "fp8-tensor" in message


COMMIT = "c69b185d1ae5f3e0fba2bd8c8fc3d30ab6b2ab2f"


def _on_hub(ref: str) -> Callable[[Checkpoint], None]:
    def change(c: Checkpoint) -> None:
        c.source, c.ref, c.revision = "hub", ref, COMMIT  # the commit the Hub resolved the reference to

    return change


def test_pinned_means_a_full_40_hex_commit():
    def pinned(draft_ref: str, target_ref: str = "Qwen/target@" + COMMIT) -> list[str]:
        target = with_(qwen3_target(), _on_hub(target_ref))
        return findings(target, with_(dflash_draft(), _on_hub(draft_ref)), "vllm").get("revision.pinned", [])

    assert pinned(f"z-lab/drafter@{COMMIT}") == []
    (branch,) = pinned("z-lab/drafter@main")
    assert branch.startswith(
        f"z-lab/drafter@main names the branch or tag 'main', not a commit (it points to {COMMIT} now)"
    )
    assert (
        branch.endswith(f"Pin it as z-lab/drafter@{COMMIT}.") and "drafter configs change between revisions" in branch
    )
    (abbreviated,) = pinned("z-lab/drafter@c69b185")
    assert "names the abbreviated commit c69b185, not a full 40-hex one" in abbreviated
    (bare,) = pinned("z-lab/drafter")
    assert f"is not pinned to a commit (main points to {COMMIT} now)" in bare
    (target,) = pinned(f"z-lab/drafter@{COMMIT}", "Qwen/target@main")
    assert target.startswith("Qwen/target@main names the branch or tag 'main'")
    assert "drafter" not in target and "z-lab" not in target  # a target's reason is its own


def test_a_fix_is_offered_only_when_it_clears_every_error():
    # llama.cpp refuses both checkpoints' formats only: converting both clears every error
    _, verdicts = judge(qwen3_target(), dflash_draft(), Deployment(), ["llama.cpp"])
    assert verdicts["llama.cpp"].fix.count("specpair convert") == 2 and verdicts["llama.cpp"].blocked_by == []
    # TensorFold: converting the target to affine4 leaves its strict layer-count check standing
    draft = dflash_draft(num_target_layers=LAYERS + 1)
    _, verdicts = judge(qwen35_target(), draft, Deployment(), ["tensorfold"])
    v = verdicts["tensorfold"]
    assert "format.target" in {f.rule for f in v.reasons} and v.fix is None
    assert "base.num_target_layers_strict" in v.blocked_by


@pytest.mark.parametrize("gigabytes", [x / 10 for x in range(680, 720, 3)])
def test_memory_message_and_verdict_agree_at_every_size(gigabytes: float):
    """Around the A100's 72.0 GB usable: memory.fit fires exactly when the per-GPU figure it shows exceeds the
    usable figure it shows, and memory.plan's figures fit."""
    target = with_(
        qwen3_target(), lambda c: setattr(c, "groups", [TensorGroup("experts", "bf16", 1, int(gigabytes * GB))])
    )
    _, verdicts = judge(target, dflash_draft(), Deployment(gpu=GPUS["a100"]), ["vllm"])
    v = verdicts["vllm"]
    fit = [f for f in v.reasons if f.rule == "memory.fit"]
    assert bool(fit) == (v.memory.per_gpu > v.memory.usable_per_gpu) == (v.memory.fits is False)
    if fit:
        assert fit[0].values["per_gpu"] > fit[0].values["usable"] == 72.0
        assert f"needs {v.memory.per_gpu:.1f} GB on one GPU" in fit[0].message
    else:
        (plan,) = [f for f in v.reasons if f.rule == "memory.plan"]
        assert f"{v.memory.per_gpu:.1f} GB on one GPU fits the 72.0 GB usable" in plan.message


def test_eagle3_layout_warnings_name_the_layers_each_stack_taps():
    """A stack reading an EAGLE-3 drafter's ids otherwise than its training framework warns with both layer lists;
    SGLang reads only eagle_config's ids (else its default 2, L//2, L-3) and adds 1 to a list starting at 1."""
    specforge = eagle3_draft(eagle_config={"eagle_aux_hidden_state_layer_ids": [1, 4, 6]})
    top_level = eagle3_draft(eagle_config=None, eagle_aux_hidden_state_layer_ids=[2, 4, 6])
    (message,) = findings(qwen3_target(), specforge, "vllm")["taps.layout"]  # vLLM reads top-level ids only
    assert "outputs of target layers [1, 3, 4]" in message and "default ids [2, 4, 5]" in message
    assert "outputs of layers [1, 4, 6] (SpecForge" in message
    (message,) = findings(qwen3_target(), top_level, "sglang")["taps.layout"]
    assert "outputs of target layers [1, 3, 4]" in message and "default ids [2, 4, 5]" in message
    assert "outputs of layers [1, 3, 5] (vLLM" in message
    assert "taps.layout" in findings(qwen3_target(), eagle3_draft(), "vllm")  # [2, 4, 6] under eagle_config
    quiet = [(specforge, "sglang"), (top_level, "vllm"), (eagle3_draft(eagle_config=None), "sglang")]
    quiet += [(eagle3_draft(eagle_config=None), "vllm"), (eagle3_draft(), "sglang")]
    for draft, stack in quiet:
        assert "taps.layout" not in findings(qwen3_target(), draft, stack), (draft.drafter.taps, stack)


def test_a_speculators_drafter_pinning_this_target_passes_and_vllm_serves_the_drafter():
    """Pinned to the target by its name, its path's last part or an HF cache snapshot's repo: no finding; vLLM's
    launch is `vllm serve DRAFT` (the pin names the target); DFlash2 keeps the target form (no vLLM updater)."""
    for pinned in ("target", "/models/target", "/cache/models--org--target/snapshots/abc123"):
        draft = dflash_draft(pin=Verifier(pinned, ("Qwen3ForCausalLM",)))
        assert draft.drafter.verifier == pinned and draft.drafter.taps.layers == [1, 3, 5]
        for stack in ("specpair", "sglang", "vllm"):
            assert "speculators.verifier" not in findings(qwen3_target(), draft, stack), (pinned, stack)
    _, verdicts = judge(qwen3_target(), dflash_draft(pin=PIN), Deployment(), ["vllm"])
    assert verdicts["vllm"].launch.startswith("vllm serve dflash-draft --max-model-len ")
    assert "--speculative-config" not in verdicts["vllm"].launch
    copy = dflash_draft(pin=Verifier("/models/target", ("Qwen3ForCausalLM",)))  # `vllm serve` would load that one
    _, verdicts = judge(qwen3_target(), copy, Deployment(), ["vllm"])
    assert verdicts["vllm"].launch.startswith('vllm serve target --speculative-config \'{"method":"dflash"')
    dflash2 = dflash_draft(dflash2=DFLASH2, architectures=["DFlash2DraftModel"], pin=PIN)
    assert dflash2.drafter.native_keys  # its own config written beside: read by the stacks that do not read it
    _, verdicts = judge(qwen3_target(), dflash2, Deployment(), ["vllm"])
    assert verdicts["vllm"].launch.startswith("vllm serve target --speculative-config ")
    assert '"model":"dflash-draft"' in verdicts["vllm"].launch


def test_a_speculators_drafter_on_a_stack_that_does_not_read_the_format_is_an_error_with_its_convert():
    """DFlash in the format: SGLang, ExLlamaV3 and TensorFold read it only in its own layout (`--to bf16` writes
    that); speculators' own DFlash2 export (flat, no model_type) is not read by vLLM either (no updater)."""
    for stack in ("sglang", "exllamav3", "tensorfold"):
        _, verdicts = judge(qwen3_target(), dflash_draft(pin=PIN), Deployment(), [stack])
        (finding,) = [f for f in verdicts[stack].reasons if f.rule == "speculators.format"]
        assert f"is in vLLM's speculators format, which {stack} does not read for DFlash drafters" in finding.message
        if stack != "tensorfold":  # which loads no Qwen3 target: format.family blocks its fix
            assert verdicts[stack].fix == "specpair convert dflash-draft dflash-draft-bf16 --to bf16"
    assert "speculators.format" not in findings(qwen3_target(), dflash_draft(pin=PIN), "vllm")
    dflash2 = dflash_draft(dflash2=DFLASH2, architectures=["DFlash2DraftModel"], pin=PIN)
    assert "speculators.format" not in findings(qwen3_target(), dflash2, "sglang")
    flat = with_(dflash2, _set_drafter(native_keys=False))  # as speculators writes it
    assert "speculators.format" in findings(qwen3_target(), flat, "vllm")


@pytest.mark.parametrize(
    "pin,why",
    [
        (Verifier("Qwen/Qwen3-8B", ("Qwen3ForCausalLM",)), "the target is target"),
        (Verifier("target", ("LlamaForCausalLM",)), "the target's architecture is Qwen3ForCausalLM"),
    ],
)
def test_a_speculators_pin_on_another_target_is_an_error_naming_the_pinned_verifier(pin: Verifier, why: str):
    for stack in ("specpair", "vllm", "sglang", "llama.cpp"):
        _, verdicts = judge(qwen3_target(), dflash_draft(pin=pin), Deployment(), [stack])
        verdict = verdicts[stack]
        (finding,) = [f for f in verdict.reasons if f.rule == "speculators.verifier"]
        assert verdict.status == "fail" and finding.severity == "error"
        assert f"pins its verifier {pin.name_or_path} ({pin.architectures[0]}), but {why}" in finding.message
        assert "specpair convert dflash-draft dflash-draft-speculators --to speculators --target target" in verdict.fix
