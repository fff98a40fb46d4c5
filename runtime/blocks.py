"""The blocks every family is made of: norms, attention, Gated DeltaNet, dense MLP, MoE, the decoder layer.

Every matmul, norm, attention and its output gate, rotary and cache write, SwiGLU gate, MoE routing and combination,
GDN conv, gates and recurrence goes through runtime/kernels (a torch reference on CPU, Triton on CUDA, each
batch-invariant), so a row's bits never depend on how many rows share a call, the CPU path tests the GPU path's
logic, and a decode step launches a few kernels per layer (its launches are what a CUDA graph replays:
benchmarks/step_profile.py counts them). What stays here is reshapes and splits.

Blocks are built by `build(config, ..., fetch)`: `fetch(name, shape, matmul=False, fp32=False)` returns the
canonical weight (checkpoint/names.py) of that shape: `matmul=True` where it only feeds a matmul and so may stay
`Packed`, `fp32=True` for the parameters kept in float32 whatever the model dtype (the conv, A_log, dt_bias),
the rest in the model dtype (norm gains too: the kernels round as transformers does with gains loaded so).
The loader calls every builder twice: once to learn which weights of which shapes the model needs, once with
the loaded ones.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch
from torch import Tensor

from specpair.checkpoint.config import ModelConfig
from specpair.formats.packed import Packed
from specpair.runtime.cache import Cache, GDNInputs, Pending
from specpair.runtime.kernels import activation, attention, experts, gdn, linear, norm, qk
from specpair.runtime.kernels.experts import ExpertTerms
from specpair.runtime.kernels.linear import SplitSums
from specpair.runtime.parallel import SINGLE
from specpair.runtime.rope import Rope

Weight = Tensor | Packed
Fetch = Callable[..., Weight]  # fetch(name, shape, matmul=False, fp32=False)


def project(x: Tensor, w: Weight, bias: Tensor | None = None, unsummed: bool = False) -> Tensor | SplitSums:
    """x [..., in] @ w.T -> [..., out]; `unsummed` (no bias): a split K's partials over x's rows as they are, for
    the kernel that reads the product next to add (a mixer's output: the residual add and norm after it)."""
    out = linear.matmul(x.reshape(-1, x.shape[-1]), w, unsummed=unsummed and bias is None)
    if isinstance(out, SplitSums):
        return out
    out = out.reshape(*x.shape[:-1], out.shape[-1])
    return out if bias is None else out + bias


_fused_everywhere = contextvars.ContextVar("fused_everywhere", default=False)


@contextlib.contextmanager
def fused_projections() -> Iterator[None]:
    """Projections built inside fuse on the CPU too (a target's: runtime/loading.load). On the CPU a fused
    product is one weight pass instead of several, in fewer, larger calls: SmolLM2's decode step makes 121
    products instead of 211."""
    token = _fused_everywhere.set(True)
    try:
        yield
    finally:
        _fused_everywhere.reset(token)


def fusing(w: Weight) -> bool:
    """Whether blocks build new weights from loaded ones (fused rows, a shared expert in the expert stacks): on
    CUDA, and on the CPU inside `fused_projections()`."""
    return linear.on_cuda(w) or _fused_everywhere.get()


@dataclass
class Projections:
    """Projections of one input, consecutive ones fused into one weight where linear.fuse_rows can make them
    one (q|k|v, gate|up, the GDN's input projections, router|shared-expert gate): one pass over x and one launch
    instead of several. Each output row is computed from its own weight row alone; the split of K a kernel
    picks depends on the weight's shape, so the fused and the separate products agree to float32 rounding, and a
    model always runs one of them."""

    groups: list[tuple[Weight, list[int]]]  # a weight and the output rows of each projection it holds
    biases: list[Tensor | None]

    @classmethod
    def of(
        cls, weights: list[Weight], biases: list[Tensor | None] | None = None, fuse: bool | None = None
    ) -> Projections:
        """fuse: by default on CUDA, and on the CPU inside `fused_projections()`; elsewhere on the CPU the separate
        weights stay what the caller loaded (a drafter's: tests and tools train them in place)."""
        fuse = fusing(weights[0]) if fuse is None else fuse
        groups: list[list[Weight]] = []
        for w in weights:
            if groups and fuse and linear.fusable_rows([*groups[-1], w]):
                groups[-1].append(w)
            else:
                groups.append([w])
        return cls(
            [(g[0] if len(g) == 1 else linear.fuse_rows(g), [w.shape[-2] for w in g]) for g in groups],
            biases or [None] * len(weights),
        )

    def __call__(self, x: Tensor, unsummed: bool = False) -> list[Tensor | SplitSums]:
        """`unsummed`: a split K's partials (column views) for the kernels that read them next to add (a MoE's
        router logits: route and combine; the GDN's input: conv, norm and gates; attention's q|k|v: the rotation
        and the cache write, and its output gate), where a fused weight's projections have no bias."""
        outs, first = [], 0
        for w, sizes in self.groups:
            keep = unsummed and all(b is None for b in self.biases[first : first + len(sizes)])
            outs += project(x, w, unsummed=keep).split(sizes, dim=-1)
            first += len(sizes)
        return [out if b is None else out + b for out, b in zip(outs, self.biases)]


def optional_bias(config_flag: bool, fetch: Fetch, name: str, size: int) -> Tensor | None:
    """The bias beside weight `name` where the config says the layer has one."""
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

    def add(self, h: Tensor, delta: Tensor | SplitSums | ExpertTerms) -> tuple[Tensor, Tensor]:
        """(h + delta, this norm of it): a residual add and the norm after it, in one pass (delta: or the partials
        of a split product over h's rows, or a MoE's terms, added first)."""
        return norm.add_rms_norm(h, delta, self.weight, self.eps, self.zero_centred)


@dataclass
class Step:
    """What one forward step shares with every layer: explicit positions and the cache."""

    positions: Tensor  # [B, T] int64
    cos: Tensor  # rope tables [B, T, 1, rotary_dim] float32
    sin: Tensor
    cache: Cache
    pending: Pending | None  # a verify step: what its commit needs to roll it back is kept here
    kv_end: Tensor  # [B, T] int32 positions + 1: what causal attention reads up to
    kv_start: Tensor  # [B, T] int32 zeros: where full attention starts reading
    # the sum of a row-parallel output over the ranks (runtime/parallel.py); partials come back as they are on one
    reduce: Callable[[Tensor | SplitSums | ExpertTerms], Tensor | SplitSums | ExpertTerms]

    @classmethod
    def of(
        cls,
        positions: Tensor,
        cos: Tensor,
        sin: Tensor,
        cache: Cache,
        pending: Pending | None,
        reduce: Callable[[Tensor], Tensor] = SINGLE.reduce,
    ) -> Step:
        """The ranges once per step, in the attention kernel's int32, not once per layer."""
        end = (positions + 1).to(torch.int32)
        return cls(positions, cos, sin, cache, pending, end, torch.zeros_like(end), reduce)


@dataclass
class Attention:
    """Grouped-query attention over the cache, optionally with per-head q/k RMSNorm and a sigmoid output gate
    (q_proj emits [query | gate] per head), optionally a sliding window."""

    layer: int
    qkv: Projections
    o_proj: Weight
    o_bias: Tensor | None
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
        biases = [optional_bias(config.attention_bias, fetch, p + k + ".weight", s[0]) for k, s in shapes.items()]
        q_norm = Norm.build(config, p + "q_norm.weight", d, fetch) if config.qk_norm else None
        k_norm = Norm.build(config, p + "k_norm.weight", d, fetch) if config.qk_norm else None
        window = config.sliding_window if config.layer_types[layer] == "sliding" else None
        qkv = Projections.of([weights["q_proj"], weights["k_proj"], weights["v_proj"]], biases[:3])
        return cls(
            layer,
            qkv,
            weights["o_proj"],
            biases[3],
            q_norm,
            k_norm,
            heads,
            kv,
            d,
            config.attn_output_gate,
            window,
            rope,
        )

    def __call__(self, h: Tensor, step: Step) -> Tensor | SplitSums:
        B, T, _ = h.shape
        # a split product's partials added where they are read: q's, k's and v's as they are rotated and stored,
        # the gate's as attention gates its output
        q, k, v = self.qkv(h, unsummed=True)
        q, gate = q.view(B, T, self.heads, -1), None
        if self.gated:
            q, gate = q.split([self.head_dim, self.head_dim], dim=-1)
        k = k.view(B, T, self.kv_heads, self.head_dim)
        v = v.view(B, T, self.kv_heads, self.head_dim)
        cache, slot = step.cache, step.cache.slots[self.layer]
        gains = (self.q_norm.weight, self.k_norm.weight) if self.q_norm is not None else (None, None)
        eps, zero_centred = (self.q_norm.eps, self.q_norm.zero_centred) if self.q_norm is not None else (0.0, False)
        q = qk.rotate_and_store(
            q, k, v, *gains, eps, zero_centred, step.cos, step.sin, self.rope.rotary_dim, cache.kv, slot, step.positions
        )
        end = step.kv_end
        start = (end - self.window).clamp(min=0) if self.window else step.kv_start
        o = attention.attention(q, cache.kv[0, slot, :B], cache.kv[1, slot, :B], start, end, self.head_dim**-0.5, gate)
        return project(o.reshape(B, T, self.heads * self.head_dim), self.o_proj, self.o_bias, unsummed=True)


@dataclass
class GatedDeltaNet:
    """Qwen3.5/3.6 and Qwen3-Next linear attention: depthwise causal conv (K taps) + SiLU over [q | k | v],
    the gated delta rule with an fp32 state per value head, a gated RMSNorm with z, out_proj."""

    layer: int
    in_proj: Projections  # qkv, z, b, a
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
            Projections.of(weights[:4]),
            weights[4],
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

    def __call__(self, h: Tensor, step: Step) -> Tensor | SplitSums:
        B, T, _ = h.shape
        # split products' partials added where they are read: qkv's and b|a's in the conv's and gates' launch, z's in
        # the norm
        qkv, z, b, a = self.in_proj(h, unsummed=True)
        verify = step.pending is not None
        conv_window, state = step.cache.gdn_state(self.layer, B)
        keys, values = self.key_heads * self.key_dim, self.value_heads * self.value_dim
        q, k, v, columns, g, beta = gdn.conv_silu_gates(
            conv_window, qkv, self.conv, (keys, keys, values), verify, a, b, self.A_log, self.dt_bias
        )
        q = q.reshape(B, T, self.key_heads, self.key_dim)
        k = k.reshape(B, T, self.key_heads, self.key_dim)
        v = v.reshape(B, T, self.value_heads, self.value_dim)
        g, beta = g.reshape(B, T, self.value_heads), beta.reshape(B, T, self.value_heads)
        if verify:
            step.pending.gdn[self.layer] = GDNInputs(columns, q, k, v, g, beta)
        # a verify step leaves the state as it was: its commit replays the kept tokens from it
        o = gdn.gdn_recurrent(q, k, v, g, beta, state, write_state=not verify)
        o = norm.gated_rms_norm(o.reshape(-1, self.value_dim), z, self.norm_weight, self.eps)
        return project(o.reshape(B, T, -1), self.out_proj, unsummed=True)


@dataclass
class MLP:
    """SwiGLU: down(silu(gate(x)) * up(x))."""

    gate_up: Projections
    down_proj: Weight
    down_bias: Tensor | None

    @classmethod
    def build(cls, config: ModelConfig, prefix: str, width: int, fetch: Fetch, bias: bool = False) -> MLP:
        hidden = config.hidden_size
        shapes = {"gate_proj": (width, hidden), "up_proj": (width, hidden), "down_proj": (hidden, width)}
        weights = [fetch(f"{prefix}{k}.weight", s, matmul=True) for k, s in shapes.items()]
        biases = [optional_bias(bias, fetch, f"{prefix}{k}.weight", s[0]) for k, s in shapes.items()]
        return cls(Projections.of(weights[:2], biases[:2]), weights[2], biases[2])

    def __call__(self, x: Tensor, unsummed: bool = False) -> Tensor | SplitSums:
        """`unsummed`: down_proj's split-K partials, for a kernel that adds them as it reads them (the next norm's
        residual add, a DFlash2 convolution)."""
        gate, up = self.gate_up(x, unsummed=True)  # split-K partials added in the SwiGLU's kernel
        act = activation.silu_mul(gate, up).reshape(*x.shape[:-1], -1)  # partials come over x's rows flattened
        return project(act, self.down_proj, self.down_bias, unsummed=unsummed)

    def delta(self, x: Tensor) -> Tensor | SplitSums:
        """A decoder layer's output for the next norm to add (Norm.add): down_proj's partials where it split K."""
        return self(x, unsummed=True)


@dataclass
class MoE:
    """Routed experts: router softmax (fp32) -> top-k -> renormalised when norm_topk_prob; each token's k
    experts are SwiGLUs; plus, where the family has one, a shared expert scaled by sigmoid(shared_expert_gate).
    Where the shared expert is one more expert of the stacks' layout and shape (Qwen3.5/3.6 and Qwen3-Next in
    BF16, FP8 or NVFP4: its width is the experts'), it is stored in them as expert E (linear.with_expert) and
    every token routes to it too: its SwiGLU runs in the routed experts' launches instead of three of its own."""

    router: Projections  # [E, H] router logits, and the shared expert's [1, H] gate where there is one
    gate_up: list[Weight]  # [E(+1), 2I, H] fused, or [E(+1), I, H] gate and up
    down_proj: Weight  # [E(+1), H, I]
    top_k: int
    renormalise: bool
    shared: MLP | None  # the shared expert where it is not in the stacks
    shared_id: int | None  # the shared expert's id where it is: E
    prefetch: list[Tensor]  # the experts' largest tensors, which routing may ask L2 for (experts.route)

    @classmethod
    def build(cls, config: ModelConfig, layer: int, fetch: Fetch, shared_expert: bool) -> MoE:
        p = f"layers.{layer}.mlp."
        e, hidden, width = config.num_experts, config.hidden_size, config.moe_intermediate_size
        shapes = {"gate_proj": (e, width, hidden), "up_proj": (e, width, hidden), "down_proj": (e, hidden, width)}
        gate, up, down = [fetch(f"{p}experts.{k}.weight", s, matmul=True) for k, s in shapes.items()]
        fuse = linear.on_cuda(gate) and linear.fusable_rows([gate, up])
        router = [fetch(p + "gate.weight", (e, hidden), matmul=True)]
        shared, shared_id = None, None
        if shared_expert:
            prefix, size = p + "shared_expert.", config.shared_expert_intermediate_size
            own = {"gate_proj": (size, hidden), "up_proj": (size, hidden), "down_proj": (hidden, size)}
            one = [fetch(f"{prefix}{k}.weight", s, matmul=True) for k, s in own.items()]
            router.append(fetch(p + "shared_expert_gate.weight", (1, hidden), matmul=True))
            if fusing(gate) and all(linear.appendable_expert([w], [o]) for w, o in zip((gate, up, down), one)):
                fuse = fuse and linear.fusable_rows(one[:2])
                pairs = [([gate, up], one[:2])] if fuse else [([gate], one[:1]), ([up], one[1:2])]
                gate_up = [linear.with_expert(stacks, extra) for stacks, extra in pairs]
                down, shared_id = linear.with_expert([down], one[2:]), e
            else:
                shared = MLP(Projections.of(one[:2]), one[2], None)
        if shared_id is None:
            gate_up = [linear.fuse_rows([gate, up])] if fuse else [gate, up]
        return cls(
            Projections.of(router),
            gate_up,
            down,
            config.experts_per_token,
            config.norm_topk_prob,
            shared,
            shared_id,
            linear.expert_stacks([*gate_up, down])[: experts.PREFETCHED],
        )

    def delta(self, x: Tensor) -> ExpertTerms:
        """The terms of the output's rows (x's rows flattened), which the next residual add's norm adds."""
        x = x.reshape(-1, x.shape[-1])
        logits = self.router(x, unsummed=True)  # split-K partials added in route and combine
        weights, ids = experts.route(logits[0], self.top_k, self.renormalise, self.prefetch, self.shared_id)
        tables = linear.TileTables(ids)  # past the in-kernel window, every expert matmul here reads the same tiles
        if len(self.gate_up) == 1:  # its split-K partials summed in the SwiGLU's kernel
            act = activation.swiglu(linear.matmul_experts(x, self.gate_up[0], ids, unsummed=True, tables=tables))
        else:
            act = activation.silu_mul(*(linear.matmul_experts(x, w, ids, tables=tables) for w in self.gate_up))
        down = linear.matmul_experts(act.reshape(-1, act.shape[-1]), self.down_proj, ids, per_pair=True, tables=tables)
        if self.shared_id is not None:
            shared, shared_logit = down[:, self.top_k], logits[1]  # the last column: a view combine reads in place
        elif self.shared is not None:
            shared, shared_logit = self.shared(x), logits[1]
        else:
            shared, shared_logit = None, None
        return ExpertTerms(weights, down, shared, shared_logit)


@dataclass
class DecoderLayer:
    input_norm: Norm
    mixer: Attention | GatedDeltaNet
    post_norm: Norm
    mlp: MLP | MoE

    def __call__(
        self, h: Tensor, step: Step, previous_delta: Tensor | ExpertTerms | None = None
    ) -> tuple[Tensor, Tensor, Tensor | ExpertTerms]:
        """(stream, h, delta): the residual stream this layer reads (the previous layer's output: h plus
        `previous_delta`, added by this layer's input norm), the stream after the mixer's add, and the MLP's
        output, which the next norm adds (fused with it: Norm.add). A reader of a layer's output (a drafter's taps)
        takes the next layer's `stream`: the one addition every step makes, with or without taps."""
        stream, x = (h, self.input_norm(h)) if previous_delta is None else self.input_norm.add(h, previous_delta)
        h, x = self.post_norm.add(stream, step.reduce(self.mixer(x, step)))
        return stream, h, step.reduce(self.mlp.delta(x))


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
