"""The runtime (runtime/) against transformers 5 on tiny random models of every family, in float32 on the CPU.

Each family's logits must equal transformers' within 1e-4 for a full forward, token-by-token decode and
multi-token steps with the cache; rolling a verify step back to any prefix must leave the cache bitwise as a
run of that prefix alone; a sequence's logits must have the same bits alone, in a batch of sequences of
other lengths, and inside a verify block. Models are written with save_pretrained and read through
open_model, so the model layer's names and transforms are in the loop.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from fixtures import DEFAULT_FLAVOUR, save, tiny_model

from specpair.errors import BadInput
from specpair.runtime.blocks import Projections
from specpair.runtime.generate import generate, prefill
from specpair.runtime.kernels import linear
from specpair.runtime.kernels.cpu_rows import PRODUCTS, tile_rows
from specpair.runtime.loading import load, plan_load
from specpair.runtime.model import shard_rows
from specpair.runtime.sampling import Sampling
from specpair.sources.model import open_model

FAMILIES = ["llama", "qwen3", "qwen3_moe", "qwen3_next", "qwen3_5", "qwen3_5_moe"]
HYBRIDS = ["qwen3_next", "qwen3_5", "qwen3_5_moe"]
TOLERANCE = 1e-4


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def flavour(family: str) -> str:
    return "llama3" if DEFAULT_FLAVOUR[family] == "llama3" else "qwen3"


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory) -> dict[str, tuple[object, Path]]:
    """family -> (transformers model, its save_pretrained directory), built once per module."""
    built = {}
    for family in FAMILIES:
        hf = tiny_model(family)
        built[family] = hf, save(hf, tmp_path_factory.mktemp(family) / "hf", flavour(family))
    return built


def runtime(directory: Path):
    return load(plan_load(open_model(str(directory)), "cpu"))


def steps(model, ids: torch.Tensor, sizes: list[int], cache=None, start: int = 0) -> torch.Tensor:
    """Logits of ids[:, start:] [1, N] run in steps of the given sizes on one cache (from position start)."""
    cache = cache or model.new_cache(1, ids.shape[1])
    out = []
    for size in sizes:
        positions = torch.arange(start, start + size)[None]
        out.append(model.forward(ids[:, start : start + size], positions, cache).logits)
        start += size
    return torch.cat(out, dim=1)


@pytest.mark.parametrize("family", FAMILIES)
def test_logits_equal_transformers(checkpoints, family):
    hf, directory = checkpoints[family]
    model = runtime(directory)
    ids = torch.randint(0, hf.config.vocab_size, (1, 24), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        reference = hf(ids).logits
    assert (steps(model, ids, [24]) - reference).abs().max() <= TOLERANCE  # full forward
    assert (steps(model, ids, [1] * 24) - reference).abs().max() <= TOLERANCE  # token by token
    assert (steps(model, ids, [9, 1, 6, 1, 7]) - reference).abs().max() <= TOLERANCE  # multi-token steps


@pytest.mark.parametrize("family", FAMILIES)
def test_fused_projections_equal_transformers(checkpoints, family, monkeypatch):
    """On CUDA the blocks fuse q|k|v, gate|up (routed experts' too), the GDN's input projections and the router
    with the shared expert's gate into one weight each (blocks.Projections); the same fusion on the CPU gives
    transformers' logits, and a verify block the bits of decoding token by token."""
    hf, directory = checkpoints[family]
    monkeypatch.setattr(linear, "on_cuda", lambda w: True)
    model = runtime(directory)
    projections = [p for layer in model.layers for p in (*vars(layer.mixer).values(), *vars(layer.mlp).values())]
    projections = [p for p in projections if isinstance(p, Projections)]
    assert any(len(sizes) > 1 for p in projections for _, sizes in p.groups)
    assert all(len(p.groups) == 1 for p in projections)
    assert all(len(layer.mlp.gate_up) == 1 for layer in model.layers if hasattr(layer.mlp, "router"))
    ids = torch.randint(0, hf.config.vocab_size, (1, 16), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        reference = hf(ids).logits
    assert (steps(model, ids, [16]) - reference).abs().max() <= TOLERANCE
    assert (steps(model, ids, [1] * 16) - reference).abs().max() <= TOLERANCE


def test_projections_keep_the_partials_where_no_bias_is_added(monkeypatch):
    """Asked for split partials, a projection's product is left unsummed unless a bias must be added to it, and a
    fused weight's only where none of its projections has one: the flags each product call was given."""
    asked = []
    plain = linear.matmul

    def matmul(x, w, unsummed=False):
        asked.append((w.shape[0], unsummed))
        return plain(x, w)

    monkeypatch.setattr(linear, "matmul", matmul)
    weights = [torch.randn(rows, 8) for rows in (6, 4, 3, 2)]
    biases = [None, torch.randn(4), None, None]
    x = torch.randn(1, 8)
    separate = Projections.of(weights, biases, fuse=False)
    outs = separate(x, unsummed=True)
    assert asked == [(6, True), (4, False), (3, True), (2, True)]
    assert all(
        torch.allclose(o, x @ w.T + (0 if b is None else b), atol=1e-5) for o, w, b in zip(outs, weights, biases)
    )
    asked.clear()
    Projections.of(weights, fuse=True)(x, unsummed=True)
    Projections.of(weights, biases, fuse=True)(x, unsummed=True)
    Projections.of(weights, fuse=True)(x)
    assert asked == [(15, True), (15, False), (15, False)]


def test_a_fused_projections_partials_are_cut_and_regrouped_as_its_product(monkeypatch):
    """A fused q|k|v weight's split partials (linear.SplitSums) come out of Projections cut into its projections,
    and regroup into heads and halves of heads as blocks.Attention regroups the product: every plane a view of the
    partials (no copy) holding, summed, the values the summed product holds there."""
    partial = torch.randn(3, 2 * 5, 8 + 4 + 4)
    monkeypatch.setattr(linear, "matmul", lambda x, w, unsummed=False: linear.SplitSums(partial, torch.float32))
    weights = [torch.randn(rows, 7) for rows in (8, 4, 4)]
    q, k, v = Projections.of(weights, fuse=True)(torch.randn(10, 7), unsummed=True)
    product = partial.sum(0).view(2, 5, -1)  # the product's values, as its sum kernel would give them unrounded
    want_q, want_k, want_v = product.split([8, 4, 4], dim=-1)
    query, gate = q.view(2, 5, 2, -1).split([2, 2], dim=-1)
    pairs = [(query, want_q.view(2, 5, 2, -1)[..., :2]), (gate, want_q.view(2, 5, 2, -1)[..., 2:])]
    pairs += [(k.view(2, 5, 1, 4), want_k.view(2, 5, 1, 4)), (v.view(2, 5, 1, 4), want_v.view(2, 5, 1, 4))]
    for got, want in pairs:
        first, plane, splits = got.planes()
        assert got.shape == want.shape and first.shape == want.shape and (plane, splits) == (partial.stride(0), 3)
        assert got.partial.untyped_storage().data_ptr() == partial.untyped_storage().data_ptr()
        assert torch.allclose(got.partial.sum(0), want, atol=1e-6)
    with pytest.raises(ValueError, match="last dimension"):
        k.split([2, 2], dim=0)


@pytest.mark.parametrize("fused", [False, True])
@pytest.mark.parametrize("shared_width", [32, 48])
def test_the_shared_expert_rides_in_the_expert_stacks_where_it_fits(tmp_path, monkeypatch, shared_width, fused):
    """A shared expert as wide as the routed ones is expert E of the stacks (every token routes to it: one expert
    launch computes it with the routed ones), gate and up fused or not; a wider one runs apart. Both give
    transformers' logits, decoding and in a block."""
    if fused:
        monkeypatch.setattr(linear, "on_cuda", lambda w: True)
    hf = tiny_model("qwen3_5_moe", moe_intermediate_size=32, shared_expert_intermediate_size=shared_width)
    model = runtime(save(hf, tmp_path / "hf", "qwen3"))
    moes = [layer.mlp for layer in model.layers]
    experts = hf.config.num_experts
    if shared_width == 32:
        assert all(m.shared is None and m.shared_id == experts for m in moes)
        assert all(w.shape[0] == experts + 1 for m in moes for w in [*m.gate_up, m.down_proj])
        assert all(len(m.gate_up) == (1 if fused else 2) for m in moes)
    else:
        assert all(m.shared is not None and m.shared_id is None for m in moes)
        assert all(w.shape[0] == experts for m in moes for w in [*m.gate_up, m.down_proj])
    ids = torch.randint(0, hf.config.vocab_size, (1, 12), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        reference = hf(ids).logits
    assert (steps(model, ids, [12]) - reference).abs().max() <= TOLERANCE
    assert (steps(model, ids, [1] * 12) - reference).abs().max() <= TOLERANCE


@pytest.mark.parametrize(
    "rope",
    [
        {"rope_type": "yarn", "rope_theta": 1e4, "factor": 4.0, "original_max_position_embeddings": 16},
        {"rope_type": "linear", "rope_theta": 1e4, "factor": 2.0},
    ],
)
def test_rope_scaling_equals_transformers(tmp_path, rope):
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    hf = Qwen3ForCausalLM(
        Qwen3Config(
            vocab_size=512,
            hidden_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=16,
            intermediate_size=128,
            max_position_embeddings=64,
            rope_parameters=rope,
        )
    ).eval()
    model = runtime(save(hf, tmp_path / "hf", "qwen3"))
    ids = torch.randint(0, 512, (1, 40), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        reference = hf(ids).logits
    assert (steps(model, ids, [30, 1, 9]) - reference).abs().max() <= TOLERANCE


def test_sliding_window_layers_equal_transformers(tmp_path):
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    hf = Qwen3ForCausalLM(
        Qwen3Config(
            vocab_size=512,
            hidden_size=64,
            num_hidden_layers=3,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=16,
            intermediate_size=128,
            use_sliding_window=True,
            sliding_window=5,
            max_window_layers=1,
            attn_implementation="eager",
        )
    ).eval()
    directory = save(hf, tmp_path / "hf", "qwen3")
    assert open_model(str(directory)).config.layer_types == ("full", "sliding", "sliding")
    model = runtime(directory)
    ids = torch.randint(0, 512, (1, 17), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        reference = hf(ids).logits
    assert (steps(model, ids, [17]) - reference).abs().max() <= TOLERANCE
    assert (steps(model, ids, [6, 1, 1, 9]) - reference).abs().max() <= TOLERANCE


@pytest.mark.parametrize("family", ["llama", "qwen3_5_moe"])
def test_taps_and_final_hidden_are_transformers_hidden_states(checkpoints, family):
    hf, directory = checkpoints[family]
    model = runtime(directory)
    ids = torch.randint(0, hf.config.vocab_size, (1, 10), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        states = hf(ids, output_hidden_states=True).hidden_states
    out = model.forward(ids, torch.arange(10)[None], model.new_cache(1, 10), taps=(2, 0), hidden=True)
    hidden = model.config.hidden_size
    assert out.taps.shape == (1, 10, 2 * hidden)
    assert (out.taps[..., :hidden] - states[3]).abs().max() <= TOLERANCE  # output of decoder layer 2
    assert (out.taps[..., hidden:] - states[1]).abs().max() <= TOLERANCE  # output of decoder layer 0
    assert (out.hidden - states[-1]).abs().max() <= TOLERANCE  # the final normed hidden state
    assert torch.equal(model.head(out.hidden), out.logits)
    assert torch.equal(model.embed(ids), model.embed_tokens[ids])
    bare = model.forward(ids, torch.arange(10)[None], model.new_cache(1, 10), logits=False)
    assert bare.logits is None and bare.taps is None and bare.hidden is None


def cache_state(cache, rows: slice = slice(None)) -> list[torch.Tensor]:
    return [t[rows] for buffers in (cache.k, cache.v, cache.conv, cache.state) for t in buffers.values()]


@pytest.mark.parametrize("family", ["qwen3", "qwen3_next", "qwen3_5_moe"])
def test_rollback_to_every_prefix_is_a_run_of_that_prefix(checkpoints, family):
    model = runtime(checkpoints[family][1])
    vocab = model.config.vocab_size
    ids = torch.randint(0, vocab, (1, 16), generator=torch.Generator().manual_seed(5))
    prompt, block = 6, 5
    for accepted in range(block + 1):
        cache = model.new_cache(1, 16)
        steps(model, ids, [prompt], cache)
        out = model.forward(
            ids[:, prompt : prompt + block], torch.arange(prompt, prompt + block)[None], cache, verify=True
        )
        out.pending.commit(torch.tensor([accepted]))
        alone = model.new_cache(1, 16)
        steps(model, ids, [prompt] + ([accepted] if accepted else []), alone)
        assert all(torch.equal(a, b) for a, b in zip(cache_state(cache), cache_state(alone))), accepted
        kept = prompt + accepted
        on = steps(model, ids, [1, 1, 1], cache, start=kept)
        fresh = steps(model, ids[:, : kept + 3], [kept + 3])[:, kept:]
        assert (on - fresh).abs().max() <= 1e-5, accepted


def test_an_id_outside_the_vocabulary_fails_where_indexing_would_wrap_it(checkpoints):
    """A placeholder -1 reaching the embedding (eugr/spark-vllm-docker#308) or an id past the vocabulary is an error,
    not the last row read unseen; the rows of valid ids are the table's own."""
    model = runtime(checkpoints["qwen3"][1])
    vocab = model.config.vocab_size
    for bad in (-1, vocab):
        with pytest.raises(IndexError):
            model.embed(torch.tensor([[3, bad]]))
    assert torch.equal(model.embed(torch.tensor([[3, vocab - 1]])), model.embed_tokens[[3, vocab - 1]][None])


@pytest.mark.parametrize("shards", [2, 4])
def test_vocabulary_shards_add_up_to_the_table_and_each_refuses_an_id_outside_it(shards):
    """Under tensor parallelism each rank looks up its rows of the vocabulary and the sum is the table's lookup,
    exactly; an id outside the vocabulary fails on every rank, where masking it to zeros everywhere would embed a
    -1 placeholder as a zero vector unseen (eugr/spark-vllm-docker#308)."""
    vocab = 12
    table = torch.randn(vocab, 5, generator=torch.Generator().manual_seed(3))
    tokens = torch.tensor([[0, 5, 11], [3, 6, 9]])
    part = vocab // shards
    looked = [shard_rows(table[r * part : (r + 1) * part], tokens, r * part, vocab) for r in range(shards)]
    assert torch.equal(sum(looked), table[tokens]) and all(int((x != 0).any(-1).sum()) for x in looked)
    for bad in (-1, vocab):
        for r in range(shards):
            with pytest.raises(IndexError):
                shard_rows(table[r * part : (r + 1) * part], torch.tensor([[3, bad]]), r * part, vocab)


def test_rollback_of_a_batch_keeps_each_sequence_its_own_prefix(checkpoints):
    """One commit with accepted counts 0, 2, 2 and 4 of 4: each row ends as a run of its own prefix."""
    model = runtime(checkpoints["qwen3_5_moe"][1])
    ids = torch.randint(0, model.config.vocab_size, (4, 12), generator=torch.Generator().manual_seed(6))
    accepted = [0, 2, 2, 4]
    cache = model.new_cache(4, 12)
    model.forward(ids[:, :5], torch.arange(5).expand(4, 5), cache)
    model.forward(ids[:, 5:9], torch.arange(5, 9).expand(4, 4), cache, verify=True).pending.commit(
        torch.tensor(accepted)
    )
    for row, kept in enumerate(accepted):
        alone = model.new_cache(1, 12)
        model.forward(ids[row : row + 1, : 5 + kept], torch.arange(5 + kept)[None], alone)
        assert all(torch.equal(a, b) for a, b in zip(cache_state(cache, slice(row, row + 1)), cache_state(alone))), row


def test_a_verify_step_is_decided_once_before_any_other_step_and_its_counts_are_checked(checkpoints):
    model = runtime(checkpoints["qwen3_5"][1])
    cache = model.new_cache(1, 8)
    tokens, positions = torch.tensor([[1, 2, 3]]), torch.arange(3)[None]
    assert model.forward(tokens, positions, cache).pending is None  # a plain step needs no decision
    out = model.forward(tokens, positions + 3, cache, verify=True)
    with pytest.raises(RuntimeError, match="commit"):
        model.forward(tokens, positions + 3, cache)
    with pytest.raises(RuntimeError, match="commit"):
        model.forward(tokens, positions + 3, cache, verify=True)
    with pytest.raises(ValueError, match="0..3"):
        out.pending.commit(torch.tensor([4]))
    out.pending.commit(torch.tensor([2]))
    with pytest.raises(RuntimeError, match="decided already"):
        out.pending.commit(torch.tensor([1]))  # committed twice
    with pytest.raises(RuntimeError, match="decided already"):
        out.pending.discard()
    later = model.forward(tokens, positions + 5, cache, verify=True)
    with pytest.raises(RuntimeError, match="decided already"):
        out.pending.commit(torch.tensor([1]))  # a stale step, while a newer one is open
    other = model.new_cache(1, 8)
    with pytest.raises(RuntimeError, match="decided already"):
        other.commit(later.pending, torch.tensor([1]))  # another cache's step
    later.pending.discard()
    fresh = model.new_cache(1, 8)
    model.forward(torch.tensor([[1, 2, 3, 1, 2]]), torch.arange(5)[None], fresh)
    assert all(torch.equal(a, b) for a, b in zip(cache_state(cache), cache_state(fresh)))


@pytest.mark.parametrize("family", ["llama", "qwen3_5_moe"])
def test_a_sequence_has_the_same_bits_alone_in_a_batch_and_in_a_verify_block(checkpoints, family):
    model = runtime(checkpoints[family][1])
    gen = torch.Generator().manual_seed(7)
    prompts = [torch.randint(0, model.config.vocab_size, (n,), generator=gen).tolist() for n in (7, 3, 11, 5)]
    together_cache = model.new_cache(4, 16)
    together = [model.head(prefill(model, together_cache, prompts, chunk=4))]
    next_tokens = torch.randint(0, model.config.vocab_size, (4, 3), generator=gen)
    positions = torch.tensor([len(p) for p in prompts])
    for t in range(3):
        together.append(model.forward(next_tokens[:, t : t + 1], (positions + t)[:, None], together_cache).logits[:, 0])
    for row, p in enumerate(prompts):
        cache = model.new_cache(1, 16)
        alone = [model.head(prefill(model, cache, [p]))]
        for t in range(3):
            step = model.forward(next_tokens[row : row + 1, t : t + 1], torch.tensor([[len(p) + t]]), cache)
            alone.append(step.logits[:, 0])
        assert all(torch.equal(a[0], b[row]) for a, b in zip(alone, together)), row
    sequence = torch.tensor([prompts[2]])
    decoded = steps(model, sequence, [1] * 11)
    cache = model.new_cache(1, 11)
    blocks = torch.cat(
        [
            model.forward(sequence[:, :3], torch.arange(3)[None], cache).logits,
            model.forward(sequence[:, 3:], torch.arange(3, 11)[None], cache, verify=True).logits,
        ],
        dim=1,
    )
    assert torch.equal(decoded, blocks)


def test_a_prefill_takes_prompt_tiles_and_the_steps_after_it_generated_ones(checkpoints, monkeypatch):
    """On the CPU what generate.prefill runs is tiled as prompt rows (cpu_rows.py), a drafter's observation of it
    included; the steps after it are generated rows'."""
    seen: list[tuple[str, int]] = []
    model = runtime(checkpoints["qwen3_5_moe"][1])
    for name in ("rows_mm", "weight_mm"):  # products of any operand, and of a model's weight
        real = getattr(linear, name)
        monkeypatch.setattr(linear, name, lambda a, b, real=real: seen.append(("product", tile_rows())) or real(a, b))
    cache = model.new_cache(2, 16)
    observed = []
    prefill(model, cache, [[1, 2, 3], [4, 5]], observe=lambda c: observed.append(tile_rows()))
    prompt, generated = PRODUCTS[torch.float32].prompt, PRODUCTS[torch.float32].generated
    assert seen and {t for _, t in seen} == {prompt} and observed == [prompt]
    seen.clear()
    model.forward(torch.tensor([[6], [7]]), torch.tensor([[3], [2]]), cache)
    assert seen and {t for _, t in seen} == {generated}


def test_generation_alone_and_in_a_batch_pick_the_same_tokens(checkpoints):
    model = runtime(checkpoints["qwen3_next"][1])
    gen = torch.Generator().manual_seed(8)
    prompts = [torch.randint(0, model.config.vocab_size, (n,), generator=gen).tolist() for n in (4, 9, 2)]
    for sampling in (Sampling(), Sampling(temperature=0.8, top_k=20, top_p=0.9, seed=11)):
        together, _ = generate(model, prompts, 6, sampling)
        for p, row in zip(prompts, together):
            (alone,), _ = generate(model, [p], 6, sampling)
            assert alone.tokens == row.tokens
        again, _ = generate(model, prompts, 6, sampling)
        assert [g.tokens for g in again] == [g.tokens for g in together]


def test_generation_stops_at_a_stop_id_and_greedy_is_argmax(checkpoints):
    hf, directory = checkpoints["qwen3"]
    model = runtime(directory)
    prompt = [5, 17, 99]
    (free,), _ = generate(model, [prompt], 5, Sampling())
    with torch.no_grad():
        greedy = hf.generate(torch.tensor([prompt]), max_new_tokens=5, do_sample=False, min_new_tokens=5)[0, 3:]
    assert free.tokens == greedy.tolist() and not free.stopped
    (stopped,), _ = generate(model, [prompt], 5, Sampling(), stop_ids=[free.tokens[1]])
    assert stopped.tokens == free.tokens[:2] and stopped.stopped


def test_sampling_filters_as_transformers_warpers():
    logits = torch.tensor([[2.0, 1.0, 0.5, -1.0, 3.0]])
    probs = Sampling(temperature=1.0, top_k=2).probabilities(logits)
    assert (probs[0] > 0).tolist() == [True, False, False, False, True]
    probs = Sampling(temperature=1.0, top_p=0.5).probabilities(logits)
    assert (probs[0] > 0).tolist() == [False, False, False, False, True]  # 3.0 alone holds 0.63 > 0.5
    probs = Sampling(temperature=0.5).probabilities(logits)
    assert torch.allclose(probs, torch.softmax(logits / 0.5, dim=-1))


@pytest.mark.parametrize("top_k", [1, 2, 40, 300])
@pytest.mark.parametrize("top_p", [0.5, 0.9, 0.95])
def test_top_p_after_top_k_keeps_what_sorting_the_whole_row_keeps(top_k: int, top_p: float):
    """On the CPU top-p after top-k sorts only what top-k kept; the set is transformers' (their warpers: top-k, then
    the whole row sorted for top-p): over rows of several spreads, bf16 ties at the k-th value, a row where
    every token ties."""
    from transformers.generation.logits_process import TopKLogitsWarper, TopPLogitsWarper

    generator = torch.Generator().manual_seed(top_k)
    logits = (torch.randn(24, 3000, generator=generator) * torch.linspace(0.3, 8, 24)[:, None]).bfloat16().float()
    logits[0] = 0.0
    warped = TopPLogitsWarper(top_p)(None, TopKLogitsWarper(top_k)(None, logits.clone()))
    probs = Sampling(temperature=1.0, top_k=top_k, top_p=top_p).probabilities(logits)
    kept = warped > float("-inf")
    # where a token left out ties the lowest one kept, which of the tied ones stay is the sort's order of equal
    # scores: there the same number of tokens, elsewhere the same tokens
    lowest = logits.masked_fill(~kept, float("inf")).amin(dim=-1, keepdim=True)
    edge = ((logits == lowest) & ~kept).any(dim=-1)
    assert bool(edge[0]) and int(edge.sum()) < len(edge) // 2
    assert torch.equal((probs > 0)[~edge], kept[~edge])
    assert torch.equal((probs > 0).sum(-1), kept.sum(-1))


@pytest.mark.parametrize(
    "sampling",
    [Sampling(0.7), Sampling(1.0, 40, 0.95), Sampling(1.0, 0, 0.9), Sampling(0.8, 3000, 0.95)],
    ids=["t0.7", "topk-topp", "topp", "wide-topk-topp"],
)
def test_a_rows_distribution_is_its_own_in_any_batch(sampling: Sampling):
    """A row's probabilities have the same bits alone and beside rows that keep more or fewer tokens (flat rows
    keep every tie of top-k): a verify block's rows and a decode step's row then sample alike."""
    generator = torch.Generator().manual_seed(2)
    logits = (torch.randn(12, 3000, generator=generator) * torch.linspace(0.05, 8, 12)[:, None]).bfloat16().float()
    logits[3] = 0.0
    together = sampling.probabilities(logits.reshape(3, 4, -1)).reshape(12, -1)
    for i in range(12):
        assert torch.equal(sampling.probabilities(logits[i : i + 1])[0], together[i]), i
        assert torch.equal(sampling.probabilities(logits[[i, 3]])[0], together[i]), i


def test_what_the_runtime_cannot_run_is_named(checkpoints, tmp_path):
    import json
    import shutil

    directory = tmp_path / "dynamic"
    shutil.copytree(checkpoints["qwen3"][1], directory)
    config = json.loads((directory / "config.json").read_text())
    config["rope_parameters"] = {"rope_type": "dynamic", "rope_theta": 1e6, "factor": 2.0}
    (directory / "config.json").write_text(json.dumps(config))
    with pytest.raises(BadInput, match="rope type 'dynamic' is not one the runtime computes"):
        plan_load(open_model(str(directory)), "cpu")
    config["rope_parameters"] = {"rope_type": "default", "rope_theta": 1e6}
    config["intermediate_size"] = 96
    (directory / "config.json").write_text(json.dumps(config))
    with pytest.raises(
        BadInput,
        match=r"weight 'layers.0.mlp.gate_proj.weight' is \[128, 64\], where its config "
        r"makes it \[96, 64\]",
    ):
        plan_load(open_model(str(directory)), "cpu")
    config["intermediate_size"] = 128
    config["num_hidden_layers"], config["layer_types"] = 3, config["layer_types"][:3]
    (directory / "config.json").write_text(json.dumps(config))
    with pytest.raises(
        BadInput,
        match=r"has weights a qwen3 model does not use: layers.3.input_layernorm.weight, "
        r".* and 7 more",
    ):
        plan_load(open_model(str(directory)), "cpu")
