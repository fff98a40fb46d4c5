"""The published seed pairs at real shape with random weights in their published layouts, each through
`specpair run` (the gate: drafted == undrafted in every cell) and `specpair bench` (users by depth).

    PYTHONPATH=<a directory holding the repository as specpair> python3 benchmarks/seed_pairs_gpu.py \
        --pair 35b-nvfp4|gguf|exl3|122b-fp8 [--scale real|tiny] [--device cuda|cpu] [--out DIR] [--work DIR] \
        [--users 1,2,4,8] [--depth 0,3k,5k,8k] [--tokens 64] [--gate-tokens 32] [--gate-batch N] [--skip-load] \
        [--in-memory] [--only build|gate|bench] [--reuse]

On the GPU machine, one pair per device call (the repository root as the working directory; orjson, and for the
gguf pair gguf-py, installed into /tmp/site from carried wheels as for the other GPU benchmarks):

    mkdir -p /tmp/pkgs && ln -sfn "$PWD" /tmp/pkgs/specpair && PYTHONPATH=/tmp/pkgs:/tmp/site \
        python3 benchmarks/seed_pairs_gpu.py --pair 35b-nvfp4        # likewise --pair gguf, --pair exl3
    ... python3 benchmarks/seed_pairs_gpu.py --pair 122b-fp8 --skip-load --users 1,4 --depth 0,5k  # target in memory

(the 122B on one H200: 130.3 GB of its 140 GiB at peak in the gate, run with
PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True; results/seed_pairs.md).

A pair too long for one device call (the gguf pair writes a 35B source and converts it) splits over calls of one
machine kept warm: `--only build` writes it under --work and records it (built.json), then `--reuse --only gate`
and `--reuse --only bench` run it (`--reuse` builds it where no record or one of its files is missing). Every
bench is also priced at τ 3.5 (`--at-tau`, AT_TAU): random weights accept nothing.

Pairs (one row of PAIRS each):
- `35b-nvfp4`: Qwen3.6-35B-A3B in NVIDIA's NVFP4 + FP8 layout with its BF16 MTP head (runtime_gpu.py and
  speculative_gpu.py's builders), with incoai's DFlash2 drafter quantized to affine-4 at load (`--draft-bits 4`)
  and with the MTP head (`--mtp`).
- `gguf`, the llama.cpp pair: the same target written as NVFP4 safetensors, then `specpair convert`ed to a
  `qwen35moe` GGUF with a UD-Q4_K_M-style per-tensor mix, GGUF_MIX. Unsloth's exact per-tensor types are recorded
  nowhere in the project: the mix is llama.cpp's Q4_K_M rule (Q6_K output, and attn_v / ffn_down_exps in the "more
  bits" layers; the catalog reconstructs the file by it) plus unsloth-dynamic-style upgrades so that all four
  types occur: Q8_0 shared experts and SSM alpha/beta, Q5_K attention and SSM projections. Round to nearest
  (`:rtn`): the same layout as the search, minutes faster at 35B. The drafter: z-lab's Qwen3.6-35B-A3B-DFlash
  (c69b185: 6 layers, 8 taps, block 16) converted to the upstream `dflash` GGUF arch in Q8_0 with `--target`, the
  layout of williamliao's file. Writing GGUF needs gguf-py.
- `exl3`, the ExLlamaV3 pair: UnstableLlama/Qwen3.6-35B-A3B-exl3-4.00bpw (4 bits every quantized linear, lm_head 6,
  routers and embeddings BF16) with UnstableLlama/Qwen3.6-35B-A3B-DFlash-exl3-2.50bpw (z-lab's c69b185 shape,
  3-bit attention and fc, 2-bit MLP), as tools/build_catalog.py reconstructs them. The trellis codes are drawn at
  random, not encoded: every code is a weight of the layout, and the Viterbi search (~44k tiles/s) would take ~50
  minutes for 35B; suh carries random signs at EXL3_SCALE, svh random signs. specpair has no EXL3 matmul kernel:
  EXL3 weights are dequantized to BF16 at load (runtime/loading.py keeps packed only layouts with a kernel), so
  the target holds ~69 GB on the GPU against 18.4 GB stored.
- `122b-fp8`: Qwen3.5-122B-A10B in Qwen's FP8 128x128 block layout (experts one by one; embeddings, lm_head,
  norms, routers, shared_expert_gate and in_proj_a/b BF16), 123.7 GB, with a coral-bricks-shaped DFlash2 drafter
  (block 12, taps [1,7,14,20,26,32,39,45], every layer sliding with window 8192, mask 248077, 6 layers; 1.86 GB,
  as its card says). Where the disk under --work cannot hold both (the GPU machine's 64 GiB), or with
  --in-memory, the target is not written: runtime_gpu.GeneratedFiles serves the files write_checkpoint would
  write (config.json and the shards' headers and index from the same Writer plan, the tokenizer) and draws each
  tensor's bytes when the loader reads it, from a generator seeded by the tensor's name, on --device, handed over
  in host memory one tensor (one stack of experts) at a time. sources/model.open_files opens it; the loader reads
  it through the same code as a directory (Model.reader.tensor: formats/weights.read_parts / read_cut); the gate
  and bench run through the app functions the CLI calls (app/gate.run_gate, app/bench.run_bench), given the opened
  Model, loaded once for all of them (a load draws every tensor again). The drafter is written.

Each pair: a line per stage with the elapsed seconds (flushed), and after every stage (so a run cut off keeps what
it measured) in --out (default $OUT, else --work): seed_pairs_<pair>.json (each stage's result: the target's load
time, resident bytes and peak GPU memory alone; each command line, its exit code, wall time, peak GPU memory and
its document: the gate's and bench's --json) and seed_pairs_<pair>.md (the gate's cells and bench's tables), and
bench's depth plots. Every `specpair` command runs in this process, as the CLI parses it. A stage that fails is
recorded with its error and the next one runs. `--scale tiny` keeps every layout, tensor name and per-tensor type
and shrinks widths, experts, layers and vocabulary (TINY_TEXT, TINY_DRAFT); tests/test_seed_pairs.py runs each
pair so on the CPU, with `--quick` (the gate on one prompt, greedy, solo; no bench).

With random weights τ is near 1: what this measures is exactness and the cost of the steps at real shape. The
tokenizer is bench_gpu.py's byte-level BPE with one merge (a GGUF needs one), as long as Qwen's against the
embedding rows at every scale (tokenizer_ids: 248077 ids for 248320 rows; the GGUF converter refuses a tokenizer
far shorter than the rows).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import gc
import io
import json
import os
import re
import shlex
import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_gpu import byte_tokenizer, write_byte_tokenizer  # noqa: E402
from runtime_gpu import CONFIGS, GB, GeneratedFiles, Tensor, qwen36_tensors, write_checkpoint  # noqa: E402
from speculative_gpu import DFLASH2, INCOAI_35B, DraftShape, dflash_tensors, mtp_tensors  # noqa: E402

from specpair.app.models import LoadedTarget  # noqa: E402
from specpair.convert.quant_configs import quantization_files  # noqa: E402
from specpair.formats import exl3  # noqa: E402
from specpair.formats.codecs import codec, stored_nbytes  # noqa: E402
from specpair.formats.layouts import EXL3, layout_of  # noqa: E402
from specpair.sources.model import Model, open_files, open_model  # noqa: E402

QWEN36 = "nvidia__Qwen3.6-35B-A3B-NVFP4.json"
# every bench is also priced at τ 3.5 (bench --at-tau): random weights accept nothing, and issue 24 sets its drafted
# goal there (the MTP head at block 4)
AT_TAU = 3.5
QWEN35_122B = "Qwen__Qwen3.5-122B-A10B.json"
# len(tokenizer) of Qwen3.5/3.6 (248044 BPE tokens and 33 added ones) against their 248320 embedding rows
# (targets.md): every scale writes a tokenizer covering its rows in this ratio (tokenizer_ids)
QWEN_TOKENIZER_IDS, QWEN_VOCAB_ROWS = 248077, 248320

# coral-bricks-ai/qwen35-122b-dflash2-drafter (tools/build_catalog.py's DRAFTERS row: heads and FFN as z-lab's 122B
# drafter, every layer sliding, incoai's DFlash2 selector)
CORAL_122B = DraftShape(3072, 6, 32, 8, 128, 9216, 6, 8192, [1, 7, 14, 20, 26, 32, 39, 45], 248077, 12, DFLASH2)

# z-lab/Qwen3.6-35B-A3B-DFlash at c69b185 (tools/build_catalog.py's DRAFTERS row): the drafter the llama.cpp and
# ExLlamaV3 pairs convert
ZLAB_35B = DraftShape(2048, 6, 32, 8, 128, 6144, 5, 4096, [1, 6, 11, 16, 22, 27, 32, 37], 248077, 16)

# Qwen3.5/3.6 MoE text config at tiny scale: every tensor and layout kept, widths multiples of 256 (k-quant rows),
# two KV groups of value heads (the GGUF's tiled value-head order still moves rows)
TINY_TEXT = {
    "hidden_size": 256,
    "num_hidden_layers": 8,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "head_dim": 128,
    "linear_num_key_heads": 2,
    "linear_num_value_heads": 4,
    "linear_key_head_dim": 64,
    "linear_value_head_dim": 64,
    "num_experts": 8,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 256,
    "shared_expert_intermediate_size": 256,
    "vocab_size": 512,
}
TINY_DRAFT = {"layers": 2, "heads": 2, "kv_heads": 1, "ffn": 512, "window": 32}

# GGUF type per output tensor, first match wins (see the docstring); `{more}` is llama.cpp's Q4_K_M "more bits"
# layers (the first and last eighth, and every third between)
GGUF_MIX = (
    (r"output\.weight", "Q6_K"),
    (r"token_embd\.weight", "Q4_K"),
    (r"blk\.{more}\.(attn_v|ffn_down_exps)\.weight", "Q6_K"),
    (r"blk\.\d+\.(ffn_(gate|up|down)_shexp|ssm_alpha|ssm_beta)\.weight", "Q8_0"),
    (r"blk\.\d+\.(attn_qkv|attn_gate|attn_q|attn_k|attn_output|ssm_out)\.weight", "Q5_K"),
)
GGUF_DEFAULT = "Q4_K"
CONVERT_WORKERS = (
    "--workers",
    "4",
)  # tensors read, quantized and written at once (convert_speed.py used 8 on the H200)


@dataclasses.dataclass(frozen=True)
class Drafted:
    """One drafter of a pair: how `specpair run` / `bench` name it."""

    label: str
    draft: Path | None  # None: --mtp
    options: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True)
class Built:
    target: Path | Model  # written, or generated in memory (runtime_gpu.GeneratedFiles)
    drafters: list[Drafted]
    notes: dict


@dataclasses.dataclass(frozen=True)
class Scale:
    name: str  # real | tiny
    device: str
    in_memory: bool = False  # generate the 122B target in memory even where the disk could hold it (--in-memory)

    def text(self, config: dict) -> dict:
        """A multimodal Qwen3.5/3.6 config with its text_config shrunk at tiny scale (quantized layer lists cut)."""
        if self.name == "real":
            return config
        t = config["text_config"]
        layers = TINY_TEXT["num_hidden_layers"]
        small = {**t, **TINY_TEXT, "layer_types": t["layer_types"][:layers]}
        return cut_layers({**config, "text_config": small}, layers)

    def draft(self, shape: DraftShape, real_layers: int, vocab: int, real_vocab: int) -> DraftShape:
        if self.name == "real":
            return shape
        layers = TINY_TEXT["num_hidden_layers"]
        dflash2 = shape.dflash2 and {**shape.dflash2, "selector_rank": 32, "selector_top_k": 4}
        return dataclasses.replace(
            shape,
            hidden=TINY_TEXT["hidden_size"],
            layers=TINY_DRAFT["layers"],
            heads=TINY_DRAFT["heads"],
            kv_heads=TINY_DRAFT["kv_heads"],
            ffn=TINY_DRAFT["ffn"],
            sliding_layers=TINY_DRAFT["layers"]
            if shape.sliding_layers == shape.layers
            else min(shape.sliding_layers, TINY_DRAFT["layers"] - 1),
            window=TINY_DRAFT["window"],
            taps=[min(round(t * layers / real_layers), layers - 1) for t in shape.taps],
            mask_token_id=shape.mask_token_id - tokenizer_ids(real_vocab) + tokenizer_ids(vocab),
            dflash2=dflash2,
        )

    def quant(self, quant: dict) -> dict:
        return quant if self.name == "real" else cut_layers(quant, TINY_TEXT["num_hidden_layers"])


def tokenizer_ids(vocab: int) -> int:
    """The length of the tokenizer written for `vocab` embedding rows: Qwen's ratio at every scale, so that the
    tiny scale's tokenizer covers its rows as the real one does (the GGUF converter pads it to the rows)."""
    return vocab * QWEN_TOKENIZER_IDS // QWEN_VOCAB_ROWS


def cut_layers(value, layers: int):
    """`value` without the dict keys and list strings that name a layer at or past `layers`."""
    beyond = re.compile(r"layers\.(\d+)\.")

    def kept(s) -> bool:
        return not isinstance(s, str) or not (m := beyond.search(s)) or int(m[1]) < layers

    if isinstance(value, dict):
        return {k: cut_layers(v, layers) for k, v in value.items() if kept(k)}
    if isinstance(value, list):
        return [cut_layers(v, layers) for v in value if kept(v)]
    return value


# ------------------------------------------------------------------------------------------------ builders


def qwen36_target(work: Path, scale: Scale, name: str, mtp: bool) -> tuple[Path, dict]:
    """Qwen3.6-35B-A3B NVFP4 + FP8 (with its MTP head when `mtp`) and the byte tokenizer; its config."""
    config = scale.text(json.loads((CONFIGS / QWEN36).read_text()))
    hf_quant = scale.quant(json.loads((CONFIGS / "nvidia__Qwen3.6-35B-A3B-NVFP4.hf_quant_config.json").read_text()))
    directory = work / name
    tensors = qwen36_tensors(config, hf_quant["quantization"]["quantized_layers"])
    write_checkpoint(
        directory,
        config,
        tensors + (mtp_tensors(config) if mtp else []),
        {"hf_quant_config.json": hf_quant},
        scale.device,
    )
    vocab = config["text_config"]["vocab_size"]
    write_byte_tokenizer(directory, vocab, MERGES, tokenizer_ids(vocab))
    return directory, config


def drafter_tensors(
    scale: Scale, shape: DraftShape, config: dict, target_layers: int, real_config: str = QWEN36
) -> tuple[dict, list[Tensor]]:
    """config.json and tensors (BF16) of a drafter of the published `shape` at this scale, for the target `config`
    (its vocabulary), reading `target_layers` (its config's num_target_layers)."""
    real = json.loads((CONFIGS / real_config).read_text())["text_config"]
    vocab = config["text_config"]["vocab_size"]
    return dflash_tensors(
        scale.draft(shape, real["num_hidden_layers"], vocab, real["vocab_size"]), vocab, target_layers
    )


def build_35b(work: Path, scale: Scale, stage: Callable[[str], None]) -> Built:
    target, config = qwen36_target(work, scale, "qwen3.6-35b-a3b-nvfp4-mtp", mtp=True)
    stage("target written (NVFP4 + FP8, MTP head BF16)")
    t = config["text_config"]
    draft = work / "incoai-dflash2"
    write_checkpoint(draft, *drafter_tensors(scale, INCOAI_35B, config, t["num_hidden_layers"]), None, scale.device)
    stage("DFlash2 drafter written (BF16, affine-4 at load)")
    return Built(
        target,
        [Drafted("dflash2-affine4", draft, ("--draft-bits", "4")), Drafted("mtp", None, ("--mtp",))],
        {"target": "nvidia/Qwen3.6-35B-A3B-NVFP4 layout", "drafter": "incoai DFlash2 shape, affine-4 at load"},
    )


def gguf_keeps(layers: int) -> list[str]:
    """--keep GLOB=LAYOUT options giving GGUF_MIX (a glob per tensor name: --keep matches globs, not regexes)."""
    more = [i for i in range(layers) if i < layers // 8 or i >= 7 * layers // 8 or (i - layers // 8) % 3 == 2]
    names = ["output.weight", "token_embd.weight"]
    per_layer = (
        "attn_v",
        "ffn_down_exps",
        "ffn_gate_shexp",
        "ffn_up_shexp",
        "ffn_down_shexp",
        "ssm_alpha",
        "ssm_beta",
        "attn_qkv",
        "attn_gate",
        "attn_q",
        "attn_k",
        "attn_output",
        "ssm_out",
    )
    names += [f"blk.{i}.{n}.weight" for i in range(layers) for n in per_layer]
    pattern = [(re.compile(p.replace("{more}", "(" + "|".join(map(str, more)) + ")")), q) for p, q in GGUF_MIX]
    keeps = []
    for name in names:
        kind = next((q for p, q in pattern if p.fullmatch(name)), GGUF_DEFAULT)
        if kind != GGUF_DEFAULT:
            keeps += ["--keep", f"{name}=gguf:{kind}:rtn"]
    return keeps


def build_gguf(work: Path, scale: Scale, stage: Callable[[str], None]) -> Built:
    source, config = qwen36_target(work, scale, "qwen3.6-35b-a3b-source", mtp=False)
    stage("source written (NVFP4 + FP8 safetensors, no MTP: unsloth ships it apart)")
    t = config["text_config"]
    draft_source = work / "zlab-dflash"
    zlab = drafter_tensors(scale, ZLAB_35B, config, t["num_hidden_layers"] + 1)
    write_checkpoint(draft_source, *zlab, None, scale.device)
    stage("z-lab DFlash drafter written (BF16)")
    target, draft = work / "Qwen3.6-35B-A3B-UD-Q4_K_M.gguf", work / "Qwen3.6-35B-A3B-DFlash-Q8_0.gguf"
    for path in (target, draft):
        path.unlink(missing_ok=True)
    device = ["--device", scale.device]
    specpair(["convert", str(draft_source), str(draft), "--to", "gguf:Q8_0", "--target", str(source), *device])
    stage("drafter converted to the dflash GGUF arch, Q8_0")
    keeps = gguf_keeps(t["num_hidden_layers"])
    specpair(
        ["convert", str(source), str(target), "--to", f"gguf:{GGUF_DEFAULT}:rtn", *keeps, *device, *CONVERT_WORKERS]
    )
    stage(f"target converted to GGUF ({target.stat().st_size / GB:.1f} GB, {len(keeps) // 2} tensors kept off Q4_K)")
    shutil.rmtree(source, ignore_errors=True)
    shutil.rmtree(draft_source, ignore_errors=True)
    return Built(
        target,
        [Drafted("dflash-q8_0", draft)],
        {"target": "qwen35moe GGUF, UD-Q4_K_M-style mix (GGUF_MIX)", "keeps": len(keeps) // 2},
    )


MERGES = (("Ġ", "t"),)  # one merge: a GGUF's BPE vocabulary needs one (llama.cpp refuses none)

# the CPU test's one prompt: random tiny targets stop where chance puts a stop id, and the gate needs 16 tokens
# compared; every pair runs 16 past this one (the 35B's stopped after 6 of "def fibonacci(n):" once its first token
# came from a generated row, as the speculative loop's does)
QUICK_PROMPT = "Once upon a time"

EXL3_SCALE = 0.02  # the RMS of the drawn weights; the codebook's values have an RMS of about 1


def exl3_codes(t: Tensor, name: str, gen: torch.Generator) -> dict[str, torch.Tensor] | None:
    """Random EXL3 parts of weight `name` (one expert of a stack): codes uniform over int16, suh random signs at
    EXL3_SCALE, svh random signs, the mul1 marker."""
    form = layout_of(t.layout)
    if form.kind != EXL3:
        return None
    shape = t.shape[1:] if t.experts else t.shape
    device = gen.device
    parts = {}
    for key, (_, stored) in codec(t.layout).stored(shape).items():
        if key == ".trellis":
            parts[key] = torch.randint(-(1 << 15), 1 << 15, stored, generator=gen, device=device, dtype=torch.int32)
            parts[key] = parts[key].to(torch.int16)
        elif key in (".suh", ".svh"):
            signs = torch.randint(0, 2, stored, generator=gen, device=device).to(torch.float16) * 2 - 1
            parts[key] = signs * (EXL3_SCALE if key == ".suh" else 1.0)
        else:  # the codebook marker, an int32 scalar
            parts[key] = torch.tensor(exl3.MULTIPLIERS["mul1"], dtype=torch.int64).to(torch.int32)
    return parts


EXL3_KEPT = re.compile(r".*(mlp\.gate|shared_expert_gate)\.weight$")  # routers stay BF16 (build_catalog.EXL3_KEPT)


def exl3_layouts(tensors: list[Tensor], bits: Callable[[str], int]) -> list[Tensor]:
    """The quantized linears of `tensors` (every non-BF16 one, and BF16 projections) in EXL3 at `bits(name)`."""
    out = []
    for t in tensors:
        matrix = len(t.shape) - (1 if t.experts else 0) == 2
        linear = matrix and t.name.endswith(".weight") and "embed_tokens" not in t.name and "conv1d" not in t.name
        if linear and not EXL3_KEPT.match(t.name) and "codebook" not in t.name:
            t = dataclasses.replace(t, layout=f"exl3-{bits(t.name)}bpw")
        out.append(t)
    return out


def build_exl3(work: Path, scale: Scale, stage: Callable[[str], None]) -> Built:
    config = scale.text(json.loads((CONFIGS / QWEN36).read_text()))
    config = {k: v for k, v in config.items() if k != "quantization_config"}
    t = config["text_config"]
    target = work / "qwen3.6-35b-a3b-exl3-4.00bpw"
    tensors = exl3_layouts(qwen36_tensors(config, {}), lambda n: 6 if n == "lm_head.weight" else 4)
    keys, files = quantization_keys(tensors)
    fits(work, [tensors])
    write_checkpoint(target, {**config, **keys}, tensors, files, scale.device, exl3_codes)
    write_byte_tokenizer(target, t["vocab_size"], MERGES, tokenizer_ids(t["vocab_size"]))
    stage("target written (EXL3 4.00 bpw, lm_head 6, random codes)")
    draft = work / "qwen3.6-dflash-exl3-2.50bpw"
    draft_config, draft_tensors = drafter_tensors(scale, ZLAB_35B, config, t["num_hidden_layers"] + 1)
    draft_tensors = exl3_layouts(draft_tensors, lambda n: 2 if ".mlp." in n else 3)
    keys, files = quantization_keys(draft_tensors)
    write_checkpoint(draft, {**draft_config, **keys}, draft_tensors, files, scale.device, exl3_codes)
    stage("DFlash drafter written (EXL3: attention and fc 3 bits, MLP 2)")
    return Built(
        target,
        [Drafted("dflash-exl3", draft)],
        {"target": "EXL3 4.00 bpw, dequantized to BF16 at load", "drafter": "EXL3 2.50 bpw average"},
    )


# Qwen's FP8 exports leave these linears in BF16 (targets.md §2.3, as tools/build_catalog.py reconstructs them)
FP8_KEPT = re.compile(r".*(mlp\.gate|shared_expert_gate|linear_attn\.in_proj_a|linear_attn\.in_proj_b)$|lm_head")


def build_122b(work: Path, scale: Scale, stage: Callable[[str], None]) -> Built:
    config = scale.text(json.loads((CONFIGS / QWEN35_122B).read_text()))
    tensors = qwen36_tensors(config, {}, lambda module: "bf16" if FP8_KEPT.match(module) else "fp8-block")
    t = config["text_config"]
    draft_config, draft_tensors = drafter_tensors(scale, CORAL_122B, config, t["num_hidden_layers"], QWEN35_122B)
    fits(work, [draft_tensors])
    keys, _ = quantization_keys(tensors)
    tokenizer = byte_tokenizer(t["vocab_size"], MERGES, tokenizer_ids(t["vocab_size"]))
    name = "qwen3.5-122b-a10b-fp8"
    target: Path | Model
    if scale.in_memory or needed([tensors, draft_tensors]) > shutil.disk_usage(work).free:
        # the loader reads the same tensors through the same code path, from the files' generator instead of a disk
        target = open_files(
            GeneratedFiles(f"generated:{name}", {**config, **keys}, tensors, None, scale.device, files=tokenizer)
        )
        stage(f"target generated in memory ({needed([tensors]) / GB:.1f} GB, drawn per tensor as it is read)")
    else:
        target = work / name
        write_checkpoint(target, {**config, **keys}, tensors, None, scale.device)
        for file, raw in tokenizer.items():
            (target / file).write_bytes(raw)
        stage("target written (FP8 128x128 blocks, Qwen's BF16 modules)")
    draft = work / "coral-bricks-dflash2"
    write_checkpoint(draft, draft_config, draft_tensors, None, scale.device)
    stage("DFlash2 drafter written (BF16, block 12, window 8192)")
    return Built(
        target,
        [Drafted("dflash2", draft)],
        {
            "target": "Qwen/Qwen3.5-122B-A10B-FP8 layout"
            + (", generated in memory (runtime_gpu.GeneratedFiles)" if isinstance(target, Model) else ""),
            "drafter": "coral-bricks DFlash2 shape, BF16",
        },
    )


def quantization_keys(tensors: list[Tensor]) -> tuple[dict, dict]:
    """(config.json keys, extra JSON files) the converter writes for these layouts (convert/quant_configs.py)."""
    layouts, stored = {}, {}
    for t in tensors:
        shape = t.shape[1:] if t.experts else t.shape
        if len(shape) != 2:
            continue
        for name in [t.name.format(e=e) for e in range(t.experts)] if t.experts else [t.name]:
            layouts[name.removesuffix(".weight")] = t.layout
            stored[name.removesuffix(".weight")] = codec(t.layout).stored(shape)
    return quantization_files(layouts, set(), stored, None)


def needed(checkpoints: list[list[Tensor]]) -> int:
    """Bytes of the checkpoints' tensors as stored."""
    return sum(stored_nbytes(dtype, shape) for ts in checkpoints for t in ts for _, dtype, shape in t.planned())


def fits(work: Path, checkpoints: list[list[Tensor]]) -> None:
    """Refuse up front (one line) when the checkpoints cannot be written under `work`."""
    free = shutil.disk_usage(work).free
    if needed(checkpoints) > free:
        sys.exit(f"{work}: the checkpoints need {needed(checkpoints) / GB:.0f} GB of disk, {free / GB:.0f} GB are free")


PAIRS: dict[str, Callable[[Path, Scale, Callable[[str], None]], Built]] = {
    "35b-nvfp4": build_35b,
    "gguf": build_gguf,
    "exl3": build_exl3,
    "122b-fp8": build_122b,
}


# ------------------------------------------------------------------------------------------------ runs


def specpair(args: list[str]) -> tuple[int, str]:
    """One `specpair` command in this process: (exit code, stdout). Errors raise (BadInput names the problem)."""
    from specpair.cli import app

    out = io.StringIO()
    argv, sys.argv = sys.argv, ["specpair", *args]  # the command line the reports name
    try:
        with contextlib.redirect_stdout(out):
            code = app(args, prog_name="specpair", standalone_mode=False)
    finally:
        sys.argv = argv
    return int(code or 0), out.getvalue()


def fresh_peak(device: str) -> None:
    gc.collect()
    if device.startswith("cuda"):
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


def peak_bytes(device: str) -> int | None:
    return torch.cuda.max_memory_allocated() if device.startswith("cuda") else None


def load_once(target: Path | Callable[[], LoadedTarget], device: str) -> dict:
    """The target loaded alone: seconds, resident bytes, bytes read, peak GPU memory. A written target is loaded
    and let go; a generated one is its shared load (`shared_load`), kept for the pair's gate and bench."""
    from specpair.runtime.loading import load, plan_load

    fresh_peak(device)
    start = time.perf_counter()
    if isinstance(target, Path):
        plan = plan_load(open_model(str(target)), device)
        model = load(plan)
    else:
        shared = target()
        plan, model = shared.plan, shared.runtime
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    stored = sum(e.size for e in plan.model.reader.list())
    layouts = sorted({plan.model.layout(n) for n in plan.model.names})
    result = {
        "load_s": seconds,
        "stored_bytes": stored,
        "resident_bytes": plan.resident_bytes,
        "packed": sorted({plan.model.layout(n) for n in plan.packed}),
        "layouts": layouts,
        "peak_gpu_bytes": peak_bytes(device),
    }
    del model, plan
    return result


def run_pair(args: argparse.Namespace, out: Path) -> dict:
    scale = Scale(args.scale, args.device, args.in_memory)
    work = args.work / args.pair
    work.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    figures: dict = {"pair": args.pair, "scale": args.scale, "device": args.device, "stages": []}
    if args.device.startswith("cuda"):
        figures["gpu"] = torch.cuda.get_device_name()

    def stage(what: str, **extra) -> None:
        elapsed = time.perf_counter() - start
        figures["stages"].append({"stage": what, "elapsed_s": round(elapsed, 1), **extra})
        figures["total_s"] = elapsed
        print(f"[{elapsed:7.1f} s] {args.pair}: {what}", flush=True)
        write_results(out, figures)  # after every stage: a run cut off at its time limit keeps what it measured

    built = reused(work) if args.reuse else None
    if built is None:
        built = PAIRS[args.pair](work, scale, stage)
        if isinstance(built.target, Path):
            (work / BUILT).write_text(json.dumps(built_record(built, work)) + "\n")
    else:
        stage(f"reused the pair an earlier call built under {work} ({BUILT})")
    figures["notes"] = built.notes
    if args.only == "build":
        return figures
    loaded = shared_load(built.target, args.device) if isinstance(built.target, Model) else None
    if args.skip_load:
        figures["load"] = {"skipped": "--skip-load"}
    else:
        attempt(stage, figures, "load", "target loaded alone", lambda: load_once(loaded or built.target, args.device))
    device = ["--device", args.device]
    target = built.target.ref if isinstance(built.target, Model) else str(built.target)
    for d in built.drafters:
        pair = [target, *([str(d.draft)] if d.draft else []), *d.options]
        gate = ["run", *pair, "--json", "--max-tokens", str(args.gate_tokens), *device]
        gate += ["--batch", str(args.gate_batch)] if args.gate_batch else []
        gate += ["--prompt", QUICK_PROMPT, "--temperature", "0"] if args.quick else []
        run = (lambda gate=gate: specpair(gate)) if loaded is None else gate_of(d, args, loaded)
        if args.only != "bench":
            attempt(
                stage,
                figures,
                f"gate_{d.label}",
                f"gate ({d.label})",
                lambda g=gate, r=run: measured(g, r, args.device),
            )
        if args.quick or args.only == "gate":
            continue
        plot = out / f"seed_pairs_{args.pair}_{d.label}_depth.png"
        bench = ["bench", *pair, "--json", "--users", args.users, "--depth", args.depth, "--tokens", str(args.tokens)]
        bench += ["--at-tau", f"{AT_TAU:g}", "--plot", str(plot), *device]
        run = (
            (lambda bench=bench: specpair(bench))
            if loaded is None
            else bench_of(d, args, shlex.join(["specpair", *bench]), plot, loaded)
        )
        attempt(
            stage, figures, f"bench_{d.label}", f"bench ({d.label})", lambda b=bench, r=run: measured(b, r, args.device)
        )
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    return figures


BUILT = "built.json"  # what a build wrote under --work, for a later call's --reuse


def built_record(built: Built, work: Path) -> dict:
    """A written pair as --reuse reads it back: paths relative to the pair's --work folder."""
    return {
        "target": str(built.target.relative_to(work)),
        "drafters": [
            {"label": d.label, "draft": str(d.draft.relative_to(work)) if d.draft else None, "options": list(d.options)}
            for d in built.drafters
        ],
        "notes": built.notes,
    }


def reused(work: Path) -> Built | None:
    """The pair an earlier call built and kept under `work` (--only build, or --keep), or None where it left no
    record or a file the record names is gone."""
    record = work / BUILT
    if not record.is_file():
        return None
    r = json.loads(record.read_text())
    drafters = [
        Drafted(d["label"], work / d["draft"] if d["draft"] else None, tuple(d["options"])) for d in r["drafters"]
    ]
    paths = [work / r["target"], *(d.draft for d in drafters if d.draft)]
    if not all(p.exists() for p in paths):
        return None
    return Built(work / r["target"], drafters, r["notes"])


def gate_of(d: Drafted, args: argparse.Namespace, loaded: Callable[[], LoadedTarget]) -> Callable[[], tuple[int, str]]:
    """`specpair run`'s gate as the command line would run it, on a target opened from generated files: the app
    function the CLI calls, given the opened Model and its load (`shared_load`)."""
    from specpair.app.gate import run_gate

    def run() -> tuple[int, str]:
        report = run_gate(
            loaded().model,
            str(d.draft) if d.draft else None,
            mtp="--mtp" in d.options,
            draft_bits=draft_bits(d),
            prompt=QUICK_PROMPT if args.quick else None,
            sampling=(0.0, 0, 1.0, 0) if args.quick else None,
            max_tokens=args.gate_tokens,
            device=args.device,
            batch=args.gate_batch,
            loaded=loaded(),
        )
        return report.exit_code, json.dumps(report.to_json())

    return run


def bench_of(
    d: Drafted, args: argparse.Namespace, command: str, plot: Path, loaded: Callable[[], LoadedTarget]
) -> Callable[[], tuple[int, str]]:
    """`specpair bench` as the command line would run it (`command`), on a target opened from generated files and
    its load (`shared_load`)."""
    from specpair.app.bench import run_bench
    from specpair.cli.bench import parse_counts, write_plot

    def run() -> tuple[int, str]:
        report = run_bench(
            loaded().model,
            str(d.draft) if d.draft else None,
            command=command,
            mtp="--mtp" in d.options,
            draft_bits=draft_bits(d),
            depths=parse_counts("--depth", args.depth, 0),
            user_counts=parse_counts("--users", args.users, 1),
            tokens=args.tokens,
            device=args.device,
            at_tau=AT_TAU,
            loaded=loaded(),
        )
        write_plot(str(plot), report.depth)
        report.plot = str(plot)
        return report.exit_code, json.dumps(report.to_json())

    return run


def shared_load(target: Model, device: str) -> Callable[[], LoadedTarget]:
    """The generated target loaded at its first use and kept for every gate and bench of the pair: a load draws
    the whole checkpoint again (the 122B's 124 GB: most of its gate's two minutes on an H200)."""
    from specpair.app.device import place_runtime
    from specpair.app.models import load_target
    from specpair.runtime.loading import plan_load

    @functools.cache
    def loaded() -> LoadedTarget:
        placed = place_runtime(device)
        return load_target(plan_load(target, placed.device, placed.dtype, parallel=placed.parallel))

    return loaded


def draft_bits(d: Drafted) -> int | None:
    return int(d.options[d.options.index("--draft-bits") + 1]) if "--draft-bits" in d.options else None


def measured(args: list[str], run: Callable[[], tuple[int, str]], device: str) -> dict:
    """`run` (the command `args`, in this process): its exit code, wall time, peak GPU memory and JSON document."""
    fresh_peak(device)
    held = torch.cuda.memory_allocated() if device.startswith("cuda") else None  # what an earlier stage left
    start = time.perf_counter()
    code, out = run()
    return {
        "command": shlex.join(["specpair", *args]),
        "exit_code": code,
        "wall_s": time.perf_counter() - start,
        "peak_gpu_bytes": peak_bytes(device),
        "gpu_bytes_held_before": held,
        "document": json.loads(out),
    }


def attempt(stage: Callable[..., None], figures: dict, key: str, what: str, work: Callable[[], dict]) -> None:
    """figures[key]: `work`'s result, or its error (one failing stage leaves the others' figures: the device call is
    one shot); then the stage's line, which writes the results."""
    try:
        figures[key] = work()
    except Exception as e:  # noqa: BLE001 - recorded and printed; the run goes on to the next stage
        figures[key] = {"error": f"{type(e).__name__}: {e}"}
        stage(f"{what} FAILED: {figures[key]['error']}")
        return
    code = figures[key].get("exit_code")
    stage(what + (f" (exit {code})" if code else ""), **({"exit_code": code} if code is not None else {}))


def write_results(out: Path, figures: dict) -> None:
    """seed_pairs_<pair>.json and .md, each written under a temporary name and renamed."""
    for suffix, text in (("json", json.dumps(figures, indent=2, default=str)), ("md", markdown(figures))):
        path = out / f"seed_pairs_{figures['pair']}.{suffix}"
        temporary = path.with_name(path.name + ".tmp")
        temporary.write_text(text)
        temporary.replace(path)


def markdown(figures: dict) -> str:
    from specpair.cli.bench import print_report

    lines = [f"# Seed pair `{figures['pair']}` ({figures['scale']} scale, {figures.get('gpu', figures['device'])})", ""]
    lines += [f"- {k}: {v}" for k, v in figures.get("notes", {}).items()]
    load = figures.get("load", {"error": "not run"})
    if "skipped" in load:
        lines.append(f"- load: skipped ({load['skipped']})")
    elif "error" in load:
        lines.append(f"- load: FAILED {load['error']}")
    else:
        peak = load["peak_gpu_bytes"]
        lines.append(
            f"- target alone: {load['stored_bytes'] / GB:.1f} GB stored, loaded in {load['load_s']:.1f} s, resident "
            f"{load['resident_bytes'] / GB:.1f} GB, peak GPU memory {peak / GB:.1f} GB"
            if peak is not None
            else f"- target alone: loaded in {load['load_s']:.1f} s, resident {load['resident_bytes'] / GB:.3f} GB"
        )
        lines.append(f"- kept packed: {', '.join(load['packed']) or 'none'}; stored: {', '.join(load['layouts'])}")
    for key, value in figures.items():
        if not key.startswith(("gate_", "bench_")):
            continue
        lines += ["", f"## {key.replace('_', ' ', 1)}", ""]
        if "error" in value:
            lines.append(f"FAILED: {value['error']}")
            continue
        peak = value["peak_gpu_bytes"]
        lines.append(
            f"`{value['command']}`: exit {value['exit_code']}, {value['wall_s']:.0f} s"
            + (f", peak GPU memory {peak / GB:.1f} GB" if peak is not None else "")
        )
        document = value["document"]
        if key.startswith("gate_"):
            lines += ["", document["summary"], ""]
            lines += [f"- {run_summary(r)}" for r in document["runs"]]
        else:
            text = io.StringIO()
            with contextlib.redirect_stdout(text):
                print_report(document, md=True)
            lines += ["", text.getvalue()]
    lines += ["", f"total {figures['total_s']:.0f} s", ""]
    return "\n".join(lines)


def run_summary(run: dict) -> str:
    """One gate cell: its setting, verdict, τ and speed."""
    verdict = {True: "identical", False: "DIFFERENT", None: f"inconclusive ({run['inconclusive']})"}[run["identical"]]
    rates = run["tokens_per_s"]
    return (
        f"T={run['sampling']['temperature']:g} seed {run['sampling']['seed']}, batch {run['batch']}: {verdict}, "
        f"{run['compared_tokens']} tokens compared, τ {run['tau']:.2f}, {rates['drafted']:.1f} vs "
        f"{rates['undrafted']:.1f} tok/s undrafted ({run['speedup']:.2f}×)"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pair", choices=list(PAIRS), required=True)
    parser.add_argument("--scale", choices=("real", "tiny"), default="real")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--work", type=Path, default=Path("/tmp/specpair-seed-pairs"))
    parser.add_argument("--out", type=Path, default=Path(os.environ["OUT"]) if os.environ.get("OUT") else None)
    parser.add_argument("--users", default="1,2,4,8")
    parser.add_argument("--depth", default="0,3k,5k,8k", help="the drafters' 4096 windows are crossed by 5k and 8k")
    parser.add_argument("--tokens", type=int, default=64, help="tokens per sequence in bench")
    parser.add_argument("--gate-tokens", type=int, default=32, help="tokens per prompt and setting in the gate")
    parser.add_argument("--gate-batch", type=int, help="the gate at this concurrency only (default: 1 and 4)")
    parser.add_argument(
        "--quick", action="store_true", help="the gate on one prompt, greedy only; no bench (the CPU test's run)"
    )
    parser.add_argument("--skip-load", action="store_true", help="no load of the target alone (its time and memory)")
    parser.add_argument("--keep", action="store_true", help="keep the checkpoints written under --work")
    parser.add_argument(
        "--only",
        choices=("build", "gate", "bench"),
        help="only write the pair (kept under --work for --reuse), or run only the gate, or only bench: a pair split "
        "over calls of one machine",
    )
    parser.add_argument(
        "--reuse", action="store_true", help="run the pair an earlier call built under --work (else build it)"
    )
    parser.add_argument(
        "--in-memory",
        action="store_true",
        help="122b-fp8: generate the target in memory even where the disk could hold it (it is, where it cannot)",
    )
    args = parser.parse_args(argv)
    args.keep = args.keep or args.only == "build" or args.reuse
    out = args.out or args.work
    out.mkdir(parents=True, exist_ok=True)
    figures = run_pair(args, out)
    print(markdown(figures), flush=True)
    gates = [v for k, v in figures.items() if k.startswith("gate_")]
    return 0 if all(g.get("exit_code") == 0 for g in gates) else 1


if __name__ == "__main__":
    sys.exit(main())
