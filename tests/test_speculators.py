"""The vllm-project/speculators drafter format, against what speculators 0.9.0 writes and vLLM reads.

The `speculators` package is not installed to test against: 0.9.0 imports openai, datasets and pydantic-settings
at import time and pins transformers <= 5.19 (the test extra pins 5.24). The reference configs below are built
as its source builds them (src/speculators/convert/dflash/converter.py `_build_config`, convert/eagle/
eagle3_converter.py, models/{dflash,eagle3}/config.py, proposals/greedy.py, config.py `SpeculatorsConfig`,
`VerifierConfig`); reading follows vLLM's vllm/transformers_utils/configs/speculators/{base,algos}.py.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from drafting import dflash_checkpoint, eagle3_checkpoint, tiny_target
from fixtures import write_json
from safetensors.torch import load_file, save_file

from specpair.app.gate import judged
from specpair.app.pair import GatePair
from specpair.checkpoint import speculators
from specpair.checkpoint.families import DRAFTER_KINDS, EAGLE_NORMS
from specpair.compat.pair import Deployment
from specpair.compat.stacks import STACK_NAMES
from specpair.compat.verdict import judge
from specpair.convert import converter as conv
from specpair.errors import BadInput
from specpair.sources import open_checkpoint
from specpair.sources.model import open_model

SPECULATORS_VERSION = "0.9.0"
DFLASH_NON_TRANSFORMER_KEYS = {"architectures", "auto_map", "block_size", "dflash_config", "num_target_layers"}


def greedy(tokens: int) -> dict:
    """proposals/greedy.py GreedyTokenProposalConfig, as model_dump writes it."""
    return {"proposal_type": "greedy", "speculative_tokens": tokens, "verifier_accept_k": 1, "accept_tolerance": 0.0}


def dflash_reference(source: dict, verifier: dict, name: str) -> dict:
    """The config.json speculators 0.9.0's DFlashConverter writes for a z-lab DFlash (`_build_config`): z-lab's
    target_layer_ids + 1, a tap on the verifier's last layer dropped, the rest of the config as the transformer's."""
    dflash = source.get("dflash_config", {})
    block = source.get("block_size") or dflash["block_size"]
    layer = {k: v for k, v in source.items() if k not in DFLASH_NON_TRANSFORMER_KEYS}
    layers = verifier["num_hidden_layers"]
    return {
        "architectures": ["DFlashDraftModel"],  # save_pretrained: the model class
        "speculators_model_type": "dflash",
        "speculators_version": SPECULATORS_VERSION,
        "transformer_layer_config": layer,
        "draft_vocab_size": layer["vocab_size"],
        "block_size": block,
        "target_hidden_size": None,
        "aux_hidden_state_layer_ids": [i + 1 for i in dflash["target_layer_ids"] if i + 1 != layers],
        "mask_token_id": dflash.get("mask_token_id"),
        "sliding_window_non_causal": False,
        "sample_from_anchor": False,
        "speculators_config": {
            "algorithm": "dflash",
            "proposal_methods": [greedy(block - 1)],
            "default_proposal_method": "greedy",
            "verifier": {"name_or_path": name, "architectures": verifier["architectures"]},
        },
    }


def eagle3_reference(source: dict, verifier: dict, name: str, aux: list[int] | None) -> dict:
    """The config.json speculators 0.9.0's Eagle3Converter writes (a LlamaConfig transformer, 3 speculative
    tokens, norm_before_residual as its flag says, the aux ids only when given)."""
    return {
        "architectures": ["Eagle3Speculator"],
        "speculators_model_type": "eagle3",
        "speculators_version": SPECULATORS_VERSION,
        "transformer_layer_config": {
            "model_type": "llama",
            "vocab_size": source["vocab_size"],
            "hidden_size": source["hidden_size"],
            "intermediate_size": source["intermediate_size"],
            "num_hidden_layers": 1,
            "num_attention_heads": source["num_attention_heads"],
            "num_key_value_heads": source["num_key_value_heads"],
            "hidden_act": "silu",
            "max_position_embeddings": max(source["max_position_embeddings"], verifier["max_position_embeddings"]),
            "rms_norm_eps": source["rms_norm_eps"],
            "tie_word_embeddings": False,
            "rope_parameters": {"rope_type": "default", "rope_theta": source["rope_theta"]},
        },
        "draft_vocab_size": source["draft_vocab_size"],
        "norm_before_residual": False,
        "norm_before_fc": False,
        "fc_norm": False,
        "norm_output": False,
        "target_hidden_size": source.get("target_hidden_size"),
        "eagle_aux_hidden_state_layer_ids": aux,  # its --eagle-aux-hidden-state-layer-ids, else None
        "embed_requires_grad": False,
        "speculators_config": {
            "algorithm": "eagle3",
            "proposal_methods": [greedy(3)],
            "default_proposal_method": "greedy",
            "verifier": {"name_or_path": name, "architectures": verifier["architectures"]},
        },
    }


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """A tiny Qwen3 target (4 layers) and a z-lab DFlash, a DFlash2 and an EAGLE-3 drafter for it."""
    root = tmp_path_factory.mktemp("speculators")
    target = tiny_target(root / "target", "qwen3")
    config = open_model(str(target)).config
    drafters = {
        "dflash": dflash_checkpoint(root / "dflash", "qwen3", config),
        "dflash2": dflash_checkpoint(root / "dflash2", "qwen3", config, dflash2=True),
        "eagle3": eagle3_checkpoint(root / "eagle3", config),
    }
    return target, drafters


def convert(source: Path, destination: Path, target: Path, to: str = "speculators:f32") -> dict:
    conv.execute(
        conv.plan(conv.open_source(str(source)), conv.parse_target(to), [], conv.open_source(str(target))),
        str(destination),
    )
    return json.loads((destination / "config.json").read_text())


def config_of(path: Path) -> dict:
    return json.loads((path / "config.json").read_text())


def reference_dflash_checkpoint(source: Path, target: Path, where: Path, name: str) -> Path:
    """A z-lab DFlash as speculators' converter saves it: its config, the drafter's tensors and the verifier's
    embedding, head and final norm copied in (load_verifier_weights; verifier_lm_head is not saved)."""
    where.mkdir()
    write_json(where / "config.json", dflash_reference(config_of(source), config_of(target), name))
    tensors = load_file(str(source / "model.safetensors"))
    verifier = load_file(str(target / "model.safetensors"))
    tensors["embed_tokens.weight"] = verifier["model.embed_tokens.weight"]
    tensors["lm_head.weight"] = verifier.get("lm_head.weight", verifier["model.embed_tokens.weight"])
    tensors["verifier_norm.weight"] = verifier["model.norm.weight"]
    save_file(tensors, str(where / "model.safetensors"), metadata={"format": "pt"})
    return where


def test_what_speculators_writes_for_a_dflash_reads_as_the_z_lab_drafter(pair, tmp_path):
    """speculators' aux ids (z-lab + 1) read back as the z-lab taps; the verifier's copies are not read (the
    target's own are); every drafter tensor is the same; check pins it to the target and vLLM serves the drafter."""
    target, drafters = pair
    native = open_model(str(drafters["dflash"]))
    reference = reference_dflash_checkpoint(drafters["dflash"], target, tmp_path / "ref", str(target))
    assert config_of(reference)["aux_hidden_state_layer_ids"] == [2, 3]  # z-lab's [1, 2] on a 4-layer verifier
    read = open_model(str(reference))
    assert read.config.drafter.target_layer_ids == native.config.drafter.target_layer_ids == (1, 2)
    assert read.config.drafter.mask_token_id == native.config.drafter.mask_token_id
    assert read.config.drafter.block_size == native.config.drafter.block_size == 8
    assert sorted(read.names) == sorted(native.names)
    assert all(torch.equal(read.load(n), native.load(n)) for n in native.names)
    assert "embed_tokens.weight, lm_head.weight, verifier_norm.weight (the verifier's copies)" in read.notes[0]
    checkpoint = open_checkpoint(str(reference))
    assert checkpoint.drafter.verifier == str(target)
    assert checkpoint.drafter.verifier_architectures == ["Qwen3ForCausalLM"]
    taps = checkpoint.drafter.taps
    assert (taps.layers, taps.raw, taps.source) == ([1, 2], [2, 3], "aux_hidden_state_layer_ids")
    verdicts, _ = judged(GatePair(str(target), str(reference)), None, None, 64)
    assert verdicts["vllm"].launch.startswith(f"vllm serve {reference} --max-model-len 64 ")
    assert all(f.rule != "speculators.verifier" for v in verdicts.values() for f in v.reasons)
    # speculators.format's fix for SGLang and the rest: the drafter in its own layout, as z-lab ships it
    own = convert(reference, tmp_path / "own", target, "f32")
    assert "speculators_config" not in own and own["architectures"] == ["DFlashDraftModel"]
    assert own["dflash_config"]["target_layer_ids"] == [1, 2] and own["dflash_config"]["mask_token_id"] == 511
    assert set(load_file(str(tmp_path / "own" / "model.safetensors"))) == set(native.names)


def test_what_speculators_writes_for_an_eagle3_reads_as_vllm_builds_it(pair, tmp_path):
    """Its layers.0.* are EAGLE's midlayer.*; its aux ids reach the runtime unchanged as vLLM passes them (the
    input of layer j); without ids (the converter's default) vLLM's default taps apply."""
    target, drafters = pair
    native = open_model(str(drafters["eagle3"]))
    for aux, expected in (([1, 2, 3], (0, 1, 2)), (None, ())):
        where = tmp_path / f"ref-{aux is None}"
        where.mkdir()
        write_json(where / "config.json", eagle3_reference(config_of(drafters["eagle3"]), config_of(target), "t", aux))
        tensors = load_file(str(drafters["eagle3"] / "model.safetensors"))
        tensors = {k.replace("midlayer.", "layers.0."): v for k, v in tensors.items()}
        save_file(tensors, str(where / "model.safetensors"), metadata={"format": "pt"})
        read = open_model(str(where))
        assert read.config.drafter.kind == "eagle3" and read.config.drafter.target_layer_ids == expected
        assert read.config.drafter.draft_vocab_size == native.config.drafter.draft_vocab_size
        assert not read.config.drafter.norm_before_residual  # written false by speculators, not vLLM's default
        assert sorted(read.names) == sorted(native.names)
        assert all(torch.equal(read.load(n), native.load(n)) for n in native.names)
    assert native.config.drafter.target_layer_ids == (0, 1, 2)


@pytest.mark.parametrize("kind", ["dflash", "dflash2", "eagle3"])
def test_convert_writes_what_speculators_writes_and_reads_back_the_same_drafter(pair, tmp_path, kind):
    """The keys vLLM reads equal speculators' converter's (DFlash; EAGLE-3 beyond its LlamaConfig defaults and its
    fixed 3 tokens); DFlash2 carries the nested dflash_config beside; every tensor and the wiring read back."""
    target, drafters = pair
    written = convert(drafters[kind], tmp_path / "out", target)
    source, verifier = config_of(drafters[kind]), config_of(target)
    if kind == "eagle3":
        reference = eagle3_reference(source, verifier, str(target), [1, 2, 3])
        keys = ["speculators_model_type", "draft_vocab_size", "target_hidden_size", "eagle_aux_hidden_state_layer_ids"]
        keys += ["norm_before_residual", "architectures", *EAGLE_NORMS]
        assert written["speculators_config"]["verifier"] == reference["speculators_config"]["verifier"]
        block = DRAFTER_KINDS["eagle3"].block_size  # the block check's launch lines and run use (its row)
        assert written["speculators_config"]["proposal_methods"] == [greedy(block - 1)]
    else:
        reference = dflash_reference(source, verifier, str(target))
        keys = ["speculators_model_type", "aux_hidden_state_layer_ids", "mask_token_id", "block_size"]
        keys += ["draft_vocab_size", "speculators_config"]
        if kind == "dflash":
            keys += ["architectures", "transformer_layer_config"]
            assert written["transformer_layer_config"] == reference["transformer_layer_config"]
        else:  # speculators' DFlash2 model class, its keys flat and nested, the transformer's beside (model_type)
            reference.update(speculators_model_type="dflash2", architectures=["DFlash2DraftModel"])
            reference["speculators_config"]["algorithm"] = "dflash2"
            keys += ["architectures", "conv_kernel_size", "selector_top_k"]
            reference.update({k: source["dflash_config"][k] for k in ("conv_kernel_size", "selector_top_k")})
            assert written["dflash_config"] == source["dflash_config"] and written["model_type"] == "qwen3"
    assert {k: written.get(k) for k in keys} == {k: reference[k] for k in keys}
    native, read = open_model(str(drafters[kind])), open_model(str(tmp_path / "out"))
    assert read.config.drafter.target_layer_ids == native.config.drafter.target_layer_ids
    assert read.config.drafter.block_size == native.config.drafter.block_size
    assert sorted(read.names) == sorted(native.names)
    assert all(torch.equal(read.load(n), native.load(n)) for n in native.names)
    stored = set(load_file(str(tmp_path / "out" / "model.safetensors")))
    own = set(load_file(str(drafters[kind] / "model.safetensors")))
    assert stored == {n.replace("midlayer.", "layers.0.") for n in own}  # speculators' Eagle3Speculator names


def test_an_eagle31_head_keeps_its_norms_in_the_speculators_format(pair, tmp_path):
    """EAGLE-3.1's keys go where speculators' converter writes them (the top level, from the source's top level or
    eagle_config) and its norm weights under their own names; the head reads back with the same norms."""
    target, drafters = pair
    source = tmp_path / "eagle31"
    shutil.copytree(drafters["eagle3"], source)
    config = config_of(source)
    write_json(source / "config.json", {**config, "norm_output": True, "eagle_config": {"fc_norm": True}})
    tensors = load_file(str(source / "model.safetensors"))
    h = config["hidden_size"]
    norms = {f"fc_norm.{i}.weight": torch.full((h,), 1.0 + i) for i in range(3)}
    save_file({**tensors, **norms}, str(source / "model.safetensors"), metadata={"format": "pt"})
    written = convert(source, tmp_path / "out", target)
    assert {k: written[k] for k in EAGLE_NORMS} == {"norm_before_fc": False, "fc_norm": True, "norm_output": True}
    read = open_model(str(tmp_path / "out"))
    assert read.config.drafter.eagle_norms == {"fc_norm", "norm_output"}
    assert all(torch.equal(read.load(n), w) for n, w in norms.items())


def test_convert_refuses_without_the_target_or_from_a_model_that_is_no_drafter(pair, tmp_path):
    target, drafters = pair
    cases = [
        (drafters["dflash"], None, "--to speculators: pins the drafter's verifier: give the target with --target"),
        (target, target, "is not a drafter the speculators format holds (DFlash, DFlash2, EAGLE-3)"),
    ]
    for source, donor, problem in cases:
        with pytest.raises(BadInput) as refused:
            conv.plan(
                conv.open_source(str(source)),
                conv.parse_target("speculators"),
                [],
                conv.open_source(str(donor)) if donor else None,
            )
        assert problem in str(refused.value) and "\n" not in str(refused.value)
    with pytest.raises(BadInput, match="speculators drafters are written in bf16, f16, f32"):
        conv.parse_target("speculators:fp8")
    assert not (tmp_path / "out").exists()


BAD_CONFIGS = {
    "speculators_model_type 'medusa' is not one specpair reads (dflash, dflash2, eagle3)": {
        "speculators_model_type": "medusa"
    },
    "speculators_model_type 'dspark' is not one specpair reads (dflash, dflash2, eagle3): a DSpark drafter, which "
    'vLLM serves with method "dspark" in --speculative-config': {"speculators_model_type": "dspark"},
    "'speculators_config.proposal_methods' is [], not a list of objects": {
        "speculators_config": {"proposal_methods": []}
    },
    "'speculators_config.verifier.name_or_path' is missing: the drafter pins no verifier": {
        "speculators_config": {"proposal_methods": [greedy(3)], "verifier": {"architectures": []}}
    },
    "'speculators_config.verifier.architectures' is 'Qwen3ForCausalLM', not a list of strings": {
        "speculators_config": {
            "proposal_methods": [greedy(3)],
            "verifier": {"name_or_path": "t", "architectures": "Qwen3ForCausalLM"},
        }
    },
    "'transformer_layer_config' is missing, not an object": {"transformer_layer_config": None},
    "'speculators_config.proposal_methods[0].speculative_tokens' is missing, not a count": {
        "speculators_config": {"proposal_methods": [{"proposal_type": "greedy"}], "verifier": {"name_or_path": "t"}}
    },
    "'aux_hidden_state_layer_ids' is [1.5], not a list of integers": {"aux_hidden_state_layer_ids": [1.5]},
}


@pytest.mark.parametrize("problem", sorted(BAD_CONFIGS))
def test_a_speculators_config_vllm_refuses_is_refused_in_one_line(pair, problem):
    target, drafters = pair
    good = dflash_reference(config_of(drafters["dflash"]), config_of(target), "t")
    bad = {**good, **BAD_CONFIGS[problem]}
    with pytest.raises(BadInput) as refused:
        speculators.read(bad, "draft/config.json")
    assert str(refused.value) == f"draft/config.json: {problem}"


def test_a_dflash_without_block_size_drafts_the_proposals_tokens(pair):
    """vLLM drafts `speculative_tokens` a round (base.py extract_vllm_speculative_config): the block is one more."""
    target, drafters = pair
    config = dflash_reference(config_of(drafters["dflash"]), config_of(target), "t")
    del config["block_size"]
    config["speculators_config"]["proposal_methods"] = [greedy(5)]
    built, verifier, kind = speculators.read(config, "draft/config.json")
    assert (built["dflash_config"]["block_size"], verifier.name_or_path, kind.name) == (6, "t", "dflash")


def test_a_dspark_block_in_the_format_reaches_the_sample_from_anchor_rule(pair, tmp_path):
    """speculators' sample_from_anchor (true for DSpark: the anchor row drafts too) reaches drafter.sample_from_anchor,
    which the rule of that name reports on every stack."""
    target, drafters = pair
    reference = reference_dflash_checkpoint(drafters["dflash"], target, tmp_path / "ref", str(target))
    config = config_of(reference)
    write_json(reference / "config.json", {**config, "sample_from_anchor": True})
    assert open_checkpoint(str(reference)).drafter.sample_from_anchor is True
    verdicts, _ = judged(GatePair(str(target), str(reference)), None, None, 64)
    assert any(f.rule == "drafter.sample_from_anchor" for f in verdicts["vllm"].reasons)


def test_a_reduced_vocabulary_dflash_is_refused_where_it_opens(pair, tmp_path):
    """Its head is then trained over the draft vocabulary, not the verifier's copy specpair's DFlash replaces."""
    target, drafters = pair
    reference = reference_dflash_checkpoint(drafters["dflash"], target, tmp_path / "ref", "t")
    tensors = load_file(str(reference / "model.safetensors"))
    tensors["d2t"] = torch.zeros(8, dtype=torch.int64)
    save_file(tensors, str(reference / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(BadInput, match="is a reduced-vocabulary DFlash \\(d2t\\): specpair's DFlash drafts over"):
        open_model(str(reference))


def test_a_dflash_head_of_its_own_is_refused_by_check_and_by_the_loader_alike(pair, tmp_path):
    """A head of fewer rows than the verifier's vocabulary is the drafter's own, not the verifier's copy: the loader
    refuses it where it dropped it for the target's head unseen (vllm-ascend#11374's failure), and `check` says so
    first on specpair and on SGLang (which skips it), not on vLLM, which drafts through it; the verifier's own copy
    still opens and passes."""
    target, drafters = pair
    reference = reference_dflash_checkpoint(drafters["dflash"], target, tmp_path / "ref", str(target))
    tensors = load_file(str(reference / "model.safetensors"))
    rows, hidden = tensors["lm_head.weight"].shape
    verdicts, _ = judged(GatePair(str(target), str(reference)), None, None, 64)
    assert all(not any(f.rule == "vocab.draft_head" for f in v.reasons) for v in verdicts.values())
    assert "lm_head.weight" not in open_model(str(reference)).names  # the verifier's copy: the target's is used
    tensors["lm_head.weight"] = torch.randn(rows // 2, hidden)
    save_file(tensors, str(reference / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(BadInput, match=f"ships lm_head.weight of {rows // 2} rows, not its vocabulary's {rows}"):
        open_model(str(reference))
    with pytest.raises(BadInput, match="vocab.draft_head"):
        judged(GatePair(str(target), str(reference)), None, None, 64)
    _, verdicts = judge(open_checkpoint(str(target)), open_checkpoint(str(reference)), Deployment(), list(STACK_NAMES))
    assert {s for s, v in verdicts.items() if any(f.rule == "vocab.draft_head" for f in v.reasons)} == {
        "specpair",
        "sglang",
    }


def test_run_refuses_a_drafter_pinned_to_another_verifier(pair, tmp_path):
    """`specpair run` judges the pair first: the pin's mismatch is its one-line refusal, naming the verifier."""
    target, drafters = pair
    reference = reference_dflash_checkpoint(drafters["dflash"], target, tmp_path / "ref", "Qwen/Qwen3-8B")
    with pytest.raises(BadInput) as refused:
        judged(GatePair(str(target), str(reference)), None, None, 64)
    message = str(refused.value)
    assert "speculators.verifier" in message and "pins its verifier Qwen/Qwen3-8B (Qwen3ForCausalLM)" in message


def test_the_commands_as_a_user_types_them(pair, tmp_path):
    """`specpair convert DRAFT OUT --to speculators --target T`, then `specpair check T OUT`: vLLM's launch serves
    the drafter; against another target the check fails (exit 1) naming the pinned verifier."""
    target, drafters = pair
    out = tmp_path / "dflash-speculators"

    def specpair(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "specpair", *args], capture_output=True, text=True, timeout=300)

    done = specpair(
        "convert", str(drafters["dflash"]), str(out), "--to", "speculators", "--target", str(target), "--quiet"
    )
    assert done.returncode == 0, done.stderr
    done = specpair("check", str(target), str(out), "--offline", "--json")
    report = json.loads(done.stdout)
    assert done.returncode == 0 and report["draft"]["drafter"]["verifier"] == str(target), done.stdout
    assert report["verdicts"]["vllm"]["launch"].startswith(f"vllm serve {out} --max-model-len ")
    other = tiny_target(tmp_path / "other", "llama")
    done = specpair("check", str(other), str(out), "--offline", "--json")
    verifier = json.loads(done.stdout)["verdicts"]["specpair"]
    assert done.returncode == 1 and verifier["status"] == "fail"
    (finding,) = [r for r in verifier["reasons"] if r["rule"] == "speculators.verifier"]
    assert (
        f"pins its verifier {target} (Qwen3ForCausalLM), but the target's architecture is LlamaForCausalLM"
        in finding["message"]
    )
