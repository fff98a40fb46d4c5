"""The blocks every family is made of: norms, attention, Gated DeltaNet, dense MLP, MoE, the decoder layer.

Every matmul, norm, attention and GDN recurrence goes through runtime/kernels (a torch reference on CPU, Triton
on CUDA, each batch-invariant), so a row's bits never depend on how many rows share a call and the CPU path
tests the GPU path's logic. What stays here is elementwise, gathers and the conv's K-tap sum; the activations
are written with exp, which gives the same bits wherever an element sits (torch's own CPU silu, sigmoid and
softplus take a vector path or a scalar tail path by position, which differ by an ulp).

Blocks are built by `build(config, ..., fetch)`: `fetch(name, shape, matmul=False, fp32=False)` returns the
canonical weight (checkpoint/names.py) of that shape: `matmul=True` where it only feeds a matmul and so may stay
`Packed`, `fp32=True` for the parameters kept in float32 whatever the model dtype (the conv, A_log, dt_bias),
the rest in the model dtype (norm gains too: the kernels round as transformers does with gains loaded so).
The loader calls every builder twice: once to learn which weights of which shapes the model needs, once with
the loaded ones.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from specpair.checkpoint.config import ModelConfig
from specpair.formats.packed import Packed
from specpair.runtime.cache import Cache
from specpair.runtime.kernels import attention, gdn, linear, norm
from specpair.runtime.rope import Rope

Weight = Tensor | Packed
Fetch = Callable[..., Weight]  # fetch(name, shape, matmul=False, fp32=False)
SOFTPLUS_THRESHOLD = 20.0  # torch's: above it softplus(x) is x


def silu(x: Tensor) -> Tensor:
    return x / (1 + torch.exp(-x))


def sigmoid(x: Tensor) -> Tensor:
    return 1 / (1 + torch.exp(-x))


def softplus(x: Tensor) -> Tensor:
    return torch.where(x > SOFTPLUS_THRESHOLD, x, torch.log1p(torch.exp(x)))


def project(x: Tensor, w: Weight, bias: Tensor | None = None) -> Tensor:
    """x [..., in] @ w.T -> [..., out]."""
    out = linear.matmul(x.reshape(-1, x.shape[-1]), w)
    out = out.reshape(*x.shape[:-1], out.shape[-1])
    return out if bias is None else out + bias


def _bias(config_flag: bool, fetch: Fetch, name: str, size: int) -> Tensor | None:
    return fetch(name.removesuffix(".weight") + ".bias", (size,)) if config_flag else None


@dataclass
class Norm:
    """RMSNorm over the last dim; zero-centred ones apply 1 + w (Qwen3.5/3.6, Qwen3-Next)."""

    weight: Tensor
    eps: float
    zero_centred: bool

    @classmethod
    def build(cls, config: ModelConfig, name: str, size: int, fetch: Fetch) -> Norm:
        return cls(fetch(name, (size,)), config.rms_norm_eps, config.zero_centred_norms)

    def __call__(self, x: Tensor) -> Tensor:
        out = norm.rms_norm(x.reshape(-1, x.shape[-1]), self.weight, self.eps, self.zero_centred)
        return out.reshape(x.shape)


@dataclass
class Step:
    """What one forward step shares with every layer: explicit positions and the cache."""

    positions: Tensor  # [B, T] int64
    cos: Tensor  # rope tables [B, T, 1, rotary_dim] float32
    sin: Tensor
    cache: Cache
    verify: bool  # keep what commit() needs to roll this step back

    @property
    def kv_end(self) -> Tensor:
        return self.positions + 1


@dataclass
class Attention:
    """Grouped-query attention over the cache, optionally with per-head q/k RMSNorm and a sigmoid output gate
    (q_proj emits [query | gate] per head), optionally a sliding window."""

    layer: int
    q_proj: Weight
    k_proj: Weight
    v_proj: Weight
    o_proj: Weight
    biases: tuple[Tensor | None, Tensor | None, Tensor | None, Tensor | None]
    q_norm: Norm | None
    k_norm: Norm | None
    heads: int
    kv_heads: int
    head_dim: int
    gated: bool
    window: int | None
    rope: Rope

    @classmethod
    def build(cls, config: ModelConfig, layer: int, fetch: Fetch, rope: Rope) -> Attention:
        p = f"layers.{layer}.self_attn."
        hidden, heads, kv, d = config.hidden_size, config.num_heads, config.num_kv_heads, config.head_dim
        q_rows = heads * d * (2 if config.attn_output_gate else 1)
        shapes = {
            "q_proj": (q_rows, hidden),
            "k_proj": (kv * d, hidden),
            "v_proj": (kv * d, hidden),
            "o_proj": (hidden, heads * d),
        }
        weights = {k: fetch(p + k + ".weight", s, matmul=True) for k, s in shapes.items()}
        biases = tuple(_bias(config.attention_bias, fetch, p + k + ".weight", s[0]) for k, s in shapes.items())
        q_norm = Norm.build(config, p + "q_norm.weight", d, fetch) if config.qk_norm else None
        k_norm = Norm.build(config, p + "k_norm.weight", d, fetch) if config.qk_norm else None
        window = config.sliding_window if config.layer_types[layer] == "sliding" else None
        return cls(
            layer, *weights.values(), biases, q_norm, k_norm, heads, kv, d, config.attn_output_gate, window, rope
        )

    def __call__(self, h: Tensor, step: Step) -> Tensor:
        B, T, _ = h.shape
        bq, bk, bv, bo = self.biases
        q = project(h, self.q_proj, bq).view(B, T, self.heads, -1)
        if self.gated:
            q, gate = q.chunk(2, dim=-1)
        k = project(h, self.k_proj, bk).view(B, T, self.kv_heads, self.head_dim)
        v = project(h, self.v_proj, bv).view(B, T, self.kv_heads, self.head_dim)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = self.rope.rotate(q, step.cos, step.sin), self.rope.rotate(k, step.cos, step.sin)
        k_cache, v_cache = step.cache.write_kv(self.layer, step.positions, k, v)
        end = step.kv_end
        start = (end - self.window).clamp(min=0) if self.window else torch.zeros_like(end)
        o = attention.attention(q.contiguous(), k_cache, v_cache, start, end, self.head_dim**-0.5)
        o = o.reshape(B, T, self.heads * self.head_dim)
        if self.gated:
            o = o * sigmoid(gate.reshape(B, T, -1).float()).to(o.dtype)
        return project(o, self.o_proj, bo)


@dataclass
class GatedDeltaNet:
    """Qwen3.5/3.6 and Qwen3-Next linear attention: depthwise causal conv (K taps) + SiLU over [q | k | v],
    the gated delta rule with an fp32 state per value head, a gated RMSNorm with z, out_proj."""

    layer: int
    in_proj_qkv: Weight
    in_proj_z: Weight
    in_proj_b: Weight
    in_proj_a: Weight
    out_proj: Weight
    conv: Tensor  # [C, K] float32
    A_log: Tensor  # [Hv] float32
    dt_bias: Tensor
    norm_weight: Tensor  # [dv], a plain gain (not 1 + w)
    key_heads: int
    value_heads: int
    key_dim: int
    value_dim: int
    eps: float

    @classmethod
    def build(cls, config: ModelConfig, layer: int, fetch: Fetch) -> GatedDeltaNet:
        p = f"layers.{layer}.linear_attn."
        hidden = config.hidden_size
        hk, hv = config.linear_num_key_heads, config.linear_num_value_heads
        dk, dv, taps = config.linear_key_head_dim, config.linear_value_head_dim, config.linear_conv_kernel
        channels = config.linear_conv_dim
        proj = {
            "in_proj_qkv": (channels, hidden),
            "in_proj_z": (hv * dv, hidden),
            "in_proj_b": (hv, hidden),
            "in_proj_a": (hv, hidden),
            "out_proj": (hidden, hv * dv),
        }
        weights = [fetch(p + k + ".weight", s, matmul=True) for k, s in proj.items()]
        conv = fetch(p + "conv1d.weight", (channels, 1, taps), fp32=True).reshape(channels, taps)
        return cls(
            layer,
            *weights,
            conv,
            fetch(p + "A_log", (hv,), fp32=True),
            fetch(p + "dt_bias", (hv,), fp32=True),
            fetch(p + "norm.weight", (dv,)),
            hk,
            hv,
            dk,
            dv,
            config.rms_norm_eps,
        )

    def __call__(self, h: Tensor, step: Step) -> Tensor:
        B, T, _ = h.shape
        qkv = project(h, self.in_proj_qkv)
        z = project(h, self.in_proj_z)
        b, a = project(h, self.in_proj_b), project(h, self.in_proj_a)
        conv_window, state = step.cache.gdn_state(self.layer, B)
        # the window's K-1 pre-conv columns, then this step's: output t reads columns t .. t+K-1
        columns = torch.cat((conv_window, qkv), dim=1)
        mixed = silu(causal_conv(columns, self.conv, T)).to(h.dtype)
        conv_window.copy_(columns[:, T:])
        keys = self.key_heads * self.key_dim
        q = mixed[..., :keys].reshape(B, T, self.key_heads, self.key_dim)
        k = mixed[..., keys : 2 * keys].reshape(B, T, self.key_heads, self.key_dim)
        v = mixed[..., 2 * keys :].reshape(B, T, self.value_heads, self.value_dim)
        beta = sigmoid(b.float())
        g = -torch.exp(self.A_log) * softplus(a.float() + self.dt_bias)
        if step.verify:
            step.cache.record_gdn(self.layer, columns, q, k, v, g, beta)
        o = gdn.gdn_recurrent(q, k, v, g, beta, state)
        o = norm.gated_rms_norm(
            o.reshape(-1, self.value_dim), z.reshape(-1, self.value_dim), self.norm_weight, self.eps
        )
        return project(o.reshape(B, T, -1), self.out_proj)


def causal_conv(columns: Tensor, weight: Tensor, steps: int) -> Tensor:
    """Depthwise causal conv as an explicit sum over its K taps in float32, one fixed order for every row:
    out[:, t] = sum_j weight[:, j] * columns[:, t + j], for columns [B, K-1+T, C], weight [C, K]."""
    out = columns[:, 0:steps].float() * weight[:, 0]
    for j in range(1, weight.shape[1]):
        out = out + columns[:, j : j + steps].float() * weight[:, j]
    return out


@dataclass
class MLP:
    """SwiGLU: down(silu(gate(x)) * up(x))."""

    gate_proj: Weight
    up_proj: Weight
    down_proj: Weight
    biases: tuple[Tensor | None, Tensor | None, Tensor | None]

    @classmethod
    def build(cls, config: ModelConfig, prefix: str, width: int, fetch: Fetch, bias: bool = False) -> MLP:
        hidden = config.hidden_size
        shapes = {"gate_proj": (width, hidden), "up_proj": (width, hidden), "down_proj": (hidden, width)}
        weights = [fetch(f"{prefix}{k}.weight", s, matmul=True) for k, s in shapes.items()]
        return cls(*weights, tuple(_bias(bias, fetch, f"{prefix}{k}.weight", s[0]) for k, s in shapes.items()))

    def __call__(self, x: Tensor) -> Tensor:
        bg, bu, bd = self.biases
        gate = project(x, self.gate_proj, bg)
        return project(silu(gate.float()).to(x.dtype) * project(x, self.up_proj, bu), self.down_proj, bd)


@dataclass
class MoE:
    """Routed experts: router softmax (fp32) -> top-k -> renormalised when norm_topk_prob; each token's k
    experts are SwiGLUs; plus, where the family has one, a shared expert scaled by sigmoid(shared_expert_gate)."""

    router: Weight  # [E, H]
    gate_proj: Weight  # [E, I, H]
    up_proj: Weight
    down_proj: Weight  # [E, H, I]
    top_k: int
    renormalise: bool
    shared: MLP | None
    shared_gate: Weight | None  # [1, H]

    @classmethod
    def build(cls, config: ModelConfig, layer: int, fetch: Fetch, shared_expert: bool) -> MoE:
        p = f"layers.{layer}.mlp."
        e, hidden, width = config.num_experts, config.hidden_size, config.moe_intermediate_size
        shapes = {"gate_proj": (e, width, hidden), "up_proj": (e, width, hidden), "down_proj": (e, hidden, width)}
        experts = [fetch(f"{p}experts.{k}.weight", s, matmul=True) for k, s in shapes.items()]
        shared = shared_gate = None
        if shared_expert:
            shared = MLP.build(config, p + "shared_expert.", config.shared_expert_intermediate_size, fetch)
            shared_gate = fetch(p + "shared_expert_gate.weight", (1, hidden), matmul=True)
        return cls(
            fetch(p + "gate.weight", (e, hidden), matmul=True),
            *experts,
            config.experts_per_token,
            config.norm_topk_prob,
            shared,
            shared_gate,
        )

    def __call__(self, x: Tensor) -> Tensor:
        shape = x.shape
        x = x.reshape(-1, shape[-1])
        probs = torch.softmax(linear.matmul(x, self.router).float(), dim=-1)
        weights, ids = torch.topk(probs, self.top_k, dim=-1)
        if self.renormalise:  # summed term by term: a reduction kernel may order a row's sum by the row count
            total = weights[:, 0]
            for j in range(1, self.top_k):
                total = total + weights[:, j]
            weights = weights / total[:, None]
        gate = linear.matmul_experts(x, self.gate_proj, ids)
        up = linear.matmul_experts(x, self.up_proj, ids)
        act = silu(gate.float()).to(x.dtype) * up  # [N, k, I]
        down = linear.matmul_experts(act.reshape(-1, act.shape[-1]), self.down_proj, ids.reshape(-1, 1))
        down = down.reshape(*ids.shape, -1).float()
        out = weights[:, 0, None] * down[:, 0]
        for j in range(1, self.top_k):  # a fixed order of the k terms, the same for every row
            out = out + weights[:, j, None] * down[:, j]
        if self.shared is not None:
            scale = sigmoid(linear.matmul(x, self.shared_gate).float())
            out = out + scale * self.shared(x).float()
        return out.to(x.dtype).reshape(shape)


@dataclass
class DecoderLayer:
    input_norm: Norm
    mixer: Attention | GatedDeltaNet
    post_norm: Norm
    mlp: MLP | MoE

    def __call__(self, h: Tensor, step: Step) -> Tensor:
        h = h + self.mixer(self.input_norm(h), step)
        return h + self.mlp(self.post_norm(h))


def mixer(config: ModelConfig, layer: int, fetch: Fetch, rope: Rope) -> Attention | GatedDeltaNet:
    """The token mixer a layer type names (the families that have Gated DeltaNet layers build them here)."""
    if config.layer_types[layer] == "linear":
        return GatedDeltaNet.build(config, layer, fetch)
    return Attention.build(config, layer, fetch, rope)


def norms(config: ModelConfig, layer: int, fetch: Fetch) -> tuple[Norm, Norm]:
    p, h = f"layers.{layer}.", config.hidden_size
    return (
        Norm.build(config, p + "input_layernorm.weight", h, fetch),
        Norm.build(config, p + "post_attention_layernorm.weight", h, fetch),
    )
