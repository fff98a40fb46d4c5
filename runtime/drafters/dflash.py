"""DFlash and DFlash2 drafters (dflash.md §3): one forward over a block of mask tokens drafts a whole round.

Context. For every committed position p the target's taps (the residual stream after layers
target_layer_ids, concatenated) become c_p = hidden_norm(fc(taps_p)), and each draft layer l stores
K_l[p] = rope_p(k_norm(W_k c_p)), V_l[p] = W_v c_p in the drafter's own static cache, once, when p is committed
(`observe`); c_p feeds every layer's k/v projection directly, never a layer's input. The context of a round's
verify block waits for the next proposal, whose products take its rows beside the block's (each layer's q|k|v reads
its weight once a round, not twice; on a GPU the rows share one tile of the matmul, whose rows do not change each
other's bits); its rows past what the target kept store nothing, as the block writes those positions in the same
kernel. Any other step (a prompt's chunks) is stored when observed.

Block. A round at anchor position s runs [anchor, mask x (B - 1)] at positions s .. s+B-1: the target's raw
embedding rows (times input_embedding_scale; the rows of mask_token_id are the drafter's shipped mask embedding
where it has one, substituted on the side of the scale its kind's MaskEmbedding row says, docs/drafters.md) through
the draft layers (pre-norm Qwen3 blocks; DFlash2 adds its convolutions, dflash2.py), each query attending to the
context before s and to the block, whose K/V are written at their positions for this forward only. Within the block,
`is_causal` applies to every layer when the config sets it; otherwise full-attention layers are bidirectional and
sliding ones causal (z-lab's rule). A sliding layer's query at p sees keys p - W < k (and k < p + W when
bidirectional), as z-lab, SGLang and vLLM mask them. MuseGlimmer assistants follow transformers, their reference:
bidirectional on every layer, and a window that reaches |p - k| <= W. Rows 1..B-1 are read out through the target's
head, times output_multiplier, soft-capped by final_logit_softcapping: DFlash drafts each row's argmax, DFlash2
walks its candidate selector.

Cache hygiene without rollback: block K/V at s..s+B-1 are overwritten by the next round's block, which covers
s'..s'+B-1, before its attention reads them; the context of rejected verify rows (at positions at or after the next
anchor s') is not stored with that block (those rows have no position), and where a verify block's context is
stored at once (no proposal followed its observation) the next block overwrites those rows as it does its own;
nothing at or beyond s'+B is read.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from specpair.checkpoint.config import ModelConfig
from specpair.checkpoint.families import DRAFTER_KINDS
from specpair.errors import BadInput
from specpair.runtime.blocks import MLP, Fetch, Norm, Projections, Weight, optional_bias, project
from specpair.runtime.cache import Cache
from specpair.runtime.drafters import Committed, Drafting, Proposal
from specpair.runtime.drafters.dflash2 import CandidateSelector, DynamicConv
from specpair.runtime.drafters.weights import load_weights
from specpair.runtime.graphs import StepGraphs
from specpair.runtime.kernels import attention, qk
from specpair.runtime.kernels.linear import SplitSums
from specpair.runtime.model import Transformer
from specpair.runtime.rope import Rope
from specpair.sources.model import Model

BIDIRECTIONAL_ARCHITECTURES = ("MuseGlimmerAssistantModel", "DFlashMuseGlimmerAssistantModel")


@dataclass
class DFlashLayer:
    layer: int
    input_norm: Norm
    post_norm: Norm
    qkv: Projections  # q|k|v, one product where they fuse: the block's rows, and the context's (their k and v)
    o_proj: Weight
    o_bias: Tensor | None
    q_norm: Norm
    k_norm: Norm
    mlp: MLP
    heads: int
    kv_heads: int
    head_dim: int
    causal: bool
    reach: int | None  # sliding layers: the farthest a key may sit from its query, |q - k| <= reach
    attention_conv: DynamicConv | None
    mlp_conv: DynamicConv | None

    @classmethod
    def build(cls, config: ModelConfig, i: int, fetch: Fetch, causal: bool | None, inclusive: bool) -> DFlashLayer:
        """causal: every layer's in-block causality, or None for z-lab's rule (sliding causal, full not);
        inclusive: a window of W reaches W positions away (transformers' bidirectional mask), not W - 1."""
        p, hidden = f"layers.{i}.", config.hidden_size
        heads, kv, d = config.num_heads, config.num_kv_heads, config.head_dim
        shapes = {
            "q_proj": (heads * d, hidden),
            "k_proj": (kv * d, hidden),
            "v_proj": (kv * d, hidden),
            "o_proj": (hidden, heads * d),
        }
        weights = [fetch(f"{p}self_attn.{k}.weight", s, matmul=True) for k, s in shapes.items()]
        biases = [
            optional_bias(config.attention_bias, fetch, f"{p}self_attn.{k}.weight", s[0]) for k, s in shapes.items()
        ]
        sliding = config.layer_types[i] == "sliding"
        dflash2 = config.drafter.kind == "dflash2"
        return cls(
            i,
            Norm.build(config, p + "input_layernorm.weight", hidden, fetch),
            Norm.build(config, p + "post_attention_layernorm.weight", hidden, fetch),
            Projections.of(weights[:3], biases[:3]),
            weights[3],
            biases[3],
            Norm.build(config, p + "self_attn.q_norm.weight", d, fetch),
            Norm.build(config, p + "self_attn.k_norm.weight", d, fetch),
            MLP.build(config, p + "mlp.", config.intermediate_size, fetch),
            heads,
            kv,
            d,
            sliding if causal is None else causal,
            (config.sliding_window - (0 if inclusive else 1)) if sliding else None,
            DynamicConv.build(config, p + "attention_conv.", fetch) if dflash2 else None,
            DynamicConv.build(config, p + "mlp_conv.", fetch) if dflash2 else None,
        )

    def store_context(self, c: Tensor, positions: Tensor, cos: Tensor, sin: Tensor, rope: Rope, cache: Cache) -> None:
        """The context rows' k and v, normed and rotated, into the cache at their positions: q|k|v's one product and
        one kernel, no queries (the k and v products alone and their norm, rotation and store took ~13 launches a
        layer)."""
        self.queries(c, positions, cos, sin, rope, cache, context_rows=c.shape[1])

    def queries(
        self, x: Tensor, positions: Tensor, cos: Tensor, sin: Tensor, rope: Rope, cache: Cache, context_rows: int = 0
    ) -> Tensor:
        """x's rows through q|k|v: their k and v stored in the cache at `positions` (none at a negative one), the q
        of the rows from context_rows on returned, each normed and rotated (q|k|v's partials added where the qk
        kernel reads them)."""
        B, T, _ = x.shape
        q, k, v = self.qkv(x, unsummed=True)
        return qk.rotate_and_store(
            q.view(B, T, self.heads, self.head_dim),
            k.view(B, T, self.kv_heads, self.head_dim),
            v.view(B, T, self.kv_heads, self.head_dim),
            self.q_norm.weight,
            self.k_norm.weight,
            self.q_norm.eps,
            self.q_norm.zero_centred,
            cos,
            sin,
            rope.rotary_dim,
            cache.kv,
            cache.slots[self.layer],
            positions,
            context_rows,
        )

    def span(self, positions: Tensor, block_end: Tensor) -> tuple[Tensor, Tensor]:
        """The cache range [start, end) each block row's query reads, for layers of this causality and reach."""
        end = positions + 1 if self.causal else block_end[:, None].expand_as(positions)
        start = torch.zeros_like(positions)
        if self.reach is not None:
            start = (positions - self.reach).clamp(min=0)
            if not self.causal:
                end = torch.minimum(end, positions + self.reach + 1)
        return start, end

    def __call__(
        self,
        h: Tensor,
        delta: Tensor | SplitSums | None,
        positions: Tensor,
        span: tuple[Tensor, Tensor],
        cos: Tensor,
        sin: Tensor,
        rope: Rope,
        cache: Cache,
        context: Tensor | None = None,
    ) -> tuple[Tensor, Tensor]:
        """(the residual stream, what this layer adds to it): the next layer's input norm adds it, as the
        target's layers do (one kernel for the add and the norm), the last one's the drafter's final norm.
        `context` [B, Tc, H]: context rows stored by the block's q|k|v product, before its rows (`positions`, `cos`
        and `sin` then cover both)."""
        B, T, _ = h.shape
        h, x = (h, self.input_norm(h)) if delta is None else self.input_norm.add(h, delta)
        if self.attention_conv is not None:
            x, coefficients = self.attention_conv.prepare(x)
        if context is None:
            q = self.queries(x, positions, cos, sin, rope, cache)
        else:
            q = self.queries(torch.cat((context, x), dim=1), positions, cos, sin, rope, cache, context.shape[1])
        slot = cache.slots[self.layer]
        o = attention.attention(q, cache.kv[0, slot, :B], cache.kv[1, slot, :B], *span, self.head_dim**-0.5)
        # o_proj's and the MLP's partials added where they are read: by DFlash2's convolution, or by the next norm
        y = project(o.reshape(B, T, -1), self.o_proj, self.o_bias, unsummed=True)
        if self.attention_conv is not None:
            y = self.attention_conv.finish(y, coefficients, T)
        h, x = self.post_norm.add(h, y)
        if self.mlp_conv is not None:
            x, coefficients = self.mlp_conv.prepare(x)
        y = self.mlp(x, unsummed=True)
        if self.mlp_conv is not None:
            y = self.mlp_conv.finish(y, coefficients, T)
        return h, y


class DFlash:
    hidden = False

    def __init__(
        self,
        config: ModelConfig,
        target: Transformer,
        fc: Weight,
        hidden_norm: Norm,
        layers: list[DFlashLayer],
        norm: Norm,
        selector: CandidateSelector | None,
        mask_embedding: Tensor | None = None,
    ) -> None:
        d = config.drafter
        self.kind, self.config, self.target = d.kind, config, target
        self.fc, self.hidden_norm, self.layers, self.norm, self.selector = fc, hidden_norm, layers, norm, selector
        self.taps = d.target_layer_ids
        self.block_size = d.block_size or DRAFTER_KINDS[d.kind].block_size
        self.mask_token_id = d.mask_token_id
        self.mask_embedding = mask_embedding  # [H]: the block's mask rows, in place of the target's row
        shipped = DRAFTER_KINDS[d.kind].mask_embedding
        self.mask_before_scale = shipped is None or shipped.before_scale
        self.embedding_scale = d.input_embedding_scale
        self.multiplier, self.softcap = d.output_multiplier, d.final_logit_softcapping
        self.max_positions = config.max_position_embeddings
        self.samples = DRAFTER_KINDS[d.kind].samples
        self.rope = Rope(config, target.device)
        self.cache: Cache | None = None
        self.drafting: StepGraphs | None = None  # `_drafted`: a proposal, with the context that waits for it
        self.pending: tuple[Tensor, Tensor, Tensor] | None = None  # a round's context: taps, positions, kept
        self.round = 0  # rows of a round's block: drafts + 1

    @classmethod
    def load(cls, model: Model, target: Transformer, bits: int | None = None) -> DFlash:
        config = model.config
        check_pair(model, target)
        d = config.drafter
        muse = config.architecture in BIDIRECTIONAL_ARCHITECTURES
        causal = False if d.is_causal is None and muse else d.is_causal
        mask = shipped_mask_embedding(model)

        def build(fetch: Fetch) -> DFlash:
            fc = fetch(
                "fc.weight", (config.hidden_size, len(d.target_layer_ids) * target.config.hidden_size), matmul=True
            )
            layers = [DFlashLayer.build(config, i, fetch, causal, muse) for i in range(config.num_layers)]
            selector = CandidateSelector.build(config, fetch) if d.kind == "dflash2" else None
            return cls(
                config,
                target,
                fc,
                Norm.build(config, "hidden_norm.weight", config.hidden_size, fetch),
                layers,
                Norm.build(config, "norm.weight", config.hidden_size, fetch),
                selector,
                fetch(mask, model.shape(mask)).reshape(-1) if mask else None,
            )

        return load_weights(model, build, target.device, target.dtype, bits)

    def start(self, batch: int, context: int, graphs: bool = False) -> None:
        self.cache = Cache(self.config, batch, context, self.target.dtype, self.target.device)
        self.drafting = StepGraphs(self._drafted, graphs)
        self.pending = None
        self.round = 0

    def reorder(self, order: Tensor) -> None:
        self.cache.reorder(order)
        if self.pending is not None:  # the rows of the last step, whose order moves within them
            self.pending = tuple(t[order[: t.shape[0]]] for t in self.pending)

    def observe(self, committed: Committed) -> None:
        """A round's verify block (as wide as the last proposal's) waits for the next proposal; a prompt's chunk
        is stored now."""
        self.flush()
        if committed.tokens.shape[1] == self.round:
            self.pending = (committed.taps, committed.positions, committed.kept)
        else:
            self._context(committed.taps, committed.positions)

    def flush(self) -> None:
        """Store the context that waits for a proposal now (an observation that no proposal followed)."""
        if self.pending is not None:
            taps, positions, _ = self.pending
            self.pending = None
            self._context(taps, positions)

    def _context(self, taps: Tensor, positions: Tensor) -> None:
        c = self.hidden_norm(project(taps, self.fc))
        cos, sin = self.rope.tables(positions)
        for layer in self.layers:
            layer.store_context(c, positions, cos, sin, self.rope, self.cache)

    def block(
        self, anchors: Tensor, positions: Tensor, size: int, context: tuple[Tensor, ...] = ()
    ) -> tuple[Tensor, Tensor]:
        """The normed output rows [B, size, H] of the block [anchor, mask x (size - 1)] at positions .. + size,
        and the block's positions [B, size]. `context`: a verify block's taps [B, T, n·H], positions [B, T] and
        kept rows [B], stored by the block's products (the rows past kept at no position)."""
        batch = anchors.shape[0]
        ids = torch.full((batch, size), self.mask_token_id, dtype=torch.int64, device=anchors.device)
        ids[:, 0] = anchors
        block_positions = positions[:, None] + torch.arange(size, device=anchors.device)
        h = self.target.embed(ids)
        if self.mask_before_scale:
            h = self._masked(ids, h)
        if self.embedding_scale is not None:
            h = h * self.embedding_scale
        if not self.mask_before_scale:
            h = self._masked(ids, h)
        c, rows = None, block_positions
        if context:
            taps, at, kept = context
            c = self.hidden_norm(project(taps, self.fc))
            at = torch.where(torch.arange(at.shape[1], device=at.device) < kept[:, None], at, -1)
            rows = torch.cat((at, block_positions), dim=1)
        cos, sin = self.rope.tables(rows)
        end = positions + size
        spans: dict[tuple[bool, int | None], tuple[Tensor, Tensor]] = {}  # once per block, not per layer
        delta = None
        for layer in self.layers:
            key = (layer.causal, layer.reach)
            if key not in spans:
                spans[key] = layer.span(block_positions, end)
            h, delta = layer(h, delta, rows, spans[key], cos, sin, self.rope, self.cache, c)
        return self.norm.add(h, delta)[1], block_positions

    def _masked(self, ids: Tensor, h: Tensor) -> Tensor:
        """The block's embedding rows with those of mask_token_id replaced by the shipped mask embedding, if any (by
        id, as vLLM substitutes it and SGLang's merged table row reads)."""
        if self.mask_embedding is None:
            return h
        return torch.where((ids == self.mask_token_id)[..., None], self.mask_embedding.to(h.dtype), h)

    def logits(self, out: Tensor) -> Tensor:
        logits = self.target.head(out)
        if self.multiplier is not None:
            logits = logits * self.multiplier
        if self.softcap:
            logits = torch.tanh(logits / self.softcap) * self.softcap
        return logits

    def _drafted(self, anchors: Tensor, positions: Tensor, *context: Tensor, size: int, drafting: Drafting) -> Proposal:
        """A whole proposal, the context that waited for it to tokens: on CUDA one graph, the selector's walk and
        the draws included (keyed by position, so they replay)."""
        out, block_positions = self.block(anchors, positions, size, context)
        logits = self.logits(out[:, 1:])
        if self.selector is not None:
            return self.selector.walk(out[:, 1:], logits, anchors, block_positions[:, 1:], drafting)
        return drafting.pick(logits, block_positions[:, 1:])

    def propose(self, anchors: Tensor, positions: Tensor, drafts: int, drafting: Drafting) -> Proposal:
        # the context's live rows: finished sequences were moved behind them (reorder) and propose no more
        context = () if self.pending is None else tuple(t[: anchors.shape[0]] for t in self.pending)
        self.pending = None
        self.round = drafts + 1
        return self.drafting(anchors, positions, *context, size=drafts + 1, drafting=drafting)


def check_pair(model: Model, target: Transformer) -> None:
    """What the forward pass relies on, checked before any weight is read: taps the target has, a block
    embedding and readout in the target's width, a mask token inside its embedding rows."""
    d, config, t = model.config.drafter, model.config, target.config
    if not d.target_layer_ids:
        raise BadInput(model.ref, "has no dflash_config.target_layer_ids: which target layers feed it is unknown")
    if max(d.target_layer_ids) >= t.num_layers or min(d.target_layer_ids) < 0:
        raise BadInput(
            model.ref, f"taps target layers {list(d.target_layer_ids)}, but the target has layers 0..{t.num_layers - 1}"
        )
    if config.hidden_size != t.hidden_size:
        raise BadInput(
            model.ref,
            f"hidden_size {config.hidden_size} differs from the target's {t.hidden_size}: its "
            "block reads the target's embedding and its output the target's head",
        )
    if d.mask_token_id is None or not 0 <= d.mask_token_id < t.vocab_size:
        raise BadInput(
            model.ref, f"mask_token_id {d.mask_token_id} is not a row of the target's embedding (0..{t.vocab_size - 1})"
        )
    if d.kind == "dflash2" and None in (d.conv_kernel_size, d.conv_group_size, d.selector_rank, d.selector_top_k):
        raise BadInput(
            model.ref,
            "is a DFlash2 drafter without all of conv_kernel_size, conv_group_size, selector_rank and selector_top_k",
        )
    if "sliding" in config.layer_types and not config.sliding_window:
        raise BadInput(model.ref, "has sliding_attention layers but no sliding_window")
    mask = shipped_mask_embedding(model)
    if mask and model.shape(mask) not in ((config.hidden_size,), (1, config.hidden_size)):
        raise BadInput(
            model.ref,
            f"weight {mask!r} is {list(model.shape(mask))}, where a mask embedding is [{config.hidden_size}] "
            "(the drafter's hidden_size)",
        )


def shipped_mask_embedding(model: Model) -> str | None:
    """The name of the learned mask embedding among the drafter's weights (its kind's MaskEmbedding row), if it
    ships one in that form; a torch.save file beside them is read only by `convert --from-pickle`."""
    row = DRAFTER_KINDS[model.config.drafter.kind].mask_embedding
    return row.tensor if row is not None and row.tensor in model.maps else None
