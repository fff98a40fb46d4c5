"""The speculative loop: a drafter proposes, the target verifies a block in one pass, the rule keeps a prefix.

    results, timing = speculative_generate(target, drafter, prompts, max_tokens, sampling, stop_ids)

Prefill runs each prompt but its last token through the target (chunked, taps and hidden as the drafter asks),
and the drafter observes every chunk: generate.prefill_context, the undrafted loop's start too, so that the last
prompt token is a generated row in both. The last prompt token is the first round's anchor: a round at anchor
position s drafts k = block_size - 1 tokens, runs [anchor, d_1 .. d_k] at s .. s+k through the target as a
verify step, keeps `accepted` drafts and the token after them (runtime/acceptance.py), commits anchor +
accepted rows (the verify step's Pending.commit rolls the target's KV and Gated DeltaNet state back to exactly
that prefix), and the drafter observes the step with its kept rows; the next anchor is the token after the kept
drafts, at s + accepted + 1. Sequences of a batch sit at their own positions and accept independently; a finished
sequence (a stop id, or max_tokens) keeps its place and commits nothing.

Exactness. The target's row for position p has the same bits alone, in a batch, in a decode step or in a
verify block (the kernels are batch-invariant), and the token it yields is its argmax or its keyed draw at p
(runtime/sampling.py): with the default rule (`rule="exact"`, acceptance.by_choice_of) every token the loop emits
is the one the undrafted loop (runtime/generate.py) emits at that position, greedy or seeded, whatever the
drafter proposed. `rule="rejection"` is Leviathan's rule with the drafter's q: lossless in distribution, but not
the undrafted run's draws.

Speed. With `graphs` (the default on CUDA) the verify step is a CUDA graph (runtime/graphs.py) and each drafter
captures its fixed-shape steps (`start(batch, context, graphs)`), all warmed up and captured before the first
round, untimed, and so is the commit's rollback (its shapes do not depend on the counts). What a round commits is
worked out on the device, in one graph too (`_decided`: the target's choices against the drafts, then `_kept`: the
accepted drafts and the token after them, cut at max_tokens and at a stop id; the next anchors and positions), so
commit, observation and the next round's proposal are queued before the host reads the round, once, in one copy
(the counts, the committed tokens, which rows are done), which it needs to emit tokens: the GPU drafts while the
host emits. Its draft and verify phases are timed by CUDA events, read at the end.

What the loop costs beyond its steps: `round_steps` builds the target's decode step, its verify step and the
drafter's round (propose + observe), each callable alone after a prefill of the same prompts, and `step_times`
times them replayed back to back (benchmarks/round_profile.py --loop profiles them beside the loop's rounds).
From them and τ, `StepTimes.predicted_speedup` is what a loop with no overhead of its own would reach; a measured
speedup below it is the loop's own work (the round's one read, the launches between its graphs, the host's
bookkeeping).
"""

from __future__ import annotations

import functools
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

import torch
from torch import Tensor

from specpair.runtime import acceptance
from specpair.runtime.cache import Cache
from specpair.runtime.drafters import Committed, Drafter, Drafting, Proposal
from specpair.runtime.generate import PREFILL_CHUNK, prefill_context
from specpair.runtime.graphs import ForwardGraph, StepGraphs
from specpair.runtime.model import StepOutput, Transformer
from specpair.runtime.sampling import TOKEN_STREAM, Sampling, greedy_choice, gumbel, uniform

RULES = ("exact", "rejection")
DRAFT_STREAM = 1  # the drafter's own draws under the rejection rule, independent of the target's
ACCEPT_STREAM = 2  # the rejection rule's uniforms


@dataclass
class Drafted:
    tokens: list[int] = field(default_factory=list)  # generated ids (the prompt excluded), a final stop id included
    stopped: bool = False  # ended on a stop id, not at max_tokens
    finished: bool = False
    committed: list[int] = field(default_factory=list)  # tokens each round committed: accepted + 1, fewer if cut
    accepted: list[int] = field(default_factory=list)  # drafts each round kept

    @property
    def measured(self) -> list[int]:
        """Drafts kept in each round that committed them all and the token after them. A round cut short by
        max_tokens or a stop id (the last one) is left out: what the drafter would have kept past the cut is not
        known, and counting its committed tokens would make tau disagree with acceptance by position. ModelOpt's
        specdec_bench leaves each request's last step out for the same reason."""
        return [a for a, c in zip(self.accepted, self.committed) if c == a + 1]

    @property
    def tau(self) -> float:
        """Tokens committed per measured round, the token after the drafts included: 1 + the sum of acceptance
        by position over the same rounds."""
        return mean_accept_length(self.measured)


@dataclass
class SpeculativeTiming:
    prefill_s: float = 0.0
    draft_s: float = 0.0  # propose and observe
    verify_s: float = 0.0  # the target's verify steps and the rule
    capture_s: float = 0.0  # warming up and capturing the graphs: once per call, in no other figure
    rounds: int = 0
    prompt_tokens: int = 0
    generated_tokens: int = 0

    @property
    def tokens_per_s(self) -> float:
        total = self.prefill_s + self.draft_s + self.verify_s
        return self.generated_tokens / total if total else 0.0


@dataclass
class StepTimes:
    """Seconds per call of each step alone, on the same batch and context."""

    decode_s: float  # the target's one-token step (the undrafted loop's step)
    verify_s: float  # the target's verify step of a block
    draft_s: float  # the drafter's round: its proposal of block - 1 drafts and its observation of the verify step

    def predicted_speedup(self, tau: float) -> float:
        """Tokens per second drafted over undrafted if a round cost only its steps: τ tokens per draft + verify,
        against one token per decode step."""
        return tau * self.decode_s / (self.draft_s + self.verify_s)


def mean_accept_length(accepted: Sequence[int]) -> float:
    """tau: tokens per round over rounds that kept `accepted` drafts each (0.0 for no rounds)."""
    return 1 + sum(accepted) / len(accepted) if accepted else 0.0


def accepted_by_position(accepted: Sequence[int], drafts: int) -> list[float]:
    """For draft position i = 1..drafts: the share of rounds, each keeping `accepted` drafts, that kept at least
    i; 1 + their sum is mean_accept_length of the same rounds."""
    return [sum(a >= i for a in accepted) / len(accepted) if accepted else 0.0 for i in range(1, drafts + 1)]


def acceptance_by_position(results: Sequence[Drafted], drafts: int) -> list[float]:
    """accepted_by_position over the measured rounds (Drafted.measured) of `results`."""
    return accepted_by_position([a for r in results for a in r.measured], drafts)


def speculative_generate(
    target: Transformer,
    drafter: Drafter,
    prompts: Sequence[Sequence[int]],
    max_tokens: int,
    sampling: Sampling,
    stop_ids: Sequence[int] = (),
    *,
    block_size: int | None = None,
    rule: str = "exact",
    chunk: int = PREFILL_CHUNK,
    on_token: Callable[[int, int], None] | None = None,
    graphs: bool | None = None,
    keep_rows: bool | None = None,
) -> tuple[list[Drafted], SpeculativeTiming]:
    """Up to `max_tokens` new tokens per prompt, `block_size` (default: the drafter's) tokens verified a round.
    `graphs`: the verify step and the drafter's fixed-shape steps as CUDA graphs (default: on CUDA). `keep_rows`:
    finished sequences keep their rows and the next proposal is queued before the host reads a round (default,
    and required, with graphs); else they leave the rounds."""
    if max_tokens < 1 or not prompts or any(len(p) == 0 for p in prompts):
        raise ValueError("speculative_generate needs max_tokens >= 1 and non-empty prompts")
    if rule not in RULES:
        raise ValueError(f"rule {rule!r} is not one of {', '.join(RULES)}")
    block = block_size or drafter.block_size
    if block < 1:
        raise ValueError(f"block size {block} verifies no token")
    drafts, device, batch = block - 1, target.device, len(prompts)
    graphs = device.type == "cuda" if graphs is None else graphs
    keep_rows = graphs if keep_rows is None else keep_rows
    if graphs and not keep_rows:
        raise ValueError("a graphed verify step keeps its batch: keep_rows=False needs graphs=False")
    lengths = [len(p) for p in prompts]
    context = max(lengths) + max_tokens + block
    cache = target.new_cache(batch, context)
    drafter.start(batch, context, graphs)
    drafting = Drafting(
        sampling, drafter.samples and not sampling.greedy, TOKEN_STREAM if rule == "exact" else DRAFT_STREAM
    )
    timing = SpeculativeTiming(prompt_tokens=sum(lengths))
    stops = set(stop_ids)
    results = [Drafted() for _ in prompts]

    start = time.perf_counter()
    _prefill_drafted(target, drafter, cache, prompts, chunk)
    _sync(device)
    timing.prefill_s = time.perf_counter() - start
    anchors = torch.tensor([p[-1] for p in prompts], device=device)
    positions = torch.tensor([n - 1 for n in lengths], device=device)
    offsets = torch.arange(block, device=device)
    start = time.perf_counter()
    verify, prepared = _verify_step(target, drafter, cache, anchors, positions, block, drafting, graphs)
    stop_tensor = torch.tensor(sorted(stops), dtype=torch.int64, device=device)
    generated = torch.zeros(batch, dtype=torch.int64, device=device)
    done = torch.zeros(batch, dtype=torch.bool, device=device)
    # what a round keeps, from the verify step's logits (the exact rule) or from the rule's counts: one graph each
    by_choice = sampling.greedy or rule == "exact"
    fixed = {"stops": stop_tensor, "max_tokens": max_tokens}  # the same every round: read in place by a graph
    decide = StepGraphs(functools.partial(_decided, sampling=sampling, **fixed), graphs and by_choice)
    settle = StepGraphs(functools.partial(_settled, **fixed), graphs and not by_choice)
    if graphs:
        _warm_up_decision(prepared, decide if by_choice else settle, by_choice, anchors, positions, block)
        _sync(device)
        timing.capture_s = time.perf_counter() - start
    clock = _Clock(device)
    # slots[i]: the sequence in batch row i. With keep_rows (a graphed verify step keeps its batch) finished rows
    # stay, committing nothing, and the next round's proposal is queued before the host reads this round, so the
    # GPU drafts while the host emits tokens (after the last round, one proposal goes unused). Else finished
    # sequences leave the rounds: moved behind the live ones (cache and drafter rows with them), which run as a
    # prefix of the batch; a round's cost then follows the sequences still generating, and the next proposal
    # waits for the host to know which they are.
    slots, live_rows = list(range(batch)), batch
    ahead: tuple[Proposal | None, Tensor] | None = None
    while live_rows:
        clock.mark("draft")
        step_anchors, step_positions = anchors[:live_rows], positions[:live_rows]
        proposal, proposed = ahead or _propose(drafter, step_anchors, step_positions, drafts, drafting)

        clock.mark("verify")
        tokens = torch.cat((step_anchors[:, None], proposed), dim=1)
        rows = step_positions[:, None] + offsets
        out = verify(tokens, rows)
        if by_choice:
            decision = decide(out.logits, proposed, tokens, rows, generated[:live_rows], done[:live_rows])
        else:
            accepted, following = _rejected(out.logits, proposed, proposal, rows, sampling)
            decision = settle(accepted, following, tokens, rows, generated[:live_rows], done[:live_rows])
        read = _HostCopy(decision.host)
        out.pending.commit(decision.kept)
        timing.rounds += 1

        clock.mark("draft")
        drafter.observe(Committed(tokens, rows, decision.after, decision.kept, out.taps, out.hidden))
        generated, done = _joined(decision.generated, generated, live_rows), _joined(decision.done, done, live_rows)
        anchors = _joined(decision.anchors, anchors, live_rows)
        positions = _joined(decision.positions, positions, live_rows)
        ahead = _propose(drafter, anchors[:live_rows], positions[:live_rows], drafts, drafting) if keep_rows else None

        finished = []
        for row, (count, kept, ended, *emitted) in enumerate(read.values()):
            r = results[slots[row]]
            if not r.finished:  # a row done before this round committed nothing
                taken = emitted[:kept]
                r.tokens += taken
                if on_token:
                    for t in taken:
                        on_token(slots[row], t)
                r.accepted.append(count)
                r.committed.append(kept)
                r.finished, r.stopped = bool(ended), bool(ended) and taken[-1] in stops
            finished.append(r.finished)
        if keep_rows:
            live_rows = 0 if all(finished) else live_rows
        elif any(finished):
            order = [i for i in range(live_rows) if not finished[i]] + [i for i in range(live_rows) if finished[i]]
            order += list(range(live_rows, batch))
            moved = torch.tensor(order, device=device)
            cache.reorder(moved)
            drafter.reorder(moved)
            anchors, positions, generated, done = anchors[moved], positions[moved], generated[moved], done[moved]
            slots = [slots[i] for i in order]
            live_rows -= sum(finished)
    clock.mark("end")
    spent = clock.totals()
    timing.draft_s, timing.verify_s = spent.get("draft", 0.0), spent.get("verify", 0.0)
    timing.generated_tokens = sum(len(r.tokens) for r in results)
    return results, timing


def _propose(
    drafter: Drafter, anchors: Tensor, positions: Tensor, drafts: int, drafting: Drafting
) -> tuple[Proposal | None, Tensor]:
    """The drafter's proposal for a round at `anchors` and its tokens [B, drafts] (none for a block of 1)."""
    if not drafts:
        return None, anchors[:, None][:, :0]
    proposal = drafter.propose(anchors, positions, drafts, drafting)
    return proposal, proposal.tokens


class Kept(NamedTuple):
    """What a round keeps, worked out on the device: the next round and the host read it."""

    kept: Tensor  # [B] tokens each row commits: its accepted drafts and the token after them, cut (_kept)
    after: Tensor  # [B, T] the verified rows' tokens as the round leaves them: row j holds the token after j
    done: Tensor  # [B] bool: the row is finished
    generated: Tensor  # [B] tokens each row has generated, this round's included
    anchors: Tensor  # [B] the next round's anchor (a finished row keeps its own)
    positions: Tensor  # [B] the next anchor's position
    host: Tensor  # [B, 3 + T] accepted, kept, done and after: what the host reads of the round, in one copy


def _decided(
    logits: Tensor,
    proposed: Tensor,
    tokens: Tensor,
    rows: Tensor,
    generated: Tensor,
    done: Tensor,
    *,
    stops: Tensor,
    max_tokens: int,
    sampling: Sampling,
) -> Kept:
    """The round under the exact rule: the target's own choice at each verified row (its argmax or keyed draw)
    against the drafts (acceptance.by_choice_of), then `_settled`."""
    accepted, following = acceptance.by_choice_of(proposed, logits, rows + 1, sampling.choose)
    return _settled(accepted, following, tokens, rows, generated, done, stops=stops, max_tokens=max_tokens)


def _settled(
    accepted: Tensor,
    following: Tensor,
    tokens: Tensor,
    rows: Tensor,
    generated: Tensor,
    done: Tensor,
    *,
    stops: Tensor,
    max_tokens: int,
) -> Kept:
    """What rows that accepted `accepted` drafts [B], then `following` [B], keep of a round that verified `tokens`
    at `rows` [B, T]: fixed shapes and no host read, so it runs inside a CUDA graph."""
    after = torch.cat((tokens[:, 1:], following[:, None]), dim=1)
    after[torch.arange(after.shape[0], device=after.device), accepted] = following
    kept, finished = _kept(after, accepted, generated, done, max_tokens, stops)
    anchors = torch.where(finished, tokens[:, 0], following)
    positions = torch.where(finished, rows[:, 0], rows[:, 0] + kept)
    host = torch.cat((accepted[:, None], kept[:, None], finished[:, None], after), dim=1)
    return Kept(kept, after, finished, generated + kept, anchors, positions, host)


def _joined(live: Tensor, old: Tensor, live_rows: int) -> Tensor:
    """The live rows' new values ahead of the finished rows' old ones (none where every row is live)."""
    return live if live_rows == old.shape[0] else torch.cat((live, old[live_rows:]))


def _kept(
    after: Tensor, accepted: Tensor, generated: Tensor, done: Tensor, max_tokens: int, stops: Tensor
) -> tuple[Tensor, Tensor]:
    """(tokens each row commits this round [B], which rows are done after it [B]). A row offers its accepted drafts
    and the token after them (after[:, :accepted + 1]); it keeps them up to max_tokens and through its first stop
    id, and nothing once done. Computed where the round ran, so the commit needs no host read."""
    offered = accepted + 1
    index = torch.arange(after.shape[1], device=after.device)
    # every stop id compared, not torch.isin: past ~10·n^0.145 ids (numpy's rule) isin sorts with a host read
    stopping = (after[..., None] == stops).any(dim=-1)
    stop_at = torch.where(stopping & (index < offered[:, None]), index, after.shape[1]).amin(dim=1)
    allowed = torch.minimum(offered, max_tokens - generated)
    kept = torch.where(done, 0, torch.minimum(allowed, stop_at + 1))
    return kept, done | (stop_at < allowed) | (generated + kept >= max_tokens)


class _HostCopy:
    """A device tensor's values for the host, copied without waiting: on CUDA into pinned memory, queued on the
    stream with an event after it, so the host can queue more work before it waits for them."""

    def __init__(self, values: Tensor) -> None:
        self.event = None
        if values.is_cuda:
            self.host = torch.empty(values.shape, dtype=values.dtype, pin_memory=True)
            self.host.copy_(values, non_blocking=True)
            self.event = torch.cuda.Event()
            self.event.record()
        else:
            self.host = values

    def values(self) -> list[list[int]]:
        if self.event is not None:
            self.event.synchronize()
        return self.host.tolist()


@dataclass
class RoundSteps:
    """Each step of a round as the loop runs it, ready to call alone: `round_steps` builds them."""

    decode: Callable[[], object]  # the target's one-token step
    verify: Callable[[], object]  # the target's verify step of a block, with the commit of its whole block
    draft: Callable[[], object]  # the drafter's proposal of block - 1 drafts and its observation of a verify step


def round_steps(
    target: Transformer,
    drafter: Drafter,
    prompts: Sequence[Sequence[int]],
    block: int,
    *,
    graphs: bool | None = None,
    chunk: int = PREFILL_CHUNK,
) -> RoundSteps:
    """The steps of a round after a prefill of `prompts`, as the loop runs them (CUDA graphs with `graphs`, the
    default on CUDA), each callable again and again: values are not kept, every call rewrites the same rows. The
    verify step runs the block a round would verify at the prompts' ends (the anchor and the drafter's proposal
    after it) and commits its whole block (the cache takes one verify step at a time; the rollback costs the same
    whatever was kept, but for the kept tokens' replay); the drafter observes a step that kept nothing (its observe
    steps have one shape whatever was kept)."""
    device, batch = target.device, len(prompts)
    graphs = device.type == "cuda" if graphs is None else graphs
    lengths = [len(p) for p in prompts]
    context = max(lengths) + block
    cache = target.new_cache(batch, context)
    drafter.start(batch, context, graphs)
    drafting = Drafting(Sampling(), False, TOKEN_STREAM)
    _prefill_drafted(target, drafter, cache, prompts, chunk)
    anchors = torch.tensor([p[-1] for p in prompts], device=device)
    positions = torch.tensor([n - 1 for n in lengths], device=device)
    rows = positions[:, None] + torch.arange(block, device=device)
    verify, _ = _verify_step(target, drafter, cache, anchors, positions, block, drafting, graphs)
    # the block a round verifies: the anchor and the drafter's proposal after it. Not the anchor repeated: a MoE
    # routes each distinct token to experts of its own, so such a block would read fewer experts than a round does
    tokens = torch.cat((anchors[:, None], _propose(drafter, anchors, positions, block - 1, drafting)[1]), dim=1)
    whole, nothing = torch.full((batch,), block, device=device), torch.zeros(batch, dtype=torch.int64, device=device)
    out = verify(tokens, rows)
    out.pending.commit(whole, [block] * batch)

    def verify_step() -> None:
        verify(tokens, rows).pending.commit(whole, [block] * batch)

    def draft_round() -> None:
        _propose(drafter, anchors, positions, block - 1, drafting)
        drafter.observe(Committed(tokens, rows, tokens, nothing, out.taps, out.hidden))

    # the decode step decodes what the undrafted loop would: the target's own token after each anchor, one a
    # sequence (the anchors of prompts that end alike, as chat templates make them, are one token repeated)
    following, at = greedy_choice(out.logits[:, 0])[:, None], positions[:, None] + 1
    decode = functools.partial(target.forward, cache=cache)
    if graphs:
        decode = ForwardGraph(target, cache, batch, 1)
        decode.prepare(following, at)
    return RoundSteps(lambda: decode(following, at), verify_step, draft_round)


def step_times(
    target: Transformer,
    drafter: Drafter,
    prompts: Sequence[Sequence[int]],
    block: int,
    *,
    graphs: bool | None = None,
    repeats: int = 20,
    chunk: int = PREFILL_CHUNK,
) -> StepTimes:
    """Each step of `round_steps` timed alone: `repeats` calls of each (after one untimed call), in spans of calls
    back to back that take turns between the steps; a step's time is the median of its spans' means. Taking turns
    puts a busy spell of the machine (a shared CPU core, a clock change) in every step's spans alike, where timing
    the steps one after another would charge it to whichever ran then, and the median leaves it out."""
    steps = round_steps(target, drafter, prompts, block, graphs=graphs, chunk=chunk)
    verify_s, draft_s, decode_s = seconds_per_call((steps.verify, steps.draft, steps.decode), repeats, target.device)
    return StepTimes(decode_s=decode_s, verify_s=verify_s, draft_s=draft_s)


SPANS = 5  # spans a step's calls are timed in (fewer when there are fewer calls)


def seconds_per_call(
    steps: Sequence[Callable[[], object]], repeats: int, device: torch.device, spans: int = SPANS
) -> list[float]:
    """Seconds per call of each of `steps`: one untimed call each, then `repeats` calls each in `spans` turns of
    back-to-back calls (the last spans take the remainder), the median of each step's span means."""
    spans = max(1, min(spans, repeats))
    calls = [repeats // spans + (i >= spans - repeats % spans) for i in range(spans)]
    for step in steps:
        step()
    _sync(device)
    means: list[list[float]] = [[] for _ in steps]
    for count in calls:
        for step, taken in zip(steps, means):
            start = time.perf_counter()
            for _ in range(count):
                step()
            _sync(device)
            taken.append((time.perf_counter() - start) / count)
    return [statistics.median(taken) for taken in means]


def _verify_step(
    target: Transformer,
    drafter: Drafter,
    cache: Cache,
    anchors: Tensor,
    positions: Tensor,
    block: int,
    drafting: Drafting,
    graphs: bool,
) -> tuple[Callable[[Tensor, Tensor], StepOutput], StepOutput | None]:
    """The verify step, whose output's Pending the caller commits: eager, or with `graphs` captured with its
    rollback (the drafter's graphs warmed up too), with the output of its warm-up (its buffers' shapes)."""
    if not graphs:
        verify = functools.partial(target.forward, cache=cache, taps=drafter.taps, hidden=drafter.hidden, verify=True)
        return verify, None
    return _warm_up_graphs(target, drafter, cache, anchors, positions, block, drafting)


def _warm_up_graphs(
    target: Transformer,
    drafter: Drafter,
    cache: Cache,
    anchors: Tensor,
    positions: Tensor,
    block: int,
    drafting: Drafting,
) -> tuple[ForwardGraph, StepOutput]:
    """Before the first round, untimed: the target's verify step captured (its warm-up run at the first round's
    positions is rolled back to nothing), and the drafter's graphs, which it builds at the second call of each
    fixed-shape step, warmed up and captured in the order the rounds call them: two proposals after the prompt
    (the first round's), then twice an observation of a step that kept nothing and a proposal after it (every
    later round's: a DFlash drafter's proposal then carries that observation, a shape of its own). Nothing
    leaves history behind: a proposal writes its cache only at positions from the anchor on, which the next
    round's proposal rewrites before reading (each drafter's cache hygiene), a step that kept nothing commits
    nothing (drafters/__init__.py), and the last call is a proposal, which leaves no observation waiting."""
    batch = anchors.shape[0]
    if block > 1:
        for _ in range(2):
            drafter.propose(anchors, positions, block - 1, drafting)
    rows = positions[:, None] + torch.arange(block, device=anchors.device)
    tokens = anchors[:, None].expand(batch, block).contiguous()
    verify = ForwardGraph(target, cache, batch, block, taps=drafter.taps, hidden=drafter.hidden, verify=True)
    out = verify.prepare(tokens, rows)
    nothing = torch.zeros(batch, dtype=torch.int64, device=anchors.device)
    for _ in range(2):
        drafter.observe(Committed(tokens, rows, tokens, nothing, out.taps, out.hidden))
        if block > 1:
            drafter.propose(anchors, positions, block - 1, drafting)
    return verify, out


def _warm_up_decision(
    prepared: StepOutput,
    decision: StepGraphs,
    by_choice: bool,
    anchors: Tensor,
    positions: Tensor,
    block: int,
) -> None:
    """The round's decision (`_decided`, or `_settled` after another rule) warmed up and captured before the first
    round, untimed, on the verify graph's warm-up output (`prepared`: its buffers, whatever they hold); a decision
    reads its inputs and writes only its own outputs, so its warm-up leaves nothing behind."""
    batch = anchors.shape[0]
    rows = positions[:, None] + torch.arange(block, device=anchors.device)
    tokens = anchors[:, None].expand(batch, block).contiguous()
    counts = torch.zeros(batch, dtype=torch.int64, device=anchors.device)
    done = torch.zeros(batch, dtype=torch.bool, device=anchors.device)
    for _ in range(2):  # a StepGraph captures at its second call
        if by_choice:
            decision(prepared.logits, tokens[:, 1:], tokens, rows, counts, done)
        else:
            decision(counts, anchors, tokens, rows, counts, done)


class _Clock:
    """Wall time per phase of the loop, summed: on CUDA from events recorded on the stream and read once at the
    end (timing adds no host synchronisation to a round), on the CPU from perf_counter."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self.marks: list[tuple[str, object]] = []

    def mark(self, phase: str) -> None:
        """The phase that starts now (and ends at the next mark)."""
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            self.marks.append((phase, event))
        else:
            self.marks.append((phase, time.perf_counter()))

    def totals(self) -> dict[str, float]:
        if self.cuda:
            self.marks[-1][1].synchronize()
        spent: dict[str, float] = {}
        for (phase, begin), (_, end) in zip(self.marks, self.marks[1:]):
            spent[phase] = spent.get(phase, 0.0) + (begin.elapsed_time(end) / 1e3 if self.cuda else end - begin)
        return spent


def _rejected(
    logits: Tensor, proposed: Tensor, proposal: Proposal | None, rows: Tensor, sampling: Sampling
) -> tuple[Tensor, Tensor]:
    """(accepted [B], the token after them [B]) by the rejection rule at a temperature, for the verify rows' logits
    [B, k+1, V] (eager: its draws' shapes follow the drafter's q)."""
    p = sampling.probabilities(logits)
    if proposal is None or proposal.q_ids is None:
        q_ids, q_probs = proposed[..., None], torch.ones(proposed.shape + (1,), device=proposed.device)
    else:
        q_ids, q_probs = proposal.q_ids, proposal.q_probs
    accept_u = uniform(sampling.seed, ACCEPT_STREAM, rows[:, 1:], torch.zeros(1, dtype=torch.int64, device=rows.device))
    noise = gumbel(sampling.seed, TOKEN_STREAM, rows + 1, logits.shape[-1])
    return acceptance.rejection(p, proposed, q_ids, q_probs, accept_u[..., 0], noise)


def _prefill_drafted(
    target: Transformer, drafter: Drafter, cache: Cache, prompts: Sequence[Sequence[int]], chunk: int
) -> None:
    """Each prompt but its last token (the first round's anchor) into the target's cache, every chunk observed by
    the drafter."""
    prefill_context(target, cache, prompts, chunk, taps=drafter.taps, hidden=drafter.hidden, observe=drafter.observe)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
