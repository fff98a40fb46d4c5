"""The speculative loop: a drafter proposes, the target verifies a block in one pass, the rule keeps a prefix.

    results, timing = speculative_generate(target, drafter, prompts, max_tokens, sampling, stop_ids)

Prefill runs each prompt but its last token through the target (chunked, taps and hidden as the drafter asks),
and the drafter observes every chunk. The last prompt token is the first round's anchor: a round at anchor
position s drafts k = block_size - 1 tokens, runs [anchor, d_1 .. d_k] at s .. s+k through the target as a
verify step, keeps `accepted` drafts and the token after them (runtime/acceptance.py), commits anchor +
accepted rows (cache.commit rolls the target's KV and Gated DeltaNet state back to exactly that prefix), and
the drafter observes the step with its kept rows; the next anchor is the token after the kept drafts, at
s + accepted + 1. Sequences of a batch sit at their own positions and accept independently; a finished
sequence (a stop id, or max_tokens) keeps its place and commits nothing.

Exactness. The target's row for position p has the same bits alone, in a batch, in a decode step or in a
verify block (the kernels are batch-invariant), and the token it yields is its argmax or its keyed draw at p
(runtime/sampling.py): with the default rule (`rule="exact"`, acceptance.by_choice) every token the loop emits
is the one the undrafted loop (runtime/generate.py) emits at that position, greedy or seeded, whatever the
drafter proposed. `rule="rejection"` is Leviathan's rule with the drafter's q: lossless in distribution, but not
the undrafted run's draws.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor

from specpair.runtime import acceptance
from specpair.runtime.drafters import Committed, Drafter, Drafting
from specpair.runtime.generate import PREFILL_CHUNK
from specpair.runtime.model import Transformer
from specpair.runtime.sampling import TOKEN_STREAM, Sampling, gumbel, uniform

RULES = ("exact", "rejection")
DRAFT_STREAM = 1  # the drafter's own draws under the rejection rule, independent of the target's
ACCEPT_STREAM = 2  # the rejection rule's uniforms


@dataclass
class Drafted:
    tokens: list[int] = field(default_factory=list)  # generated ids (the prompt excluded), a final stop id included
    stopped: bool = False  # ended on a stop id, not at max_tokens
    finished: bool = False
    committed: list[int] = field(default_factory=list)  # tokens each of its rounds committed (accepted + 1)
    accepted: list[int] = field(default_factory=list)  # drafts each round kept

    @property
    def tau(self) -> float:
        """Tokens committed per round, the token after the drafts included."""
        return sum(self.committed) / len(self.committed) if self.committed else 0.0


@dataclass
class SpeculativeTiming:
    prefill_s: float = 0.0
    draft_s: float = 0.0  # propose and observe
    verify_s: float = 0.0  # the target's verify steps and the rule
    rounds: int = 0
    prompt_tokens: int = 0
    generated_tokens: int = 0

    @property
    def tokens_per_s(self) -> float:
        total = self.prefill_s + self.draft_s + self.verify_s
        return self.generated_tokens / total if total else 0.0


def acceptance_by_position(results: Sequence[Drafted], drafts: int) -> list[float]:
    """For draft position i = 1..drafts: the share of rounds that kept at least i drafts."""
    rounds = [a for r in results for a in r.accepted]
    return [sum(a >= i for a in rounds) / len(rounds) if rounds else 0.0 for i in range(1, drafts + 1)]


def speculative_generate(target: Transformer, drafter: Drafter, prompts: Sequence[Sequence[int]], max_tokens: int,
                         sampling: Sampling, stop_ids: Sequence[int] = (), *, block_size: int | None = None,
                         rule: str = "exact", chunk: int = PREFILL_CHUNK,
                         on_token: Callable[[int, int], None] | None = None) -> tuple[list[Drafted], SpeculativeTiming]:
    """Up to `max_tokens` new tokens per prompt, `block_size` (default: the drafter's) tokens verified a round."""
    if max_tokens < 1 or not prompts or any(len(p) == 0 for p in prompts):
        raise ValueError("speculative_generate needs max_tokens >= 1 and non-empty prompts")
    if rule not in RULES:
        raise ValueError(f"rule {rule!r} is not one of {', '.join(RULES)}")
    block = block_size or drafter.block_size
    if block < 1:
        raise ValueError(f"block size {block} verifies no token")
    drafts, device, batch = block - 1, target.device, len(prompts)
    lengths = [len(p) for p in prompts]
    context = max(lengths) + max_tokens + block
    cache = target.new_cache(batch, context)
    drafter.start(batch, context)
    drafting = Drafting(sampling, drafter.samples and not sampling.greedy,
                        TOKEN_STREAM if rule == "exact" else DRAFT_STREAM)
    timing = SpeculativeTiming(prompt_tokens=sum(lengths))
    stops = set(stop_ids)
    results = [Drafted() for _ in prompts]

    start = time.perf_counter()
    _prefill(target, drafter, cache, prompts, chunk)
    timing.prefill_s = time.perf_counter() - start
    anchors = torch.tensor([p[-1] for p in prompts], device=device)
    positions = torch.tensor([n - 1 for n in lengths], device=device)
    offsets = torch.arange(block, device=device)
    while not all(r.finished for r in results):
        start = time.perf_counter()
        if drafts:
            proposal = drafter.propose(anchors, positions, drafts, drafting)
            proposed = proposal.tokens
        else:
            proposal, proposed = None, anchors[:, None][:, :0]
        _sync(device)
        timing.draft_s += time.perf_counter() - start

        start = time.perf_counter()
        tokens = torch.cat((anchors[:, None], proposed), dim=1)
        rows = positions[:, None] + offsets
        out = target.forward(tokens, rows, cache, taps=drafter.taps, hidden=drafter.hidden, verify=True)
        accepted, following = _verify(out.logits, proposed, proposal, rows, sampling, rule)
        counts, nexts = accepted.tolist(), following.tolist()
        kept = []
        for b, r in enumerate(results):
            if r.finished:
                kept.append(0)
                continue
            emitted = proposed[b, :counts[b]].tolist() + [nexts[b]]
            room = max_tokens - len(r.tokens)
            taken = emitted[:room]
            for i, t in enumerate(taken):
                if t in stops:
                    taken = taken[:i + 1]
                    break
            r.tokens += taken
            if on_token:
                for t in taken:
                    on_token(b, t)
            r.accepted.append(counts[b])
            r.committed.append(len(taken))
            r.stopped = taken[-1] in stops
            r.finished = r.stopped or len(r.tokens) >= max_tokens
            kept.append(counts[b] + 1)
        kept_t = torch.tensor(kept, device=device)
        cache.commit(kept_t)
        _sync(device)
        timing.verify_s += time.perf_counter() - start
        timing.rounds += 1

        start = time.perf_counter()
        after = torch.cat((tokens[:, 1:], following[:, None]), dim=1)
        after[torch.arange(batch, device=device), accepted] = following
        drafter.observe(Committed(tokens, rows, after, kept_t, out.taps, out.hidden))
        live = torch.tensor([not r.finished for r in results], device=device)  # the finished keep their place
        anchors = torch.where(live, following, anchors)
        positions = torch.where(live, positions + kept_t, positions)
        _sync(device)
        timing.draft_s += time.perf_counter() - start
    timing.generated_tokens = sum(len(r.tokens) for r in results)
    return results, timing


def _verify(logits: Tensor, proposed: Tensor, proposal, rows: Tensor, sampling: Sampling,
            rule: str) -> tuple[Tensor, Tensor]:
    """(accepted [B], the token after them [B]) for the verify rows' logits [B, k+1, V]."""
    if sampling.greedy or rule == "exact":
        return acceptance.by_choice(proposed, sampling.choose(logits, rows + 1))
    p = sampling.probabilities(logits)
    if proposal is None or proposal.q_ids is None:
        q_ids, q_probs = proposed[..., None], torch.ones(proposed.shape + (1,), device=proposed.device)
    else:
        q_ids, q_probs = proposal.q_ids, proposal.q_probs
    accept_u = uniform(sampling.seed, ACCEPT_STREAM, rows[:, 1:], torch.zeros(1, dtype=torch.int64, device=rows.device))
    noise = gumbel(sampling.seed, TOKEN_STREAM, rows + 1, logits.shape[-1])
    return acceptance.rejection(p, proposed, q_ids, q_probs, accept_u[..., 0], noise)


def _prefill(target: Transformer, drafter: Drafter, cache, prompts: Sequence[Sequence[int]], chunk: int) -> None:
    """Each prompt but its last token into the target's cache in chunks (shorter ones padded, then committed to
    their own rows), each chunk observed by the drafter."""
    device, batch = target.device, len(prompts)
    lengths = [len(p) - 1 for p in prompts]
    done = [0] * batch
    while any(d < n for d, n in zip(done, lengths)):
        steps = min(chunk, max(n - d for d, n in zip(done, lengths)))
        kept = [min(steps, n - d) for d, n in zip(done, lengths)]
        tokens = [[p[d + t] if t < k else 0 for t in range(steps)] for p, d, k in zip(prompts, done, kept)]
        following = [[p[d + t + 1] if t < k else 0 for t in range(steps)] for p, d, k in zip(prompts, done, kept)]
        positions = [[min(d + t, cache.context - 1) for t in range(steps)] for d in done]
        padded = any(k < steps for k in kept)
        tokens_t, positions_t = torch.tensor(tokens, device=device), torch.tensor(positions, device=device)
        out = target.forward(tokens_t, positions_t, cache, taps=drafter.taps, hidden=drafter.hidden, logits=False,
                             verify=padded)
        kept_t = torch.tensor(kept, device=device)
        if padded:
            cache.commit(kept_t)
        drafter.observe(Committed(tokens_t, positions_t, torch.tensor(following, device=device), kept_t,
                                  out.taps, out.hidden))
        done = [d + k for d, k in zip(done, kept)]


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
