"""Tiny targets and drafters that track them, for the speculative-loop tests.

A random drafter is rejected at nearly every draft, which leaves the accept paths of the loop untested. So each
drafter here is distilled on its own target: the target greedily continues a few random prompts, and the
drafter's weights are trained for a few hundred steps to predict those continuations from the target's
features, through the runtime's own drafter modules with the kernels swapped for differentiable torch
equivalents (`differentiable_kernels`). The trained weights are written back as a checkpoint (float32
safetensors), so the tests load them the way `specpair run` does.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path

import torch
from fixtures import DFlash2, build_dflash, save, tiny_model, write_json
from safetensors.torch import load_file, save_file

from specpair.formats.packed import Packed
from specpair.runtime import loading
from specpair.runtime.blocks import project
from specpair.runtime.drafters import Committed
from specpair.runtime.drafters.loading import load_drafter
from specpair.runtime.generate import generate
from specpair.runtime.kernels import activation, attention, experts, linear, norm, qk
from specpair.runtime.model import Transformer
from specpair.runtime.sampling import Sampling
from specpair.sources.model import open_model

FAMILIES = ("llama", "qwen3", "qwen3_moe", "qwen3_next", "qwen3_5", "qwen3_5_moe")
HYBRID = ("qwen3_next", "qwen3_5", "qwen3_5_moe")
VOCAB = 512
MASK_TOKEN = VOCAB - 1
MTP_KEYS = {
    "qwen3_next": "num_nextn_predict_layers",
    "qwen3_5": "mtp_num_hidden_layers",
    "qwen3_5_moe": "mtp_num_hidden_layers",
}


# ------------------------------------------------------------------------------------------------ kernels


def _matmul(x: torch.Tensor, w, unsummed: bool = False) -> torch.Tensor:
    w = w.dequantize() if isinstance(w, Packed) else w
    return x @ w.T.to(x.dtype)


def _matmul_experts(x: torch.Tensor, w, ids: torch.Tensor, per_pair: bool = False, tables=None) -> torch.Tensor:
    w = w.dequantize() if isinstance(w, Packed) else w
    if per_pair:
        return torch.einsum("tsnk,tsk->tsn", w[ids], x.reshape(*ids.shape, -1))
    return torch.einsum("tsnk,tk->tsn", w[ids], x)


def _rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float, zero_centred: bool) -> torch.Tensor:
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return (h * (1 + w.float()) if zero_centred else h * w).to(x.dtype)


def _add_rms_norm(
    h: torch.Tensor, delta: torch.Tensor | experts.ExpertTerms, w: torch.Tensor, eps: float, zero_centred: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    if isinstance(delta, experts.ExpertTerms):
        delta = delta.combined()
    summed = h + delta.reshape(h.shape)
    return summed, _rms_norm(summed, w, eps, zero_centred)


def _attention(q, k_cache, v_cache, kv_start, kv_end, scale, gate=None):
    group = q.shape[2] // k_cache.shape[2]
    k = k_cache.repeat_interleave(group, dim=2)
    v = v_cache.repeat_interleave(group, dim=2)
    scores = torch.einsum("bthd,bshd->bths", q, k) * scale
    p = torch.arange(k.shape[1])
    visible = (p >= kv_start[..., None]) & (p < kv_end[..., None])  # [B, T, S]
    scores = scores.masked_fill(~visible[:, :, None, :], float("-inf"))
    probs = torch.nan_to_num(torch.softmax(scores, dim=-1))
    o = torch.einsum("bths,bshd->bthd", probs, v)
    return o if gate is None else activation.sigmoid_mul_reference(o, gate)  # as the runtime's CPU path gates


@contextlib.contextmanager
def differentiable_kernels() -> Iterator[None]:
    """The runtime's matmul, norms and attention as plain differentiable torch, whole tensors at a time (for
    training only: for batch invariance the attention reference and the matmuls work a fixed tile of rows at a
    time, which makes autograd's graph a node per row or tile; the q/k norm inside rotate_and_store's reference too)."""
    swaps = [
        (linear, "matmul", _matmul),
        (linear, "matmul_experts", _matmul_experts),
        (norm, "rms_norm", _rms_norm),
        (norm, "add_rms_norm", _add_rms_norm),
        (qk, "rms_norm_reference", _rms_norm),
        (attention, "attention", _attention),
    ]
    saved = [(module, name, getattr(module, name)) for module, name, _ in swaps]
    for module, name, replacement in swaps:
        setattr(module, name, replacement)
    try:
        yield
    finally:
        for module, name, original in saved:
            setattr(module, name, original)


# ------------------------------------------------------------------------------------------------ targets


def tiny_target(directory: Path, family: str, mtp: bool = True, **dims: int) -> Path:
    """fixtures.tiny_model(family, **dims) as a checkpoint; the hybrid families get a random MTP head (mtp.*, as a
    stacked-expert MoE layer for the MoE ones) and the config key that declares it."""
    model = tiny_model(family, **dims)
    path = save(model, directory, "llama3" if family == "llama" else "qwen3")
    if mtp and family in HYBRID:
        config = json.loads((path / "config.json").read_text())
        config[MTP_KEYS[family]] = 1
        write_json(path / "config.json", config)
        tensors = load_file(str(path / "model.safetensors"))
        tensors.update(_mtp_tensors(family, model.config))
        save_file(tensors, str(path / "model.safetensors"), metadata={"format": "pt"})
    return path


def _mtp_tensors(family: str, c) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(7)
    h, heads, kv, d = c.hidden_size, c.num_attention_heads, c.num_key_value_heads, c.head_dim

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=g) * shape[-1] ** -0.5

    out = {
        "mtp.fc.weight": rand(h, 2 * h),
        "mtp.norm.weight": torch.zeros(h),
        "mtp.pre_fc_norm_embedding.weight": torch.zeros(h),
        "mtp.pre_fc_norm_hidden.weight": torch.zeros(h),
    }
    p = "mtp.layers.0."
    out.update(
        {
            p + "input_layernorm.weight": torch.zeros(h),
            p + "post_attention_layernorm.weight": torch.zeros(h),
            p + "self_attn.q_proj.weight": rand(2 * heads * d, h),
            p + "self_attn.k_proj.weight": rand(kv * d, h),
            p + "self_attn.v_proj.weight": rand(kv * d, h),
            p + "self_attn.o_proj.weight": rand(h, heads * d) * 0.1,
            p + "self_attn.q_norm.weight": torch.zeros(d),
            p + "self_attn.k_norm.weight": torch.zeros(d),
        }
    )
    if family == "qwen3_5":
        i = c.intermediate_size
        out.update(
            {
                p + "mlp.gate_proj.weight": rand(i, h),
                p + "mlp.up_proj.weight": rand(i, h),
                p + "mlp.down_proj.weight": rand(h, i) * 0.1,
            }
        )
    else:
        e, i, s = c.num_experts, c.moe_intermediate_size, c.shared_expert_intermediate_size
        out.update(
            {
                p + "mlp.gate.weight": rand(e, h),
                p + "mlp.experts.gate_proj.weight": rand(e, i, h),
                p + "mlp.experts.up_proj.weight": rand(e, i, h),
                p + "mlp.experts.down_proj.weight": rand(e, h, i) * 0.1,
                p + "mlp.shared_expert.gate_proj.weight": rand(s, h),
                p + "mlp.shared_expert.up_proj.weight": rand(s, h),
                p + "mlp.shared_expert.down_proj.weight": rand(h, s) * 0.1,
                p + "mlp.shared_expert_gate.weight": rand(1, h),
            }
        )
    return out


def load_target(path: Path) -> tuple[object, Transformer]:
    model = open_model(str(path))
    return model, loading.load(loading.plan_load(model, "cpu"))


def prompts(lengths: tuple[int, ...], seed: int = 9) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, VOCAB - 1, (n,), generator=g).tolist() for n in lengths]


def continuations(target: Transformer, prompts: list[list[int]], length: int) -> list[list[int]]:
    """Each prompt followed by the target's greedy continuation (computed with the fast kernels: training data)."""
    with differentiable_kernels(), torch.no_grad():
        out, _ = generate(target, prompts, length, Sampling())
    return [p + o.tokens for p, o in zip(prompts, out)]


# ------------------------------------------------------------------------------------------------ drafters


def dflash_checkpoint(
    directory: Path,
    family: str,
    target_config,
    *,
    dflash2: bool = False,
    layers: int = 1,
    block_size: int = 8,
    layer_types: list[str] | None = None,
    sliding_window: int = 4096,
    max_positions: int | None = None,
) -> Path:
    c = target_config
    taps = [1, c.num_layers - 2]
    path = build_dflash(
        directory,
        target_layer_ids=taps,
        num_target_layers=c.num_layers,
        target_hidden=c.hidden_size,
        hidden=c.hidden_size,
        layers=layers,
        heads=4,
        kv_heads=2,
        head_dim=16,
        intermediate=128,
        block_size=block_size,
        mask_token_id=MASK_TOKEN,
        vocab_size=c.vocab_size,
        layer_types=layer_types or ["full_attention"] * layers,
        sliding_window=sliding_window,
        dflash2=DFlash2(conv_kernel_size=2, conv_group_size=16, selector_rank=16, selector_top_k=4)
        if dflash2
        else None,
    )
    if max_positions is not None:
        config = json.loads((path / "config.json").read_text())
        config["max_position_embeddings"] = max_positions
        write_json(path / "config.json", config)
    return path


def eagle3_checkpoint(directory: Path, target_config) -> Path:
    """An EAGLE-3 head over the target's vocabulary (draft vocab = target vocab, d2t = 0) reading 3 aux layers."""
    c = target_config
    directory.mkdir(parents=True, exist_ok=True)
    h = c.hidden_size
    config = {
        "architectures": ["LlamaForCausalLMEagle3"],
        "draft_vocab_size": c.vocab_size,
        "eagle_aux_hidden_state_layer_ids": [1, 2, 3],  # vLLM's layout: the inputs of layers 1-3 (outputs of 0-2)
        "hidden_act": "silu",
        "hidden_size": h,
        "intermediate_size": 128,
        "max_position_embeddings": 4096,
        "model_type": "llama",
        "num_attention_heads": 4,
        "num_hidden_layers": 1,
        "num_key_value_heads": 2,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "target_hidden_size": h,
        "tie_word_embeddings": False,
        "vocab_size": c.vocab_size,
    }
    write_json(directory / "config.json", config)
    g = torch.Generator().manual_seed(3)

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=g) * shape[-1] ** -0.5

    d = h // 4
    tensors = {
        "d2t": torch.zeros(c.vocab_size, dtype=torch.int64),
        "t2d": torch.ones(c.vocab_size, dtype=torch.bool),
        "fc.weight": rand(h, 3 * h),
        "norm.weight": torch.ones(h),
        "lm_head.weight": rand(c.vocab_size, h),
        "midlayer.hidden_norm.weight": torch.ones(h),
        "midlayer.input_layernorm.weight": torch.ones(h),
        "midlayer.post_attention_layernorm.weight": torch.ones(h),
        "midlayer.self_attn.q_proj.weight": rand(4 * d, 2 * h),
        "midlayer.self_attn.k_proj.weight": rand(2 * d, 2 * h),
        "midlayer.self_attn.v_proj.weight": rand(2 * d, 2 * h),
        "midlayer.self_attn.o_proj.weight": rand(h, 4 * d),
        "midlayer.mlp.gate_proj.weight": rand(128, h),
        "midlayer.mlp.up_proj.weight": rand(128, h),
        "midlayer.mlp.down_proj.weight": rand(h, 128),
    }
    save_file(tensors, str(directory / "model.safetensors"), metadata={"format": "pt"})
    return directory


def _reinitialise(weights: dict) -> None:
    """Plain norms start at 1, zero-centred ones at 0, matrices at 1/sqrt(fan-in) (the fixtures' 0.02 noise
    would start a plain-norm drafter at zero), DFlash2's conv as the identity."""
    g = torch.Generator().manual_seed(5)
    for name, w in weights.items():
        if not isinstance(w, torch.Tensor) or not w.is_floating_point():
            continue
        with torch.no_grad():
            if w.ndim == 1:
                w.fill_(0.0 if name.startswith("mtp.") else 1.0)
            elif name.endswith("base_kernel"):
                w.zero_()
                w[:, 0] = 1.0
            elif name.endswith("kernel_projection.weight"):
                w.zero_()
            elif name.endswith("_codebook"):  # the selector's pair scores start small: its walk near the argmax
                w.copy_(torch.randn(w.shape, generator=g) * 0.05)
            else:
                w.copy_(torch.randn(w.shape, generator=g) * w.shape[-1] ** -0.5)


def distil(
    drafter,
    target: Transformer,
    sequences: list[list[int]],
    first: int,
    steps: int = 200,
    block: int = 8,
    lr: float = 1e-2,
) -> None:
    """Train the drafter's float weights in place to predict the continuations in `sequences` (cut to the
    shortest) from position `first` on: the drafter memorises what the target does on these prompts."""
    data = torch.tensor([s[: min(map(len, sequences))] for s in sequences])
    params = [
        w
        for n, w in drafter.weights.items()
        if isinstance(w, torch.Tensor) and w.is_floating_point() and not n.endswith(("_codebook",))
    ]
    for w in params:
        w.requires_grad_(True)
    optimiser = torch.optim.Adam(params, lr=lr)
    count, length = data.shape
    positions = torch.arange(length).expand(count, -1)
    with differentiable_kernels(), torch.no_grad():
        out = target.forward(
            data,
            positions,
            target.new_cache(count, length + block),
            taps=drafter.taps,
            hidden=drafter.hidden,
            logits=False,
        )
    following = torch.cat((data[:, 1:], data[:, -1:]), dim=1)
    g = torch.Generator().manual_seed(1)
    with differentiable_kernels():
        for _ in range(steps):
            drafter.start(count, length + block)
            committed = Committed(data, positions, following, torch.full((count,), length), out.taps, out.hidden)
            if drafter.kind in ("dflash", "dflash2"):
                drafter.observe(committed)
                anchor_at = torch.randint(first, length - block, (count,), generator=g)
                rows, _ = drafter.block(data[torch.arange(count), anchor_at], anchor_at, block)
                logits = drafter.logits(rows[:, 1:])
                labels = data.gather(1, anchor_at[:, None] + torch.arange(1, block))
            else:
                features = project(out.taps, drafter.fc) if drafter.kind == "eagle3" else out.hidden
                _, logits = drafter.step(features, following, positions)
                logits, labels = logits[:, first - 1 : -2], data[:, first + 1 :]
            loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), labels.reshape(-1))
            optimiser.zero_grad()
            loss.backward()
            optimiser.step()
    for w in params:
        w.requires_grad_(False)


def trained_drafter(
    checkpoint: Path | None,
    target_path: Path,
    target_model,
    target: Transformer,
    sequences: list[list[int]],
    first: int,
    steps: int = 200,
) -> Path:
    """Distil the drafter in `checkpoint` (None: the target's MTP head) on `sequences` and write it back, float32."""
    draft = open_model(str(checkpoint)) if checkpoint is not None else None
    drafter = load_drafter(draft, target_model, target)
    _reinitialise(drafter.weights)
    distil(drafter, target, sequences, first, steps)
    if checkpoint is None:
        tensors = load_file(str(target_path / "model.safetensors"))
        tensors.update({n: w.detach().contiguous() for n, w in drafter.weights.items()})
        save_file(tensors, str(target_path / "model.safetensors"), metadata={"format": "pt"})
        return target_path
    tensors = {n: w.detach().float().contiguous() for n, w in drafter.weights.items() if n != "d2t"}
    tensors.update({n: t for n, t in load_file(str(checkpoint / "model.safetensors")).items() if n not in tensors})
    save_file(tensors, str(checkpoint / "model.safetensors"), metadata={"format": "pt"})
    return checkpoint
