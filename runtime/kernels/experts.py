"""A MoE layer's first and last steps, one kernel each on the GPU (instead of the softmax, the sort-based
top-k, and 2k + 4 elementwise ops torch launches for them):

    weights, ids = route(logits, top_k, renormalise, shared_id=E)
    out = combine_experts(weights, down, shared, shared_logit)

`route`: the router's softmax in float32 over logits [N, E] (a view of a fused router output: rows through a
stride), its top_k probabilities and their experts [N, k] (largest first; a tie goes to the lower expert id; int32,
the expert matmuls' index type), renormalised to sum to one where the family says so (the total summed left to
right). Given `prefetch` (the stacked expert weights' tensors, largest first: linear.expert_stacks) and PDL mode 2
(triton_common.py), it also asks L2 for the chosen experts' bytes of as many of them as PREFETCH_BUDGET holds
for all its tokens, the moment it has chosen them: the expert matmuls that follow find their weights on the way
instead of starting their stream. Where a MoE's shared expert rides in its expert stacks as expert E (one expert
launch reads it with the routed ones: linear.with_expert), `shared_id=E` appends that id to every token's: ids
[N, k + 1], weights still [N, k]. `combine_experts`: each token's k expert outputs down [N, k, H] (or [N, k + 1, H],
the shared expert's output last, read from there when `shared` is that column's view) weighted by weights [N, k],
plus the shared expert [N, H] scaled by sigmoid(shared_logit [N, 1]) where there is one, in float32, rounded once
to the activations' dtype. The k terms are summed in one fixed order, the same for every row (a reduction kernel may
order a row's sum by the row count), so a row's bits depend on its own inputs alone. A MoE layer hands its output on
as those terms (ExpertTerms), and the residual add's norm kernel that follows adds them with the same code
(`terms_sum`), so on the GPU the combination costs no launch of its own.

On the GPU the router's logits and the shared expert's may come as their product's split-K partials
(linear.SplitSums, column views of the router|shared-gate product): route and combine add them as the matmul's sum
kernel would (in split order, rounded to the activations' dtype) before reading them, the same bits without the
sum's launch.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from specpair.runtime.kernels.linear import SplitSums
from specpair.runtime.kernels.triton_common import (
    after_previous_kernel,
    device_function,
    launch_options,
    prefetch_to_l2,
    require_triton,
    rounded,
    split_sum,
    tl,
    tl_dtype,
    triton,
)

BLOCK = 1024  # hidden columns per program
PREFETCHED = 4  # stacked expert tensors route can prefetch: gate|up's and down's codes and scales
# bytes route may ask L2 for: half of an H100's or H200's 50 MB, so that what it asks for stays until it is read
# (a verify step's 8 tokens x 8 experts of the 35B-A3B in NVFP4 would be 113 MB: a prefix of the stacks, or none)
PREFETCH_BUDGET = 24 << 20


def route(
    logits: Tensor | SplitSums,
    top_k: int,
    renormalise: bool,
    prefetch: Sequence[Tensor] = (),
    shared_id: int | None = None,
) -> tuple[Tensor, Tensor]:
    if isinstance(logits, SplitSums) or logits.is_cuda:
        return route_triton(logits, top_k, renormalise, prefetch, shared_id)
    return route_reference(logits, top_k, renormalise, shared_id)


def route_reference(
    logits: Tensor, top_k: int, renormalise: bool, shared_id: int | None = None
) -> tuple[Tensor, Tensor]:
    probs = torch.softmax(logits.float(), dim=-1)
    weights, ids = torch.topk(probs, top_k, dim=-1)
    ids = ids.to(torch.int32)  # the expert kernels' index type: no conversion per matmul
    if shared_id is not None:
        ids = torch.cat((ids, torch.full_like(ids[:, :1], shared_id)), dim=1)
    if renormalise:
        total = weights[:, 0]
        for j in range(1, top_k):
            total = total + weights[:, j]
        weights = weights / total[:, None]
    return weights, ids


def within_budget(stacks: Sequence[Tensor], chosen: int) -> list[Tensor]:
    """The longest prefix of `stacks` whose bytes for `chosen` (tokens x top_k) experts fit PREFETCH_BUDGET."""
    kept, asked = [], 0
    for t in stacks:
        asked += chosen * t.stride(0) * t.element_size()
        if asked > PREFETCH_BUDGET:
            break
        kept.append(t)
    return kept


def route_triton(
    logits: Tensor | SplitSums,
    top_k: int,
    renormalise: bool,
    prefetch: Sequence[Tensor] = (),
    shared_id: int | None = None,
) -> tuple[Tensor, Tensor]:
    require_triton("route")
    # partials [splits, tokens, experts] (a column view), or the logits [tokens, experts]
    partials = isinstance(logits, SplitSums)
    round_to = logits.dtype
    logits = logits.partial if partials else logits
    splits, plane = (logits.shape[0], logits.stride(0)) if partials else (0, 0)
    tokens, experts = logits.shape[-2:]
    if logits.stride(-1) != 1 or not 0 < top_k <= experts:
        raise ValueError(f"route: top {top_k} of logits {list(logits.shape)} with strides {logits.stride()}")
    # a stack may hold the shared expert after the routed ones
    if len(prefetch) > PREFETCHED or any(t.shape[0] < experts or not t.is_contiguous() for t in prefetch):
        raise ValueError(f"route: prefetch {[list(t.shape) for t in prefetch]}: at most {PREFETCHED} stacks")
    prefetch = within_budget(prefetch, tokens * top_k)
    # each expert's bytes of a stack, as bytes: contiguous, one stride of dim 0 apart (unused slots repeat one)
    stacks = [t.view(torch.uint8) for t in prefetch]
    stacks += [stacks[0] if stacks else logits.view(torch.uint8)] * (PREFETCHED - len(stacks))
    expert_bytes = [t.stride(0) for t in stacks]
    weights = torch.empty(tokens, top_k, dtype=torch.float32, device=logits.device)
    columns = top_k + (shared_id is not None)
    ids = torch.empty(tokens, columns, dtype=torch.int32, device=logits.device)
    if tokens:
        _route_kernel[(tokens,)](
            logits,
            weights,
            ids,
            experts,
            logits.stride(-2),
            plane,
            *stacks,
            *expert_bytes,
            -1 if shared_id is None else shared_id,
            TOP_K=top_k,
            ID_COLUMNS=columns,
            SPLITS=splits,
            ROUND_TO=tl_dtype(round_to),
            RENORMALISE=renormalise,
            PREFETCH=len(prefetch),
            BLOCK_E=triton.next_power_of_2(experts),
            BLOCK_K=triton.next_power_of_2(columns),
            num_warps=1,  # one token's few hundred logits: a warp's shuffles reduce them, no shared memory
            **launch_options(),
        )
    return weights, ids


@dataclass
class ExpertTerms:
    """A MoE layer's output before its terms are added: each token's routed experts' outputs down [N, k(+1), H],
    their weights [N, k], and the shared expert's output and logit where there is one (combine_experts' arguments).
    `combined()` adds them; on the GPU the kernel of the residual add that follows adds them itself
    (norm.add_rms_norm), with the bits combine_experts gives and one launch fewer."""

    weights: Tensor
    down: Tensor
    shared: Tensor | None
    shared_logit: Tensor | SplitSums | None

    def combined(self) -> Tensor:
        return combine_experts(self.weights, self.down, self.shared, self.shared_logit)


def combine_experts(
    weights: Tensor, down: Tensor, shared: Tensor | None, shared_logit: Tensor | SplitSums | None
) -> Tensor:
    if down.is_cuda:
        return combine_experts_triton(weights, down, shared, shared_logit)
    return combine_experts_reference(weights, down, shared, shared_logit)


def combine_experts_reference(
    weights: Tensor, down: Tensor, shared: Tensor | None, shared_logit: Tensor | None
) -> Tensor:
    top_k = weights.shape[1]
    terms = down.float()
    out = weights[:, 0, None] * terms[:, 0]
    for j in range(1, top_k):
        out = out + weights[:, j, None] * terms[:, j]
    if shared is not None:
        logit = shared_logit.float()
        out = out + 1 / (1 + torch.exp(-logit)) * shared.float()
    return out.to(down.dtype)


@dataclass
class TermsOperands:
    """ExpertTerms as a kernel reads them (`terms_sum`): its tensors, their row strides, and constexprs."""

    weights: Tensor
    down: Tensor
    shared: Tensor
    logits: Tensor
    strides: tuple[int, int, int, int]  # down's, shared's and the logit's rows, the logit partials' planes
    constexprs: dict[str, int | bool]

    @classmethod
    def absent(cls, tensor: Tensor) -> TermsOperands:
        """No terms (TOP_K 0): `tensor` as every pointer, which the kernel never reads."""
        return cls(tensor, tensor, tensor, tensor, (0, 0, 0, 0), {"TOP_K": 0, "SHARED": False, "LOGIT_SPLITS": 0})


def terms_operands(terms: ExpertTerms) -> TermsOperands:
    """Checks the terms fit together and lays them out for `terms_sum` (rows through strides: the shared expert's
    output may be down's last column, a view; the shared logit a column of the router's product or its partials)."""
    weights, down, shared, shared_logit = terms.weights, terms.down, terms.shared, terms.shared_logit
    tokens, columns, hidden = down.shape
    top_k = weights.shape[1]
    # down's columns past the k routed ones: the shared expert's output, given as `shared` (its view)
    extra = columns - top_k
    if (
        weights.shape[0] != tokens
        or extra not in (0, int(shared is not None))
        or (shared is None) != (shared_logit is None)
    ):
        raise ValueError(f"combine_experts: weights {list(weights.shape)} and down {list(down.shape)} do not fit")
    # the shared expert's logit, or its product's partials [splits, tokens, 1] (a column view)
    logit_partials = isinstance(shared_logit, SplitSums)
    if logit_partials and shared_logit.dtype != down.dtype:
        raise ValueError(f"combine_experts: shared logit partials for {shared_logit.dtype}, down {down.dtype}")
    shared_logit = shared_logit.partial if logit_partials else shared_logit
    if shared is not None and (shared.shape != (tokens, hidden) or shared_logit.shape[-2:] != (tokens, 1)):
        raise ValueError(
            f"combine_experts: shared {list(shared.shape)}, shared_logit {list(shared_logit.shape)} for {tokens} tokens"
        )
    weights = weights.float().contiguous()
    if down.stride(2) != 1 or down.stride(1) != hidden:
        down = down.contiguous()
    if shared is None:
        shared = down[:, 0]  # a pointer the kernel never reads
    elif shared.stride(1) != 1:
        shared = shared.contiguous()
    logits = weights if shared_logit is None else shared_logit
    return TermsOperands(
        weights,
        down,
        shared,
        logits,
        (down.stride(0), shared.stride(0), logits.stride(-2), logits.stride(0) if logit_partials else 0),
        {"TOP_K": top_k, "SHARED": shared_logit is not None, "LOGIT_SPLITS": logits.shape[0] if logit_partials else 0},
    )


def combine_experts_triton(
    weights: Tensor, down: Tensor, shared: Tensor | None, shared_logit: Tensor | SplitSums | None
) -> Tensor:
    require_triton("combine_experts")
    op = terms_operands(ExpertTerms(weights, down, shared, shared_logit))
    tokens, _, hidden = op.down.shape
    out = torch.empty(tokens, hidden, dtype=down.dtype, device=down.device)
    if out.numel() == 0:
        return out
    _combine_kernel[(tokens, triton.cdiv(hidden, BLOCK))](
        op.weights,
        op.down,
        op.shared,
        op.logits,
        out,
        hidden,
        *op.strides,
        **op.constexprs,
        BLOCK=BLOCK,
        **launch_options(),
    )
    return out


if triton is not None:

    @device_function
    def terms_sum(
        w_ptr,
        down_ptr,
        shared_ptr,
        logit_ptr,
        row,
        cols,
        inside,
        hidden,
        down_stride,
        shared_stride,
        logit_stride,
        logit_plane,
        TOP_K: tl.constexpr,
        SHARED: tl.constexpr,
        LOGIT_SPLITS: tl.constexpr,
        ROUND_TO: tl.constexpr,
    ):
        """Row `row`'s columns `cols` of ExpertTerms added (`terms_operands` lays them out), in float32, in one
        fixed order: every kernel that adds a MoE's terms adds them here, so the bits are the same in either."""
        for j in tl.static_range(TOP_K):
            w = tl.load(w_ptr + row * TOP_K + j)
            term = tl.load(down_ptr + row * down_stride + j * hidden + cols, mask=inside, other=0.0).to(tl.float32)
            if j == 0:
                out = w * term
            else:
                out = out + w * term
        if SHARED:
            if LOGIT_SPLITS > 0:  # summed as the matmul's sum kernel sums them
                at = row * logit_stride + tl.zeros([1], tl.int64)
                logit = split_sum(logit_ptr, logit_plane, LOGIT_SPLITS, at, at >= 0)
                logit = tl.sum(rounded(logit, ROUND_TO).to(tl.float32), axis=0)
            else:
                logit = tl.load(logit_ptr + row * logit_stride).to(tl.float32)
            shared = tl.load(shared_ptr + row * shared_stride + cols, mask=inside, other=0.0).to(tl.float32)
            out = out + 1.0 / (1.0 + tl.exp(-logit)) * shared
        return out

    @triton.jit(do_not_specialize_on_alignment=["down_ptr", "shared_ptr", "logit_ptr", "out_ptr"])
    def _combine_kernel(
        w_ptr,
        down_ptr,
        shared_ptr,
        logit_ptr,
        out_ptr,
        hidden,
        down_stride,
        shared_stride,
        logit_stride,
        logit_plane,
        TOP_K: tl.constexpr,
        SHARED: tl.constexpr,
        LOGIT_SPLITS: tl.constexpr,
        BLOCK: tl.constexpr,
        PDL: tl.constexpr,
    ):
        after_previous_kernel(PDL)
        row = tl.program_id(0).to(tl.int64)
        cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        inside = cols < hidden
        dtype = out_ptr.dtype.element_ty
        out = terms_sum(
            w_ptr,
            down_ptr,
            shared_ptr,
            logit_ptr,
            row,
            cols,
            inside,
            hidden,
            down_stride,
            shared_stride,
            logit_stride,
            logit_plane,
            TOP_K,
            SHARED,
            LOGIT_SPLITS,
            dtype,
        )
        tl.store(out_ptr + row * hidden + cols, rounded(out, dtype), mask=inside)

    @triton.jit(do_not_specialize_on_alignment=["logit_ptr", "s0", "s1", "s2", "s3"])
    def _route_kernel(
        logit_ptr,
        w_ptr,
        id_ptr,
        experts,
        logit_stride,
        plane,
        s0,
        s1,
        s2,
        s3,
        b0,
        b1,
        b2,
        b3,
        shared_id,
        TOP_K: tl.constexpr,
        ID_COLUMNS: tl.constexpr,
        SPLITS: tl.constexpr,
        ROUND_TO: tl.constexpr,
        RENORMALISE: tl.constexpr,
        PREFETCH: tl.constexpr,
        BLOCK_E: tl.constexpr,
        BLOCK_K: tl.constexpr,
        PDL: tl.constexpr,
    ):
        after_previous_kernel(PDL)
        row = tl.program_id(0).to(tl.int64)
        cols = tl.arange(0, BLOCK_E)
        inside = cols < experts
        if SPLITS > 0:  # float32 partials [splits, tokens, experts], summed as the matmul's sum kernel sums them
            x = split_sum(logit_ptr, plane, SPLITS, row * logit_stride + cols, inside)
            x = tl.where(inside, rounded(x, ROUND_TO).to(tl.float32), -float("inf"))
        else:
            x = tl.load(logit_ptr + row * logit_stride + cols, mask=inside, other=-float("inf")).to(tl.float32)
        e = tl.exp(x - tl.max(x, axis=0))
        probs = tl.where(inside, e / tl.sum(e, axis=0), -1.0)
        # one reduction a choice: a probability's bits above the complement of its expert id order as (the
        # probability, then the lower id) do; a probability is >= 0 (its bits order as integers), -1 sinks
        keys = (probs.to(tl.int32, bitcast=True).to(tl.int64) << 32) | (BLOCK_E - 1 - cols).to(tl.int64)
        slots = tl.arange(0, BLOCK_K)
        chosen = tl.zeros([BLOCK_K], dtype=tl.float32)
        ids = tl.zeros([BLOCK_K], dtype=tl.int64)
        for j in tl.static_range(TOP_K):
            top = tl.max(keys, axis=0)
            best = (top >> 32).to(tl.int32).to(tl.float32, bitcast=True)
            expert = BLOCK_E - 1 - (top & 0xFFFFFFFF)
            chosen = tl.where(slots == j, best, chosen)
            ids = tl.where(slots == j, expert, ids)
            if j == 0:
                total = best
            else:
                total = total + best
            keys = tl.where(keys == top, -1, keys)
        if RENORMALISE:
            chosen = chosen / total
        kept = slots < TOP_K
        tl.store(w_ptr + row * TOP_K + slots, chosen, mask=kept)
        if ID_COLUMNS > TOP_K:  # the shared expert's id after the routed ones
            ids = tl.where(slots == TOP_K, shared_id, ids)
        tl.store(id_ptr + row * ID_COLUMNS + slots, ids, mask=slots < ID_COLUMNS)
        if PDL == 2:  # the chosen experts' bytes of each stack (a slot past TOP_K repeats expert ids[0])
            first = tl.where(kept, ids, tl.max(tl.where(slots == 0, ids, 0), axis=0))
            if PREFETCH > 0:
                prefetch_to_l2(s0 + first * b0, first * 0 + b0)
            if PREFETCH > 1:
                prefetch_to_l2(s1 + first * b1, first * 0 + b1)
            if PREFETCH > 2:
                prefetch_to_l2(s2 + first * b2, first * 0 + b2)
            if PREFETCH > 3:
                prefetch_to_l2(s3 + first * b3, first * 0 + b3)
