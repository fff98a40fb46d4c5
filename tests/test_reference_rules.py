"""Drafter features against upstream behaviour, each on a tiny target (tests/drafting.py) with drafted == undrafted.

Where a reference runs on CPU it is the reference: z-lab's `dflash` package (DFlashDraftModel, DFlash2DraftModel
over transformers' own target) for input_embedding_scale, output_multiplier, final_logit_softcapping, tied-embedding
targets and DFlash2's sampled candidate selector. Where none does, the published source's rule: vLLM's and SGLang's
d2t map for reduced-vocabulary EAGLE-3 heads, and vLLM's Qwen3-Next MTP predictor built from transformers' own
Qwen3-Next decoder layer (transformers ships no MTP module).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from drafting import MASK_TOKEN, dflash_checkpoint, eagle3_checkpoint, load_target, prompts, tiny_target
from fixtures import save, tiny_model, write_json
from safetensors.torch import load_file, save_file

from specpair.errors import BadInput
from specpair.runtime.drafters import Committed, Drafting
from specpair.runtime.drafters.loading import load_drafter
from specpair.runtime.generate import generate
from specpair.runtime.sampling import Sampling
from specpair.runtime.speculative import DRAFT_STREAM, speculative_generate
from specpair.sources.model import open_model

GREEDY = Sampling()
HOT = 96  # the reduced draft vocabulary's size


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def qwen3(tmp_path_factory):
    hf = tiny_model("qwen3")
    path = save(hf, tmp_path_factory.mktemp("qwen3") / "target", "qwen3")
    model, target = load_target(path)
    return hf, path, model, target


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
    _, _, model, target = qwen3
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


def eagle31(plain: Path, directory: Path, norms: dict[str, bool], tensors: dict[str, torch.Tensor]) -> Path:
    """The EAGLE-3 head at `plain` with EAGLE-3.1's config keys and norm weights added."""
    shutil.copytree(plain, directory)
    config = json.loads((directory / "config.json").read_text())
    write_json(directory / "config.json", {**config, **norms})
    weights = load_file(str(directory / "model.safetensors"))
    save_file({**weights, **tensors}, str(directory / "model.safetensors"), metadata={"format": "pt"})
    return directory


def test_eagle31_norms_as_speculators_trains_them(qwen3, tmp_path):
    """speculators 0.9.0 (models/eagle3/core.py, the framework EAGLE-3.1 heads are trained in): norm_before_fc is one
    RMSNorm over the concatenated taps before fc (input_norm.weight, ones where none is shipped), fc_norm one RMSNorm
    per tap, and norm_output feeds norm(z) to the next step where EAGLE-3 feeds z. Each head proposes what the plain
    head proposes with that rule applied around it (each rule changes the proposals, so a runtime ignoring it fails
    here), and drafts the undrafted output."""
    _, _, model, target = qwen3
    plain_dir = eagle3_checkpoint(tmp_path / "plain", model.config)
    h, eps = model.config.hidden_size, 1e-5
    g = torch.Generator().manual_seed(8)
    scales = [1 + 0.5 * torch.randn(h, generator=g) for _ in range(3)]

    def rms(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        return (x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + eps) * weight).to(x.dtype)

    def around_fc(weights: list[torch.Tensor]):
        """The plain head with the taps normalized before fc, in len(weights) equal parts."""
        drafter = load_drafter(open_model(str(plain_dir)), model, target)
        observed = drafter.observed

        def normed(read, following, positions):
            parts = read.chunk(len(weights), dim=-1)
            return observed(torch.cat([rms(x, w) for x, w in zip(parts, weights)], -1), following, positions)

        drafter.observed = normed
        return drafter

    def fed_normed():
        drafter = load_drafter(open_model(str(plain_dir)), model, target)
        step = drafter.step

        def normed(features, tokens, positions):
            z, logits = step(features, tokens, positions)
            return drafter.norm(z), logits

        drafter.step = normed
        return drafter

    concatenated = torch.cat(scales)
    cases = {
        "norm_before_fc": ({"input_norm.weight": concatenated}, around_fc([concatenated])),
        "norm_before_fc, no input_norm.weight": ({}, around_fc([torch.ones(3 * h)])),
        "fc_norm": ({f"fc_norm.{i}.weight": w for i, w in enumerate(scales)}, around_fc(scales)),
        "norm_output": ({}, fed_normed()),
    }
    plain = load_drafter(open_model(str(plain_dir)), model, target)
    asked = prompts((5, 9, 13, 3), seed=12)
    for name, (tensors, reference) in cases.items():
        keys = {name.split(",")[0]: True}
        head = load_drafter(open_model(str(eagle31(plain_dir, tmp_path / name, keys, tensors))), model, target)
        got = [proposals(head, target, p, 5) for p in asked]
        assert got == [proposals(reference, target, p, 5) for p in asked], name
        assert got != [proposals(plain, target, p, 5) for p in asked], name
    undrafted, _ = generate(target, asked, 32, GREEDY)
    drafted, _ = speculative_generate(target, head, asked, 32, GREEDY, block_size=4)
    assert [r.tokens for r in drafted] == [r.tokens for r in undrafted]

    both = eagle31(plain_dir, tmp_path / "both", {"norm_before_fc": True, "fc_norm": True}, {})
    with pytest.raises(BadInput, match="both norm_before_fc and fc_norm"):
        open_model(str(both))


# ------------------------------------------------------------------------------------------------ z-lab's reference


@pytest.fixture(scope="module")
def tied(tmp_path_factory):
    """A Qwen3 target whose head is its embedding (tie_word_embeddings: no lm_head.weight in its file), as
    transformers holds it (the reference's target) and as specpair loads it."""
    hf = tiny_model("qwen3")
    hf.config.tie_word_embeddings = True
    hf.lm_head.weight = hf.model.embed_tokens.weight
    path = save(hf, tmp_path_factory.mktemp("tied") / "target", "qwen3")
    assert "lm_head.weight" not in load_file(str(path / "model.safetensors"))
    model, target = load_target(path)
    return hf, path, model, target


def with_dflash_config(path: Path, **keys) -> Path:
    """The drafter at `path` with `keys` added to its dflash_config and weights of a working scale (norms 1,
    matrices 1/sqrt(fan-in): the fixture's small noise leaves logits near 0, where a softcap does nothing)."""
    g = torch.Generator().manual_seed(6)
    tensors = {
        name: torch.ones(t.shape) if t.ndim == 1 else torch.randn(t.shape, generator=g) * t.shape[-1] ** -0.5
        for name, t in load_file(str(path / "model.safetensors")).items()
    }
    save_file(tensors, str(path / "model.safetensors"), metadata={"format": "pt"})
    config = json.loads((path / "config.json").read_text())
    config["dflash_config"] = {**config["dflash_config"], **keys}
    write_json(path / "config.json", config)
    return path


def both_blocks(
    reference,
    drafter,
    hf,
    target,
    sequence: list[int],
    anchor: int,
    block: int,
    scale: float = 1.0,
    mask_embedding: torch.Tensor | None = None,
):
    """The block [anchor, mask x (block - 1)] after sequence[:anchor], through z-lab's drafter over transformers'
    hidden states (its noise embedding the target's raw rows times input_embedding_scale, as dflash_generate
    builds it; with `mask_embedding`, the rows of the mask token replaced by it before the scale, as vLLM's
    DFlash2Qwen3Model.embed_input_ids does) and through specpair's over its own runtime's taps: (theirs, ours), the
    normed rows after the anchor [1, block - 1, H]."""
    from dflash.model import extract_context_feature

    context = torch.tensor([sequence[:anchor]])
    with torch.no_grad():
        hidden = extract_context_feature(
            hf(context, output_hidden_states=True).hidden_states, reference.target_layer_ids
        )
        ids = torch.tensor([[sequence[anchor]] + [reference.mask_token_id] * (block - 1)])
        noise = hf.get_input_embeddings()(ids)
        if mask_embedding is not None:
            noise = torch.where((ids == reference.mask_token_id)[..., None], mask_embedding, noise)
        theirs = reference(
            target_hidden=hidden, noise_embedding=noise * scale, position_ids=torch.arange(anchor + block)[None]
        )[:, 1:]
        positions = torch.arange(anchor)[None]
        out = target.forward(context, positions, target.new_cache(1, anchor + block), taps=drafter.taps, logits=False)
        drafter.start(1, anchor + block)
        following = torch.tensor([sequence[1 : anchor + 1]])
        drafter.observe(Committed(context, positions, following, torch.tensor([anchor]), out.taps, None))
        ours, _ = drafter.block(torch.tensor([sequence[anchor]]), torch.tensor([anchor]), block)
    return theirs, ours[:, 1:]


def test_dflash_scales_and_a_tied_head_as_z_labs_reference(tied, tmp_path):
    """dflash_config.input_embedding_scale (the block's embedding rows times it), output_multiplier and
    final_logit_softcapping (z-lab's compute_logits) on a target whose head is its embedding: specpair's draft
    logits equal z-lab's DFlashDraftModel's over transformers' tied Qwen3 (its `lm_head`, the embedding) at four
    anchors, the scale changes them, and the drafter drafts exactly."""
    from dflash.model import DFlashDraftModel

    hf, path, model, target = tied
    checkpoint = with_dflash_config(
        dflash_checkpoint(tmp_path / "dflash", "qwen3", model.config, block_size=6),
        input_embedding_scale=3.0,
        output_multiplier=4.0,
        final_logit_softcapping=2.0,
    )
    reference = DFlashDraftModel.from_pretrained(str(checkpoint), dtype=torch.float32).eval()
    drafter = load_drafter(open_model(str(checkpoint)), model, target)
    assert drafter.embedding_scale == 3.0 and drafter.mask_token_id == MASK_TOKEN
    (prompt,) = prompts((7,), seed=5)
    reply, _ = generate(target, [prompt], 12, GREEDY)
    sequence = prompt + reply[0].tokens
    for anchor in (6, 9, 12, 15):
        theirs, ours = both_blocks(reference, drafter, hf, target, sequence, anchor, 6, scale=3.0)
        unscaled, _ = both_blocks(reference, drafter, hf, target, sequence, anchor, 6)
        assert float((theirs - unscaled).abs().max()) > 1e-2  # the scale is not a no-op here
        with torch.no_grad():
            want, got = reference.compute_logits(theirs, hf.lm_head), drafter.logits(ours)
        assert float(want.abs().max()) > 1.0 and torch.allclose(got, want, atol=1e-5, rtol=1e-5), anchor
        assert torch.equal(got.argmax(-1), want.argmax(-1))
    asked = prompts((5, 9, 13, 3), seed=11)
    undrafted, _ = generate(target, asked, 32, GREEDY)
    drafted, _ = speculative_generate(target, drafter, asked, 32, GREEDY, block_size=6)
    assert [r.tokens for r in drafted] == [r.tokens for r in undrafted]


def test_shipped_mask_embedding_as_vllms_rule_over_z_labs_reference(qwen3, tmp_path):
    """A drafter shipping a learned mask embedding (ExLlamaV3's tensor `mask_embedding` among its safetensors) drafts
    its mask rows with it, substituted before input_embedding_scale as vLLM (qwen3_dflash.py embed_input_ids, then
    qwen3_dflash2.py's scale) and SGLang (the target's table row merged, then the noise scale) do: specpair's draft
    logits equal z-lab's DFlashDraftModel's fed that block at four anchors. The vector moves them, the other order
    (ExLlamaV3's, over the scaled rows) gives other logits, and the drafter drafts exactly."""
    from dflash.model import DFlashDraftModel

    hf, _, model, target = qwen3
    checkpoint = with_dflash_config(
        dflash_checkpoint(tmp_path / "dflash", "qwen3", model.config, block_size=6), input_embedding_scale=3.0
    )
    weights = load_file(str(checkpoint / "model.safetensors"))
    vector = torch.randn(model.config.hidden_size, generator=torch.Generator().manual_seed(8))
    save_file({**weights, "mask_embedding": vector}, str(checkpoint / "model.safetensors"), metadata={"format": "pt"})
    reference = DFlashDraftModel.from_pretrained(str(checkpoint), dtype=torch.float32).eval()
    drafter = load_drafter(open_model(str(checkpoint)), model, target)
    assert torch.equal(drafter.mask_embedding, vector) and drafter.mask_before_scale
    (prompt,) = prompts((7,), seed=5)
    reply, _ = generate(target, [prompt], 12, GREEDY)
    sequence = prompt + reply[0].tokens
    for anchor in (6, 9, 12, 15):
        theirs, ours = both_blocks(reference, drafter, hf, target, sequence, anchor, 6, 3.0, vector)
        unshipped, _ = both_blocks(reference, drafter, hf, target, sequence, anchor, 6, 3.0)
        assert float((theirs - unshipped).abs().max()) > 1e-2  # the shipped vector is not the target's row
        with torch.no_grad():
            want, got = reference.compute_logits(theirs, hf.lm_head), drafter.logits(ours)
        assert torch.allclose(got, want, atol=1e-5, rtol=1e-5), anchor
        assert torch.equal(got.argmax(-1), want.argmax(-1))
        drafter.mask_before_scale = False  # ExLlamaV3's order: the vector written over the scaled rows
        _, after = both_blocks(reference, drafter, hf, target, sequence, anchor, 6, 3.0, vector)
        drafter.mask_before_scale = True
        assert float((drafter.logits(after) - want).abs().max()) > 1e-2
    asked = prompts((5, 9, 13, 3), seed=11)
    undrafted, _ = generate(target, asked, 32, GREEDY)
    drafted, _ = speculative_generate(target, drafter, asked, 32, GREEDY, block_size=6)
    assert [r.tokens for r in drafted] == [r.tokens for r in undrafted]


@pytest.mark.parametrize("temperature", [0.7, 1.5])
def test_dflash2_sampled_selector_as_z_labs_reference(qwen3, tmp_path, monkeypatch, temperature):
    """DFlash2's candidate selector at a temperature (z-lab's CandidateSelector.select: the top-k candidates of
    each position's logits, scored unary + pair term with the previous pick, q = softmax(scores / T), a draw from
    q feeding the next position). specpair's walk draws with its keyed noise; z-lab's, forced along the same path,
    gives the same candidates and the same q at every position (to 1e-5) at three anchors. Then drafted ==
    undrafted at that temperature."""
    import dflash.model
    from dflash.model import DFlash2DraftModel

    hf, _, model, target = qwen3
    block = 6
    checkpoint = with_dflash_config(dflash_checkpoint(tmp_path / "dflash2", "qwen3", model.config, dflash2=True))
    reference = DFlash2DraftModel.from_pretrained(str(checkpoint), dtype=torch.float32).eval()
    drafter = load_drafter(open_model(str(checkpoint)), model, target)
    sampling = Sampling(temperature=temperature, seed=3)
    drafting = Drafting(sampling, drafter.samples, DRAFT_STREAM)
    top_k = reference.candidate_selector.top_k
    (prompt,) = prompts((7,), seed=5)
    reply, _ = generate(target, [prompt], 12, GREEDY)
    sequence = prompt + reply[0].tokens
    spread = 0.0
    for anchor in (6, 10, 14):
        theirs, ours = both_blocks(reference, drafter, hf, target, sequence, anchor, block)
        anchors = torch.tensor([sequence[anchor]])
        with torch.no_grad():
            proposal = drafter.selector.walk(
                ours, drafter.logits(ours), anchors, anchor + torch.arange(1, block)[None], drafting
            )
            logits = reference.compute_logits(theirs, hf.lm_head)
            candidates = torch.topk(logits, top_k, dim=-1, sorted=False).indices[0]  # as select computes them
            path = proposal.tokens[0]
            forced = iter([(candidates[j] == path[j]).nonzero()[0] for j in range(block - 1)])
            monkeypatch.setattr(dflash.model, "_sample_probs", lambda q, path=forced: next(path))
            chosen, their_ids, their_q = reference.candidate_selector.select(theirs, logits, anchors, temperature)
        assert torch.equal(chosen[0], path)
        for j in range(block - 1):
            mine, order = proposal.q_ids[0, j].sort()
            other, other_order = their_ids[0, j].sort()
            assert torch.equal(mine, other), (anchor, j)
            assert torch.allclose(proposal.q_probs[0, j][order], their_q[0, j][other_order], atol=1e-5), (anchor, j)
        spread = max(spread, float(1 - proposal.q_probs.max(dim=-1).values.min()))
    assert spread > 0.05  # q is a spread distribution, not a one-hot
    asked = prompts((5, 9, 13, 3), seed=11)
    undrafted, _ = generate(target, asked, 24, sampling)
    drafted, _ = speculative_generate(target, drafter, asked, 24, sampling, block_size=block)
    assert [r.tokens for r in drafted] == [r.tokens for r in undrafted]


# ------------------------------------------------------------------------------------------------ Qwen3-Next MTP


def test_qwen3_next_mtp_head_as_vllms_rule_over_transformers_layer(tmp_path):
    """Qwen3-Next's MTP head (vLLM vllm/model_executor/models/qwen3_next_mtp.py, Qwen3NextMultiTokenPredictor:
    e = pre_fc_norm_embedding(embed(x_{p+1})), h = pre_fc_norm_hidden(h_p), z = fc([e | h]), one full-attention
    Qwen3-Next decoder layer, logits = the target's lm_head(norm(z)), zero-centred norms). transformers has no MTP
    module, so the reference is that rule built from transformers' own Qwen3NextDecoderLayer (gated attention,
    sparse MoE with a gated shared expert) and Qwen3NextRMSNorm, loaded with the checkpoint's mtp.* weights, over
    the target's final normed hidden rows: specpair's head gives the same logits (to 1e-5) on 12 rows of causal
    attention, and its drafts are exact."""
    from transformers.models.qwen3_next.modeling_qwen3_next import Qwen3NextDecoderLayer, Qwen3NextRMSNorm

    path = tiny_target(tmp_path / "target", "qwen3_next")
    model, target = load_target(path)
    drafter = load_drafter(None, model, target)
    hf = tiny_model("qwen3_next")  # the same weights the target was saved with
    cfg = hf.config
    weights = {
        n[len("mtp.") :]: t for n, t in load_file(str(path / "model.safetensors")).items() if n.startswith("mtp.")
    }
    p = "layers.0."
    layer = Qwen3NextDecoderLayer(cfg, cfg.layer_types.index("full_attention")).eval()
    layer_weights = {n[len(p) :]: t for n, t in weights.items() if n.startswith(p) and ".experts." not in n}
    layer_weights["mlp.experts.gate_up_proj"] = torch.cat(
        (weights[p + "mlp.experts.gate_proj.weight"], weights[p + "mlp.experts.up_proj.weight"]), dim=1
    )
    layer_weights["mlp.experts.down_proj"] = weights[p + "mlp.experts.down_proj.weight"]
    layer.load_state_dict(layer_weights)

    def norm(name: str) -> Qwen3NextRMSNorm:
        module = Qwen3NextRMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)
        module.load_state_dict({"weight": weights[name]})
        return module

    (sequence,) = prompts((13,), seed=8)
    length = len(sequence) - 1
    tokens, following = torch.tensor([sequence[:-1]]), torch.tensor([sequence[1:]])
    positions = torch.arange(length)[None]
    with torch.no_grad():
        hidden = target.forward(tokens, positions, target.new_cache(1, length), hidden=True, logits=False).hidden
        e = norm("pre_fc_norm_embedding.weight")(hf.get_input_embeddings()(following))
        z = torch.cat((e, norm("pre_fc_norm_hidden.weight")(hidden)), dim=-1) @ weights["fc.weight"].T
        causal = torch.full((length, length), float("-inf")).triu(1)[None, None]
        z = layer(
            z, position_embeddings=hf.model.rotary_emb(z, positions), attention_mask=causal, position_ids=positions
        )
        want = hf.lm_head(norm("norm.weight")(z))
        drafter.start(1, length + 4)
        _, got = drafter.observed(hidden, following, positions)
    assert float(want.abs().max()) > 0.1 and torch.allclose(got, want, atol=1e-5, rtol=1e-5)
    assert torch.equal(got.argmax(-1), want.argmax(-1))
    asked = prompts((5, 9, 13, 3), seed=11)
    undrafted, _ = generate(target, asked, 24, GREEDY)
    drafted, _ = speculative_generate(target, drafter, asked, 24, GREEDY, block_size=3)
    assert [r.tokens for r in drafted] == [r.tokens for r in undrafted]
