"""Time `specpair check` on two local checkpoints of real size, in fresh processes.

The target is laid out like Qwen3.6-35B-A3B (40 layers, fused experts, per-expert MTP, vision tower,
14 shards with an index, a 248k-token tokenizer.json); the drafter like z-lab's DFlash for it. Tensor
data sections are sparse files, so the checkpoints cost no disk and reading any data would show up as
time. Baselines measured in the same run: a bare interpreter start and `import torch` (what a checker
that loads a framework pays before reading anything).

    python benchmarks/check_speed.py [--runs 7]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import struct
import subprocess
import sys
import tempfile
import time

H, LAYERS, EXPERTS, MOE, VOCAB, TOKENS = 2048, 40, 256, 512, 248320, 248077


def write_safetensors(path: str, tensors: dict[str, tuple[str, list[int]]]) -> None:
    """A valid header followed by a sparse data section of the right size."""
    sizes = {"BF16": 2, "F32": 4}
    header, offset = {}, 0
    for name, (dtype, shape) in tensors.items():
        n = sizes[dtype]
        for d in shape:
            n *= d
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + n]}
        offset += n
    raw = json.dumps(header).encode()
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)) + raw)
    os.truncate(path, 8 + len(raw) + offset)


def target_tensors() -> dict[str, tuple[str, list[int]]]:
    t: dict[str, tuple[str, list[int]]] = {
        "model.language_model.embed_tokens.weight": ("BF16", [VOCAB, H]),
        "model.language_model.norm.weight": ("BF16", [H]), "lm_head.weight": ("BF16", [VOCAB, H]),
    }
    for i in range(LAYERS):
        p = f"model.language_model.layers.{i}."
        t[p + "input_layernorm.weight"] = ("BF16", [H])
        t[p + "post_attention_layernorm.weight"] = ("BF16", [H])
        if i % 4 == 3:
            for name, shape in (("q_proj", [8192, H]), ("k_proj", [512, H]), ("v_proj", [512, H]), ("o_proj", [H, 4096])):
                t[p + f"self_attn.{name}.weight"] = ("BF16", shape)
            t[p + "self_attn.q_norm.weight"] = ("BF16", [256])
            t[p + "self_attn.k_norm.weight"] = ("BF16", [256])
        else:
            for name, shape in (("in_proj_qkv", [8192, H]), ("in_proj_z", [4096, H]), ("in_proj_a", [32, H]),
                                ("in_proj_b", [32, H]), ("out_proj", [H, 4096])):
                t[p + f"linear_attn.{name}.weight"] = ("BF16", shape)
            t[p + "linear_attn.conv1d.weight"] = ("BF16", [8192, 1, 4])
            t[p + "linear_attn.A_log"] = ("F32", [32])
            t[p + "linear_attn.dt_bias"] = ("BF16", [32])
            t[p + "linear_attn.norm.weight"] = ("F32", [128])
        t[p + "mlp.gate.weight"] = ("BF16", [EXPERTS, H])
        t[p + "mlp.experts.gate_up_proj"] = ("BF16", [EXPERTS, 2 * MOE, H])
        t[p + "mlp.experts.down_proj"] = ("BF16", [EXPERTS, H, MOE])
        for name, shape in (("gate_proj", [MOE, H]), ("up_proj", [MOE, H]), ("down_proj", [H, MOE])):
            t[p + f"mlp.shared_expert.{name}.weight"] = ("BF16", shape)
        t[p + "mlp.shared_expert_gate.weight"] = ("BF16", [1, H])
    t["mtp.fc.weight"] = ("BF16", [H, 2 * H])
    for e in range(EXPERTS):
        for name, shape in (("gate_proj", [MOE, H]), ("up_proj", [MOE, H]), ("down_proj", [H, MOE])):
            t[f"mtp.layers.0.mlp.experts.{e}.{name}.weight"] = ("BF16", shape)
    for i in range(27):
        for name in ("attn.qkv.weight", "attn.proj.weight", "mlp.linear_fc1.weight", "mlp.linear_fc2.weight"):
            t[f"model.visual.blocks.{i}.{name}"] = ("BF16", [1152, 1152])
    return t


def write_target(root: str) -> None:
    text = {"model_type": "qwen3_5_moe_text", "hidden_size": H, "num_hidden_layers": LAYERS, "num_attention_heads": 16,
            "num_key_value_heads": 2, "head_dim": 256, "vocab_size": VOCAB, "max_position_embeddings": 262144,
            "layer_types": ["full_attention" if i % 4 == 3 else "linear_attention" for i in range(LAYERS)],
            "linear_num_key_heads": 16, "linear_num_value_heads": 32, "linear_key_head_dim": 128,
            "linear_value_head_dim": 128, "linear_conv_kernel_dim": 4, "num_experts": EXPERTS, "num_experts_per_tok": 8,
            "moe_intermediate_size": MOE, "shared_expert_intermediate_size": MOE, "mtp_num_hidden_layers": 1,
            "rope_parameters": {"rope_type": "default", "rope_theta": 10000000, "partial_rotary_factor": 0.25,
                                "mrope_section": [11, 11, 10], "mrope_interleaved": True}, "eos_token_id": 248044}
    config = {"architectures": ["Qwen3_5MoeForConditionalGeneration"], "model_type": "qwen3_5_moe", "text_config": text,
              "tie_word_embeddings": False}
    json.dump(config, open(os.path.join(root, "config.json"), "w"))
    tensors = list(target_tensors().items())
    shards, weight_map = 14, {}
    for s in range(shards):
        name = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        part = dict(tensors[s::shards])
        write_safetensors(os.path.join(root, name), part)
        weight_map.update({k: name for k in part})
    json.dump({"metadata": {}, "weight_map": weight_map}, open(os.path.join(root, "model.safetensors.index.json"), "w"))
    vocab = {f"\u0120tok{i}": i for i in range(248044)}
    added = [{"id": 248044 + i, "content": f"<|special_{i}|>", "special": True} for i in range(33)]
    merges = [f"\u0120t ok{i}" for i in range(247587)]
    tokenizer = {"model": {"type": "BPE", "vocab": vocab, "merges": merges}, "added_tokens": added,
                 "normalizer": {"type": "NFC"}, "pre_tokenizer": {"type": "ByteLevel"}, "decoder": {"type": "ByteLevel"}}
    json.dump(tokenizer, open(os.path.join(root, "tokenizer.json"), "w"))
    json.dump({"eos_token": "<|special_2|>", "pad_token": "<|special_0|>"}, open(os.path.join(root, "tokenizer_config.json"), "w"))


def write_draft(root: str) -> None:
    taps = [1, 6, 11, 16, 22, 27, 32, 37]
    config = {"architectures": ["DFlashDraftModel"], "model_type": "qwen3", "hidden_size": H, "num_hidden_layers": 6,
              "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128, "intermediate_size": 6144,
              "vocab_size": VOCAB, "max_position_embeddings": 262144, "num_target_layers": 41,
              "layer_types": ["sliding_attention"] * 5 + ["full_attention"], "sliding_window": 4096,
              "rope_parameters": {"rope_type": "default", "rope_theta": 10000000},
              "dflash_config": {"target_layer_ids": taps, "mask_token_id": 248077, "block_size": 16}}
    json.dump(config, open(os.path.join(root, "config.json"), "w"))
    t = {"fc.weight": ("BF16", [H, len(taps) * H]), "hidden_norm.weight": ("BF16", [H]), "norm.weight": ("BF16", [H])}
    for i in range(6):
        p = f"layers.{i}."
        for name, shape in (("self_attn.q_proj", [4096, H]), ("self_attn.k_proj", [1024, H]), ("self_attn.v_proj", [1024, H]),
                            ("self_attn.o_proj", [H, 4096]), ("mlp.gate_proj", [6144, H]), ("mlp.up_proj", [6144, H]),
                            ("mlp.down_proj", [H, 6144])):
            t[p + name + ".weight"] = ("BF16", shape)
        for name in ("input_layernorm", "post_attention_layernorm"):
            t[p + name + ".weight"] = ("BF16", [H])
    write_safetensors(os.path.join(root, "model.safetensors"), t)


def median_seconds(cmd: list[str], runs: int, ok_codes: tuple[int, ...] = (0,)) -> float:
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        done = subprocess.run(cmd, capture_output=True)
        times.append(time.perf_counter() - start)
        if done.returncode not in ok_codes:
            sys.exit(f"{' '.join(cmd)} exited {done.returncode}: {done.stderr.decode()[-500:]}")
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        target, draft = os.path.join(tmp, "Qwen3.6-35B-A3B"), os.path.join(tmp, "Qwen3.6-35B-A3B-DFlash")
        os.makedirs(target)
        os.makedirs(draft)
        write_target(target)
        write_draft(draft)
        apparent = sum(os.path.getsize(os.path.join(target, f)) for f in os.listdir(target)) / 1e9
        python = sys.executable
        bare = median_seconds([python, "-c", "pass"], args.runs)
        torch = median_seconds([python, "-c", "import torch"], args.runs)
        check = median_seconds([python, "-m", "specpair", "check", target, draft, "--json"], args.runs, ok_codes=(0, 1))
        human = median_seconds([python, "-m", "specpair", "check", target, draft], args.runs, ok_codes=(0, 1))
    print(f"target: {len(target_tensors())} tensors in 14 shards, {apparent:.1f} GB apparent (sparse), 248k-token tokenizer")
    print(f"median of {args.runs} fresh processes:")
    print(f"  python -c pass          {bare:6.3f} s")
    print(f"  python -c 'import torch' {torch:6.3f} s   (baseline: a checker that imports a framework)")
    print(f"  specpair check --json   {check:6.3f} s   = {check / torch:.2f}x the torch import, {check / 0.3:.2f}x the 0.3 s budget")
    print(f"  specpair check (tables) {human:6.3f} s   = {human / torch:.2f}x the torch import, {human / 0.3:.2f}x the 0.3 s budget")


if __name__ == "__main__":
    main()
