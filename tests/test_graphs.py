"""runtime/graphs.py on the CPU, where a step graph runs its step eagerly through the same static buffers a CUDA
graph replays: what is copied in and comes out, the warm-up that leaves the cache as it was, and a verify step's
pending state handed to the cache, bit for bit against plain forward calls across steps and rollbacks; then the
loops (generate, speculative_generate with every drafter kind) with graphs on equal to the loops with them off.
The capture itself needs a GPU (benchmarks/bench_gpu.py runs it)."""

from __future__ import annotations

import pytest
import torch
from drafting import eagle3_checkpoint
from fixtures import build_dflash, build_target

from specpair.runtime.drafters.loading import load_drafter
from specpair.runtime.generate import generate, prefill
from specpair.runtime.graphs import ForwardGraph, StepGraphs
from specpair.runtime.loading import load, plan_load
from specpair.runtime.sampling import Sampling
from specpair.runtime.speculative import speculative_generate
from specpair.sources.model import open_model

GREEDY = Sampling()


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("graphs")
    return {
        "hybrid": build_target(root / "hybrid", "qwen3_5", layers=4, vision=False),  # GDN layers, an MTP head
        "dense": build_target(root / "dense", "qwen3", layers=3),
        "dflash": build_dflash(
            root / "dflash", target_layer_ids=[0, 1], num_target_layers=3, flavour="qwen3", layers=1, block_size=4
        ),
        "eagle3": root / "eagle3",
    }  # written from the dense target's config, below


@pytest.fixture(scope="module")
def targets(checkpoints) -> dict:
    out = {}
    for name in ("hybrid", "dense"):
        model = open_model(str(checkpoints[name]))
        out[name] = model, load(plan_load(model, "cpu"))
    eagle3_checkpoint(checkpoints["eagle3"], out["dense"][0].config)
    return out


def state(cache) -> list[torch.Tensor]:
    return [t.clone() for buffers in (cache.k, cache.v, cache.conv, cache.state) for t in buffers.values()]


def same(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b))


def test_a_forward_graph_is_the_plain_forward_bit_for_bit_across_steps_and_rollbacks(targets):
    _, model = targets["hybrid"]
    gen = torch.Generator().manual_seed(1)
    vocab = model.config.vocab_size
    prompts = [torch.randint(0, vocab, (n,), generator=gen).tolist() for n in (7, 4)]
    graphed, plain = model.new_cache(2, 40), model.new_cache(2, 40)
    for cache in (graphed, plain):
        prefill(model, cache, prompts)
    token, positions = torch.tensor([[3], [9]]), torch.tensor([[7], [4]])
    decode = ForwardGraph(model, graphed, 2, 1)
    decode.prepare(token, positions)
    assert same(state(graphed), state(plain)), "the warm-up step was not rolled back"

    def decode_both(tokens: torch.Tensor, at: torch.Tensor) -> torch.Tensor:
        logits = decode(tokens, at).logits
        assert torch.equal(logits, model.forward(tokens, at, plain).logits)
        assert same(state(graphed), state(plain))
        assert torch.equal(decode.graph.inputs[0], tokens) and torch.equal(decode.graph.inputs[1], at)
        return logits.argmax(dim=-1)

    for _ in range(3):
        token = decode_both(token, positions)
        positions = positions + 1
    verify = ForwardGraph(model, graphed, 2, 4, taps=(1, 2), hidden=True, verify=True)
    for accepted in ([1, 4], [0, 2], [4, 0], [3, 3]):
        block = torch.randint(0, vocab, (2, 4), generator=gen)
        rows = positions + torch.arange(4)
        got = verify(block, rows)
        want = model.forward(block, rows, plain, taps=(1, 2), hidden=True, verify=True)
        for a, b in ((got.logits, want.logits), (got.taps, want.taps), (got.hidden, want.hidden)):
            assert torch.equal(a, b)
        assert got.pending.positions is verify.graph.inputs[1]  # commit reads the step's own buffers
        with pytest.raises(RuntimeError, match="commit"):
            verify(block, rows)
        got.pending.commit(torch.tensor(accepted), accepted)  # counts given on the host
        want.pending.commit(torch.tensor(accepted))  # counts read from the tensor
        assert same(state(graphed), state(plain)), accepted
        positions = positions + torch.tensor(accepted)[:, None]
        token = decode_both(block[:, :1], positions)
        positions = positions + 1
    with pytest.raises(ValueError, match="step graph"):
        decode(token[:, :0], positions)
    with pytest.raises(ValueError, match="step graph"):
        decode(token.float(), positions)


def test_step_graphs_keep_one_graph_per_shape_and_keyword():
    calls = []

    def step(x: torch.Tensor, scale: int) -> torch.Tensor:
        calls.append((tuple(x.shape), scale))
        return x * scale

    steps = StepGraphs(step, True)
    for x, scale in ((torch.ones(2, 1), 2), (torch.ones(2, 1), 2), (torch.ones(2, 3), 2), (torch.ones(2, 1), 5)):
        assert torch.equal(steps(x, scale=scale), x * scale)
    assert len(steps.graphs) == 3 and len(calls) == 4
    off = StepGraphs(step, False)
    assert torch.equal(off(torch.ones(1), scale=3), torch.full((1,), 3.0)) and not off.graphs


@pytest.mark.parametrize("sampling", [GREEDY, Sampling(temperature=0.8, top_k=20, seed=3)], ids=["greedy", "sampled"])
def test_generate_with_graphs_is_generate_without(targets, sampling):
    _, model = targets["hybrid"]
    prompts = [[5, 6, 7, 8, 9], [11, 12]]
    off, _ = generate(model, prompts, 6, sampling, graphs=False)
    on, timing = generate(model, prompts, 6, sampling, graphs=True)
    assert [g.tokens for g in on] == [g.tokens for g in off]
    assert timing.sequences == 2 and timing.generated_tokens == 12


# (target, drafter checkpoint: None is the target's MTP head, "self" the target as its own draft model)
DRAFTERS = {
    "draft_model": ("dense", "self"),
    "draft_model_hybrid": ("hybrid", "self"),
    "mtp": ("hybrid", None),
    "dflash": ("dense", "dflash"),
    "eagle3": ("dense", "eagle3"),
}
PROMPTS = [[5, 6, 7, 8, 9], [11, 12, 13]]
TOKENS = 8


@pytest.fixture(scope="module")
def references(targets) -> dict:
    return {
        name: [g.tokens for g in generate(target, PROMPTS, TOKENS, GREEDY)[0]] for name, (_, target) in targets.items()
    }


@pytest.mark.parametrize("kind", DRAFTERS)
def test_speculative_with_graphs_is_speculative_without(checkpoints, targets, references, kind):
    """The random drafters keep almost nothing; the target drafting for itself keeps every draft, which holds only
    if its cache is right after every round."""
    target_name, draft_name = DRAFTERS[kind]
    target_model, target = targets[target_name]
    draft = checkpoints[target_name] if draft_name == "self" else checkpoints.get(draft_name)
    runs = {}
    for graphs in (False, True):
        drafter = load_drafter(open_model(str(draft)) if draft else None, target_model, target)
        runs[graphs], _ = speculative_generate(target, drafter, PROMPTS, TOKENS, GREEDY, block_size=4, graphs=graphs)
    for on, off, want in zip(runs[True], runs[False], references[target_name]):
        assert on.tokens == off.tokens == want
        assert on.accepted == off.accepted  # the drafter proposed the same with its steps graphed
    if draft_name == "self":
        assert all(a == 3 for r in runs[True] for a in r.accepted)
