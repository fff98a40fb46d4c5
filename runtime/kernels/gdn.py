"""The Gated DeltaNet delta rule, token by token (transformers' `torch_recurrent_gated_delta_rule` with
`use_qk_l2norm_in_kernel=True`, op for op).

q, k [B, T, Hk, dk] raw (after the conv); v [B, T, Hv, dv]; g [B, T, Hv] log decay (<= 0); beta [B, T, Hv];
value head j reads key head j // (Hv // Hk). In float32: q and k are L2-normalised (x · rsqrt(Σx² + 1e-6)),
q is divided by sqrt(dk), and per value head, with the state S [dk, dv]:
    S = exp(g_t) · S;  u = beta_t · (v_t − Sᵀk_t);  S = S + k_t uᵀ;  o_t = Sᵀq_t
`state` (float32 [B, Hv, dk, dv]) is updated in place to the state after the last token; `step_states`
(float32 [B, T, Hv, dk, dv]), when given, receives the state after every token, for rolling a verify back.
Returns o [B, T, Hv, dv] in v's dtype.

Batch invariance: the state of a token follows from the state before it and that token's inputs alone, by
the same operations whatever T and B, and the state goes through memory in float32 unchanged, so T steps of
one token and one step of T tokens give the same bits. The Triton kernel gives each (sequence, value head,
block of BLOCK_V value columns) its own program (the columns of S evolve independently) and walks the tokens
in order; the reference does the same per sequence.
"""

from __future__ import annotations

import torch
from torch import Tensor

from specpair.runtime.kernels.triton_common import require_triton, rounded, tl, triton

L2_EPS = 1e-6
BLOCK_V = 32  # value columns per program: the [dk, BLOCK_V] float32 state tile stays in registers


def gdn_recurrent(
    q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, state: Tensor, step_states: Tensor | None = None
) -> Tensor:
    if v.is_cuda:
        return gdn_recurrent_triton(q, k, v, g, beta, state, step_states)
    return gdn_recurrent_reference(q, k, v, g, beta, state, step_states)


def _l2norm(x: Tensor) -> Tensor:
    return x * torch.rsqrt((x * x).sum(dim=-1, keepdim=True) + L2_EPS)


def gdn_recurrent_reference(
    q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, state: Tensor, step_states: Tensor | None = None
) -> Tensor:
    batch, tokens, key_heads, key_dim = k.shape
    value_heads = v.shape[2]
    per_key = value_heads // key_heads
    out = torch.empty(v.shape, dtype=v.dtype)
    for b in range(batch):
        s = state[b].to(torch.float32, copy=True)  # [Hv, dk, dv]
        for t in range(tokens):
            q_t = _l2norm(q[b, t].float().repeat_interleave(per_key, dim=0))  # [Hv, dk]
            k_t = _l2norm(k[b, t].float().repeat_interleave(per_key, dim=0))
            q_t = q_t / (key_dim**0.5)
            v_t = v[b, t].float()  # [Hv, dv]
            s = s * g[b, t].float().exp()[:, None, None]
            kv_mem = (s * k_t.unsqueeze(-1)).sum(dim=-2)
            delta = (v_t - kv_mem) * beta[b, t].float().unsqueeze(-1)
            s = s + k_t.unsqueeze(-1) * delta.unsqueeze(-2)
            out[b, t] = (s * q_t.unsqueeze(-1)).sum(dim=-2)
            if step_states is not None:
                step_states[b, t] = s
        state[b] = s
    return out


def gdn_recurrent_triton(
    q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, state: Tensor, step_states: Tensor | None = None
) -> Tensor:
    require_triton("gdn_recurrent")
    batch, tokens, key_heads, key_dim = k.shape
    value_heads, value_dim = v.shape[2], v.shape[3]
    if q.shape != k.shape or value_heads % key_heads or tuple(state.shape) != (batch, value_heads, key_dim, value_dim):
        raise ValueError(
            f"gdn_recurrent: q {list(q.shape)}, k {list(k.shape)}, v {list(v.shape)}, "
            f"state {list(state.shape)} do not fit together"
        )
    if state.dtype != torch.float32 or not state.is_contiguous():
        raise ValueError("gdn_recurrent: state must be a contiguous float32 tensor (it is updated in place)")
    if step_states is not None and (
        step_states.dtype != torch.float32
        or not step_states.is_contiguous()
        or tuple(step_states.shape) != (batch, tokens, value_heads, key_dim, value_dim)
    ):
        raise ValueError(
            f"gdn_recurrent: step_states must be contiguous float32 {[batch, tokens, value_heads, key_dim, value_dim]}"
        )
    out = torch.empty(v.shape, dtype=v.dtype, device=v.device)
    if tokens == 0 or batch == 0:
        return out
    q, k, v, g, beta = (x.contiguous() for x in (q, k, v, g, beta))
    grid = (batch * value_heads, triton.cdiv(value_dim, BLOCK_V))
    _gdn_kernel[grid](
        q,
        k,
        v,
        g,
        beta,
        state,
        step_states if step_states is not None else state,
        out,
        tokens,
        key_heads,
        value_heads,
        key_dim,
        value_dim,
        key_dim**0.5,
        L2_EPS,
        STEPS=step_states is not None,
        BLOCK_K=triton.next_power_of_2(key_dim),
        BLOCK_V=BLOCK_V,
    )
    return out


if triton is not None:

    @triton.jit(
        do_not_specialize=["tokens"],
        do_not_specialize_on_alignment=["q_ptr", "k_ptr", "v_ptr", "g_ptr", "beta_ptr", "out_ptr"],
    )
    def _gdn_kernel(
        q_ptr,
        k_ptr,
        v_ptr,
        g_ptr,
        beta_ptr,
        state_ptr,
        steps_ptr,
        out_ptr,
        tokens,
        key_heads,
        value_heads,
        key_dim,
        value_dim,
        sqrt_dk,
        eps,
        STEPS: tl.constexpr,
        BLOCK_K: tl.constexpr,
        BLOCK_V: tl.constexpr,
    ):
        bh = tl.program_id(0)
        b = bh // value_heads
        head = bh % value_heads
        key_head = head // (value_heads // key_heads)
        kk = tl.arange(0, BLOCK_K)
        vv = tl.program_id(1) * BLOCK_V + tl.arange(0, BLOCK_V)
        k_in = kk < key_dim
        v_in = vv < value_dim
        tile = k_in[:, None] & v_in[None, :]
        tile_offsets = kk[:, None] * value_dim + vv[None, :]
        state_base = state_ptr + bh.to(tl.int64) * key_dim * value_dim
        s = tl.load(state_base + tile_offsets, mask=tile, other=0.0)
        for t in range(tokens):
            row = b.to(tl.int64) * tokens + t
            qk_offsets = (row * key_heads + key_head) * key_dim + kk
            q = tl.load(q_ptr + qk_offsets, mask=k_in, other=0.0).to(tl.float32)
            k = tl.load(k_ptr + qk_offsets, mask=k_in, other=0.0).to(tl.float32)
            q = q * tl.math.rsqrt(tl.sum(q * q, axis=0) + eps) / sqrt_dk
            k = k * tl.math.rsqrt(tl.sum(k * k, axis=0) + eps)
            head_row = row * value_heads + head
            v = tl.load(v_ptr + head_row * value_dim + vv, mask=v_in, other=0.0).to(tl.float32)
            decay = tl.exp(tl.load(g_ptr + head_row).to(tl.float32))
            beta = tl.load(beta_ptr + head_row).to(tl.float32)
            s = s * decay
            delta = (v - tl.sum(s * k[:, None], axis=0)) * beta
            s = s + k[:, None] * delta[None, :]
            o = tl.sum(s * q[:, None], axis=0)
            tl.store(out_ptr + head_row * value_dim + vv, rounded(o, out_ptr.dtype.element_ty), mask=v_in)
            if STEPS:
                tl.store(steps_ptr + head_row * key_dim * value_dim + tile_offsets, s, mask=tile)
        tl.store(state_base + tile_offsets, s, mask=tile)
