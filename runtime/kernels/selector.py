"""DFlash2's candidate selector (runtime/drafters/dflash2.py CandidateSelector) in two steps of few launches: each
draft row's top-K candidates over the vocabulary, then the walk over them, one launch for a whole block.

Candidates. torch's top-k over 248,320 logits is a radix select of ~10 launches; `top_candidates` is three, and
reads each row's logits once and K chunks of them again: each program finds the largest logit of a chunk of CHUNK;
K programs a row each take the K largest of one of the row's K chunks of largest maxima (a larger maximum first,
between equal ones the chunk of lower ids); one program a row takes the K largest of those K·K picks. The K largest
of a row lie in those chunks: each of them holds a logit at least as large as the K-th chunk's maximum, which is at
least any logit of another chunk, and a logit equal to it in another chunk comes after all K of them (its chunk's ids
are higher). Every pass takes a larger value first and, between equal values, the lower id, so the result is the
same however the vocabulary is cut (torch leaves the order of ties open: the reference's ids may differ there, never
its values).

Walk. For each sequence, left to right over the block's k rows after the anchor, with `previous` the token chosen
before (the anchor first):

    scores[c] = unary[j, c] + sum_r (predecessors[previous, r] · hidden[j, r]) · successors[candidates[j, c], r]

and the row's token is candidates[j, argmax scores] (greedy), or, sampled, a Gumbel-max draw from q =
softmax(scores / temperature) with the given keyed noise (sampling.keyed_sample), q being kept for the verify
rule. The reference is that loop in torch ops (~10 launches a row, run eagerly or captured in the proposal's
graph); the kernel keeps the walk in one program per sequence, its K candidates' successor rows in registers.

A proposal never changes what the target emits (the verify rule keeps only what the target itself chooses), so
the kernel need not match the reference's bits: its sums over the rank run in another order, so a score may
differ in its last bit and a near tie may fall the other way, costing at most that draft's acceptance. Each
sequence is one program reading only its own rows, so a sequence drafts the same tokens alone as in a batch.
"""

from __future__ import annotations

import torch
from torch import Tensor

from specpair.runtime.kernels.triton_common import (
    after_previous_kernel,
    device_function,
    launch_options,
    require_triton,
    tl,
    triton,
)
from specpair.runtime.sampling import keyed_sample

CHUNK = 2048  # logits per program of the candidates' first pass: 122 programs a row for a 248,320-token vocabulary


def top_candidates(logits: Tensor, k: int) -> tuple[Tensor, Tensor]:
    """logits [..., V] -> (the k largest of each row, float32, descending [..., k]; their ids [..., k] int64)."""
    if logits.shape[-1] < k:
        raise ValueError(f"top_candidates: {k} candidates of {logits.shape[-1]} logits")
    if logits.is_cuda:
        return top_candidates_triton(logits, k)
    return top_candidates_reference(logits, k)


def top_candidates_reference(logits: Tensor, k: int) -> tuple[Tensor, Tensor]:
    values, ids = torch.topk(logits, k, dim=-1)  # in the logits' dtype: widening after is exact
    return values.float(), ids


def top_candidates_triton(logits: Tensor, k: int) -> tuple[Tensor, Tensor]:
    require_triton("top_candidates")
    vocab = logits.shape[-1]
    rows = logits.reshape(-1, vocab)
    if rows.stride(-1) != 1:
        rows = rows.contiguous()
    chunks = triton.cdiv(vocab, CHUNK)
    kept = min(k, chunks)  # the chunks of largest maxima, which hold the k largest logits
    maxima = torch.empty(rows.shape[0], chunks, dtype=torch.float32, device=logits.device)
    picked = torch.empty(rows.shape[0], kept * k, dtype=torch.float32, device=logits.device)
    picked_ids = torch.empty(rows.shape[0], kept * k, dtype=torch.int32, device=logits.device)
    values = torch.empty(rows.shape[0], k, dtype=torch.float32, device=logits.device)
    ids = torch.empty(rows.shape[0], k, dtype=torch.int64, device=logits.device)
    if rows.shape[0]:
        _chunk_max_kernel[(rows.shape[0], chunks)](rows, maxima, vocab, rows.stride(0), CHUNK=CHUNK, **launch_options())
        _chunk_top_kernel[(rows.shape[0], kept)](
            rows,
            maxima,
            picked,
            picked_ids,
            vocab,
            rows.stride(0),
            chunks,
            K=k,
            CHUNK=CHUNK,
            CHUNKS=triton.next_power_of_2(chunks),
            **launch_options(),
        )
        _merge_top_kernel[(rows.shape[0],)](
            picked,
            picked_ids,
            values,
            ids,
            kept * k,
            K=k,
            BLOCK=triton.next_power_of_2(kept * k),
            **launch_options(),
        )
    return values.view(*logits.shape[:-1], k), ids.view(*logits.shape[:-1], k)


def selector_walk(
    unary: Tensor,
    candidates: Tensor,
    hidden: Tensor,
    predecessors: Tensor,
    successors: Tensor,
    anchors: Tensor,
    noise: Tensor | None,
    temperature: float,
) -> tuple[Tensor, Tensor | None]:
    """unary [B, k, K] float32 (the rows' top-K logits) of candidates [B, k, K], hidden [B, k, R] float32,
    predecessors and successors [V, R] float32, anchors [B]; noise [B, k, K] (the keyed Gumbel noise of each
    candidate) to draw, None for greedy -> (tokens [B, k], q [B, k, K] or None when greedy)."""
    if unary.is_cuda:
        return selector_walk_triton(unary, candidates, hidden, predecessors, successors, anchors, noise, temperature)
    return selector_walk_reference(unary, candidates, hidden, predecessors, successors, anchors, noise, temperature)


def selector_walk_reference(
    unary: Tensor,
    candidates: Tensor,
    hidden: Tensor,
    predecessors: Tensor,
    successors: Tensor,
    anchors: Tensor,
    noise: Tensor | None,
    temperature: float,
) -> tuple[Tensor, Tensor | None]:
    previous, tokens, q_rows = anchors, [], []
    for j in range(unary.shape[1]):
        context = predecessors[previous] * hidden[:, j]  # [B, R]
        scores = unary[:, j] + (context[:, None, :] * successors[candidates[:, j]]).sum(dim=-1)
        if noise is None:
            index = scores.argmax(dim=-1)
        else:
            q = torch.softmax(scores / temperature, dim=-1)
            index = keyed_sample(q, noise[:, j])
            q_rows.append(q)
        previous = candidates[:, j].gather(1, index[:, None])[:, 0]
        tokens.append(previous)
    chosen = torch.stack(tokens, dim=1) if tokens else anchors[:, None][:, :0]
    return chosen, (torch.stack(q_rows, dim=1) if q_rows else None)


def selector_walk_triton(
    unary: Tensor,
    candidates: Tensor,
    hidden: Tensor,
    predecessors: Tensor,
    successors: Tensor,
    anchors: Tensor,
    noise: Tensor | None,
    temperature: float,
) -> tuple[Tensor, Tensor | None]:
    require_triton("selector_walk")
    batch, steps, top_k = unary.shape
    rank = hidden.shape[-1]
    if (
        candidates.shape != unary.shape
        or hidden.shape[:2] != (batch, steps)
        or predecessors.shape != successors.shape
        or predecessors.shape[1] != rank
        or anchors.shape != (batch,)
        or (noise is not None and noise.shape != unary.shape)
    ):
        raise ValueError(
            f"selector_walk: unary {list(unary.shape)}, candidates {list(candidates.shape)}, hidden "
            f"{list(hidden.shape)}, codebooks {list(predecessors.shape)} and {list(successors.shape)}, anchors "
            f"{list(anchors.shape)} do not fit"
        )
    unary, candidates, hidden = (t.contiguous() for t in (unary, candidates, hidden))
    predecessors, successors = predecessors.contiguous(), successors.contiguous()
    tokens = torch.empty(batch, steps, dtype=torch.int64, device=unary.device)
    q = torch.empty_like(unary) if noise is not None else None
    if tokens.numel():
        _walk_kernel[(batch,)](
            unary,
            candidates,
            hidden,
            predecessors,
            successors,
            anchors.to(torch.int64).contiguous(),
            unary if noise is None else noise.contiguous(),
            tokens,
            unary if q is None else q,
            steps,
            top_k,
            rank,
            float(temperature),
            SAMPLED=noise is not None,
            BLOCK_K=triton.next_power_of_2(top_k),
            BLOCK_R=triton.next_power_of_2(rank),
            **launch_options(),
        )
    return tokens, q


if triton is not None:

    @triton.jit
    def _walk_kernel(
        unary_ptr,
        candidates_ptr,
        hidden_ptr,
        predecessors_ptr,
        successors_ptr,
        anchors_ptr,
        noise_ptr,
        tokens_ptr,
        q_ptr,
        steps,
        top_k,
        rank,
        temperature,
        SAMPLED: tl.constexpr,
        BLOCK_K: tl.constexpr,
        BLOCK_R: tl.constexpr,
        PDL: tl.constexpr,
    ):
        after_previous_kernel(PDL)
        b = tl.program_id(0).to(tl.int64)
        ks = tl.arange(0, BLOCK_K)
        rs = tl.arange(0, BLOCK_R)
        is_candidate = ks < top_k
        in_rank = rs < rank
        previous = tl.load(anchors_ptr + b)
        for j in range(steps):
            row = b * steps + j
            context = tl.load(predecessors_ptr + previous * rank + rs, mask=in_rank, other=0.0) * tl.load(
                hidden_ptr + row * rank + rs, mask=in_rank, other=0.0
            )
            ids = tl.load(candidates_ptr + row * top_k + ks, mask=is_candidate, other=0)
            codes = tl.load(
                successors_ptr + ids[:, None] * rank + rs[None, :],
                mask=is_candidate[:, None] & in_rank[None, :],
                other=0.0,
            )
            unary = tl.load(unary_ptr + row * top_k + ks, mask=is_candidate, other=0.0)
            scores = tl.where(is_candidate, unary + tl.sum(context[None, :] * codes, axis=1), float("-inf"))
            if SAMPLED:
                scaled = scores / temperature
                weights = tl.exp(scaled - tl.max(scaled, axis=0))
                q = weights / tl.sum(weights, axis=0)
                tl.store(q_ptr + row * top_k + ks, q, mask=is_candidate)
                noise = tl.load(noise_ptr + row * top_k + ks, mask=is_candidate, other=0.0)
                scores = tl.where(q > 0, tl.log(tl.where(q > 0, q, 1.0)) + noise, float("-inf"))
            index = tl.argmax(scores, axis=0, tie_break_left=True)
            previous = tl.sum(tl.where(ks == index, ids, 0), axis=0)
            tl.store(tokens_ptr + row, previous)

    @triton.jit
    def _chunk_max_kernel(logits_ptr, maxima_ptr, vocab, row_stride, CHUNK: tl.constexpr, PDL: tl.constexpr):
        after_previous_kernel(PDL)
        row = tl.program_id(0).to(tl.int64)
        chunk = tl.program_id(1)
        ids = chunk * CHUNK + tl.arange(0, CHUNK)
        x = tl.load(logits_ptr + row * row_stride + ids, mask=ids < vocab, other=float("-inf")).to(tl.float32)
        tl.store(maxima_ptr + row * tl.num_programs(1) + chunk, tl.max(x, axis=0))

    @triton.jit
    def _chunk_top_kernel(
        logits_ptr,
        maxima_ptr,
        picked_ptr,
        picked_ids_ptr,
        vocab,
        row_stride,
        chunks,
        K: tl.constexpr,
        CHUNK: tl.constexpr,
        CHUNKS: tl.constexpr,
        PDL: tl.constexpr,
    ):
        """The K largest logits of the row's chunk ranked program_id(1) by its maximum (larger first, between
        equal maxima the lower chunk)."""
        after_previous_kernel(PDL)
        row = tl.program_id(0).to(tl.int64)
        rank = tl.program_id(1)
        c = tl.arange(0, CHUNKS)
        real = c < chunks
        m = tl.load(maxima_ptr + row * chunks + c, mask=real, other=float("-inf"))
        # a chunk's rank: the real chunks before it in that order
        before = ((m[None, :] > m[:, None]) | ((m[None, :] == m[:, None]) & (c[None, :] < c[:, None]))) & real[None, :]
        ranks = tl.sum(before.to(tl.int32), axis=1)
        chunk = tl.sum(tl.where(real & (ranks == rank), c, 0), axis=0)
        ids = chunk * CHUNK + tl.arange(0, CHUNK)
        x = tl.load(logits_ptr + row * row_stride + ids, mask=ids < vocab, other=float("-inf")).to(tl.float32)
        out = (row * tl.num_programs(1) + rank) * K
        _store_largest(x, ids, ids < vocab, picked_ptr + out, picked_ids_ptr + out, K)

    @triton.jit
    def _merge_top_kernel(
        picked_ptr,
        picked_ids_ptr,
        values_ptr,
        ids_ptr,
        count,
        K: tl.constexpr,
        BLOCK: tl.constexpr,
        PDL: tl.constexpr,
    ):
        after_previous_kernel(PDL)
        row = tl.program_id(0).to(tl.int64)
        slots = tl.arange(0, BLOCK)
        live = slots < count
        x = tl.load(picked_ptr + row * count + slots, mask=live, other=float("-inf"))
        ids = tl.load(picked_ids_ptr + row * count + slots, mask=live, other=0)  # int32
        _store_largest(x, ids, live, values_ptr + row * K, ids_ptr + row * K, K)

    @device_function
    def _store_largest(x, ids, live, values_ptr, ids_ptr, K: tl.constexpr):
        """The K largest of x where live (a logit of -inf in its turn, as any other) and their int32 ids, a larger
        value first and between equal values the lower id: what both passes of the candidates keep. ids are
        distinct but for no_id, which a chunk of fewer than K logits stores once it runs out, with -inf; the K
        largest of a row's picks never reach one (its K chunks of largest maxima hold at least K logits). int32,
        not int64: each of the K rounds reduces the ids, and with 64-bit ids the chunk pass took 27.6 µs a DFlash2
        round on an H100 against 13.2 (plain launches)."""
        no_id = tl.cast(2**31 - 1, tl.int32)  # larger than any id: a vocabulary has fewer tokens
        for i in tl.static_range(K):
            best = tl.max(tl.where(live, x, float("-inf")), axis=0)
            first = tl.min(tl.where(live & (x == best), ids, no_id), axis=0)
            tl.store(values_ptr + i, best)
            tl.store(ids_ptr + i, first.to(ids_ptr.dtype.element_ty))
            live = live & (ids != first)
