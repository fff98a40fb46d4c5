"""Choosing the next token from logits: greedy, or temperature with optional top-k / top-p, seeded.

Sampled draws are keyed, not streamed: the noise that picks the token at absolute position P is a hash of
(seed, P, token id) (TensorFold's rule), Gumbel-max over the sampling distribution. So a token's draw depends
on neither the other sequences of its batch nor how many draws came before it: a seeded prompt alone, inside a
batch, decoded one token a step or verified a block at a time (the speculative loop) picks the same tokens.
The hash is integer arithmetic, the same bits on every device.
"""

from __future__ import annotations

from dataclasses import dataclass

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
        if self.top_k and self.top_k < scores.shape[-1]:
            kth = torch.topk(scores, self.top_k, dim=-1).values[..., -1:]
            scores = scores.masked_fill(scores < kth, float("-inf"))
        if self.top_p < 1.0:
            ordered, order = torch.sort(scores, dim=-1)  # ascending: the tail to drop comes first
            tail = torch.softmax(ordered, dim=-1).cumsum(dim=-1) <= 1 - self.top_p
            tail[..., -1] = False
            scores = scores.masked_fill(tail.scatter(-1, order, tail), float("-inf"))
        return torch.softmax(scores, dim=-1)

    def choose(self, logits: Tensor, positions: Tensor) -> Tensor:
        """The token at each of `positions` [...] from the logits that predict it [..., V] -> [...] int64."""
        if self.greedy:
            return logits.argmax(dim=-1)
        return keyed_sample(self.probabilities(logits), gumbel(self.seed, TOKEN_STREAM, positions, logits.shape[-1]))


def keyed_sample(probs: Tensor, noise: Tensor) -> Tensor:
    """Gumbel-max: argmax(log p + noise) over the tokens p allows, which draws from p."""
    return torch.where(probs > 0, probs.log() + noise, float("-inf")).argmax(dim=-1)


def gumbel(seed: int, stream: int, positions: Tensor, width: int) -> Tensor:
    """Gumbel noise [..., width] float32 for token ids 0..width-1 at `positions` [...]."""
    return -torch.log(-torch.log(uniform(seed, stream, positions, torch.arange(width, device=positions.device))))


def uniform(seed: int, stream: int, positions: Tensor, ids: Tensor) -> Tensor:
    """Uniform (0, 1) float32 values keyed by (seed, stream, position, id), broadcast as positions[..., None]
    against ids: 24 bits of a 32-bit hash (murmur3's finalizer, chained)."""
    key = _mix32((seed ^ (seed >> 32) ^ (stream * 0x9E3779B9)) & _MASK32)  # a Python int: nothing copied to the device
    h = _mix32(key ^ (positions.to(torch.int64)[..., None] & _MASK32))
    h = _mix32(h ^ (ids.to(torch.int64) & _MASK32))
    return ((h >> 8).float() + 0.5) / float(1 << 24)


def _mix32(x: Tensor | int) -> Tensor | int:
    x = x ^ (x >> 16)
    x = _mul32(x, 0x85EBCA6B)
    x = x ^ (x >> 13)
    x = _mul32(x, 0xC2B2AE35)
    return x ^ (x >> 16)


def _mul32(x: Tensor | int, c: int) -> Tensor | int:
    """x * c mod 2^32 for x < 2^32 in int64 without overflow: the constant in 16-bit halves."""
    low = x * (c & 0xFFFF)
    high = ((x * (c >> 16)) & 0xFFFF) << 16
    return (low + high) & _MASK32
