"""The speculative loop (runtime/speculative.py) with every drafter kind on every target family: drafted output
equals undrafted output token for token (torch.equal of the ids), while the drafters, distilled on their own
targets (tests/drafting.py), keep enough drafts (tau > 1.2) that the accept and rollback paths run.

CPU, float32: the kernels' references are batch-invariant by construction, so equality must be exact.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import pytest
import torch
from drafting import (
    FAMILIES,
    HYBRID,
    MASK_TOKEN,
    dflash_checkpoint,
    differentiable_kernels,
    eagle3_checkpoint,
    load_target,
    prompts,
    tiny_target,
    trained_drafter,
)
from fixtures import write_json
from safetensors.torch import load_file, save_file

from specpair.convert import converter as conv
from specpair.runtime import acceptance, speculative
from specpair.runtime.cache import Cache
from specpair.runtime.drafters import Committed, Drafting
from specpair.runtime.drafters.dflash import DFlash
from specpair.runtime.drafters.loading import load_drafter
from specpair.runtime.generate import generate
from specpair.runtime.graphs import ForwardGraph, StepGraph
from specpair.runtime.kernels import cpu_rows
from specpair.runtime.sampling import TOKEN_STREAM, Sampling, gumbel, uniform
from specpair.runtime.speculative import (
    ACCEPT_STREAM,
    DRAFT_STREAM,
    acceptance_by_position,
    round_steps,
    seconds_per_call,
    speculative_generate,
    step_times,
)
from specpair.sources.model import open_model

TOKENS = 64
PROMPT_LENGTHS = (5, 9, 13, 3)
KINDS = ("dflash", "dflash2", "eagle3", "mtp", "draft_model")
GRID = [(f, k) for f in FAMILIES for k in KINDS if k != "mtp" or f in HYBRID]
# block sizes over the grid (test_every_block_size_from_2_to_16 runs them all)
BLOCKS = {
    "dflash": (2, 3, 4, 5, 6, 7),
    "dflash2": (3, 4, 5, 6, 7, 8),
    "eagle3": (2, 3, 4, 5, 6, 3),
    "mtp": (2, 3, 4),
    "draft_model": (4, 5, 6, 7, 8, 4),
}
SOLO = {"dflash": "qwen3_5_moe", "dflash2": "qwen3", "eagle3": "qwen3_moe", "mtp": "qwen3_next", "draft_model": "llama"}
GREEDY = Sampling()


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@dataclasses.dataclass
class Setup:
    path: Path
    model: object
    target: object
    prompts: list[list[int]]
    reference: list[list[int]]  # undrafted greedy tokens per prompt


class Workshop:
    """Targets and trained drafters, built once per module and shared by the tests."""

    def __init__(self, root: Path) -> None:
        self.root, self.setups, self.drafters, self.batch_runs = root, {}, {}, {}

    def setup(self, family: str) -> Setup:
        if family not in self.setups:
            path = tiny_target(self.root / family / "target", family)
            model, target = load_target(path)
            asked = prompts(PROMPT_LENGTHS)
            reference, _ = generate(target, asked, TOKENS, GREEDY)
            self.setups[family] = Setup(path, model, target, asked, [r.tokens for r in reference])
        return self.setups[family]

    def drafter(self, family: str, kind: str) -> Path | None:
        """A drafter checkpoint that tracks the family's target (None for MTP: the target holds it)."""
        key = (family, kind)
        if key not in self.drafters:
            s = self.setup(family)
            where = self.root / family / kind
            if kind == "draft_model":
                self.drafters[key] = noisy_copy(s.path, where)
            else:
                checkpoint = {
                    "dflash": lambda: dflash_checkpoint(where, family, s.model.config),
                    "dflash2": lambda: dflash_checkpoint(where, family, s.model.config, dflash2=True),
                    "eagle3": lambda: eagle3_checkpoint(where, s.model.config),
                    "mtp": lambda: None,
                }[kind]()
                sequences = [p + r for p, r in zip(s.prompts, s.reference)]
                trained_drafter(
                    checkpoint,
                    s.path,
                    s.model,
                    s.target,
                    sequences,
                    min(PROMPT_LENGTHS) - 1,
                    steps=200 if kind == "dflash2" else 120,
                )
                self.drafters[key] = checkpoint
                if kind == "mtp":  # the target's file changed (its MTP head): reload it
                    s.model, s.target = load_target(s.path)
        return self.drafters[key]

    def load(self, family: str, kind: str, bits: int | None = None):
        checkpoint = self.drafter(family, kind)
        s = self.setup(family)
        return load_drafter(open_model(str(checkpoint)) if checkpoint else None, s.model, s.target, bits)


def noisy_copy(source: Path, directory: Path, scale: float = 0.03) -> Path:
    """The target with 3 % noise on its matrices: a plain draft model that is often, not always, right."""
    shutil.copytree(source, directory)
    tensors = load_file(str(directory / "model.safetensors"))
    g = torch.Generator().manual_seed(2)
    for name, t in tensors.items():
        if t.ndim >= 2 and t.is_floating_point() and not name.startswith("mtp."):
            tensors[name] = t + torch.randn(t.shape, generator=g) * t.std() * scale
    save_file(tensors, str(directory / "model.safetensors"), metadata={"format": "pt"})
    return directory


@pytest.fixture(scope="module")
def workshop(tmp_path_factory) -> Workshop:
    return Workshop(tmp_path_factory.mktemp("speculative"))


def first_difference(a: list[int], b: list[int]) -> str:
    at = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    return f"first difference at token {at}: {a[at : at + 3]} vs {b[at : at + 3]}"


@pytest.mark.parametrize("family,kind", GRID)
def test_drafted_equals_undrafted(workshop, family, kind):
    """Greedy, 64 tokens, a batch of 4 prompts of lengths 3..13, each sequence at its own position."""
    drafter = workshop.load(family, kind)
    s = workshop.setup(family)
    block = BLOCKS[kind][FAMILIES.index(family) % len(BLOCKS[kind])]
    out, timing = speculative_generate(s.target, drafter, s.prompts, TOKENS, GREEDY, block_size=block)
    workshop.batch_runs[(family, kind)] = out
    for got, want in zip(out, s.reference):
        assert torch.equal(torch.tensor(got.tokens), torch.tensor(want)), first_difference(got.tokens, want)
    tau = sum(r.tau for r in out) / len(out)
    assert tau > 1.2, f"{kind} on {family} keeps too few drafts: tau {tau:.2f}"
    assert all(sum(r.committed) == TOKENS for r in out) and timing.rounds == max(len(r.committed) for r in out)


@pytest.mark.parametrize("kind", KINDS)
def test_a_sequence_alone_drafts_as_in_a_batch(workshop, kind):
    """The longest prompt alone: the same tokens and the same rounds as beside three others."""
    family = SOLO[kind]
    drafter = workshop.load(family, kind)
    s = workshop.setup(family)
    block = BLOCKS[kind][FAMILIES.index(family) % len(BLOCKS[kind])]
    longest = PROMPT_LENGTHS.index(max(PROMPT_LENGTHS))
    batch = (
        workshop.batch_runs.get((family, kind))
        or speculative_generate(s.target, drafter, s.prompts, TOKENS, GREEDY, block_size=block)[0]
    )
    (alone,), _ = speculative_generate(s.target, drafter, [s.prompts[longest]], TOKENS, GREEDY, block_size=block)
    assert alone.tokens == s.reference[longest]
    assert alone.accepted == batch[longest].accepted


def test_both_loops_run_the_last_prompt_token_as_a_generated_row(workshop, monkeypatch):
    """On a CPU a prompt row's products (cpu_rows.prompt_tiles) may differ from a generated row's in the last bits
    (bf16 on an AMX CPU: a tie between two tokens in one role and not in the other); here they differ by far more,
    every product of prompt rows scaled by 1 + 2**-4. The loops still agree token for token: both run each prompt
    but its last token as prompt rows and the last token as a generated row (generate.prefill_context), where the
    undrafted loop once chose its first token from the prefill's last prompt row."""
    s = workshop.setup("llama")
    drafter = workshop.load("llama", "dflash")
    exact, prompt_rows = cpu_rows.rows_mm, cpu_rows.PRODUCTS[torch.float32].prompt

    def skewed(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        out = exact(a, b)
        return out * (1 + 2**-4) if cpu_rows.tile_rows() == prompt_rows else out

    monkeypatch.setattr(cpu_rows, "rows_mm", skewed)
    undrafted, _ = generate(s.target, s.prompts, 16, GREEDY)
    assert [r.tokens for r in undrafted] != [r[:16] for r in s.reference]  # the skew reaches the tokens
    drafted, _ = speculative_generate(s.target, drafter, s.prompts, 16, GREEDY, block_size=4)
    assert [r.tokens for r in drafted] == [r.tokens for r in undrafted]


def test_every_block_size_from_2_to_16(workshop):
    """Every block size with the target as its own draft model (every draft kept, so a round commits the whole
    block) and with a trained DFlash2 (its conv indexes the block size the runtime drafts, not the trained 8)."""
    s = workshop.setup("qwen3")
    itself = load_drafter(open_model(str(s.path)), s.model, s.target)
    dflash2 = workshop.load("qwen3", "dflash2")
    for block in range(2, 17):
        for drafter in (itself, dflash2):
            out, _ = speculative_generate(s.target, drafter, s.prompts[1:3], 16, GREEDY, block_size=block)
            assert [r.tokens for r in out] == [r[:16] for r in s.reference[1:3]], (block, drafter.kind)
            if drafter is itself:
                assert all(r.committed == [block] * (16 // block) + ([16 % block] if 16 % block else []) for r in out)


def test_rounds_that_keep_nothing_and_rounds_that_keep_everything(workshop, tmp_path):
    """The target as its own draft model keeps every draft of every round; an untrained DFlash keeps none of
    nearly all: rollback of 0 and of all of a block, on a hybrid target, and the output unchanged either way."""
    s = workshop.setup("qwen3_5")
    itself = load_drafter(open_model(str(s.path)), s.model, s.target)
    out, _ = speculative_generate(s.target, itself, s.prompts, 30, GREEDY, block_size=5)
    assert all(set(r.accepted[:-1]) == {4} for r in out)
    assert [r.tokens for r in out] == [r[:30] for r in s.reference]
    random_dflash = load_drafter(
        open_model(str(dflash_checkpoint(tmp_path / "d", "qwen3_5", s.model.config))), s.model, s.target
    )
    out, _ = speculative_generate(s.target, random_dflash, s.prompts, 30, GREEDY, block_size=5)
    assert [r.tokens for r in out] == [r[:30] for r in s.reference]
    assert all(r.accepted.count(0) >= len(r.accepted) - 2 for r in out)


@pytest.mark.parametrize("keep_rows", [False, True])
def test_rounds_at_the_end_of_max_tokens_and_at_stop_ids(workshop, keep_rows):
    """Rounds cut inside their block, by max_tokens and by a stop id among the accepted drafts, in both loop orders
    (finished rows leaving, or kept with the next proposal queued first)."""
    s = workshop.setup("qwen3")
    drafter = load_drafter(open_model(str(s.path)), s.model, s.target)  # keeps every draft: rounds of 4
    for max_tokens in (1, 2, 7, 13):
        out, _ = speculative_generate(
            s.target, drafter, s.prompts, max_tokens, GREEDY, block_size=4, keep_rows=keep_rows
        )
        assert [r.tokens for r in out] == [r[:max_tokens] for r in s.reference]
        assert all(r.committed[-1] == (max_tokens - 1) % 4 + 1 for r in out)
    stop = s.reference[1][10]
    undrafted, _ = generate(s.target, s.prompts, TOKENS, GREEDY, [stop])
    out, _ = speculative_generate(
        s.target, drafter, s.prompts, TOKENS, GREEDY, [stop], block_size=4, keep_rows=keep_rows
    )
    assert [r.tokens for r in out] == [r.tokens for r in undrafted]
    assert [r.stopped for r in out] == [r.stopped for r in undrafted] and out[1].stopped


@pytest.mark.parametrize("kind", KINDS)
def test_finished_sequences_leave_the_rounds_and_the_rest_stay_exact(workshop, kind, monkeypatch):
    """A sequence that stops early is moved behind the live ones (cache and drafter rows with it), and the rounds
    after run the live ones alone: each sequence's tokens are still the undrafted run's, and fewer rows run."""
    family = "qwen3_5" if kind == "mtp" else "llama"
    s = workshop.setup(family)
    drafter = workshop.load(family, kind)
    stop = s.reference[0][3]  # the first prompt stops early; the others run on
    undrafted, _ = generate(s.target, s.prompts, TOKENS, GREEDY, [stop])
    orders, widths, forward = [], [], s.target.forward
    monkeypatch.setattr(
        Cache, "reorder", lambda cache, order, real=Cache.reorder: orders.append(order.tolist()) or real(cache, order)
    )
    monkeypatch.setattr(
        s.target, "forward", lambda tokens, *a, **k: widths.append(tokens.shape[0]) or forward(tokens, *a, **k)
    )
    out, _ = speculative_generate(s.target, drafter, s.prompts, TOKENS, GREEDY, [stop], block_size=4)
    assert [r.tokens for r in out] == [r.tokens for r in undrafted]
    assert out[0].stopped and len(out[0].tokens) < len(out[1].tokens)
    assert orders and all(sorted(o) == list(range(len(s.prompts))) for o in orders)  # rows moved, none lost
    assert widths[-1] < len(s.prompts)  # the last rounds ran fewer rows than the batch


@pytest.mark.parametrize("kind", KINDS)
def test_rows_kept_with_the_next_proposal_queued_first_give_the_same_rounds(workshop, kind, monkeypatch):
    """keep_rows, the order a graphed loop runs in (finished rows stay, committing nothing; the next round's
    proposal queued before the host reads the round): the tokens, stops, rounds and acceptance of the rows-leaving
    loop, greedy and seeded, cut by a stop id and by max_tokens; and each round's tokens reach the host only after
    the next proposal was asked for."""
    family = "qwen3_5" if kind == "mtp" else "llama"
    s = workshop.setup(family)
    drafter = workshop.load(family, kind)
    stop = s.reference[0][3]  # the first prompt stops early
    for sampling in (GREEDY, Sampling(temperature=0.8, top_k=20, seed=7)):
        for max_tokens in (TOKENS, 7):
            undrafted, _ = generate(s.target, s.prompts, max_tokens, sampling, [stop])
            runs = [
                speculative_generate(
                    s.target, drafter, s.prompts, max_tokens, sampling, [stop], block_size=4, keep_rows=keep
                )[0]
                for keep in (False, True)
            ]
            for out in runs:
                assert [(r.tokens, r.stopped) for r in out] == [(r.tokens, r.stopped) for r in undrafted]
            leaving, kept = ([(r.accepted, r.committed, r.finished) for r in out] for out in runs)
            assert kept == leaving, (sampling, max_tokens)

    log, propose = [], drafter.propose
    monkeypatch.setattr(drafter, "propose", lambda *a, **k: log.append("propose") or propose(*a, **k))
    out, timing = speculative_generate(
        s.target, drafter, s.prompts, 16, GREEDY, block_size=4, keep_rows=True, on_token=lambda b, t: log.append(b)
    )
    proposed, asked_before = 0, []
    for event, previous in zip(log, [None, *log]):
        if event == "propose":
            proposed += 1
        elif previous == "propose":  # the first token a round emits
            asked_before.append(proposed)
    assert asked_before == [r + 2 for r in range(timing.rounds)]  # the round's own proposal and the next one


@pytest.mark.parametrize("kind", ["dflash", "dflash2"])
def test_a_context_stored_with_the_next_proposal_drafts_as_one_stored_at_once(workshop, kind, monkeypatch):
    """A DFlash drafter stores a verify block's context with the next proposal's products (its rows past what the
    target kept at no position): every proposal is the one it makes when each observation is stored at once (the
    rows past kept written, then overwritten by the block), through rounds where a sequence finished and the
    others' rows moved, greedy and sampled."""
    family = "llama"
    s = workshop.setup(family)
    drafter = workshop.load(family, kind)
    stop = s.reference[0][3]
    real_propose, real_observe = DFlash.propose, DFlash.observe

    def run(sampling: Sampling) -> tuple[list, list]:
        proposals = []

        def propose(self, *args, **kwargs):
            waited = self.pending is not None
            proposal = real_propose(self, *args, **kwargs)
            proposals.append((waited, proposal.tokens.tolist()))
            return proposal

        monkeypatch.setattr(DFlash, "propose", propose)
        out, _ = speculative_generate(s.target, drafter, s.prompts, TOKENS, sampling, [stop], block_size=4)
        return [(r.tokens, r.accepted) for r in out], proposals

    for sampling in (GREEDY, Sampling(temperature=0.8, top_k=20, seed=7)):
        merged, merged_proposals = run(sampling)
        monkeypatch.setattr(DFlash, "observe", lambda self, committed: (real_observe(self, committed), self.flush()))
        at_once, at_once_proposals = run(sampling)
        monkeypatch.setattr(DFlash, "observe", real_observe)
        assert merged == at_once and [t for _, t in merged_proposals] == [t for _, t in at_once_proposals]
        assert sum(w for w, _ in merged_proposals) == len(merged_proposals) - 1  # all but the first took a context
        assert not any(w for w, _ in at_once_proposals)


@pytest.mark.parametrize("kind", ["dflash", "dflash2", "eagle3", "mtp", "draft_model"])
def test_seeded_sampling_equals_undrafted_and_repeats(workshop, kind):
    """At a temperature the exact rule emits the target's own keyed draws: the undrafted run's tokens, through the
    graph objects too (each round's decision a step graph, as on CUDA). The rejection rule repeats its draws, and
    its decision after the rule's draws is the same graphed or not."""
    family = "qwen3_5" if kind == "mtp" else "llama"
    s = workshop.setup(family)
    drafter = workshop.load(family, kind)
    sampling = Sampling(temperature=0.8, top_k=20, seed=7)
    undrafted, _ = generate(s.target, s.prompts, 24, sampling)
    for graphs in (False, True):
        out, _ = speculative_generate(s.target, drafter, s.prompts, 24, sampling, block_size=4, graphs=graphs)
        assert [r.tokens for r in out] == [r.tokens for r in undrafted]
    rejection, _ = speculative_generate(s.target, drafter, s.prompts[:2], 16, sampling, block_size=4, rule="rejection")
    again, _ = speculative_generate(
        s.target, drafter, s.prompts[:2], 16, sampling, block_size=4, rule="rejection", graphs=True
    )
    assert [r.tokens for r in rejection] == [r.tokens for r in again]
    assert [r.accepted for r in rejection] == [r.accepted for r in again]


def test_a_sampling_drafter_with_the_targets_own_draws_keeps_every_draft(workshop):
    """The exact rule at a temperature does not just reject: the target as its own draft model draws with the
    same keyed noise, so every draft of every round is the target's own draw and is kept."""
    s = workshop.setup("llama")
    itself = load_drafter(open_model(str(s.path)), s.model, s.target)
    sampling = Sampling(temperature=0.8, top_k=20, seed=7)
    undrafted, _ = generate(s.target, s.prompts, 24, sampling)
    out, _ = speculative_generate(s.target, itself, s.prompts, 24, sampling, block_size=4)
    assert [r.tokens for r in out] == [r.tokens for r in undrafted]
    assert all(set(r.accepted[:-1]) == {3} for r in out), [r.accepted for r in out]


def chi_squared_p(counts: torch.Tensor, probs: torch.Tensor) -> float:
    expected = probs * counts.sum()
    cells = expected > 0
    assert bool((counts[~cells] == 0).all())
    statistic = ((counts[cells] - expected[cells]) ** 2 / expected[cells]).sum()
    return float(
        torch.special.gammaincc(torch.tensor((int(cells.sum()) - 1) / 2, dtype=torch.float64), statistic.double() / 2)
    )


@pytest.mark.parametrize("kind", KINDS)
def test_rejection_rule_emits_the_targets_distribution_with_each_drafters_q(workshop, kind):
    """One real round: the drafter's own q at the first drafted position (one-hot, DFlash2's K candidates, a
    draft model's softmax) against the target's p there, over 20k keyed draws of drafts and verifier noise;
    the emitted token's frequencies match p (chi-squared, p > 0.01). top-k 6 keeps the vocabulary small."""
    family = "qwen3_5" if kind == "mtp" else "llama"
    s = workshop.setup(family)
    drafter = workshop.load(family, kind)
    sampling = Sampling(temperature=1.0, top_k=6, seed=3)
    prompt = s.prompts[1]
    draws = 20_000
    drafter.start(1, 64)
    cache = s.target.new_cache(1, 64)
    tokens = torch.tensor([prompt[:-1]])
    rows = torch.arange(len(prompt) - 1)[None]
    out = s.target.forward(tokens, rows, cache, taps=drafter.taps, hidden=drafter.hidden)
    drafter.observe(
        Committed(tokens, rows, torch.tensor([prompt[1:]]), torch.tensor([len(prompt) - 1]), out.taps, out.hidden)
    )
    anchor_at = torch.tensor([len(prompt) - 1])
    proposal = drafter.propose(
        torch.tensor([prompt[-1]]), anchor_at, 1, Drafting(sampling, drafter.samples, DRAFT_STREAM)
    )
    p = sampling.probabilities(s.target.forward(torch.tensor([[prompt[-1]]]), anchor_at[:, None], cache).logits)[0]
    if proposal.q_ids is None:
        q_ids, q_probs = proposal.tokens[..., None], torch.ones(1, 1, 1)
    else:
        q_ids, q_probs = proposal.q_ids, proposal.q_probs
    q = torch.zeros_like(p).scatter_add(1, q_ids[0], q_probs[0])  # [1, V]
    rounds = torch.arange(draws)[:, None]
    drafts = torch.where(q > 0, q.log() + gumbel(5, DRAFT_STREAM, rounds[:, 0], q.shape[-1]), float("-inf")).argmax(-1)
    p_rows = torch.cat((p, p)).expand(draws, 2, -1)  # the second row is never reached on a rejection
    accepted, following = acceptance.rejection(
        p_rows,
        drafts[:, None],
        q_ids[0].expand(draws, -1, -1),
        q_probs[0].expand(draws, -1, -1),
        uniform(5, ACCEPT_STREAM, rounds, torch.zeros(1, dtype=torch.int64))[..., 0],
        gumbel(5, TOKEN_STREAM, rounds * 2 + torch.arange(2), p.shape[-1]),
    )
    emitted = torch.where(accepted >= 1, drafts, following)
    assert chi_squared_p(torch.bincount(emitted, minlength=p.shape[-1]).double(), p[0].double()) > 0.01
    overlap = float(torch.minimum(p, q).sum())
    assert abs(float((accepted >= 1).double().mean()) - overlap) < 0.02


@pytest.mark.parametrize("family", HYBRID)
def test_rollback_after_every_acceptance_length_is_a_fresh_run(workshop, family):
    """A verify step of 6 tokens, committed to each prefix 0..6: the KV rows and the Gated DeltaNet conv
    windows and states equal, bit for bit, those of a fresh run of the committed tokens alone."""
    s = workshop.setup(family)
    target, prompt = s.target, s.prompts[2]
    block = s.reference[2][:6]
    for kept in range(7):
        cache = target.new_cache(1, 40)
        target.forward(torch.tensor([prompt]), torch.arange(len(prompt))[None], cache)
        rows = torch.arange(len(prompt), len(prompt) + 6)[None]
        target.forward(torch.tensor([block]), rows, cache, verify=True).pending.commit(torch.tensor([kept]))
        fresh = target.new_cache(1, 40)
        committed = prompt + block[:kept]
        target.forward(torch.tensor([committed]), torch.arange(len(committed))[None], fresh)
        for layer in cache.k:
            assert torch.equal(cache.k[layer], fresh.k[layer]) and torch.equal(cache.v[layer], fresh.v[layer])
        for layer in cache.state:
            assert torch.equal(cache.conv[layer], fresh.conv[layer]), (kept, layer)
            assert torch.equal(cache.state[layer], fresh.state[layer]), (kept, layer)


def test_sliding_windows_crossed_by_target_and_drafter(tmp_path):
    """A Qwen3 target whose upper layers slide over 8 positions and a DFlash drafter with a causal sliding
    layer of 6 beside a bidirectional full one, over a context of 3 windows and more."""
    from fixtures import save, tiny_model

    model = tiny_model("qwen3")
    model.config.use_sliding_window, model.config.sliding_window, model.config.max_window_layers = True, 8, 2
    path = save(model, tmp_path / "target", "qwen3")
    config = json.loads((path / "config.json").read_text())
    config.update(
        use_sliding_window=True,
        sliding_window=8,
        max_window_layers=2,
        layer_types=["full_attention"] * 2 + ["sliding_attention"] * 2,
    )
    write_json(path / "config.json", config)
    target_model, target = load_target(path)
    assert target_model.config.layer_types == ("full", "full", "sliding", "sliding")
    asked = prompts((11, 4))
    reference, _ = generate(target, asked, 28, GREEDY)
    draft = dflash_checkpoint(
        tmp_path / "d",
        "qwen3",
        target_model.config,
        layers=2,
        sliding_window=6,
        layer_types=["sliding_attention", "full_attention"],
    )
    sequences = [p + r.tokens for p, r in zip(asked, reference)]
    trained_drafter(draft, path, target_model, target, sequences, 3, steps=120)
    drafter = load_drafter(open_model(str(draft)), target_model, target)
    assert [layer.causal for layer in drafter.layers] == [True, False]
    out, _ = speculative_generate(target, drafter, asked, 28, GREEDY, block_size=6)
    assert [r.tokens for r in out] == [r.tokens for r in reference]
    assert sum(r.tau for r in out) / 2 > 1.2


def test_a_modelopt_swa_drafter_runs_every_layer_windowed_and_non_causal(workshop, tmp_path):
    """ModelOpt's DFlash export (Model-Optimizer#1960): layer_types all full, dflash_config.use_swa +
    swa_window_size, causal false. The drafter runs as trained, every layer a non-causal window, over a context
    past the window, and the output stays the undrafted one."""
    s = workshop.setup("llama")
    draft = dflash_checkpoint(tmp_path / "d", "llama", s.model.config, layers=2)
    config = json.loads((draft / "config.json").read_text())
    config["dflash_config"].update(use_swa=True, swa_window_size=6, causal=False)
    write_json(draft / "config.json", config)
    drafter = load_drafter(open_model(str(draft)), s.model, s.target)
    assert [(layer.causal, layer.reach) for layer in drafter.layers] == [(False, 5)] * 2
    prompt = (s.prompts[0] * 10)[:40]
    undrafted, _ = generate(s.target, [prompt], 12, GREEDY)
    out, _ = speculative_generate(s.target, drafter, [prompt], 12, GREEDY, block_size=4)
    assert out[0].tokens == undrafted[0].tokens


def test_context_past_4096_and_past_the_drafters_trained_window(workshop, tmp_path):
    """A prompt of 4090 tokens and 16 more, with a drafter whose max_position_embeddings is 2048: no crash,
    the same tokens (its positions past what it was trained on cost acceptance only)."""
    s = workshop.setup("llama")
    draft = dflash_checkpoint(tmp_path / "d", "llama", s.model.config, max_positions=2048)
    drafter = load_drafter(open_model(str(draft)), s.model, s.target)
    assert drafter.max_positions == 2048
    long_prompt = (s.prompts[0] * 1000)[:4090]
    undrafted, _ = generate(s.target, [long_prompt], 16, GREEDY)
    out, _ = speculative_generate(s.target, drafter, [long_prompt], 16, GREEDY, block_size=8)
    assert out[0].tokens == undrafted[0].tokens


def test_every_drafter_layout_gives_the_same_output(workshop, tmp_path):
    """A trained DFlash from BF16, quantized to affine-4 at load as TensorFold does, and as a llama.cpp `dflash`
    GGUF (Q8_0): each one verified to the same tokens, and still keeping drafts."""
    s = workshop.setup("qwen3")
    checkpoint = workshop.drafter("qwen3", "dflash")
    bf16 = tmp_path / "bf16"
    conv.execute(conv.plan(conv.open_source(str(checkpoint)), conv.parse_target("bf16"), []), str(bf16))
    gguf = tmp_path / "d.gguf"
    conv.execute(
        conv.plan(conv.open_source(str(checkpoint)), conv.parse_target("gguf:Q8_0"), [], conv.open_source(str(s.path))),
        str(gguf),
    )
    for path, bits in ((bf16, None), (checkpoint, 4), (gguf, None)):
        drafter = load_drafter(open_model(str(path)), s.model, s.target, bits)
        if bits == 4:
            packed = [n for n, w in drafter.weights.items() if not isinstance(w, torch.Tensor)]
            assert "fc.weight" in packed and "layers.0.mlp.down_proj.weight" in packed
            assert all(drafter.weights[n].layout == "affine4-g64" for n in packed)
        out, _ = speculative_generate(s.target, drafter, s.prompts, 32, GREEDY, block_size=4)
        assert [r.tokens for r in out] == [r[:32] for r in s.reference], path
        assert sum(r.tau for r in out) / len(out) > 1.2, path


@pytest.mark.parametrize("kind", ["dflash", "dflash2", "eagle3"])
def test_a_speculators_copy_drafts_exactly_as_the_drafter_it_was_written_from(workshop, tmp_path, kind):
    """`convert --to speculators` of a trained drafter, read back through its verifier pin and tap ids: the same
    tokens, and the same drafts kept in every round (a tap read one layer off would keep others)."""
    family = SOLO[kind]
    s = workshop.setup(family)
    checkpoint = workshop.drafter(family, kind)
    written = tmp_path / "speculators"
    conv.execute(
        conv.plan(
            conv.open_source(str(checkpoint)), conv.parse_target("speculators:f32"), [], conv.open_source(str(s.path))
        ),
        str(written),
    )
    assert "speculators_config" in json.loads((written / "config.json").read_text())
    runs = []
    for path in (checkpoint, written):
        drafter = load_drafter(open_model(str(path)), s.model, s.target)
        out, _ = speculative_generate(s.target, drafter, s.prompts, 32, GREEDY, block_size=4)
        assert [r.tokens for r in out] == [r[:32] for r in s.reference], path
        runs.append([r.accepted for r in out])
    assert runs[0] == runs[1] and sum(map(sum, runs[0])) > 0


def test_muse_glimmer_block_logits_equal_transformers_candidate_generator(tmp_path):
    """transformers' DFlashTokenCandidateGenerator drives a MuseGlimmerAssistantModel from a target's hidden
    states; our DFlash drafter loaded from the same checkpoint gives the same block logits within 1e-4."""
    from fixtures import save, tiny_model
    from transformers import GenerationConfig
    from transformers.generation.candidate_generator import DFlashTokenCandidateGenerator
    from transformers.models.muse_glimmer_assistant import MuseGlimmerAssistantConfig, MuseGlimmerAssistantModel

    torch.manual_seed(0)
    target_hf = tiny_model("qwen3")
    target_path = save(target_hf, tmp_path / "target", "qwen3")
    config = MuseGlimmerAssistantConfig(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        vocab_size=512,
        block_size=6,
        mask_token_id=MASK_TOKEN,
        target_layer_ids=[0, 2],
        layer_types=["sliding_attention", "full_attention"],
        sliding_window=8,
        max_position_embeddings=4096,
        rope_parameters={"rope_type": "default", "rope_theta": 1e4},
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
    )
    assistant = MuseGlimmerAssistantModel(config).eval()
    with torch.no_grad():
        for p in assistant.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    assistant.save_pretrained(tmp_path / "assistant")
    prompt = torch.tensor([prompts((14,))[0] + [5]])  # the prompt and the target's "bonus" token
    with torch.no_grad():
        outputs = target_hf(prompt[:, :-1], output_hidden_states=True)
        generator = DFlashTokenCandidateGenerator(
            assistant,
            target_hf.get_input_embeddings(),
            target_hf.get_output_embeddings(),
            GenerationConfig(max_length=64),
        )
        kwargs = {"position_ids": torch.arange(prompt.shape[1])[None], "attention_mask": None}
        _, reference = generator.get_candidates(prompt, kwargs, outputs, is_first_iteration=False, n_last_matches=0)
    target_model, target = load_target(target_path)
    drafter = load_drafter(open_model(str(tmp_path / "assistant")), target_model, target)
    assert [layer.causal for layer in drafter.layers] == [False, False]
    drafter.start(1, 64)
    rows = torch.arange(prompt.shape[1] - 1)[None]
    out = target.forward(prompt[:, :-1], rows, target.new_cache(1, 64), taps=drafter.taps, logits=False)
    drafter.observe(Committed(prompt[:, :-1], rows, prompt[:, 1:], torch.tensor([rows.shape[1]]), out.taps, None))
    block, _ = drafter.block(prompt[:, -1], torch.tensor([prompt.shape[1] - 1]), config.block_size)
    ours = drafter.logits(block[:, 1:])
    assert ours.shape == reference.shape
    assert torch.allclose(ours, reference.float(), atol=1e-4, rtol=0), float((ours - reference).abs().max())


def test_what_check_says_the_runtime_runs_is_what_it_runs():
    """runtime.AVAILABLE is data for `check` (no torch behind it): the family files and drafter loaders here."""
    from specpair import runtime
    from specpair.runtime.drafters.loading import LOADERS
    from specpair.runtime.models import FAMILIES as MODEL_FILES

    assert set(runtime.AVAILABLE.families) == set(MODEL_FILES)
    assert set(runtime.AVAILABLE.drafter_kinds) == set(LOADERS)


def test_acceptance_by_position_counts_rounds_that_reach_each_draft():
    from specpair.runtime.speculative import Drafted

    rounds = [Drafted(accepted=[0, 3, 1], committed=[1, 4, 2]), Drafted(accepted=[2], committed=[3])]
    assert acceptance_by_position(rounds, 3) == [0.75, 0.5, 0.25]


def test_tau_and_acceptance_by_position_count_the_same_rounds():
    """A last round cut by max_tokens (4 drafts kept, room for 2 tokens) once made tau 4.0 beside acceptance
    1, 1, 1, 1 at block 5: the cut round is now left out of both, and tau = 1 + the sum of acceptance."""
    from specpair.runtime.speculative import Drafted

    cut = Drafted(accepted=[4, 4, 4], committed=[5, 5, 2])
    assert cut.measured == [4, 4]
    assert cut.tau == 5.0 and acceptance_by_position([cut], 4) == [1.0, 1.0, 1.0, 1.0]
    stopped = Drafted(accepted=[1, 3, 2], committed=[2, 4, 1])  # a stop id among the last round's drafts
    assert stopped.measured == [1, 3] and stopped.tau == 1 + sum(acceptance_by_position([stopped], 4)) == 3.0


def test_differentiable_kernels_match_the_runtimes(workshop):
    """The training kernels (tests/drafting.py) compute what the runtime's do, so what the drafters learn is
    what they run."""
    s = workshop.setup("qwen3_5")
    tokens, rows = torch.tensor([s.prompts[0]]), torch.arange(len(s.prompts[0]))[None]
    exact = s.target.forward(tokens, rows, s.target.new_cache(1, 16)).logits
    with differentiable_kernels():
        fast = s.target.forward(tokens, rows, s.target.new_cache(1, 16)).logits
    assert torch.allclose(exact, fast, atol=1e-4)


@pytest.mark.parametrize("rule", ["exact", "rejection"])
@pytest.mark.parametrize("kind", KINDS)
def test_rounds_only_replay_graphs_captured_before_them(workshop, monkeypatch, kind, rule):
    """Every fixed-shape step the rounds call (the drafter's, the verify step's rollback, the round's decision under
    either rule) was captured before the
    first round's verify step (a graph records at its shape's second call): an eager run or a capture inside the
    rounds would be timed as drafting or verifying. On the CPU the graph objects run eagerly and record nothing,
    but call and record in the order CUDA's do."""
    family = SOLO[kind]
    s, drafter = workshop.setup(family), workshop.load(family, kind)
    recorded: list[StepGraph] = []
    late: list[str] = []
    rounds = []  # set at the first call of a ForwardGraph: the first round's verify step
    record, call, forward = StepGraph.record, StepGraph.__call__, ForwardGraph.__call__

    def noting_record(self: StepGraph) -> None:
        recorded.append(self)
        record(self)

    def checked_call(self: StepGraph, *inputs: torch.Tensor):
        if rounds and not any(g is self for g in recorded):
            step = getattr(self.step, "func", self.step)
            late.append(f"{step.__qualname__}{[list(x.shape) for x in inputs]}")
        return call(self, *inputs)

    def first_round(self: ForwardGraph, tokens: torch.Tensor, positions: torch.Tensor):
        rounds.append(True)
        return forward(self, tokens, positions)

    monkeypatch.setattr(StepGraph, "record", noting_record)
    monkeypatch.setattr(StepGraph, "__call__", checked_call)
    monkeypatch.setattr(ForwardGraph, "__call__", first_round)
    sampling = GREEDY if rule == "exact" else Sampling(temperature=0.8, top_k=20, seed=7)
    results, _ = speculative_generate(
        s.target, drafter, s.prompts, TOKENS, sampling, block_size=4, graphs=True, rule=rule
    )
    if rule == "exact":
        assert [r.tokens for r in results] == s.reference
    assert rounds and late == []


@pytest.mark.parametrize("kind", KINDS)
def test_the_steps_alone_run_the_tokens_a_round_and_the_undrafted_loop_run(workshop, monkeypatch, kind):
    """The steps alone (bench's predicted speedup) verify the block a round would, the anchor and then the drafter's
    own proposal after it, not the anchor repeated (a MoE would route such a block to fewer experts than a round);
    the decode step decodes the target's own next token, not the anchor again."""
    family = SOLO[kind]
    s, drafter = workshop.setup(family), workshop.load(family, kind)
    verified: list[tuple[torch.Tensor, torch.Tensor]] = []  # (tokens, logits) of each verify step
    decoded: list[tuple[torch.Tensor, torch.Tensor]] = []  # (tokens, positions) of each decode step
    forward = type(s.target).forward

    def recording(self, tokens, positions, cache, **options):
        out = forward(self, tokens, positions, cache, **options)
        if self is not s.target:  # a draft model is a Transformer too
            return out
        if options.get("verify") and out.logits is not None:  # a padded prefill chunk is a verify step too
            verified.append((tokens.clone(), out.logits.clone()))
        elif tokens.shape[1] == 1:
            decoded.append((tokens.clone(), positions.clone()))
        return out

    monkeypatch.setattr(type(s.target), "forward", recording)
    steps = round_steps(s.target, drafter, s.prompts, 4, graphs=False)
    ((tokens, logits),) = verified  # the first verify step, right after the prefill
    steps.verify()
    steps.decode()
    anchors = torch.tensor([p[-1] for p in s.prompts])
    positions = torch.tensor([len(p) - 1 for p in s.prompts])
    proposed = drafter.propose(anchors, positions, 3, Drafting(GREEDY, False, TOKEN_STREAM)).tokens
    assert torch.equal(tokens, torch.cat((anchors[:, None], proposed), dim=1))
    assert torch.equal(verified[-1][0], tokens)  # every call verifies that block
    assert any(len(set(row.tolist())) > 1 for row in tokens)  # the drafts are not all the anchor again
    # the decode step decodes the target's own token after each anchor there, as the undrafted loop would
    assert torch.equal(decoded[-1][0], logits[:, 0].argmax(dim=-1)[:, None])
    assert torch.equal(decoded[-1][1], positions[:, None] + 1)


class SteppedClock:
    """time for `seconds_per_call`: each step's call advances it by the step's cost, times `busy` while the
    machine is busy (the calls numbered in `busy_calls`, counted over every step's calls)."""

    def __init__(self, busy_calls: range, busy: float) -> None:
        self.now, self.calls, self.busy_calls, self.busy, self.order = 0.0, 0, busy_calls, busy, []

    def perf_counter(self) -> float:
        return self.now

    def step(self, name: str, cost: float):
        def call() -> None:
            self.now += cost * (self.busy if self.calls in self.busy_calls else 1.0)
            self.calls += 1
            self.order.append(name)

        return call


@pytest.mark.parametrize("repeats", [20, 7])
def test_a_busy_spell_is_charged_to_no_step(monkeypatch, repeats):
    """A busy spell the length of one step's calls back to back (ten times slower) lands in every step's spans
    alike, and the median of the spans leaves it out: each step's time is its own cost, where timing the steps
    one after another charged the spell to whichever ran then."""
    clock = SteppedClock(busy_calls=range(3, 3 + repeats // 2), busy=10.0)
    monkeypatch.setattr(speculative, "time", clock)
    steps = [clock.step("verify", 2.0), clock.step("draft", 0.5), clock.step("decode", 1.0)]
    assert seconds_per_call(steps, repeats, torch.device("cpu")) == [2.0, 0.5, 1.0]
    assert [clock.order.count(name) for name in ("verify", "draft", "decode")] == [repeats + 1] * 3
    # the steps take turns: no step's calls all run before another's start
    firsts = [clock.order.index(name, 3) for name in ("verify", "draft", "decode")]
    lasts = [len(clock.order) - 1 - clock.order[::-1].index(name) for name in ("verify", "draft", "decode")]
    assert max(firsts) < min(lasts)


@pytest.mark.parametrize("kind", KINDS)
def test_step_times_leave_the_next_run_as_a_fresh_one(workshop, kind):
    """Each step timed alone (bench's predicted speedup), through the graph objects as on CUDA: every call is a
    valid step of its cache (a verify step needs its commit before the next), and the drafter's next run starts
    over, so its output is still the undrafted one."""
    family = SOLO[kind]
    s, drafter = workshop.setup(family), workshop.load(family, kind)
    times = step_times(s.target, drafter, s.prompts, 4, graphs=True, repeats=2)
    assert min(times.decode_s, times.verify_s, times.draft_s) > 0
    assert times.predicted_speedup(2.0) == 2.0 * times.decode_s / (times.draft_s + times.verify_s)
    results, _ = speculative_generate(s.target, drafter, s.prompts, TOKENS, GREEDY, block_size=4)
    assert [r.tokens for r in results] == s.reference
