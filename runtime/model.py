"""The target model: embedding, decoder layers (one family file says which blocks), final norm, head — and the
one step function every use goes through.

    out = model.forward(tokens, positions, cache, taps=(1, 10), hidden=True, verify=True)
    out.pending.commit(accepted)

`forward` runs T tokens for each of B sequences: decode (T = 1), a verify block (T = block size), a prefill
chunk. tokens and positions are [B, T]; sequences may be at different positions (row b of the cache is
sequence b; a step over B rows uses rows 0..B-1); position p of sequence b attends to its positions <= p
(within the window on sliding layers). It returns a `StepOutput`:
  - logits [B, T, V] (model dtype), unless `logits=False` (then apply `head` to the rows you need);
  - taps [B, T, len(taps) * H]: the residual stream after each listed decoder layer (k = "output of decoder
    layer k", before the final norm; transformers' hidden_states[k + 1]), concatenated in the order given;
  - hidden [B, T, H] with `hidden=True`: the final normed hidden state, what the head and MTP read.
Taps and hidden cost nothing when not asked. With `verify=True` the step is provisional: `out.pending` is decided
before the cache takes another step, `out.pending.commit(accepted)` or `out.pending.discard()` (runtime/cache.py:
KV and Gated DeltaNet state rolled back to any prefix 0..T).
`embed(tokens)` and `head(hidden)` are the model's own embedding lookup and lm_head (the tied embedding
where there is no lm_head), callable on their own (DFlash drafts through them).

Every op is batch-invariant (runtime/blocks.py): a row's logits have the same bits whether it runs alone,
beside other sequences, or inside a verify block, which is what lets a speculative run demand bit-equality.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from specpair.checkpoint.config import ModelConfig
from specpair.runtime.blocks import DecoderLayer, Fetch, Norm, Step, Weight, project
from specpair.runtime.cache import Cache, Pending
from specpair.runtime.parallel import SINGLE, Parallel
from specpair.runtime.rope import Rope


def shard_rows(shard: Tensor, tokens: Tensor, start: int, vocab: int) -> Tensor:
    """[B, T] ids -> [B, T, H]: the rows of a vocabulary shard holding ids start.. (the table's own for ids in it,
    zeros for other ids of the vocabulary), so the shards' sum is the whole table's lookup. An id outside the
    vocabulary keeps an index outside every shard and fails on each, as the whole table's lookup does."""
    local = tokens - start
    mine = (local >= 0) & (local < shard.shape[0])
    elsewhere = (tokens >= 0) & (tokens < vocab) & ~mine
    rows = torch.nn.functional.embedding(local.masked_fill(elsewhere, 0), shard)
    return rows * mine[..., None]


@dataclass
class StepOutput:
    logits: Tensor | None  # [B, T, V]
    taps: Tensor | None  # [B, T, len(taps) * H]
    hidden: Tensor | None  # [B, T, H], final normed
    pending: Pending | None = None  # a verify step's decision, to be taken (runtime/cache.py)


class Transformer:
    def __init__(
        self,
        config: ModelConfig,
        embed_tokens: Tensor,
        layers: list[DecoderLayer],
        norm: Norm,
        lm_head: Weight,
        rope: Rope,
        dtype: torch.dtype,
        device: torch.device,
        parallel: Parallel = SINGLE,
    ) -> None:
        self.config, self.embed_tokens, self.layers, self.norm = config, embed_tokens, layers, norm
        self.lm_head, self.rope, self.dtype, self.device = lm_head, rope, dtype, device
        self.parallel = parallel  # this rank's shard (config: its heads and widths; embed and head: its vocab rows)
        self.vocab_rows = parallel.slice(config.vocab_size, "vocab_size")

    @classmethod
    def build(
        cls,
        config: ModelConfig,
        decoder_layer: Callable[..., DecoderLayer],
        fetch: Fetch,
        dtype: torch.dtype,
        device: torch.device,
        parallel: Parallel = SINGLE,
    ) -> Transformer:
        """The model from `fetch` (blocks.py), with `decoder_layer(config, i, fetch, rope)` from a family file;
        with `parallel`, `config` is this rank's (Parallel.config) and fetch gives its shard of each weight."""
        rope = Rope(config, device)
        shape = (config.vocab_size // parallel.size, config.hidden_size)
        embed = fetch("embed_tokens.weight", shape)
        layers = [decoder_layer(config, i, fetch, rope) for i in range(config.num_layers)]
        norm = Norm.build(config, "norm.weight", config.hidden_size, fetch)
        head = embed if config.tie_word_embeddings else fetch("lm_head.weight", shape, matmul=True)
        return cls(config, embed, layers, norm, head, rope, dtype, device, parallel)

    def new_cache(self, batch: int, context: int) -> Cache:
        return Cache(self.config, batch, context, self.dtype, self.device)

    def embed(self, tokens: Tensor) -> Tensor:
        """[B, T] ids -> [B, T, H] (no scaling: none of these families scales its embedding). Under tensor
        parallelism a token's row is on one rank; the others give zeros, and the sum is that row, exactly. An id
        outside the vocabulary fails (an index error; a device assert on CUDA) where indexing would wrap a -1 to the
        last row unseen (eugr/spark-vllm-docker#308: placeholder draft ids reaching the embedding)."""
        if self.parallel.size == 1:
            return torch.nn.functional.embedding(tokens, self.embed_tokens)
        return self.parallel.reduce(
            shard_rows(self.embed_tokens, tokens, self.vocab_rows.start, self.config.vocab_size)
        )

    def head(self, hidden: Tensor) -> Tensor:
        """Final normed hidden [..., H] -> logits [..., V] (every rank's vocabulary slice, gathered)."""
        return self.parallel.gather(project(hidden, self.lm_head))

    def forward(
        self,
        tokens: Tensor,
        positions: Tensor,
        cache: Cache,
        *,
        taps: Sequence[int] = (),
        hidden: bool = False,
        logits: bool = True,
        verify: bool = False,
    ) -> StepOutput:
        if tokens.shape != positions.shape or tokens.ndim != 2:
            raise ValueError(f"tokens {list(tokens.shape)} and positions {list(positions.shape)} must both be [B, T]")
        wanted = {k: None for k in taps}
        if any(not 0 <= k < len(self.layers) for k in wanted):
            raise ValueError(f"taps {list(taps)} are not all layers of 0..{len(self.layers) - 1}")
        pending = cache.begin(positions, verify)
        cos, sin = self.rope.tables(positions)
        step = Step.of(positions, cos, sin, cache, pending, self.parallel.reduce)
        h, delta = self.embed(tokens), None
        for i, layer in enumerate(self.layers):
            stream, h, delta = layer(h, step, delta)
            if i - 1 in wanted:  # layer i - 1's output, as this layer's input norm added it: taps change no bit
                wanted[i - 1] = stream
        h, normed = self.norm.add(h, delta)
        if len(self.layers) - 1 in wanted:
            wanted[len(self.layers) - 1] = h
        return StepOutput(
            self.head(normed) if logits else None,
            torch.cat([wanted[k] for k in taps], dim=-1) if taps else None,
            normed if hidden else None,
            pending,
        )
