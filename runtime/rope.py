"""Rotary position embedding: the inverse frequencies a config asks for, and their rotation of q and k.

transformers' conventions: NeoX pairing (dim j with j + rotary_dim/2, "rotate_half"), only the first
`rotary_dim = head_dim * partial_rotary_factor` dims of a head rotate, cos/sin scaled by the rope type's
attention factor. Qwen3.5/3.6's M-RoPE gives each frequency slot the T, H or W row of a [3, T] position
grid; for text all three rows are the token index, so it is exactly this 1-D rope (targets.md §3.2) and
`mrope_section` has nothing to choose.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from specpair.checkpoint.config import ModelConfig
from specpair.runtime.kernels import qk

ROPE_TYPES = ("default", "linear", "llama3", "yarn")


def rope_type(config: ModelConfig) -> str:
    return (config.rope_scaling or {}).get("rope_type", "default")


def inverse_frequencies(config: ModelConfig) -> tuple[Tensor, float]:
    """(inv_freq [rotary_dim / 2] float32, attention factor), as transformers' ROPE_INIT_FUNCTIONS compute them."""
    dim, base = config.rotary_dim, config.rope_theta
    params = config.rope_scaling or {}
    kind = rope_type(config)
    exponents = torch.arange(0, dim, 2, dtype=torch.int64).float() / dim
    inv_freq = 1.0 / (base**exponents)
    if kind == "default":
        return inv_freq, 1.0
    if kind == "linear":
        return inv_freq / params["factor"], 1.0
    if kind == "llama3":
        return _llama3(inv_freq, params), 1.0
    if kind == "yarn":
        return _yarn(inv_freq, exponents, dim, base, params, config.max_position_embeddings)
    raise ValueError(f"rope type {kind!r} is not one of {ROPE_TYPES}")


def _llama3(inv_freq: Tensor, params: dict) -> Tensor:
    factor, low, high = params["factor"], params["low_freq_factor"], params["high_freq_factor"]
    old_context = params["original_max_position_embeddings"]
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > old_context / low, inv_freq / factor, inv_freq)
    smooth = (old_context / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < old_context / high) * ~(wavelen > old_context / low)
    return torch.where(medium, smoothed, scaled)


def _yarn(
    inv_freq: Tensor, exponents: Tensor, dim: int, base: float, params: dict, max_positions: int | None
) -> tuple[Tensor, float]:
    original = params["original_max_position_embeddings"]
    factor = params.get("factor") or max_positions / original

    def mscale(scale: float, m: float = 1.0) -> float:
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    attention = params.get("attention_factor")
    if attention is None:
        m, m_all = params.get("mscale"), params.get("mscale_all_dim")
        attention = mscale(factor, m) / mscale(factor, m_all) if m and m_all else mscale(factor)
    fast, slow = params.get("beta_fast") or 32, params.get("beta_slow") or 1

    def correction_dim(rotations: float) -> float:
        return dim * math.log(original / (rotations * 2 * math.pi)) / (2 * math.log(base))

    low, high = correction_dim(fast), correction_dim(slow)
    if params.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001  # transformers' guard against a zero-width ramp
    ramp = torch.clamp((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low), 0, 1)
    extrapolation = 1 - ramp
    positional = base**exponents
    interpolated = 1.0 / (factor * positional)
    return interpolated * (1 - extrapolation) + (1.0 / positional) * extrapolation, float(attention)


class Rope:
    """cos/sin for explicit positions, and their rotation of [B, T, heads, head_dim] tensors."""

    def __init__(self, config: ModelConfig, device: torch.device | str) -> None:
        inv_freq, self.attention_factor = inverse_frequencies(config)
        self.inv_freq = inv_freq.to(device)
        self.rotary_dim = config.rotary_dim

    def tables(self, positions: Tensor) -> tuple[Tensor, Tensor]:
        """cos, sin [B, T, 1, rotary_dim] float32 for positions [B, T]."""
        freqs = positions[..., None].float() * self.inv_freq
        angles = torch.cat((freqs, freqs), dim=-1)[:, :, None, :]
        return angles.cos() * self.attention_factor, angles.sin() * self.attention_factor

    def rotate(self, x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
        """x [B, T, heads, head_dim] with its first rotary_dim dims rotated (in float32, cast back)."""
        return qk.rotate(x, cos, sin, self.rotary_dim)
