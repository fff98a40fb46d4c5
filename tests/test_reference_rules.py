"""Drafter features tested against the published rule of the stacks that serve them, where no reference
implementation runs on CPU: reduced-vocabulary EAGLE-3 heads (d2t) and tied-embedding targets. Each on a tiny
target (tests/drafting.py), with drafted == undrafted.
"""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from drafting import eagle3_checkpoint, load_target, prompts
from fixtures import save, tiny_model, write_json
from safetensors.torch import load_file, save_file

from specpair.runtime.drafters import Committed, Drafting
from specpair.runtime.drafters.loading import load_drafter
from specpair.runtime.generate import generate
from specpair.runtime.sampling import Sampling
from specpair.runtime.speculative import DRAFT_STREAM, speculative_generate
from specpair.sources.model import open_model

GREEDY = Sampling()
HOT = 96  # the reduced draft vocabulary's size


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def qwen3(tmp_path_factory):
    path = save(tiny_model("qwen3"), tmp_path_factory.mktemp("qwen3") / "target", "qwen3")
    model, target = load_target(path)
    return path, model, target


def proposals(drafter, target, prompt: list[int], drafts: int) -> list[int]:
    """The drafter's first proposal after the prompt (greedy), in target ids."""
    drafter.start(1, 64)
    cache = target.new_cache(1, 64)
    tokens, rows = torch.tensor([prompt[:-1]]), torch.arange(len(prompt) - 1)[None]
    out = target.forward(tokens, rows, cache, taps=drafter.taps, hidden=drafter.hidden)
    drafter.observe(
        Committed(tokens, rows, torch.tensor([prompt[1:]]), torch.tensor([len(prompt) - 1]), out.taps, out.hidden)
    )
    at = torch.tensor([len(prompt) - 1])
    return (
        drafter.propose(torch.tensor([prompt[-1]]), at, drafts, Drafting(GREEDY, False, DRAFT_STREAM))
        .tokens[0]
        .tolist()
    )


def test_reduced_vocabulary_eagle3_maps_draft_ids_by_d2t(qwen3, tmp_path):
    """vLLM (vllm/model_executor/models/llama_eagle3.py, `draft_id_to_target_id`) and SGLang (its EAGLE-3 `hot_token_id`
    map) read a reduced-vocabulary head's logits over draft ids and emit target id = draft_id + d2t[draft_id]; the
    next chained step embeds that target id. So a head whose lm_head is a full head's rows at the hot target ids H
    (d2t = H - arange) proposes exactly what the full head proposes with its logits outside H masked off, at every
    chained step. And its speculative output equals the undrafted output."""
    path, model, target = qwen3
    full_dir = eagle3_checkpoint(tmp_path / "full", model.config)
    vocab = model.config.vocab_size
    hot = torch.sort(torch.randperm(vocab, generator=torch.Generator().manual_seed(4))[:HOT]).values
    reduced_dir = tmp_path / "reduced"
    shutil.copytree(full_dir, reduced_dir)
    config = json.loads((reduced_dir / "config.json").read_text())
    write_json(reduced_dir / "config.json", {**config, "draft_vocab_size": HOT})
    tensors = load_file(str(reduced_dir / "model.safetensors"))
    tensors["lm_head.weight"] = tensors["lm_head.weight"][hot].contiguous()
    tensors["d2t"] = hot - torch.arange(HOT)
    tensors["t2d"] = torch.zeros(vocab, dtype=torch.bool).index_fill(0, hot, True)
    save_file(tensors, str(reduced_dir / "model.safetensors"), metadata={"format": "pt"})

    reduced = load_drafter(open_model(str(reduced_dir)), model, target)
    assert reduced.draft_vocab == HOT
    full = load_drafter(open_model(str(full_dir)), model, target)
    outside = torch.ones(vocab, dtype=torch.bool).index_fill(0, hot, False)
    full_step = full.step

    def masked_step(features, tokens, positions):
        z, logits = full_step(features, tokens, positions)
        return z, logits.masked_fill(outside, float("-inf"))

    full.step = masked_step
    asked = prompts((5, 9, 13, 3), seed=11)
    hot_ids = set(hot.tolist())
    for prompt in asked:
        got = proposals(reduced, target, prompt, 5)
        assert got == proposals(full, target, prompt, 5)
        assert set(got) <= hot_ids

    undrafted, _ = generate(target, asked, 32, GREEDY)
    drafted, _ = speculative_generate(target, reduced, asked, 32, GREEDY, block_size=4)
    assert [r.tokens for r in drafted] == [r.tokens for r in undrafted]
