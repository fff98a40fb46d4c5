"""CUDA-graph replay against eager steps, bit for bit, on every target family at tiny shapes (bf16, weights as
`specpair run` loads them on CUDA): decode steps, verify steps and the commit of each verify step's Pending (its
rollback replayed as a graph of its own), across rounds that keep different prefixes per sequence; then the
generation loop with graphs against the loop without; then both with the kernels launched by programmatic dependent
launch against plain launches."""

from __future__ import annotations

import pytest
import torch
from drafting import FAMILIES
from fixtures import build_target
from gpu_tier import DEVICE

from specpair.errors import BadInput
from specpair.runtime.generate import generate, prefill
from specpair.runtime.graphs import ForwardGraph
from specpair.runtime.kernels import triton_common
from specpair.runtime.loading import load, plan_load
from specpair.runtime.sampling import Sampling
from specpair.sources.model import open_model


@pytest.fixture(scope="module")
def targets(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("graphs_gpu")
    out = {}
    for family in FAMILIES:
        path = build_target(root / family, family, layers=4, vision=False, mtp=False)
        out[family] = load(plan_load(open_model(str(path)), DEVICE))
    return out


def state(cache) -> list[torch.Tensor]:
    return [t.clone() for buffers in (cache.k, cache.v, cache.conv, cache.state) for t in buffers.values()]


def same(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b))


@pytest.mark.parametrize("family", FAMILIES)
def test_graph_replay_is_the_eager_step_bit_for_bit(targets, family):
    model = targets[family]
    gen = torch.Generator().manual_seed(1)
    vocab = model.config.vocab_size
    prompts = [torch.randint(0, vocab, (n,), generator=gen).tolist() for n in (7, 4)]
    graphed, plain = model.new_cache(2, 64), model.new_cache(2, 64)
    for cache in (graphed, plain):
        prefill(model, cache, prompts)
    assert same(state(graphed), state(plain))
    token = torch.tensor([[3], [9]], device=DEVICE)
    positions = torch.tensor([[7], [4]], device=DEVICE)
    decode = ForwardGraph(model, graphed, 2, 1)
    decode.prepare(token, positions)
    assert decode.graph.graph is not None or DEVICE != "cuda", "the decode step was not captured"
    assert same(state(graphed), state(plain)), "the warm-up step was not rolled back"

    def decode_both(tokens: torch.Tensor, at: torch.Tensor) -> torch.Tensor:
        logits = decode(tokens, at).logits
        assert torch.equal(logits, model.forward(tokens, at, plain).logits)
        assert same(state(graphed), state(plain))
        return logits.argmax(dim=-1)

    for _ in range(3):
        token = decode_both(token, positions)
        positions = positions + 1
    verify = ForwardGraph(model, graphed, 2, 4, taps=(1, 2), hidden=True, verify=True)
    verify.prepare(token.expand(2, 4).contiguous(), positions + torch.arange(4, device=DEVICE))
    assert same(state(graphed), state(plain)), "the verify warm-up was not discarded"
    for accepted in ([1, 4], [0, 2], [4, 0], [3, 3], [2, 1]):
        block = torch.randint(0, vocab, (2, 4), generator=gen).to(DEVICE)
        rows = positions + torch.arange(4, device=DEVICE)
        got = verify(block, rows)
        want = model.forward(block, rows, plain, taps=(1, 2), hidden=True, verify=True)
        for a, b in ((got.logits, want.logits), (got.taps, want.taps), (got.hidden, want.hidden)):
            assert torch.equal(a, b)
        kept = torch.tensor(accepted, device=DEVICE)
        got.pending.commit(kept, accepted)
        want.pending.commit(kept, accepted)
        assert same(state(graphed), state(plain)), accepted
        positions = positions + kept[:, None]
        token = decode_both(block[:, :1], positions)
        positions = positions + 1
    if DEVICE == "cuda":  # the verify step was replayed, and its commits through the rollback's own graph
        assert verify.graph.graph is not None and verify.rollback is not None and verify.rollback.graph is not None


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize(
    "sampling", [Sampling(), Sampling(temperature=0.8, top_k=20, seed=3)], ids=["greedy", "seeded"]
)
def test_generate_with_graphs_is_generate_without(targets, family, sampling):
    model = targets[family]
    prompts = [[5, 6, 7, 8, 9], [11, 12], [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11]]
    off, _ = generate(model, prompts, 12, sampling, graphs=False)
    on, _ = generate(model, prompts, 12, sampling, graphs=True)
    assert [g.tokens for g in on] == [g.tokens for g in off]


def hopper() -> bool:
    return DEVICE == "cuda" and torch.cuda.get_device_capability()[0] >= 9


@pytest.mark.parametrize("family", FAMILIES)
def test_pdl_launches_change_no_bit(targets, family):
    """The same greedy generation (prefill, graphed decode steps) and the same eager verify step, launched plainly,
    with PDL, and with PDL and the weight prefetch: the same tokens and logits. A kernel reading its inputs before
    the previous kernel's writes landed would differ somewhere here. Before Hopper, use_pdl refuses."""
    if not hopper():
        with pytest.raises(BadInput):
            triton_common.use_pdl(1)
        return
    model = targets[family]
    gen = torch.Generator().manual_seed(5)
    prompts = [torch.randint(0, model.config.vocab_size, (n,), generator=gen).tolist() for n in (9, 5)]
    block = torch.randint(0, model.config.vocab_size, (2, 4), generator=gen).to(DEVICE)

    before = triton_common.pdl_mode()

    def run(mode: int) -> tuple[list[list[int]], torch.Tensor]:
        triton_common.use_pdl(mode)
        try:
            assert triton_common.pdl_mode() == mode
            out, _ = generate(model, prompts, 8, Sampling(), graphs=True)
            cache = model.new_cache(2, 32)
            prefill(model, cache, prompts)
            rows = torch.tensor([[9], [5]], device=DEVICE) + torch.arange(4, device=DEVICE)
            return [g.tokens for g in out], model.forward(block, rows, cache, verify=True).logits
        finally:
            triton_common.use_pdl(before)

    plain = run(0)
    for mode in (1, 2):
        launched = run(mode)
        assert launched[0] == plain[0] and torch.equal(launched[1], plain[1]), mode
