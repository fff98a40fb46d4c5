"""The demo's DFlash drafter (demo/SmolLM2-135M-Instruct-DFlash) and the script that trained it
(tools/train_demo_dflash.py).

Its real weights beside SmolLM2-135M-Instruct: the layout is z-lab's and specpair loads it; z-lab's reference
implementation (the `dflash` package, installed --no-deps by scripts/test) proposes the tokens specpair's drafter
proposes on the demo prompts; specpair's loop accepts its drafts on held-out prompts and stays identical to
undrafted decoding; `check` judges it for every stack and `convert` writes the `dflash` GGUF llama.cpp loads.
The script's pieces at tiny scale: prompts, self-distillation, the training forward against specpair's own
drafter, and a short training that makes the drafter draft.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from drafting import MASK_TOKEN, load_target, prompts, tiny_target
from fixtures import smollm2_gguf

from specpair.app.prompts import BUILTIN_PROMPTS
from specpair.convert.demo import DFLASH_DIRECTORY
from specpair.runtime import loading
from specpair.runtime.drafters import Committed
from specpair.runtime.drafters.loading import load_drafter
from specpair.runtime.generate import generate
from specpair.runtime.sampling import Sampling
from specpair.runtime.speculative import speculative_generate
from specpair.sources.model import open_model

ROOT = Path(__file__).resolve().parents[1]
DRAFTER = Path(DFLASH_DIRECTORY)


def _tool():
    spec = importlib.util.spec_from_file_location("train_demo_dflash", ROOT / "tools" / "train_demo_dflash.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


tool = _tool()


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def smollm2():
    model = open_model(str(smollm2_gguf()))
    return model, loading.load(loading.plan_load(model, "cpu"))


def chat(model, texts) -> list[list[int]]:
    return tool.chat_ids(model.tokenizer(), list(texts))


# ------------------------------------------------------------------------------------------------ the shipped drafter


def test_the_shipped_drafter_is_a_z_lab_drafter_that_specpair_loads(smollm2):
    model, target = smollm2
    config = json.loads((DRAFTER / "config.json").read_text())
    assert config["architectures"] == ["DFlashDraftModel"] and config["model_type"] == "qwen3"
    assert set(config["dflash_config"]) == {"block_size", "mask_token_id", "target_layer_ids"}
    weights = list(DRAFTER.glob("*.safetensors"))
    assert [w.name for w in weights] == ["model.safetensors"] and weights[0].stat().st_size <= 16 * 2**20
    drafter = load_drafter(open_model(str(DRAFTER)), model, target)
    assert drafter.kind == "dflash" and drafter.block_size == config["dflash_config"]["block_size"]
    assert drafter.taps == tuple(config["dflash_config"]["target_layer_ids"])
    record = json.loads((DRAFTER / "training.json").read_text())
    assert record["recipe"]["taps"] == config["dflash_config"]["target_layer_ids"]


def test_z_lab_reference_proposes_specpairs_tokens_on_the_demo_prompts(smollm2):
    """z-lab's DFlashDraftModel (their `dflash` package) over transformers' SmolLM2 hidden states, and specpair's
    drafter over its own runtime's taps: the same drafts at the first round of every demo prompt and at three
    later anchors along its greedy reply."""
    from dflash.model import DFlashDraftModel, extract_context_feature
    from transformers import AutoModelForCausalLM

    model, target = smollm2
    path = smollm2_gguf()
    hf = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32).eval()
    reference = DFlashDraftModel.from_pretrained(str(DRAFTER), dtype=torch.float32).eval()
    drafter = load_drafter(open_model(str(DRAFTER)), model, target)
    block = drafter.block_size
    asked = chat(model, [p for _, p in BUILTIN_PROMPTS])
    replies, _ = generate(target, asked, 12, Sampling())
    compared = 0
    for prompt, reply in zip(asked, replies):
        sequence = prompt + reply.tokens
        for anchor in (len(prompt) - 1, len(prompt) + 3, len(prompt) + 7, len(prompt) + 10):
            context = torch.tensor([sequence[:anchor]])
            with torch.no_grad():
                hidden = extract_context_feature(
                    hf(context, output_hidden_states=True).hidden_states, reference.target_layer_ids
                )
                noise = hf.get_input_embeddings()(
                    torch.tensor([[sequence[anchor]] + [reference.mask_token_id] * (block - 1)])
                )
                rows = reference(
                    target_hidden=hidden, noise_embedding=noise, position_ids=torch.arange(anchor + block)[None]
                )
                theirs = reference.compute_logits(rows[:, 1:], hf.lm_head).argmax(-1)
                positions = torch.arange(anchor)[None]
                out = target.forward(
                    context, positions, target.new_cache(1, anchor + block), taps=drafter.taps, logits=False
                )
                drafter.start(1, anchor + block)
                following = torch.tensor([sequence[1 : anchor + 1]])
                drafter.observe(Committed(context, positions, following, torch.tensor([anchor]), out.taps, None))
                ours, _ = drafter.block(torch.tensor([sequence[anchor]]), torch.tensor([anchor]), block)
            assert drafter.logits(ours[:, 1:]).argmax(-1).tolist() == theirs.tolist(), (prompt, anchor)
            compared += 1
    assert compared == 4 * len(BUILTIN_PROMPTS)


def test_specpairs_loop_accepts_its_drafts_on_held_out_prompts(smollm2):
    """Greedy, block 8, prompts never trained on (the hand-written ones after the demo's): every reply identical to
    undrafted decoding, and drafts accepted (tau above 1.15: 1.67 here; over all 16 held-out prompts at 64 tokens:
    1.88, training.json)."""
    model, target = smollm2
    drafter = load_drafter(open_model(str(DRAFTER)), model, target)
    asked = chat(model, tool.HELD_OUT[4:7])
    undrafted, _ = generate(target, asked, 20, Sampling(), [2])
    drafted, _ = speculative_generate(target, drafter, asked, 20, Sampling(), [2], block_size=8)
    assert [r.tokens for r in drafted] == [r.tokens for r in undrafted]
    tau = sum(sum(r.committed) for r in drafted) / sum(len(r.committed) for r in drafted)
    assert tau > 1.15, tau


def test_check_judges_it_for_every_stack_and_convert_writes_the_gguf_llama_cpp_loads(tmp_path):
    """`check` finds nothing wrong with the drafter on any stack: what fails there is the GGUF target's format
    (and TensorFold's families), and llama.cpp's wish for a GGUF drafter, which `convert` then meets: arch
    `dflash`, taps + 1, the mask token, and a file llama.cpp loads."""
    import ctypes

    import llama_cpp

    target = str(smollm2_gguf())
    done = subprocess.run(
        [sys.executable, "-m", "specpair", "check", target, str(DRAFTER), "--offline", "--json"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    report = json.loads(done.stdout)
    verdicts = report["verdicts"]
    assert report["drafter_kind"] == "dflash" and verdicts["specpair"]["status"] == "ok"
    for stack, verdict in verdicts.items():
        errors = {r["rule"] for r in verdict["reasons"] if r["severity"] == "error"}
        assert errors <= {"format.target", "format.family", "format.draft"}, (stack, errors)
    assert "--target" in verdicts["llama.cpp"]["fix"]
    out = tmp_path / "drafter.gguf"
    converted = subprocess.run(
        [
            sys.executable,
            "-m",
            "specpair",
            "convert",
            str(DRAFTER),
            str(out),
            "--to",
            "gguf:BF16",
            "--target",
            target,
            "--quiet",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert converted.returncode == 0, converted.stderr
    from specpair.formats.gguf import read_local

    header = read_local(str(out))
    config = json.loads((DRAFTER / "config.json").read_text())["dflash_config"]
    assert header.architecture == "dflash"
    assert header.fields["dflash.target_layers"] == [k + 1 for k in config["target_layer_ids"]]
    assert header.fields["tokenizer.ggml.mask_token_id"] == config["mask_token_id"]
    llama_cpp.llama_backend_init()
    loaded = llama_cpp.llama_model_load_from_file(str(out).encode(), llama_cpp.llama_model_default_params())
    assert loaded, "llama.cpp did not load the converted drafter"
    try:
        layers = json.loads((DRAFTER / "config.json").read_text())["num_hidden_layers"]
        assert llama_cpp.llama_model_n_embd(loaded) == 576 and llama_cpp.llama_model_n_layer(loaded) == layers
        name = ctypes.create_string_buffer(64)
        llama_cpp.llama_model_meta_val_str(loaded, b"general.architecture", name, 64)
        assert name.value == b"dflash"
    finally:
        llama_cpp.llama_model_free(loaded)


# ------------------------------------------------------------------------------------------------ the training script

TINY = tool.Recipe(
    block_size=4,
    layers=1,
    intermediate=32,
    taps=(0, 2),
    mask_token_id=MASK_TOKEN,
    heads=4,
    kv_heads=2,
    head_dim=16,
    rope_theta=10000.0,
    steps=120,
    sequences=4,
    blocks=4,
    lr=3e-3,
    warmup=5,
)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = tiny_target(tmp_path_factory.mktemp("demo_dflash") / "target", "llama", mtp=False)
    model, target = load_target(path)
    asked = prompts((5, 7, 6, 9))
    data = tool.self_distil(tool.FastTarget(target), asked, 10, [], batch=3, log=lambda _: None)
    data.final = True
    return model, target, asked, data


def test_prompts_are_seeded_distinct_and_never_held_out():
    train, validation = tool.prompt_sets(400, 40, seed=3)
    assert (train, validation) == tool.prompt_sets(400, 40, seed=3)
    assert len(set(train + validation)) == 440
    assert not set(train + validation) & set(tool.HELD_OUT)
    assert {p for _, p in BUILTIN_PROMPTS} <= set(tool.HELD_OUT)
    assert train != tool.prompt_sets(400, 40, seed=4)[0]


def test_the_prompts_people_wrote_are_split_seeded_and_never_held_out(tmp_path):
    path = ROOT / "tools" / "demo_prompts.json"
    train, validation = tool.human_prompt_sets([path], 64, seed=0)
    assert (train, validation) == tool.human_prompt_sets([path], 64, seed=0)
    assert len(validation) == 64 and len(train) >= 1600
    assert len(set(train + validation)) == len(train) + len(validation)
    assert not set(train + validation) & set(tool.HELD_OUT)
    assert validation != tool.human_prompt_sets([path], 64, seed=1)[1]
    with pytest.raises(ValueError, match="too few"):
        tool.human_prompt_sets([path], len(train) + len(validation), seed=0)
    # files after the first only train, once each: its split stays the one runs before them had
    shipped = ROOT / "tools" / "demo_prompts_more.json"
    widened, same = tool.human_prompt_sets([path, shipped], 64, seed=0)
    assert same == validation and widened[: len(train)] == train
    assert len(widened) - len(train) == len(json.loads(shipped.read_text())) >= 7000  # every one new, none held out
    more = tmp_path / "more.json"
    more.write_text(json.dumps(["a new one", validation[0], train[0], tool.HELD_OUT[0], "a new one", "another"]))
    assert tool.human_prompt_sets([path, more], 64, seed=0) == (train + ["a new one", "another"], validation)


def test_a_block_sees_the_context_before_its_anchor_and_its_own_rows():
    mask = tool.block_mask(torch.tensor([[2, 5]]), width=7, block=3)
    assert mask.shape == (1, 6, 7 + 6)
    assert mask[0, :3, :7].tolist() == [[True, True] + [False] * 5] * 3
    assert mask[0, 3:, :7].tolist() == [[True] * 5 + [False] * 2] * 3
    assert mask[0, :3, 7:].tolist() == [[True] * 3 + [False] * 3] * 3
    assert mask[0, 3:, 7:].tolist() == [[False] * 3 + [True] * 3] * 3
    anchors = tool.draw_anchors(torch.tensor([4, 9]), torch.tensor([10, 12]), 500, torch.Generator().manual_seed(0))
    assert set(anchors[0].tolist()) == set(range(3, 9)) and set(anchors[1].tolist()) == set(range(8, 11))


def test_self_distillation_is_the_targets_greedy_reply_and_its_taps(tiny):
    """FastTarget, the plain-torch target the data comes from, replies as the runtime does (greedy, every token)
    and its taps and final hidden state are the runtime's to float32 rounding; a reply's labels are its tokens."""
    _, target, asked, data = tiny
    replies, _ = generate(target, asked, 10, Sampling())
    for i, (prompt, reply) in enumerate(zip(asked, replies)):
        sequence = prompt + reply.tokens
        assert int(data.starts[i]) == len(prompt) and int(data.lengths[i]) == len(sequence)
        assert data.tokens[i, : len(sequence)].tolist() == sequence
        rows = torch.tensor([sequence])
        positions = torch.arange(len(sequence))[None]
        cache = target.new_cache(1, len(sequence))
        alone = target.forward(rows, positions, cache, taps=(2, 0), logits=False, hidden=True)
        batch = data.select(torch.tensor([i]), (2, 0))
        torch.testing.assert_close(batch.taps[:, : len(sequence)], alone.taps, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(batch.final[:, : len(sequence)], alone.hidden, rtol=1e-5, atol=1e-5)
        assert batch.labels[0, len(prompt) : len(sequence)].tolist() == reply.tokens
    # training draws a chunk of sequences and steps through parts of it: a part is those sequences selected alone
    part, alone = data.select(torch.arange(4), (2, 0)).part(slice(1, 3)), data.select(torch.tensor([1, 2]), (2, 0))
    assert torch.equal(part.tokens, alone.tokens) and torch.equal(part.labels, alone.labels)
    torch.testing.assert_close(part.taps, alone.taps)
    # its parts, cut with one read of the widths, are its parts cut one at a time
    chunk = data.select(torch.tensor([3, 0, 1, 2]), (2, 0))
    assert [p.tokens.shape[1] for p in chunk.parts(2)] == [int(chunk.lengths[:2].max()), int(chunk.lengths[2:].max())]
    for i, p in enumerate(chunk.parts(2)):
        one = chunk.part(slice(2 * i, 2 * i + 2))
        assert torch.equal(p.tokens, one.tokens) and torch.equal(p.taps, one.taps) and torch.equal(p.labels, one.labels)


def test_fast_target_samples_seeded_within_top_p_and_stops(tiny):
    """Sampled replies: the same seed the same replies, another seed others; every token within the nucleus
    top_p keeps (the target's own distribution after the reply's prefix); a reply ends with its first stop."""
    _, target, asked, _ = tiny
    fast = tool.FastTarget(target)
    first = fast.generate(asked, 12, [], 1.0, 0.5, seed=4)
    assert first == fast.generate(asked, 12, [], 1.0, 0.5, seed=4)
    assert first != fast.generate(asked, 12, [], 1.0, 0.5, seed=5)
    for prompt, (reply, stopped) in zip(asked, first):
        assert len(reply) == 12 and not stopped
        _, final = fast.taps(torch.tensor([prompt + reply]), (0,), final=True)
        probs = (final[0, len(prompt) - 1 : -1] @ fast.head.T).softmax(-1)
        for p, token in zip(probs, reply):
            assert p[p > p[token]].sum() < 0.5  # inside the smallest head of the ranking that reaches 0.5
    stop = first[0][0][3]
    cut, stopped = fast.generate(asked, 12, [stop], 1.0, 0.5, seed=4)[0]  # the same draws up to the stop
    assert stopped and cut == first[0][0][: first[0][0].index(stop) + 1]


def test_a_sampled_replys_labels_are_the_targets_greedy_choices_and_leave_the_path_in_a_block(tiny):
    """With `final` a batch's labels are the target's greedy choice at each position, whatever was sampled there;
    a block's rows count up to the first row after a token that is not its label."""
    _, target, asked, _ = tiny
    fast = tool.FastTarget(target)
    sampled = tool.self_distil(fast, asked, 10, [], batch=4, log=lambda _: None, temperature=1.0, seed=1)
    sampled.final = True
    batch = sampled.select(torch.arange(len(asked)), (0,))
    greedy = fast.generate([p + batch.tokens[i, len(p) : len(p) + 5].tolist() for i, p in enumerate(asked)], 1, [])
    for i, prompt in enumerate(asked):
        assert int(batch.labels[i, len(prompt) + 5]) == greedy[i][0][0]
    off = batch.tokens != batch.labels
    assert off[:, 1:].any() and not off[:, 0].any()
    anchors = torch.tensor([[len(p) - 1] for p in asked])
    _, labels, valid = tool.block_labels(batch, anchors, TINY)
    for i, prompt in enumerate(asked):
        first_off = next((k for k in range(1, TINY.block_size) if off[i, len(prompt) - 1 + k]), None)
        expected = [first_off is None or k <= first_off for k in range(1, TINY.block_size)]
        assert valid[i, 0].tolist() == expected


def test_the_training_forward_is_what_specpair_runs(tiny, tmp_path):
    """The script's DFlashModel, written in z-lab's layout and loaded by specpair's DFlash loader: the same block
    logits for blocks anchored anywhere in a reply."""
    model, target, _, data = tiny
    torch.manual_seed(0)
    drafter_model = tool.DFlashModel(target.config.hidden_size, TINY)
    with torch.no_grad():
        for p in drafter_model.parameters():
            p.copy_((p + torch.randn_like(p) * 0.3).bfloat16().float())  # as written: bf16
    tool.write_drafter(drafter_model, TINY, target, tmp_path / "drafter")
    drafter = load_drafter(open_model(str(tmp_path / "drafter")), model, target)
    batch = data.select(torch.tensor([3]), TINY.taps)
    tokens, starts, lengths, taps = batch.tokens, batch.starts, batch.lengths, batch.taps
    for anchor in (int(starts[0]) - 1, int(starts[0]) + 2, int(lengths[0]) - 2):
        with torch.no_grad():
            ours = tool.block_logits(
                drafter_model, target.embed_tokens, target.lm_head, tokens, taps, torch.tensor([[anchor]]), TINY
            )[0, 0]
        positions = torch.arange(anchor)[None]
        drafter.start(1, anchor + TINY.block_size)
        drafter.observe(
            Committed(
                tokens[:, :anchor], positions, tokens[:, 1 : anchor + 1], torch.tensor([anchor]), taps[:, :anchor], None
            )
        )
        rows, _ = drafter.block(tokens[:, anchor], torch.tensor([anchor]), TINY.block_size)
        assert torch.allclose(drafter.logits(rows[:, 1:])[0], ours, atol=1e-4), anchor


def test_a_short_training_lowers_the_loss_and_the_drafter_drafts(tiny, tmp_path):
    model, target, asked, data = tiny
    rows = torch.arange(len(asked))
    trained, curve = tool.train(
        data,
        rows,
        rows,
        target.embed_tokens,
        target.lm_head,
        target.norm.weight,
        TINY,
        seed=0,
        log=lambda _: None,
        every=40,
    )
    assert [p["step"] for p in curve] == [40, 80, 120]
    assert curve[-1]["loss"] < curve[0]["loss"] / 2 and curve[-1]["validation_accepted"] > 1.0
    with torch.no_grad():
        for p in trained.parameters():
            p.copy_(p.bfloat16().float())  # as written: bf16
    where = tool.write_drafter(trained, TINY, target, tmp_path / "trained")
    figures = tool.speculative_tau(target, model, where, asked, 10, [], (4,))
    assert figures[4]["identical"] and figures[4]["tau"] > 1.5, figures
    # teacher-forced, the loop's walk over the first 10 reply tokens is the loop's own tau
    assert tool.chain_tau(trained, data, rows, target.embed_tokens, target.lm_head, TINY, 10) == figures[4]["tau"]
    # the first draft at every anchor of the first 8 reply tokens, by the target's probability of its token: the
    # drafts block_loss counts, and the target's own distribution before each drafted token
    embed, head = target.embed_tokens, target.lm_head
    figure = tool.first_draft_by_confidence(trained, data, rows, embed, head, TINY, 8)
    batch = data.select(rows, TINY.taps)
    hits, probabilities = 0, []
    for i in range(len(asked)):
        start = int(data.starts[i])
        anchors = torch.arange(start - 1, min(start + 7, int(data.lengths[i]) - 1))
        _, accepted = tool.block_loss(trained, embed, head, batch.part(slice(i, i + 1)), anchors[None], TINY)
        hits += int((accepted > 0).sum())
        with torch.no_grad():
            probabilities += target.head(batch.final[i, anchors]).float().softmax(-1).amax(-1).tolist()
    assert figure["anchors"] == len(probabilities) == 8 * len(asked)
    assert figure["first_draft"] == pytest.approx(hits / len(probabilities)) and 0 < hits < len(probabilities)
    assert figure["target_probability"] == pytest.approx(sum(probabilities) / len(probabilities), rel=1e-5)
    shares = [b["share"] for b in figure["bins"]]
    assert len(shares) == len(tool.CONFIDENCE_EDGES) + 1 and sum(shares) == pytest.approx(1.0)
    assert figure["first_draft"] == pytest.approx(sum(b["share"] * (b["first_draft"] or 0) for b in figure["bins"]))
    assert tool.choose([(TINY, {"tau": 2.0}), (replace(TINY, taps=(1,)), {"tau": 2.5})]).taps == (1,)
    assert tool.choose([(TINY, {"tau": 2.0}), (replace(TINY, taps=(1,)), {"tau": 1.5})]).taps == TINY.taps


def test_a_blocks_rows_weigh_in_the_loss_by_the_position_decay(tiny):
    """Row k of a block (k = 1..B-1) weighs exp(-(k - 1) / γ) in the loss: γ = B / 2 unless the recipe sets
    `position_decay`; a smaller γ leans the loss on a block's first rows."""
    _, target, asked, data = tiny
    rows = torch.arange(len(asked))
    batch = data.select(rows, TINY.taps)
    torch.manual_seed(0)
    drafter = tool.DFlashModel(target.embed_tokens.shape[1], TINY)
    embed, head = target.embed_tokens, target.lm_head
    anchors, _, _ = tool.span_anchors(batch, 3)
    with torch.no_grad():
        logits = tool.block_logits(drafter, embed, head, batch.tokens, batch.taps, anchors, TINY)
        _, labels, valid = tool.block_labels(batch, anchors, TINY)
        losses = torch.nn.functional.cross_entropy(logits.flatten(0, 2), labels.flatten(), reduction="none")
        losses = losses.view_as(labels)
        by_row = [float(losses[..., k][valid[..., k]].sum()) for k in range(TINY.block_size - 1)]
        counts = [int(valid[..., k].sum()) for k in range(TINY.block_size - 1)]
        assert min(counts) > 0 and len(set(by_row)) == len(by_row)
        for decay, gamma in ((None, TINY.block_size / 2), (1.0, 1.0), (0.25, 0.25)):
            weights = [math.exp(-k / gamma) for k in range(TINY.block_size - 1)]
            expected = sum(w * b for w, b in zip(weights, by_row)) / sum(w * c for w, c in zip(weights, counts))
            loss, _ = tool.block_loss(drafter, embed, head, batch, anchors, replace(TINY, position_decay=decay))
            assert float(loss) == pytest.approx(expected, rel=1e-5), decay


def test_training_goes_on_from_a_written_drafter_of_the_same_recipe(tiny, tmp_path):
    """--init: the drafter starts as written (its curve's first point below a fresh start's at the same step) and a
    drafter of other taps is refused, naming its config."""
    model, target, asked, data = tiny
    rows = torch.arange(len(asked))
    fixed = (data, rows, rows, target.embed_tokens, target.lm_head, target.norm.weight)
    first, _ = tool.train(*fixed, TINY, 0, lambda _: None, 40)
    where = tool.write_drafter(first, TINY, target, tmp_path / "first")
    short = replace(TINY, steps=10)
    _, fresh = tool.train(*fixed, short, 1, lambda _: None, 10)
    _, resumed = tool.train(*fixed, short, 1, lambda _: None, 10, init=tool.initial_weights(where, short))
    assert resumed[0]["loss"] < fresh[0]["loss"] / 2 and resumed[0]["validation_accepted"] > 1.0
    with pytest.raises(SystemExit, match="config.json: not this recipe's drafter: target_layer_ids"):
        tool.initial_weights(where, replace(short, taps=(1, 2)))


def test_a_drafter_started_from_the_targets_layers_computes_them(tiny):
    """--target-layers: the drafter's layer starts as the target's layer 1 and its context as the stream that layer
    reads (the tap after layer 0): the context's keys and values are the target layer's own projections of its
    normed input, and with the target's FFN width the FFN is the target's; a narrower FFN keeps the target's
    largest neurons in their order; a layer that does not follow a tap is refused."""
    _, target, asked, data = tiny
    rows = torch.arange(len(asked))
    layer = target.layers[1]
    gate_up = torch.cat([w for w, _ in layer.mlp.gate_up.groups])
    r = replace(TINY, intermediate=gate_up.shape[0] // 2, rms_norm_eps=target.config.rms_norm_eps)
    drafter = tool.DFlashModel(target.config.hidden_size, r)
    drafter.load_state_dict(tool.target_layer_weights(target, data, rows, r, (1,)))  # strict: every weight given
    with torch.no_grad():
        context = drafter.hidden_norm(drafter.fc(data.select(rows, r.taps).taps))
        normed = layer.input_norm(data.select(rows, (0,)).taps)
        q, k, v = layer.mixer.qkv(normed)
        attention = drafter.layers[0].self_attn
        torch.testing.assert_close(attention.k_proj(context), k, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(attention.v_proj(context), v, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(attention.q_proj(normed), q)
        torch.testing.assert_close(drafter.layers[0].mlp(normed), layer.mlp(normed), rtol=1e-5, atol=1e-5)
    narrow = replace(r, intermediate=r.intermediate // 4)
    kept = tool.target_layer_weights(target, data, rows, narrow, (1,))["layers.0.mlp.gate_proj.weight"]
    gates = gate_up[: r.intermediate]
    where = [int((gates == row).all(1).nonzero()) for row in kept]
    assert len(kept) == narrow.intermediate and where == sorted(where)
    importance = gates.norm(dim=1) * gate_up[r.intermediate :].norm(dim=1) * layer.mlp.down_proj.norm(dim=0)
    assert set(where) == set(importance.topk(narrow.intermediate).indices.tolist())
    with pytest.raises(SystemExit, match=r"--target-layers \[2\]: needs 1 layers, the first after a tap"):
        tool.target_layer_weights(target, data, rows, r, (2,))


def test_the_soft_labels_are_the_targets_distribution_at_each_drafted_token(tiny):
    """Row k of a block anchored at a is the token at a + k: the target's distribution over it is its head over the
    final hidden state at a + k - 1, whose greedy choice is the reply's token there; a drafter trained on a share of
    soft labels learns to draft (its loss cannot fall below the share of the teacher's entropy: a random target's
    distribution is flat)."""
    model, target, asked, data = tiny
    batch = data.select(torch.arange(len(asked)), TINY.taps)
    for i in range(len(asked)):
        start, length = int(data.starts[i]), int(data.lengths[i])
        chosen = target.head(batch.final[i, start - 1 : length - 1]).argmax(-1)
        assert chosen.tolist() == data.tokens[i, start:length].tolist()
    # rows past a sequence's end are zeros: blocks near an end read them with weight 0, and 0 · NaN is NaN
    shortest = int(data.lengths.argmin())
    width = int(data.lengths[shortest])
    assert width < batch.final.shape[1]
    assert not batch.final[shortest, width:].any() and not batch.taps[shortest, width:].any()
    rows = torch.arange(len(asked))
    soft = replace(TINY, soft=0.5, steps=80)
    _, curve = tool.train(
        data, rows, rows, target.embed_tokens, target.lm_head, target.norm.weight, soft, 0, lambda _: None, 40
    )
    assert curve[-1]["loss"] < curve[0]["loss"] and curve[-1]["validation_accepted"] > 0.5
    # a budget spent before the calibration's steps ends the schedule there
    longer = replace(TINY, steps=2 * tool.CALIBRATION_STEPS)
    embed, head, norm = target.embed_tokens, target.lm_head, target.norm.weight
    _, cut = tool.train(data, rows, rows, embed, head, norm, longer, 0, lambda _: None, 250, budget_s=0.0)
    assert [p["step"] for p in cut] == [*range(250, tool.CALIBRATION_STEPS, 250), tool.CALIBRATION_STEPS]


def test_a_schedule_stopped_after_its_time_goes_on_from_its_state_as_if_never_stopped(tiny, tmp_path):
    """--stop-after-s and --state: a run stopped past the calibration writes its state and its drafter; the same run
    given that state ends with the weights and the curve of a run never stopped, and removes the state."""
    _, target, asked, data = tiny
    rows = torch.arange(len(asked))
    fixed = (data, rows, rows, target.embed_tokens, target.lm_head, target.norm.weight)
    r = replace(TINY, steps=tool.CALIBRATION_STEPS + 2 * tool.CHUNK_STEPS)
    whole, whole_curve = tool.train(*fixed, r, 0, lambda _: None, 250)
    state, kept = tmp_path / "run" / "state.pt", []
    _, first = tool.train(*fixed, r, 0, lambda _: None, 250, keep=kept.append, state=state, stop_s=0.0)
    assert state.exists() and [p["step"] for p in first] == [250, 500] and len(kept) == 3  # each point, the stop
    with pytest.raises(SystemExit, match=r"state.pt: not this recipe's run \(another drafter's shape\)"):
        tool.train(*fixed, replace(r, intermediate=2 * r.intermediate), 0, lambda _: None, 250, state=state)
    lines = []
    went_on, curve = tool.train(*fixed, r, 0, lines.append, 250, state=state)
    assert not state.exists() and f"step {tool.CALIBRATION_STEPS} of {r.steps}" in lines[0]
    for name, weight in whole.state_dict().items():
        assert torch.equal(went_on.state_dict()[name], weight), name

    def timeless(points: list[dict]) -> list[dict]:
        return [{k: v for k, v in p.items() if k != "seconds"} for p in points]

    assert timeless(curve) == timeless(whole_curve) and [p["step"] for p in curve] == [250, 500, r.steps]
    with pytest.raises(SystemExit, match="--stop-after-s needs --state"):
        tool.train(*fixed, r, 0, lambda _: None, 250, stop_s=0.0)
    state.write_bytes(b"not a state")
    with pytest.raises(SystemExit, match=r"state.pt: not a run's state \(UnpicklingError\)"):
        tool.train(*fixed, r, 0, lambda _: None, 250, state=state)


def test_people_s_prompts_get_rounds_of_sampled_replies_after_the_training_prompts_rounds(smollm2):
    """--human-sampled-replies: after the greedy replies to every prompt and --sampled-replies rounds over the
    training prompts, rounds over the people's training prompts alone, each round under the next seed; a spent
    --data-budget-s leaves the greedy replies only."""
    model, target = smollm2
    fast, tokenizer = tool.FastTarget(target), model.tokenizer()
    people = ["Say hi to my cat.", "Name a warm colour."]
    prompts = tool.Prompts(
        ["Count to three.", *people], ["Name a fruit."], people, [], ["Name a tree."], [], templated=1, written=0
    )
    args = argparse.Namespace(
        new_tokens=4,
        batch=8,
        seed=3,
        sampled_replies=1,
        human_sampled_replies=2,
        reply_temperature=1.0,
        data_budget_s=None,
    )
    data = tool.make_data(args, fast, tokenizer, [], prompts, lambda _: None, time.perf_counter())

    def replies(asked: list[str], temperature: float = 1.0, seed: int = 0) -> list[list[int]]:
        d = tool.self_distil(fast, chat(model, asked), 4, [], 8, lambda _: None, temperature, seed)
        return [d.tokens[i, : d.lengths[i]].tolist() for i in range(len(asked))]

    expected = replies(prompts.train + prompts.validation + prompts.held_out, temperature=0.0)
    expected += replies(prompts.train, seed=3 + 1_000_000)
    expected += replies(people, seed=3 + 2_000_000) + replies(people, seed=3 + 3_000_000)
    assert len(data.tokens) == prompts.sequences + 3 + 2 * 2 == len(expected)
    assert [data.tokens[i, : data.lengths[i]].tolist() for i in range(len(expected))] == expected
    assert [int(data.starts[i]) for i in range(prompts.sequences, len(expected))] == [
        len(ids) for ids in chat(model, prompts.train + people + people)
    ]

    budget_spent = argparse.Namespace(**{**vars(args), "data_budget_s": 0.0})
    greedy = tool.make_data(budget_spent, fast, tokenizer, [], prompts, lambda _: None, time.perf_counter() - 1.0)
    assert [greedy.tokens[i, : greedy.lengths[i]].tolist() for i in range(len(greedy.tokens))] == expected[:5]


def test_data_written_for_a_later_run_reads_back_whole(tiny, tmp_path):
    """--data: the prompts and sequences one call made are what the next call trains on; the prompts file is
    written last, so a directory without it holds no data a run would read."""
    _, target, asked, data = tiny
    prompts = tool.Prompts(["a", "b"], ["c"], ["b"], [], ["d"], [], templated=1, written=0)
    sequences = tool.Data(data.tokens[:4], data.starts[:4], data.lengths[:4], data.target)
    tool.save_data(tmp_path / "data", prompts, sequences)
    assert sorted(p.name for p in (tmp_path / "data").iterdir()) == [tool.PROMPTS_FILE, tool.SEQUENCES_FILE]
    read_prompts, read = tool.load_data(tmp_path / "data", tool.FastTarget(target))
    assert read_prompts == prompts and read_prompts.sequences == 4
    for name in ("tokens", "starts", "lengths"):
        assert torch.equal(getattr(read, name), getattr(sequences, name)) and getattr(read, name).dtype == torch.int64
