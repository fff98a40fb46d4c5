"""Which drafted tokens a verify step keeps: pure functions of the target's rows, the drafts and given noise.

A round verifies [anchor, d_1 .. d_k]: target row i (i = 0..k) predicts the token after row i's, so row i-1
judges d_i and the first row whose draft fails, or row k when all pass, yields the next token. Every rule
returns (accepted [B], next [B]): the count of leading drafts kept (0..k) and the token that follows them, so a
round commits accepted + 1 tokens.

- `by_choice`: the target's own choice at each row, `choices` [B, k+1] (its argmax when greedy, its keyed
  sample otherwise: runtime/sampling.py), against the drafts: keep the leading matches, then the target's
  choice. The output is then exactly what the target alone produces, whatever the drafter did, bit for bit.
  With greedy choices it is the greedy rule. With keyed samples it is lossless speculative sampling for every
  drafter: for a drafter whose q is one-hot (it drafts its argmax) it is exactly the rejection rule with the
  residual max(p - onehot, 0) — P(keep d) = p(d), and the token after a rejection is the target's draw given
  that it is not d, i.e. p without d, renormalised; for a drafter that samples its q with the same keyed noise
  (Gumbel coupling), P(keep) >= sum min(p, q) / (2 - sum min(p, q)).
- `rejection`: lossless speculative sampling as Leviathan et al. / Chen et al. state it, for any q: keep d_i
  iff u_i q_i(d_i) < p_i(d_i), and after the first rejection draw from normalize(max(p_i - q_i, 0)) (p_i when
  that is empty); all kept: the bonus from p_k. q is sparse, (ids, probs) per draft position: one id for a
  one-hot draft, the selector's K candidates for DFlash2, the whole vocabulary for a draft model's softmax.
  Its output has the target's distribution but is not the target's own draw, so a seeded drafted run is not
  token-identical to the undrafted one.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from specpair.runtime.sampling import keyed_sample


def by_choice(drafts: Tensor, choices: Tensor) -> tuple[Tensor, Tensor]:
    """drafts [B, k], the target's choices [B, k+1] -> (accepted [B], next [B])."""
    k = drafts.shape[1]
    accepted = (drafts == choices[:, :k]).to(torch.int64).cumprod(dim=1).sum(dim=1)
    return accepted, choices.gather(1, accepted[:, None])[:, 0]


def by_choice_of(
    drafts: Tensor, logits: Tensor, positions: Tensor, choose: Callable[[Tensor, Tensor], Tensor]
) -> tuple[Tensor, Tensor]:
    """by_choice(drafts, choose(logits, positions)) for the target's rows `logits` [B, k+1, V], `choose` a row's own
    (its choice depends on no other row: Sampling.choose). On CUDA every row at once, in fixed shapes (CUDA graphs);
    on the CPU row j of a sequence only once its drafts before j were all kept, since a sampled choice there costs
    0.4-1.5 ms a row of SmolLM2's 49,152 tokens and a round keeps about tau - 1 of its k drafts."""
    if logits.is_cuda:
        return by_choice(drafts, choose(logits, positions))
    batch, k = drafts.shape
    accepted = torch.full((batch,), k, dtype=torch.int64)
    following = torch.empty(batch, dtype=torch.int64)
    live = torch.arange(batch)
    for j in range(k + 1):
        chosen = choose(logits[live, j], positions[live, j])
        kept = chosen == drafts[live, j] if j < k else torch.zeros_like(chosen, dtype=torch.bool)
        ended = live[~kept]
        accepted[ended], following[ended] = j, chosen[~kept]
        live = live[kept]
        if not len(live):
            break
    return accepted, following


def rejection(
    p: Tensor, drafts: Tensor, q_ids: Tensor, q_probs: Tensor, accept_u: Tensor, residual_noise: Tensor
) -> tuple[Tensor, Tensor]:
    """p [B, k+1, V] the target's distributions; drafts [B, k] drawn from q = (q_ids, q_probs) [B, k, K];
    accept_u [B, k] uniform (0, 1) and residual_noise [B, k+1, V] Gumbel, independent of the drafts."""
    batch, k = drafts.shape
    rows = torch.arange(batch, device=drafts.device)
    if k == 0:
        return torch.zeros(batch, dtype=torch.int64, device=drafts.device), keyed_sample(p[:, 0], residual_noise[:, 0])
    p_draft = p[:, :k].gather(2, drafts[..., None])[..., 0]
    q_draft = (q_probs * (q_ids == drafts[..., None])).sum(dim=-1)
    kept = (accept_u * q_draft < p_draft).to(torch.int64)
    accepted = kept.cumprod(dim=1).sum(dim=1)
    at = p[rows, accepted]  # [B, V]: the row that yields the next token
    ids, probs = q_ids[rows, accepted.clamp(max=k - 1)], q_probs[rows, accepted.clamp(max=k - 1)]
    residual = at.scatter_add(1, ids, -probs).clamp(min=0)
    residual = torch.where((accepted < k)[:, None], residual, at)  # all kept: the bonus draws from p_k itself
    residual = torch.where(residual.sum(dim=1, keepdim=True) > 0, residual, at)
    return accepted, keyed_sample(residual, residual_noise[rows, accepted])
