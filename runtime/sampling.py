"""Choosing the next token from logits: greedy, or temperature with optional top-k / top-p, seeded.

Sampled draws are keyed, not streamed: the noise that picks the token at absolute position P is a hash of
(seed, P, token id) (TensorFold's rule), Gumbel-max over the sampling distribution. So a token's draw depends
on neither the other sequences of its batch nor how many draws came before it: a seeded prompt alone, inside a
batch, decoded one token a step or verified a block at a time (the speculative loop) picks the same tokens.
The hash is integer arithmetic, the same bits on every device.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

TOKEN_STREAM = 0  # the noise that picks a sequence's tokens; other streams (runtime/acceptance.py) are independent
_MASK32 = 0xFFFFFFFF


@dataclass(frozen=True)
class Sampling:
    temperature: float = 0.0  # 0: greedy
    top_k: int = 0  # 0: all tokens
    top_p: float = 1.0
    seed: int = 0

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    def probabilities(self, logits: Tensor) -> Tensor:
        """The distribution sampled from, [..., V] float32: softmax(logits / T) restricted to the top-k tokens and
        to the smallest set whose mass reaches top_p (transformers' warpers; at least one token survives)."""
        scores = logits.float() / self.temperature
        best = None
        if self.top_k and self.top_k < scores.shape[-1]:
            best = torch.topk(scores, self.top_k, dim=-1)
            scores = scores.masked_fill(scores < best.values[..., -1:], float("-inf"))
        if self.top_p < 1.0:
            scores = scores.masked_fill(self._top_p_tail(scores, best), float("-inf"))
        return torch.softmax(scores, dim=-1)

    def _top_p_tail(self, scores: Tensor, best: torch.return_types.topk | None) -> Tensor:
        """Where the tokens outside top-p's set are: those of the lowest scores whose mass stays within 1 - top_p.
        On the CPU after top-k (`best`: its topk, a row's k best in descending order: what the row kept, but for
        ties), a row at a time, only the tokens top-k kept in it are sorted, not the whole vocabulary (SmolLM2's
        49,152: 0.5 ms a row); a row's sums have its own length whatever the other rows kept, so its bits are its
        own. On CUDA every row whole, in fixed shapes (CUDA graphs)."""
        if scores.is_cuda or best is None:
            ordered, order = torch.sort(scores, dim=-1)  # ascending: the tail to drop comes first
            tail = self._tail_of(ordered)
            return tail.scatter(-1, order, tail)
        flat = scores.reshape(-1, scores.shape[-1])
        values, indices = best.values.reshape(-1, self.top_k), best.indices.reshape(-1, self.top_k)
        outside = torch.ones_like(flat, dtype=torch.bool)
        for row, kept in enumerate((flat > float("-inf")).sum(dim=-1).tolist()):
            top = (values[row], indices[row]) if kept == self.top_k else flat[row].topk(kept)
            outside[row, top[1].flip(0)] = self._tail_of(top[0].flip(0))
        return outside.view(scores.shape)

    def _tail_of(self, ordered: Tensor) -> Tensor:
        """Over scores in ascending order: those whose mass, with all below them, stays within 1 - top_p."""
        tail = torch.softmax(ordered, dim=-1).cumsum(dim=-1) <= 1 - self.top_p
        tail[..., -1] = False
        return tail

    def choose(self, logits: Tensor, positions: Tensor) -> Tensor:
        """The token at each of `positions` [...] from the logits that predict it [..., V] -> [...] int64."""
        if self.greedy:
            return greedy_choice(logits)
        return keyed_choice(self.probabilities(logits), self.seed, TOKEN_STREAM, positions)


def greedy_choice(logits: Tensor) -> Tensor:
    """Each row's most likely token [..., V] -> [...], the first of equal largest logits (argmax's rule). On the CPU
    as max's indices, which follow the same rule (torch documents both) at a quarter of argmax's time: 0.2 against
    1.0 ms over a drafter's 12 bf16 rows of SmolLM2's 49,152 tokens."""
    return logits.argmax(dim=-1) if logits.is_cuda else logits.max(dim=-1).indices


def keyed_sample(probs: Tensor, noise: Tensor) -> Tensor:
    """Gumbel-max: argmax(log p + noise) over the tokens p allows, which draws from p."""
    return torch.where(probs > 0, probs.log() + noise, float("-inf")).argmax(dim=-1)


def keyed_choice(probs: Tensor, seed: int, stream: int, positions: Tensor) -> Tensor:
    """keyed_sample(probs, gumbel(seed, stream, positions, V)), the same token. On the CPU the noise is made only for
    the tokens that can win: one whose log p is more than REACH below its row's largest cannot, since noise spans
    less than REACH (SmolLM2's rows of 49,152 tokens on the built-in prompts keep a median of 2,000-3,300 at
    temperature 0.7 and 18,000-27,000 at 1.0; top-k 40, at most its ties). On CUDA every token's, in fixed shapes
    (CUDA graphs)."""
    width = probs.shape[-1]
    if probs.is_cuda:
        return keyed_sample(probs, gumbel(seed, stream, positions, width))
    flat = probs.reshape(-1, width)
    # log p >= log max - REACH, compared as probabilities: no log of every token (a p of 0 is never a candidate)
    row, ids = (flat >= flat.amax(dim=-1, keepdim=True) * math.exp(-REACH)).nonzero(as_tuple=True)
    at = positions.expand(probs.shape[:-1]).reshape(-1)[row]  # gumbel broadcasts positions against the rows too
    scores = flat[row, ids].log() + gumbel_of(seed, stream, at, ids[:, None])[:, 0]
    rows = flat.shape[0]
    best = torch.full((rows,), float("-inf")).scatter_reduce(0, row, scores, "amax")
    won = scores == best[row]
    first = torch.full((rows,), width, dtype=torch.int64).scatter_reduce(0, row[won], ids[won], "amin")  # argmax's tie
    return first.reshape(probs.shape[:-1])


def gumbel(seed: int, stream: int, positions: Tensor, width: int) -> Tensor:
    """Gumbel noise [..., width] float32 for token ids 0..width-1 at `positions` [...]."""
    return gumbel_of(seed, stream, positions, torch.arange(width, device=positions.device))


def gumbel_of(seed: int, stream: int, positions: Tensor, ids: Tensor) -> Tensor:
    """Gumbel noise for token `ids` at `positions`, broadcast as `uniform`'s."""
    return -torch.log(-torch.log(uniform(seed, stream, positions, ids)))


# 23, not 24: every (k + 1/2) / 2^23 is a float32 below 1, where the top value of 24 bits, 1 - 2^-25, rounds to 1.0,
# whose Gumbel noise is +inf: a draw over 49,152 allowed tokens then took a token at random 0.3 % of the time
UNIFORM_BITS = 23


def _gumbel_of(u: float) -> float:
    return -math.log(-math.log(u))


# the widest spread of keyed noise (uniform's values run from 2^-24 to 1 - 2^-24: 19.4), plus a margin far above
# float32's rounding of the logs: keyed_choice's candidates
REACH = _gumbel_of(1 - 0.5 / (1 << UNIFORM_BITS)) - _gumbel_of(0.5 / (1 << UNIFORM_BITS)) + 1.0


def uniform(seed: int, stream: int, positions: Tensor, ids: Tensor) -> Tensor:
    """Uniform (0, 1) float32 values keyed by (seed, stream, position, id), broadcast as positions[..., None]
    against ids: UNIFORM_BITS bits of a 32-bit hash (murmur3's finalizer, chained), (k + 1/2) / 2^UNIFORM_BITS."""
    key = _mix32((seed ^ (seed >> 32) ^ (stream * 0x9E3779B9)) & _MASK32)  # a Python int: nothing copied to the device
    if positions.device.type == ids.device.type == "cpu":
        # numpy's uint32 products wrap modulo 2^32 as the hash's do: a sixth of the int64 ops' time (100,000 keys,
        # 0.6 ms against 4: a sampled row of SmolLM2 on the CPU hashes 3,000-30,000), the same bits
        h = _mix32(np.uint32(key) ^ positions.numpy().astype(np.uint32)[..., None])
        h = _mix32(h ^ ids.numpy().astype(np.uint32))
        top = torch.from_numpy((h >> np.uint32(32 - UNIFORM_BITS)).astype(np.float32))
    else:
        h = _mix32(key ^ (positions.to(torch.int64)[..., None] & _MASK32))
        top = (_mix32(h ^ (ids.to(torch.int64) & _MASK32)) >> (32 - UNIFORM_BITS)).float()
    return (top + 0.5) / float(1 << UNIFORM_BITS)


def _mix32(x: Tensor | np.ndarray | int) -> Tensor | np.ndarray | int:
    """murmur3's 32-bit finalizer."""
    x = x ^ (x >> 16)
    x = _mul32(x, 0x85EBCA6B)
    x = x ^ (x >> 13)
    x = _mul32(x, 0xC2B2AE35)
    return x ^ (x >> 16)


def _mul32(x: Tensor | np.ndarray | int, c: int) -> Tensor | np.ndarray | int:
    """x * c mod 2^32: numpy's uint32 products wrap; for x < 2^32 in int64 (a tensor or a Python int), without
    overflow, the constant in 16-bit halves."""
    if isinstance(x, np.ndarray):
        return x * np.uint32(c)
    low = x * (c & 0xFFFF)
    high = ((x * (c >> 16)) & 0xFFFF) << 16
    return (low + high) & _MASK32
