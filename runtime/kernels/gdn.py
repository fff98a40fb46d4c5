"""The Gated DeltaNet delta rule, token by token (transformers' `torch_recurrent_gated_delta_rule` with
`use_qk_l2norm_in_kernel=True`, op for op), and the two steps before it, one kernel each on the GPU instead of
the ~25 small ops torch launches for them:

    q, k, v, columns = conv_silu(window, qkv, weight, sizes, keep_columns)
    g, beta = gates(a, b, A_log, dt_bias)
    q, k, v, columns, g, beta = conv_silu_gates(window, qkv, weight, sizes, keep_columns, a, b, A_log, dt_bias)

`conv_silu`: the depthwise causal conv of [window | qkv] (window [B, K-1, C], the last K-1 pre-conv columns, which
it then replaces in place by the last K-1 of [window | qkv]; qkv [B, T, C] a view of the fused input projection's
output; weight [C, K] float32), summed over the K taps in one fixed order in float32, then SiLU, rounded to qkv's
dtype and split by channel into q, k, v (sizes: their channel counts), each contiguous [B, T, c]. `columns` is
[window | qkv] as it was, [B, K-1+T, C], for a verify step to keep (None unless keep_columns). `gates`: the log
decay g = -exp(A_log) · softplus(a + dt_bias) and beta = sigmoid(b), in float32, [B, T, Hv] contiguous.
Elementwise per (sequence, channel) or (sequence, token, head): batch-invariant by construction. On the GPU both
run in one kernel (a layer's step launches them together: `conv_silu_gates`), a program per sequence's block of
channels, then one per token's heads; qkv, a and b may come as their products' split partials (SplitSums), which
that kernel adds first as the matmul's sum kernel would.

q, k [B, T, Hk, dk] raw (after the conv); v [B, T, Hv, dv]; g [B, T, Hv] log decay (<= 0); beta [B, T, Hv];
value head j reads key head j // (Hv // Hk). In float32: q and k are L2-normalised (x · rsqrt(Σx² + 1e-6)),
q is divided by sqrt(dk), and per value head, with the state S [dk, dv]:
    S = exp(g_t) · S;  u = beta_t · (v_t − Sᵀk_t);  S = S + k_t uᵀ;  o_t = Sᵀq_t
`state` (float32 [B, Hv, dk, dv]) is updated in place to the state after the last token, unless `write_state` is
False (a verify step: the state stays what it was, and its commit replays the kept tokens from it); `step_states`
(float32 [B, T, Hv, dk, dv]), when given, receives the state after every token, for rolling a verify back.
`lengths` (int [B]), when given, runs sequence b through its first lengths[b] tokens only (clamped to 0..T; its o
past them is not written): a rollback replays each sequence's kept tokens in one call whose shapes do not depend
on the counts (a CUDA graph captures it, and the host never reads them). Returns o [B, T, Hv, dv] in v's dtype.

Batch invariance: the state of a token follows from the state before it and that token's inputs alone, by
the same operations whatever T and B, and the state goes through memory in float32 unchanged, so T steps of
one token and one step of T tokens give the same bits. The Triton kernel gives each (sequence, value head,
block of BLOCK_V value columns) its own program (the columns of S evolve independently) and walks the tokens
in order; the reference does the same per sequence.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from specpair.runtime.kernels.linear import SplitSums
from specpair.runtime.kernels.triton_common import (
    after_previous_kernel,
    device_function,
    launch_options,
    require_triton,
    rounded,
    split_sum,
    summed_values,
    tl,
    tl_dtype,
    triton,
)

L2_EPS = 1e-6
BLOCK_V = 32  # value columns per program: the [dk, BLOCK_V] float32 state tile stays in registers
BLOCK_C = 256  # conv channels per program
SOFTPLUS_THRESHOLD = 20.0  # torch's: above it softplus(x) is x


def conv_silu(
    window: Tensor, qkv: Tensor | SplitSums, weight: Tensor, sizes: tuple[int, int, int], keep_columns: bool
) -> tuple[Tensor, Tensor, Tensor, Tensor | None]:
    if isinstance(qkv, SplitSums) or qkv.is_cuda:
        return conv_silu_triton(window, qkv, weight, sizes, keep_columns)
    return conv_silu_reference(window, qkv, weight, sizes, keep_columns)


def gates(a: Tensor | SplitSums, b: Tensor | SplitSums, A_log: Tensor, dt_bias: Tensor) -> tuple[Tensor, Tensor]:
    if isinstance(a, SplitSums) or a.is_cuda:
        return gates_triton(a, b, A_log, dt_bias)
    return gates_reference(a, b, A_log, dt_bias)


def conv_silu_gates(
    window: Tensor,
    qkv: Tensor | SplitSums,
    weight: Tensor,
    sizes: tuple[int, int, int],
    keep_columns: bool,
    a: Tensor | SplitSums,
    b: Tensor | SplitSums,
    A_log: Tensor,
    dt_bias: Tensor,
) -> tuple[Tensor, Tensor, Tensor, Tensor | None, Tensor, Tensor]:
    """conv_silu and gates of one step, in one launch on the GPU: (q, k, v, columns, g, beta)."""
    if isinstance(qkv, SplitSums) or qkv.is_cuda:
        return conv_silu_gates_triton(window, qkv, weight, sizes, keep_columns, a, b, A_log, dt_bias)
    return (
        *conv_silu_reference(window, qkv, weight, sizes, keep_columns),
        *gates_reference(a, b, A_log, dt_bias),
    )


def conv_silu_reference(
    window: Tensor, qkv: Tensor, weight: Tensor, sizes: tuple[int, int, int], keep_columns: bool
) -> tuple[Tensor, Tensor, Tensor, Tensor | None]:
    steps = qkv.shape[1]
    # the window's K-1 pre-conv columns, then this step's: output t reads columns t .. t+K-1
    columns = torch.cat((window, qkv), dim=1)
    out = columns[:, 0:steps].float() * weight[:, 0]
    for j in range(1, weight.shape[1]):
        out = out + columns[:, j : j + steps].float() * weight[:, j]
    # SiLU written with exp, which gives an element the same bits wherever it sits (torch's own CPU silu takes a
    # vector or a scalar path by position)
    mixed = (out / (1 + torch.exp(-out))).to(qkv.dtype)
    window.copy_(columns[:, steps:])
    q, k, v = mixed.split(list(sizes), dim=-1)
    return q, k, v, columns if keep_columns else None


def gates_reference(a: Tensor, b: Tensor, A_log: Tensor, dt_bias: Tensor) -> tuple[Tensor, Tensor]:
    x = a.float() + dt_bias
    softplus = torch.where(x > SOFTPLUS_THRESHOLD, x, torch.log1p(torch.exp(x)))
    return -torch.exp(A_log) * softplus, 1 / (1 + torch.exp(-b.float()))


@dataclass
class _Conv:
    """A conv_silu's part of a launch: its kernel arguments, and what it returns."""

    args: tuple
    constexprs: dict[str, object]
    batch: int
    blocks: int  # programs a sequence: blocks of BLOCK_C channels
    outputs: tuple[Tensor, Tensor, Tensor, Tensor | None]


@dataclass
class _Gates:
    """A gates' part of a launch: its kernel arguments (a program a row), and what it returns."""

    args: tuple
    constexprs: dict[str, object]
    rows: int
    outputs: tuple[Tensor, Tensor]


def _conv(
    window: Tensor, qkv: Tensor | SplitSums, weight: Tensor, sizes: tuple[int, int, int], keep_columns: bool
) -> _Conv:
    """qkv [B, T, channels], or the split partials of its product (SplitSums [splits, B·T, channels]), which the
    kernel adds first as SplitSums.summed does."""
    batch, channels = window.shape[0], window.shape[-1]
    if isinstance(qkv, SplitSums):
        splits, rows = qkv.partial.shape[:2]
        steps = rows // max(batch, 1)
        values, plane, dtype = qkv.partial[0], qkv.partial.stride(0), qkv.dtype
        stride_t = values.stride(0)
        stride_b = steps * stride_t
        fits = qkv.partial.shape[2] == channels and steps * batch == rows
    else:
        splits, plane, dtype, steps = 0, 0, qkv.dtype, qkv.shape[1]
        values, stride_b, stride_t = qkv, qkv.stride(0), qkv.stride(1)
        fits = tuple(qkv.shape) == (batch, steps, channels)
    taps = weight.shape[1]
    if (
        not fits
        or tuple(window.shape) != (batch, taps - 1, channels)
        or tuple(weight.shape) != (channels, taps)
        or sum(sizes) != channels
        or not window.is_contiguous()
        or values.stride(-1) != 1
    ):
        shape = list(qkv.partial.shape) if isinstance(qkv, SplitSums) else list(qkv.shape)
        raise ValueError(
            f"conv_silu: window {list(window.shape)}, qkv {shape}, weight {list(weight.shape)}, "
            f"sizes {list(sizes)} do not fit"
        )
    q, k, v = (torch.empty(batch, steps, c, dtype=dtype, device=window.device) for c in sizes)
    columns = (
        torch.empty(batch, taps - 1 + steps, channels, dtype=dtype, device=window.device) if keep_columns else None
    )
    args = (window, values, weight.float().contiguous(), q, k, v, window if columns is None else columns)
    args += (steps, channels, sizes[0], sizes[1], stride_b, stride_t, plane)
    blocks = triton.cdiv(channels, BLOCK_C) if steps and channels else 0
    constexprs = {"TAPS": taps, "SPLITS": splits, "COLUMNS": keep_columns}
    return _Conv(args, constexprs, batch, blocks, (q, k, v, columns))


def _gates(a: Tensor | SplitSums, b: Tensor | SplitSums, A_log: Tensor, dt_bias: Tensor) -> _Gates:
    """a, b [..., Hv], or the split partials of their products (SplitSums: column views, [rows, Hv] a split),
    which the kernel adds first as SplitSums.summed does: g and beta [..., Hv] (rows for partials)."""
    partials = isinstance(a, SplitSums)
    if partials != isinstance(b, SplitSums) or (partials and a.partial.shape != b.partial.shape):
        raise ValueError("gates: a and b must both be tensors, or both split partials of as many splits and rows")
    round_to = a.dtype
    planes = (a.partial.stride(0), b.partial.stride(0)) if partials else (0, 0)
    splits = a.partial.shape[0] if partials else 0
    if partials:
        a, b = a.partial[0], b.partial[0]  # the first planes; the kernel reads the others a plane apart
    heads = a.shape[-1]
    if b.shape != a.shape or A_log.shape != (heads,) or dt_bias.shape != (heads,):
        raise ValueError(f"gates: a {list(a.shape)}, b {list(b.shape)}, A_log {list(A_log.shape)} do not fit")
    rows_a, rows_b = a.reshape(-1, heads), b.reshape(-1, heads)
    if rows_a.stride(-1) != 1 or rows_b.stride(-1) != 1:  # partials' columns are always unit-stride
        rows_a, rows_b = rows_a.contiguous(), rows_b.contiguous()
    g = torch.empty(*a.shape, dtype=torch.float32, device=a.device)
    beta = torch.empty_like(g)
    args = (rows_a, rows_b, A_log.float().contiguous(), dt_bias.float().contiguous(), g, beta, heads)
    args += (rows_a.stride(0), rows_b.stride(0), *planes, SOFTPLUS_THRESHOLD)
    constexprs = {"GATE_SPLITS": splits, "ROUND_TO": tl_dtype(round_to), "BLOCK_H": triton.next_power_of_2(heads)}
    return _Gates(args, constexprs, rows_a.shape[0] if g.numel() else 0, (g, beta))


def _launch(conv: _Conv | None, gates: _Gates | None) -> None:
    """One launch of conv programs (a sequence's channel blocks) then gates programs (a row each); the part not
    given gets no program (its arguments: stand-ins the kernel never reads)."""
    conv_programs = conv.batch * conv.blocks if conv is not None else 0
    gate_programs = gates.rows if gates is not None else 0
    if not conv_programs + gate_programs:
        return
    if conv is None:
        a = gates.args[0]
        conv = _Conv((a,) * 7 + (0,) * 7, {"TAPS": 2, "SPLITS": 0, "COLUMNS": False}, 0, 0, ())
    if gates is None:
        w = conv.args[2]
        stand_in = {"GATE_SPLITS": 0, "ROUND_TO": tl.float32, "BLOCK_H": 1}
        gates = _Gates((w,) * 6 + (0,) * 5 + (SOFTPLUS_THRESHOLD,), stand_in, 0, ())
    _conv_silu_gates_kernel[(conv_programs + gate_programs,)](
        *conv.args,
        max(conv.blocks, 1),
        conv_programs,
        *gates.args,
        **conv.constexprs,
        **gates.constexprs,
        BLOCK_C=BLOCK_C,
        **launch_options(),
    )


def conv_silu_triton(
    window: Tensor, qkv: Tensor | SplitSums, weight: Tensor, sizes: tuple[int, int, int], keep_columns: bool
) -> tuple[Tensor, Tensor, Tensor, Tensor | None]:
    require_triton("conv_silu")
    conv = _conv(window, qkv, weight, sizes, keep_columns)
    _launch(conv, None)
    return conv.outputs


def gates_triton(a: Tensor | SplitSums, b: Tensor | SplitSums, A_log: Tensor, dt_bias: Tensor) -> tuple[Tensor, Tensor]:
    require_triton("gates")
    gates = _gates(a, b, A_log, dt_bias)
    _launch(None, gates)
    return gates.outputs


def conv_silu_gates_triton(
    window: Tensor,
    qkv: Tensor | SplitSums,
    weight: Tensor,
    sizes: tuple[int, int, int],
    keep_columns: bool,
    a: Tensor | SplitSums,
    b: Tensor | SplitSums,
    A_log: Tensor,
    dt_bias: Tensor,
) -> tuple[Tensor, Tensor, Tensor, Tensor | None, Tensor, Tensor]:
    require_triton("conv_silu_gates")
    conv, gates = _conv(window, qkv, weight, sizes, keep_columns), _gates(a, b, A_log, dt_bias)
    _launch(conv, gates)
    return (*conv.outputs, *gates.outputs)


def gdn_recurrent(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    g: Tensor,
    beta: Tensor,
    state: Tensor,
    step_states: Tensor | None = None,
    lengths: Tensor | None = None,
    write_state: bool = True,
) -> Tensor:
    if v.is_cuda:
        return gdn_recurrent_triton(q, k, v, g, beta, state, step_states, lengths, write_state)
    return gdn_recurrent_reference(q, k, v, g, beta, state, step_states, lengths, write_state)


def _l2norm(x: Tensor) -> Tensor:
    return x * torch.rsqrt((x * x).sum(dim=-1, keepdim=True) + L2_EPS)


def gdn_recurrent_reference(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    g: Tensor,
    beta: Tensor,
    state: Tensor,
    step_states: Tensor | None = None,
    lengths: Tensor | None = None,
    write_state: bool = True,
) -> Tensor:
    batch, tokens, key_heads, key_dim = k.shape
    value_heads = v.shape[2]
    per_key = value_heads // key_heads
    out = torch.empty(v.shape, dtype=v.dtype)
    for b in range(batch):
        s = state[b].to(torch.float32, copy=True)  # [Hv, dk, dv]
        for t in range(tokens if lengths is None else min(max(int(lengths[b]), 0), tokens)):
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
        if write_state:
            state[b] = s
    return out


def gdn_recurrent_triton(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    g: Tensor,
    beta: Tensor,
    state: Tensor,
    step_states: Tensor | None = None,
    lengths: Tensor | None = None,
    write_state: bool = True,
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
    if lengths is not None and tuple(lengths.shape) != (batch,):
        raise ValueError(f"gdn_recurrent: lengths {list(lengths.shape)} for {batch} sequences")
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
        lengths if lengths is not None else state,
        out,
        tokens,
        key_heads,
        value_heads,
        key_dim,
        value_dim,
        key_dim**0.5,
        L2_EPS,
        STEPS=step_states is not None,
        LENGTHS=lengths is not None,
        WRITE_STATE=write_state,
        BLOCK_K=triton.next_power_of_2(key_dim),
        BLOCK_V=BLOCK_V,
        **launch_options(),
    )
    return out


if triton is not None:

    @triton.jit(
        do_not_specialize=["tokens"],
        do_not_specialize_on_alignment=["q_ptr", "k_ptr", "v_ptr", "g_ptr", "beta_ptr", "out_ptr", "lengths_ptr"],
    )
    def _gdn_kernel(
        q_ptr,
        k_ptr,
        v_ptr,
        g_ptr,
        beta_ptr,
        state_ptr,
        steps_ptr,
        lengths_ptr,
        out_ptr,
        tokens,
        key_heads,
        value_heads,
        key_dim,
        value_dim,
        sqrt_dk,
        eps,
        STEPS: tl.constexpr,
        LENGTHS: tl.constexpr,
        WRITE_STATE: tl.constexpr,
        BLOCK_K: tl.constexpr,
        BLOCK_V: tl.constexpr,
        PDL: tl.constexpr,
    ):
        after_previous_kernel(PDL)
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
        run = tokens
        if LENGTHS:
            run = tl.minimum(tl.maximum(tl.load(lengths_ptr + b).to(tl.int32), 0), tokens)
        for t in range(run):
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
        if WRITE_STATE:
            tl.store(state_base + tile_offsets, s, mask=tile)

    @device_function
    def _conv_program(
        window_ptr,
        qkv_ptr,
        w_ptr,
        q_ptr,
        k_ptr,
        v_ptr,
        columns_ptr,
        steps,
        channels,
        q_size,
        k_size,
        stride_b,
        stride_t,
        plane,
        b,
        block,
        TAPS: tl.constexpr,
        SPLITS: tl.constexpr,
        COLUMNS: tl.constexpr,
        BLOCK_C: tl.constexpr,
    ):
        """conv_silu of sequence b's channel block `block`, every step."""
        c = block * BLOCK_C + tl.arange(0, BLOCK_C)
        inside = c < channels
        window_base = window_ptr + b * (TAPS - 1) * channels + c
        qkv_base = qkv_ptr + b * stride_b + c
        dtype = q_ptr.dtype.element_ty
        # where each channel's value goes: q, k or v, each [B, T, its channels]
        in_q = c < q_size
        in_k = (c >= q_size) & (c < q_size + k_size)
        v_size = channels - q_size - k_size
        q_out = q_ptr + b * steps * q_size + c
        k_out = k_ptr + b * steps * k_size + (c - q_size)
        v_out = v_ptr + b * steps * v_size + (c - q_size - k_size)
        for t in range(steps):
            acc = tl.zeros([BLOCK_C], dtype=tl.float32)
            for j in tl.static_range(TAPS):
                column = tl.zeros([BLOCK_C], dtype=tl.int32) + t + j  # in [window | qkv]
                from_window = tl.load(window_base + column * channels, mask=inside & (column < TAPS - 1), other=0.0)
                from_step = summed_values(
                    qkv_base, (column - (TAPS - 1)) * stride_t, inside & (column >= TAPS - 1), plane, SPLITS, dtype
                )
                term = tl.where(column < TAPS - 1, from_window, from_step).to(tl.float32)
                term = term * tl.load(w_ptr + c * TAPS + j, mask=inside, other=0.0)
                if j == 0:
                    acc = term
                else:
                    acc = acc + term
            mixed = rounded(acc / (1.0 + tl.exp(-acc)), dtype)
            tl.store(q_out + t * q_size, mixed, mask=inside & in_q)
            tl.store(k_out + t * k_size, mixed, mask=inside & in_k)
            tl.store(v_out + t * v_size, mixed, mask=inside & ~in_q & ~in_k)
            if COLUMNS:
                step = summed_values(qkv_base, t * stride_t + c * 0, inside, plane, SPLITS, dtype)
                tl.store(columns_ptr + (b * (TAPS - 1 + steps) + TAPS - 1 + t) * channels + c, step, mask=inside)
        if COLUMNS:
            for i in tl.static_range(TAPS - 1):
                old = tl.load(window_base + i * channels, mask=inside)
                tl.store(columns_ptr + (b * (TAPS - 1 + steps) + i) * channels + c, old, mask=inside)
        # the new window, the last K-1 of [window | qkv], written in place in increasing order: entry i reads
        # entry steps + i > i of the old window, which no earlier write has replaced (each thread owns its channels)
        for i in tl.static_range(TAPS - 1):
            column = tl.zeros([BLOCK_C], dtype=tl.int32) + steps + i
            from_window = tl.load(window_base + column * channels, mask=inside & (column < TAPS - 1), other=0.0)
            from_step = summed_values(
                qkv_base, (column - (TAPS - 1)) * stride_t, inside & (column >= TAPS - 1), plane, SPLITS, dtype
            )
            tl.store(window_base + i * channels, tl.where(column < TAPS - 1, from_window, from_step), mask=inside)

    @device_function
    def _gates_row(
        a_ptr,
        b_ptr,
        a_log_ptr,
        dt_bias_ptr,
        g_ptr,
        beta_ptr,
        heads,
        stride_a,
        stride_b,
        plane_a,
        plane_b,
        threshold,
        row,
        SPLITS: tl.constexpr,
        ROUND_TO: tl.constexpr,
        BLOCK_H: tl.constexpr,
    ):
        """gates of one row (a token of a sequence)."""
        h = tl.arange(0, BLOCK_H)
        inside = h < heads
        if SPLITS > 0:  # float32 partials of the b|a product, summed as the matmul's sum kernel sums them
            x = split_sum(a_ptr, plane_a, SPLITS, row * stride_a + h, inside)
            x = rounded(x, ROUND_TO).to(tl.float32)
            beta_in = split_sum(b_ptr, plane_b, SPLITS, row * stride_b + h, inside)
            beta_in = rounded(beta_in, ROUND_TO).to(tl.float32)
        else:
            x = tl.load(a_ptr + row * stride_a + h, mask=inside, other=0.0).to(tl.float32)
            beta_in = tl.load(b_ptr + row * stride_b + h, mask=inside, other=0.0).to(tl.float32)
        x = x + tl.load(dt_bias_ptr + h, mask=inside, other=0.0)
        u = tl.exp(x)
        w = 1.0 + u  # log1p(u) to a few ulps for small u, where log(1 + u) loses u's digits (Goldberg's trick)
        softplus = tl.where(x > threshold, x, tl.where(w == 1.0, u, tl.log(w) * (u / tl.where(w == 1.0, 1.0, w - 1.0))))
        g = -tl.exp(tl.load(a_log_ptr + h, mask=inside, other=0.0)) * softplus
        tl.store(g_ptr + row * heads + h, g, mask=inside)
        tl.store(beta_ptr + row * heads + h, 1.0 / (1.0 + tl.exp(-beta_in)), mask=inside)

    @triton.jit(
        do_not_specialize=["steps", "conv_blocks", "conv_programs"],
        do_not_specialize_on_alignment=["qkv_ptr", "q_ptr", "k_ptr", "v_ptr", "a_ptr", "b_ptr"],
    )
    def _conv_silu_gates_kernel(
        window_ptr,
        qkv_ptr,
        w_ptr,
        q_ptr,
        k_ptr,
        v_ptr,
        columns_ptr,
        steps,
        channels,
        q_size,
        k_size,
        stride_qkv_b,
        stride_qkv_t,
        plane,
        conv_blocks,
        conv_programs,
        a_ptr,
        b_ptr,
        a_log_ptr,
        dt_bias_ptr,
        g_ptr,
        beta_ptr,
        heads,
        stride_a,
        stride_b,
        plane_a,
        plane_b,
        threshold,
        TAPS: tl.constexpr,
        SPLITS: tl.constexpr,
        COLUMNS: tl.constexpr,
        GATE_SPLITS: tl.constexpr,
        ROUND_TO: tl.constexpr,
        BLOCK_H: tl.constexpr,
        BLOCK_C: tl.constexpr,
        PDL: tl.constexpr,
    ):
        """The step's conv programs (conv_blocks a sequence), then its gates programs (a row each): the two
        steps before the delta rule read the same input projection, so they share a launch."""
        after_previous_kernel(PDL)
        program = tl.program_id(0)
        if program < conv_programs:
            _conv_program(
                window_ptr,
                qkv_ptr,
                w_ptr,
                q_ptr,
                k_ptr,
                v_ptr,
                columns_ptr,
                steps,
                channels,
                q_size,
                k_size,
                stride_qkv_b,
                stride_qkv_t,
                plane,
                (program // conv_blocks).to(tl.int64),
                program % conv_blocks,
                TAPS,
                SPLITS,
                COLUMNS,
                BLOCK_C,
            )
        else:
            _gates_row(
                a_ptr,
                b_ptr,
                a_log_ptr,
                dt_bias_ptr,
                g_ptr,
                beta_ptr,
                heads,
                stride_a,
                stride_b,
                plane_a,
                plane_b,
                threshold,
                (program - conv_programs).to(tl.int64),
                GATE_SPLITS,
                ROUND_TO,
                BLOCK_H,
            )
