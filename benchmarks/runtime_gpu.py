"""Runtime I on one GPU: the target models at real shape with random weights, loaded through open_model.

    PYTHONPATH=<a directory holding the repository as specpair> python3 benchmarks/runtime_gpu.py [--only a,b,c]

(a) Qwen3.6-35B-A3B in NVIDIA's NVFP4 + FP8 mixed layout (config.json and hf_quant_config.json of
    nvidia/Qwen3.6-35B-A3B-NVFP4, catalog/sources/real-configs): the checkpoint is written here, on the GPU, with
    specpair's own quantizers (formats/codecs.py) and safetensors writer, per-expert tensors as ModelOpt exports
    them; then loaded (weights kept packed: NVFP4 and FP8 matmul kernels) and run: load time and rate, peak GPU
    memory, decode tok/s.
(b) Qwen3-8B (Qwen/Qwen3-8B's config) in BF16, and the same weights as 128x128-block FP8: bitwise batch
    invariance of a row decoded alone, inside a verify block of 16 and in a batch of 4 sequences of other
    lengths; greedy output of the FP8 copy with its weights kept packed vs dequantized to BF16 at load; tok/s.
(c) Rolling Gated DeltaNet state back at Qwen3.6-35B-A3B's real shape: per-position slots vs the runtime's
    snapshot-and-replay (benchmarks/gdn_rollback.py), time per round and memory, batch 1 and 4.

Baselines in the same run: weights read once per token at the H200's 4.3 TB/s (the roofline of a step, from the
bytes the runtime holds), and for (c) a verify step's recurrence with no rollback. No kernel is CUDA-graphed or
fused yet (Runtime III): tok/s here is eager Triton, the floor the speed issue starts from.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import math
import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
CONFIGS = ROOT / "catalog" / "sources" / "real-configs"
sys.path.insert(0, str(Path(__file__).resolve().parent))

from gdn_rollback import measure, qwen36_shape, report  # noqa: E402

from specpair.checkpoint import FileEntry  # noqa: E402
from specpair.convert.quant_configs import quantization_files  # noqa: E402
from specpair.errors import BadInput  # noqa: E402
from specpair.formats import TensorInfo, TensorTable, safetensors  # noqa: E402
from specpair.formats.codecs import codec  # noqa: E402
from specpair.formats.regions import PartCut  # noqa: E402
from specpair.formats.safetensors import Writer  # noqa: E402
from specpair.runtime.generate import generate, prefill  # noqa: E402
from specpair.runtime.loading import load, plan_load  # noqa: E402
from specpair.runtime.sampling import Sampling  # noqa: E402
from specpair.sources.model import open_model  # noqa: E402

DEVICE = "cuda"
BANDWIDTH = 4.3e12  # H200 HBM bytes/s (runtime.md §1: 4.27 TB/s measured copy)
SHARD = 4 * 10**9
# Floats drawn at once for a stack of experts whose layout has no per-tensor scale (~1 GB of float32): encoding's
# temporaries stay a few GB beside a model loading from GeneratedFiles on the same GPU
CHUNK_VALUES = 1 << 28
GB = 1e9


@dataclasses.dataclass(frozen=True)
class Tensor:
    """One weight to write: its HF name (a module for quantized layouts), logical shape, layout and init."""

    name: str
    shape: tuple[int, ...]
    layout: str = "bf16"
    init: str = "normal"  # normal | zeros | ones | a_log | conv
    experts: int = 0  # > 0: a stack written per expert as `name` with `{e}` filled in

    def planned(self) -> list[tuple[str, str, tuple[int, ...]]]:
        shape = self.shape[1:] if self.experts else self.shape
        stored = codec(self.layout).stored(shape)
        names = [self.name.format(e=e) for e in range(self.experts)] if self.experts else [self.name]
        return [
            (n if key == "" else n.removesuffix(".weight") + key, dtype, s)
            for n in names
            for key, (dtype, s) in stored.items()
        ]


def values(t: Tensor, gen: torch.Generator, device: str = DEVICE) -> torch.Tensor:
    if t.init == "zeros":
        return torch.zeros(t.shape, device=device)
    if t.init == "ones":
        return torch.ones(t.shape, device=device)
    if t.init == "a_log":
        return torch.empty(t.shape, device=device).uniform_(1, 16, generator=gen).log()
    std = 0.1 if t.init == "conv" else 0.02
    return torch.randn(t.shape, device=device, generator=gen) * std


# Random stored parts of one weight (expert by expert for a stack), for layouts whose encoder is too slow to run at
# real shape (EXL3's Viterbi search): any codes of the layout are a valid weight of it. None: encode values instead.
Codes = Callable[[Tensor, str, torch.Generator], "dict[str, torch.Tensor] | None"]


def write_checkpoint(
    directory: Path,
    config: dict,
    tensors: list[Tensor],
    extra: dict[str, dict] | None = None,
    device: str = DEVICE,
    codes: Codes | None = None,
) -> float:
    """Write `tensors` (drawn: random values quantized on `device`, or random stored parts where `codes` gives them)
    and the config files; seconds taken. GeneratedFiles serves the same files without writing them."""
    start = time.perf_counter()
    shutil.rmtree(directory, ignore_errors=True)
    directory.mkdir(parents=True)
    writer = Writer(str(directory), [p for t in tensors for p in t.planned()], shard_bytes=SHARD)
    for t in tensors:
        for name, part in drawn(t, device, codes).items():
            writer.write(name, part)
    writer.close()
    for name, raw in config_files(config, extra).items():
        (directory / name).write_bytes(raw)
    return time.perf_counter() - start


def config_files(config: dict, extra: dict[str, dict] | None) -> dict[str, bytes]:
    """config.json and the `extra` JSON files, by name, as a checkpoint holds them."""
    return {name: json.dumps(doc, indent=2).encode() for name, doc in {"config.json": config, **(extra or {})}.items()}


def drawn(t: Tensor, device: str, codes: Codes | None = None, seed: int = 0) -> dict[str, torch.Tensor]:
    """The stored tensors of `t` by name, in Writer's order (t.planned()): random values encoded on `device`, or the
    stored parts `codes` draws, from a generator seeded by `t`'s name and `seed` alone, so that the same tensor is
    drawn alike whatever was drawn before it (GeneratedFiles draws one when it is read)."""
    gen = torch.Generator(device).manual_seed(
        int.from_bytes(hashlib.sha256(f"{seed}:{t.name}".encode()).digest()[:8]) >> 1
    )
    names = [t.name.format(e=e) for e in range(t.experts)] if t.experts else [t.name]
    out = {}
    chosen = [codes(t, name, gen) for name in names] if codes else [None]
    if chosen[0] is not None:
        for name, parts in zip(names, chosen):
            out |= {stored_name(name, key): part for key, part in parts.items()}
        return out
    c = codec(t.layout)
    if t.experts:  # stored expert by expert, encoded in chunks of experts (one chunk for one tensor scale)
        per = t.experts if c.tensor_amax else max(1, CHUNK_VALUES // math.prod(t.shape[1:]))
        for first in range(0, t.experts, per):
            chunk = dataclasses.replace(t, shape=(min(per, t.experts - first), *t.shape[1:]))
            w = values(chunk, gen, device)
            parts = c.encode(w.reshape(-1, w.shape[-1]), t.name, float(w.abs().max()) if c.tensor_amax else None)
            for e, name in enumerate(names[first : first + chunk.shape[0]]):
                # each expert's share of a part's rows (FP8 blocks: rows / 128)
                out |= {
                    stored_name(name, key): part
                    if part.ndim == 0
                    else part.reshape(chunk.shape[0], -1, *part.shape[1:])[e]
                    for key, part in parts.items()
                }
        return out
    w = values(t, gen, device)
    return {stored_name(t.name, key): part for key, part in c.encode(w, t.name).items()}


def stored_name(weight: str, key: str) -> str:
    """The stored tensor of part `key` of a weight (a module's `.weight`, or a companion of the module)."""
    return weight if key == "" else weight.removesuffix(".weight") + key


class GeneratedFiles:
    """The checkpoint write_checkpoint writes for these arguments, served from memory as sources/local.py's
    LocalFiles serves a directory (sources/model.open_files opens it; the app functions take the Model): config.json,
    the `extra` and `files` files, the safetensors headers and index of the same Writer plan, and each tensor's
    bytes drawn (on `device`) when it is read, in host memory one Tensor at a time: a loader reads in file order,
    so a stack of experts is drawn once, and a re-read draws the same bytes again. Nothing is written."""

    def __init__(
        self,
        where: str,
        config: dict,
        tensors: list[Tensor],
        extra: dict[str, dict] | None = None,
        device: str = DEVICE,
        codes: Codes | None = None,
        files: dict[str, bytes] | None = None,
    ) -> None:
        self.where, self.device, self.codes = where, device, codes
        self.plan = Writer(where, [p for t in tensors for p in t.planned()], shard_bytes=SHARD)
        self.small = config_files(config, extra) | (files or {})
        if (index := self.plan.index()) is not None:
            self.small[index[0]] = index[1].encode()
        self.owner = {name: t for t in tensors for name, _, _ in t.planned()}
        self.held: tuple[str, dict[str, torch.Tensor]] = ("", {})  # the Tensor drawn last: its parts not yet read

    def list(self) -> list[FileEntry]:
        shards = [FileEntry(f, self.plan.shard_bytes(k)) for k, f in enumerate(self.plan.files)]
        return sorted([*shards, *(FileEntry(n, len(raw)) for n, raw in self.small.items())], key=lambda e: e.path)

    def read(self, path: str, limit: int) -> bytes | None:
        if path in self.plan.files:
            raise BadInput(f"{self.where}/{path}", "is generated tensor by tensor: read its tensors")
        raw = self.small.get(path)
        if raw is not None and len(raw) > limit:
            raise BadInput(f"{self.where}/{path}", f"is {len(raw)} bytes, over the {limit}-byte limit for this file")
        return raw

    def safetensors_headers(self, shards: list[str]) -> list[TensorInfo]:
        return self.safetensors_table(shards).infos()

    def safetensors_table(self, shards: list[str]) -> TensorTable:
        table = TensorTable.empty()
        for shard in shards:
            k = self.plan.files.index(shard)
            raw = self.plan.header(k)
            read = lambda offset, length, raw=raw: raw[offset : offset + length]  # noqa: E731
            table.extend(safetensors.read_table(read, self.plan.shard_bytes(k), f"{self.where}/{shard}", shard)[0])
        return table

    def header_lengths(self, shards: list[str]) -> None:
        return None  # no file a forked child could read

    def gguf_header(self, path: str) -> None:
        raise BadInput(f"{self.where}/{path}", "is not a GGUF file")

    def tensor(self, info: TensorInfo, cut: PartCut | None = None) -> torch.Tensor:
        t = self.owner[info.name]
        if self.held[0] != t.name or info.name not in self.held[1]:
            self.held = (t.name, {n: part.cpu() for n, part in drawn(t, self.device, self.codes).items()})
            if self.device.startswith("cuda"):
                # the draw's transients go back to the driver: cached, they fragment what the loader allocates
                # beside them (the 122B's 124 GB of weights on a 141 GB H200 ran out of memory so)
                torch.cuda.empty_cache()
        data = self.held[1].pop(info.name)  # served once: what the reader is given is its own
        if cut is None:
            return data.reshape(info.shape)
        return cut.of(data).view(data.dtype).reshape(cut.shape)

    def sha256(self, path: str) -> str | None:
        raw = self.small.get(path)
        return hashlib.sha256(raw).hexdigest() if raw is not None else None  # a shard is never made whole


# ------------------------------------------------------------------------------------------------ shapes


def qwen36_tensors(
    config: dict, quantized: dict[str, dict], layouts: Callable[[str], str] | None = None
) -> list[Tensor]:
    """The LM of Qwen3.6-35B-A3B as nvidia/Qwen3.6-35B-A3B-NVFP4 stores it (MTP and vision left out), or of any
    Qwen3.5/3.6 MoE config; `layouts` gives a linear's layout by module (a stack of experts without `.{e}`) instead
    of ModelOpt's `quantized` table."""
    t = config["text_config"]
    h, vocab = t["hidden_size"], t["vocab_size"]
    heads, kv, d = t["num_attention_heads"], t["num_key_value_heads"], t["head_dim"]
    hk, hv, dk, dv = (
        t["linear_num_key_heads"],
        t["linear_num_value_heads"],
        t["linear_key_head_dim"],
        t["linear_value_head_dim"],
    )
    e, width, shared = t["num_experts"], t["moe_intermediate_size"], t["shared_expert_intermediate_size"]
    conv = 2 * hk * dk + hv * dv
    p = "model.language_model."

    def linear(module: str, shape: tuple[int, int], experts: int = 0) -> Tensor:
        key = module.replace(".{e}", "") if experts else module
        if layouts is not None:
            layout = layouts(key)
        else:
            algo = quantized.get(
                key.removesuffix(".gate_proj").removesuffix(".up_proj").removesuffix(".down_proj") if experts else key,
                {},
            ).get("quant_algo")
            layout = {"FP8": "fp8-tensor", "W4A16_NVFP4": "nvfp4-modelopt", "NVFP4": "nvfp4-modelopt"}.get(algo, "bf16")
        return Tensor(module + ".weight", (experts, *shape) if experts else shape, layout, experts=experts)

    out = [Tensor(p + "embed_tokens.weight", (vocab, h))]
    for i, kind in enumerate(t["layer_types"]):
        q = f"{p}layers.{i}."
        out += [
            Tensor(q + "input_layernorm.weight", (h,), init="zeros"),
            Tensor(q + "post_attention_layernorm.weight", (h,), init="zeros"),
        ]
        if kind == "linear_attention":
            a = q + "linear_attn."
            out += [
                linear(a + "in_proj_qkv", (conv, h)),
                linear(a + "in_proj_z", (hv * dv, h)),
                linear(a + "in_proj_b", (hv, h)),
                linear(a + "in_proj_a", (hv, h)),
                Tensor(a + "conv1d.weight", (conv, 1, t["linear_conv_kernel_dim"]), init="conv"),
                Tensor(a + "A_log", (hv,), init="a_log"),
                Tensor(a + "dt_bias", (hv,), init="ones"),
                Tensor(a + "norm.weight", (dv,), init="ones"),
                linear(a + "out_proj", (h, hv * dv)),
            ]
        else:
            a = q + "self_attn."
            out += [
                linear(a + "q_proj", (2 * heads * d, h)),
                linear(a + "k_proj", (kv * d, h)),
                linear(a + "v_proj", (kv * d, h)),
                linear(a + "o_proj", (h, heads * d)),
                Tensor(a + "q_norm.weight", (d,), init="zeros"),
                Tensor(a + "k_norm.weight", (d,), init="zeros"),
            ]
        m = q + "mlp."
        out += [linear(m + "gate", (e, h)), linear(m + "shared_expert_gate", (1, h))]
        out += [
            linear(m + f"experts.{{e}}.{proj}", shape, experts=e)
            for proj, shape in (("gate_proj", (width, h)), ("up_proj", (width, h)), ("down_proj", (h, width)))
        ]
        out += [
            linear(m + f"shared_expert.{proj}", shape)
            for proj, shape in (("gate_proj", (shared, h)), ("up_proj", (shared, h)), ("down_proj", (h, shared)))
        ]
    return out + [Tensor(p + "norm.weight", (h,), init="zeros"), linear("lm_head", (vocab, h))]


def qwen3_tensors(config: dict, layout: str) -> list[Tensor]:
    """Qwen3 dense, every projection in `layout`, embeddings and head in BF16 (as Qwen's FP8 repos keep them)."""
    h, layers, vocab = config["hidden_size"], config["num_hidden_layers"], config["vocab_size"]
    heads, kv, d, width = (
        config["num_attention_heads"],
        config["num_key_value_heads"],
        config["head_dim"],
        config["intermediate_size"],
    )
    out = [Tensor("model.embed_tokens.weight", (vocab, h))]
    for i in range(layers):
        q = f"model.layers.{i}."
        out += [
            Tensor(q + "input_layernorm.weight", (h,), init="ones"),
            Tensor(q + "post_attention_layernorm.weight", (h,), init="ones"),
            Tensor(q + "self_attn.q_norm.weight", (d,), init="ones"),
            Tensor(q + "self_attn.k_norm.weight", (d,), init="ones"),
        ]
        attention = {"q_proj": (heads * d, h), "k_proj": (kv * d, h), "v_proj": (kv * d, h), "o_proj": (h, heads * d)}
        out += [Tensor(q + f"self_attn.{n}.weight", s, layout) for n, s in attention.items()]
        out += [
            Tensor(q + f"mlp.{n}.weight", s, layout)
            for n, s in (("gate_proj", (width, h)), ("up_proj", (width, h)), ("down_proj", (h, width)))
        ]
    out.append(Tensor("model.norm.weight", (h,), init="ones"))
    return out if config.get("tie_word_embeddings") else out + [Tensor("lm_head.weight", (vocab, h))]


# ------------------------------------------------------------------------------------------------ runs


def loaded(directory: Path, packed: bool = True):
    """(model, plan, seconds to load); the peak memory counter starts at the load."""
    if DEVICE == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    start = time.perf_counter()
    plan = plan_load(open_model(str(directory)), DEVICE, packed=packed)
    model = load(plan)
    if DEVICE == "cuda":
        torch.cuda.synchronize()
    return model, plan, time.perf_counter() - start


def decode_rate(model, prompt: list[int], tokens: int) -> tuple[list[int], float]:
    generate(model, [prompt], 4, Sampling())  # compiles the kernels this shape uses
    (out,), timing = generate(model, [prompt], tokens, Sampling())
    return out.tokens, timing.decode_tokens_per_s


def roofline(plan) -> float:
    """Tokens/s if a decode step read what it must once at full bandwidth: the weights it holds but the
    embedding table (one row), the top-k share of the routed experts, and the GDN state twice (read, write)."""
    config = plan.model.config
    total = plan.resident_bytes
    if not config.tie_word_embeddings:
        total -= plan.resident["embed_tokens.weight"]
    if config.is_moe:
        experts = sum(b for n, b in plan.resident.items() if ".experts." in n)
        total -= experts * (1 - config.experts_touched(1))
    gdn = config.layer_types.count("linear")
    if gdn:
        total += 2 * gdn * config.linear_num_value_heads * config.linear_key_head_dim * config.linear_value_head_dim * 4
    return BANDWIDTH / total


def part_a(work: Path, lines: list[str], figures: dict) -> None:
    config = json.loads((CONFIGS / "nvidia__Qwen3.6-35B-A3B-NVFP4.json").read_text())
    hf_quant = json.loads((CONFIGS / "nvidia__Qwen3.6-35B-A3B-NVFP4.hf_quant_config.json").read_text())
    directory = work / "qwen3.6-35b-a3b-nvfp4"
    tensors = qwen36_tensors(config, hf_quant["quantization"]["quantized_layers"])
    written = write_checkpoint(directory, config, tensors, {"hf_quant_config.json": hf_quant})
    size = sum(f.stat().st_size for f in directory.glob("*.safetensors"))
    model, plan, load_s = loaded(directory)
    after_load = torch.cuda.max_memory_allocated()
    prompt = torch.randint(0, 248000, (32,), generator=torch.Generator().manual_seed(1)).tolist()
    torch.cuda.reset_peak_memory_stats()
    tokens, rate = decode_rate(model, prompt, 64)
    peak = max(after_load, torch.cuda.max_memory_allocated())
    layouts = sorted({plan.model.layout(n) for n in plan.packed})
    figures["a"] = {
        "written_s": written,
        "bytes": size,
        "tensors": sum(len(t.planned()) for t in tensors),
        "load_s": load_s,
        "load_gb_per_s": size / load_s / GB,
        "peak_gpu_bytes": peak,
        "resident_bytes": plan.resident_bytes,
        "decode_tokens_per_s": rate,
        "roofline": roofline(plan),
        "packed_layouts": layouts,
        "tokens": tokens[:16],
    }
    lines += [
        "## (a) Qwen3.6-35B-A3B, NVIDIA NVFP4 + FP8 mixed, random weights",
        "",
        f"written in {written:.0f} s: {size / GB:.1f} GB, {figures['a']['tensors']} tensors; kept packed: "
        f"{', '.join(layouts)}",
        f"load {load_s:.1f} s ({size / load_s / GB:.2f} GB/s); resident {plan.resident_bytes / GB:.1f} GB; "
        f"peak GPU memory {peak / GB:.1f} GB",
        f"decode {rate:.1f} tok/s (batch 1, 32-token prompt, 64 tokens) = {rate / roofline(plan):.1%} of the "
        f"weights roofline ({roofline(plan):.0f} tok/s)",
        "",
    ]
    del model
    shutil.rmtree(directory, ignore_errors=True)


def invariance(model, vocab: int) -> dict[str, bool]:
    """A row decoded alone, inside one verify block of 16, and in a batch of 4: its logits, bitwise."""
    gen = torch.Generator().manual_seed(2)
    prompts = [torch.randint(0, vocab, (n,), generator=gen).tolist() for n in (11, 37, 20, 5)]
    follow = torch.randint(0, vocab, (4, 16), generator=gen).to(DEVICE)
    context = 64

    cache = model.new_cache(1, context)
    prefill(model, cache, [prompts[2]])
    alone = torch.cat(
        [
            model.forward(follow[2:3, t : t + 1], torch.tensor([[20 + t]], device=DEVICE), cache).logits
            for t in range(16)
        ],
        dim=1,
    )
    cache = model.new_cache(1, context)
    prefill(model, cache, [prompts[2]])
    block = model.forward(follow[2:3], torch.arange(20, 36, device=DEVICE)[None], cache).logits
    cache = model.new_cache(4, context)
    prefill(model, cache, prompts)
    lengths = torch.tensor([len(p) for p in prompts], device=DEVICE)
    batch = torch.cat(
        [model.forward(follow[:, t : t + 1], (lengths + t)[:, None], cache).logits[2:3] for t in range(16)], dim=1
    )
    return {"block_of_16": torch.equal(alone, block), "batch_of_4": torch.equal(alone, batch)}


def part_b(work: Path, lines: list[str], figures: dict) -> None:
    config = json.loads((CONFIGS / "Qwen__Qwen3-8B.json").read_text())
    bf16, fp8 = work / "qwen3-8b-bf16", work / "qwen3-8b-fp8"
    written = write_checkpoint(bf16, config, qwen3_tensors(config, "bf16"))
    fp8_tensors = qwen3_tensors(config, "fp8-block")
    layouts = {t.name.removesuffix(".weight"): t.layout for t in fp8_tensors if len(t.shape) == 2}
    stored = {
        t.name.removesuffix(".weight"): {k: v for k, v in codec(t.layout).stored(t.shape).items()}
        for t in fp8_tensors
        if len(t.shape) == 2
    }
    keys, _ = quantization_files(layouts, set(), stored, None)
    written += write_checkpoint(fp8, {**config, **keys}, fp8_tensors)
    prompt = torch.randint(0, config["vocab_size"], (32,), generator=torch.Generator().manual_seed(3)).tolist()

    model, plan, load_s = loaded(bf16)
    checks = invariance(model, config["vocab_size"])
    tokens, rate = decode_rate(model, prompt, 64)
    figures["b_bf16"] = {"load_s": load_s, "decode_tokens_per_s": rate, "roofline": roofline(plan), **checks}
    del model
    results = {}
    for packed in (True, False):
        model, plan, load_s = loaded(fp8, packed=packed)
        results[packed] = (*decode_rate(model, prompt, 64), roofline(plan), load_s)
        del model
    same = results[True][0] == results[False][0]
    first = next((i for i, (a, b) in enumerate(zip(results[True][0], results[False][0])) if a != b), None)
    figures["b_fp8"] = {
        "greedy_equal": same,
        "first_divergence": first,
        "packed_tokens_per_s": results[True][1],
        "dequantized_tokens_per_s": results[False][1],
    }
    lines += [
        "## (b) Qwen3-8B shape, random weights",
        "",
        f"checkpoints written in {written:.0f} s; BF16 load {figures['b_bf16']['load_s']:.1f} s",
        f"batch invariance (logits of one row, bitwise): alone = in a verify block of 16: "
        f"{'yes' if checks['block_of_16'] else 'NO'}; alone = in a batch of 4: "
        f"{'yes' if checks['batch_of_4'] else 'NO'}",
        f"BF16 decode {rate:.1f} tok/s = {rate / figures['b_bf16']['roofline']:.1%} of the weights roofline "
        f"({figures['b_bf16']['roofline']:.0f} tok/s)",
        "FP8 (128x128 blocks) greedy, packed kernels vs dequantized to BF16 at load: "
        + ("identical over 64 tokens" if same else f"differ from token {first}")
        + f"; packed {results[True][1]:.1f} tok/s ({results[True][1] / results[True][2]:.1%} of its roofline), "
        f"dequantized {results[False][1]:.1f} tok/s",
        "",
    ]
    shutil.rmtree(bf16, ignore_errors=True)
    shutil.rmtree(fp8, ignore_errors=True)


def part_c(lines: list[str], figures: dict) -> None:
    config = qwen36_shape(1)
    lines += ["## (c) GDN rollback at Qwen3.6-35B-A3B's shape (30 layers, 16/32 heads of 128, fp32 state)", ""]
    for batch in (1, 4):
        result = measure(config, DEVICE, batch, 16, repeats=5)
        figures[f"c_batch{batch}"] = result
        lines += [report(result, f"block 16, batch {batch}"), ""]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", type=Path, default=Path("/tmp/specpair-runtime-gpu"))
    parser.add_argument("--only", default="a,b,c")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()
    lines = [f"# specpair runtime on {torch.cuda.get_device_name()} (torch {torch.__version__})", ""]
    figures: dict = {}
    parts = args.only.split(",")
    start = time.perf_counter()
    if "c" in parts:
        part_c(lines, figures)
    if "b" in parts:
        part_b(args.work, lines, figures)
    if "a" in parts:
        part_a(args.work, lines, figures)
    lines.append(f"total {time.perf_counter() - start:.0f} s")
    print("\n".join(lines))
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2, default=str))


if __name__ == "__main__":
    main()
