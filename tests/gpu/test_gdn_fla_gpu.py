"""The compiled Gated DeltaNet kernel (runtime/kernels/gdn.py) against fla-core's fused recurrent gated delta rule
(flash-linear-attention 0.6.0, carried to the GPU machine in .device/wheels): the kernels transformers runs for
Qwen3.5 on a GPU where fla is installed, and that SGLang's and vLLM's GDN kernels come from. Only here: under
Triton's interpreter fla's kernel gives NaN or other values than on a GPU (fla 0.6.0, Triton 3.9), so the CPU tier's
oracle is transformers' torch_recurrent_gated_delta_rule, which the reference equals bit for bit
(tests/kernel_checks/check_gdn.py)."""

from __future__ import annotations

import pytest
import torch

from specpair.runtime.kernels import gdn

CUDA = "cuda"  # compiled kernels, both: SPECPAIR_GPU_TIER_DEVICE=cpu cannot run them (test_kernels_compiled.py)
SHAPES = [  # B, T, Hk, Hv, dk, dv: grouped value heads, odd sizes, and Qwen3.5-35B-A3B's GDN heads over a block
    (3, 6, 2, 4, 32, 48),
    (1, 1, 1, 1, 24, 16),
    (2, 16, 16, 32, 128, 128),
]


@pytest.mark.parametrize("shape", SHAPES)
def test_the_compiled_kernel_agrees_with_fla(shape: tuple[int, ...]) -> None:
    from fla.ops.gated_delta_rule import fused_recurrent_gated_delta_rule

    batch, tokens, key_heads, value_heads, key_dim, value_dim = shape
    generator = torch.Generator().manual_seed(sum(shape))
    q, k = (torch.randn(batch, tokens, key_heads, key_dim, generator=generator).to(CUDA) for _ in range(2))
    v = torch.randn(batch, tokens, value_heads, value_dim, generator=generator).to(CUDA)
    g = (-torch.rand(batch, tokens, value_heads, generator=generator) * 2).to(CUDA)
    beta = torch.rand(batch, tokens, value_heads, generator=generator).to(CUDA)
    state = torch.randn(batch, value_heads, key_dim, value_dim, generator=generator).to(CUDA)
    want, want_state = fused_recurrent_gated_delta_rule(  # by name: its positional order is q, k, v, g, gk, gv, beta
        q, k, v, g=g, beta=beta, initial_state=state.clone(), output_final_state=True, use_qk_l2norm_in_kernel=True
    )
    out = gdn.gdn_recurrent_triton(q, k, v, g, beta, state)
    # float32 both, summed in other orders (over dk, token after token): far under a wrong operand's 1e-2
    assert ((out - want).abs() <= 1e-4 + 1e-4 * want.abs()).all(), (out - want).abs().max().item()
    assert ((state - want_state).abs() <= 1e-4 + 1e-4 * want_state.abs()).all()
