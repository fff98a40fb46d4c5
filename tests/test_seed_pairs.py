"""benchmarks/seed_pairs_gpu.py at tiny scale on the CPU: each seed pair's builders write every tensor name, layout
and per-tensor type of the real checkpoints, shrunk, and the pair goes through `specpair run`'s gate (one prompt,
greedy, solo), which must find drafted == undrafted. The GPU run is the same code at real shape."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

import seed_pairs_gpu  # noqa: E402

from specpair.checkpoint.gguf_tokenizer import gguf_tokenizer_fields  # noqa: E402
from specpair.formats.gguf import read_local  # noqa: E402
from specpair.sources.model import Model, open_model  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def run_tiny(pair: str, tmp_path: Path, *options: str) -> dict:
    """The script as the CPU runs it: its exit code must say every gate passed, and its figures are returned."""
    args = ["--pair", pair, "--scale", "tiny", "--device", "cpu", "--quick", "--gate-batch", "1", "--gate-tokens", "16"]
    code = seed_pairs_gpu.main([*args, "--work", str(tmp_path / "work"), "--out", str(tmp_path), "--keep", *options])
    figures = json.loads((tmp_path / f"seed_pairs_{pair}.json").read_text())
    assert code == 0, figures["stages"]
    assert (tmp_path / f"seed_pairs_{pair}.md").read_text().startswith(f"# Seed pair `{pair}` (tiny scale, cpu)")
    return figures


def gates(figures: dict) -> dict[str, dict]:
    found = {k.removeprefix("gate_"): v["document"] for k, v in figures.items() if k.startswith("gate_")}
    for label, document in found.items():
        assert document["identical"] is True, label
        assert [r["compared_tokens"] for r in document["runs"]] == [16], label
    return found


def test_35b_nvfp4_pair_with_dflash2_and_mtp(tmp_path: Path) -> None:
    figures = run_tiny("35b-nvfp4", tmp_path)
    assert set(gates(figures)) == {"dflash2-affine4", "mtp"}
    assert figures["load"]["layouts"] == ["bf16", "fp8-tensor", "nvfp4-modelopt"]
    draft = open_model(str(tmp_path / "work" / "35b-nvfp4" / "incoai-dflash2"))
    assert draft.hf_config["architectures"] == ["DFlash2DraftModel"]
    # the first row past the tokenizer, as 248077 is Qwen's
    assert draft.hf_config["dflash_config"]["mask_token_id"] == seed_pairs_gpu.tokenizer_ids(512) == 511
    assert "candidate_selector.successor_codebook" in draft.weights


def test_gguf_pair_has_the_four_kquant_types_and_the_dflash_arch(tmp_path: Path) -> None:
    """Split over two calls as on the GPU: one writes the pair and stops, the next runs what the first kept."""
    built = run_tiny("gguf", tmp_path, "--only", "build")
    assert not any(k.startswith("gate_") for k in built) and "load" not in built
    assert [s["stage"] for s in built["stages"]][-1].startswith("target converted to GGUF")
    figures = run_tiny("gguf", tmp_path, "--reuse")
    assert figures["stages"][0]["stage"].startswith("reused the pair an earlier call built")
    assert set(gates(figures)) == {"dflash-q8_0"}
    work = tmp_path / "work" / "gguf"
    target = read_local(str(work / "Qwen3.6-35B-A3B-UD-Q4_K_M.gguf"))
    types = {t.name: t.dtype for t in target.tensors}
    assert target.fields["general.architecture"] == "qwen35moe"
    assert (types["output.weight"], types["token_embd.weight"]) == ("Q6_K", "Q4_K")
    # layers 0 and 7 are in the first and last eighth (llama.cpp's "more bits"), layer 1 is not; 3 is full attention
    assert (types["blk.0.ffn_down_exps.weight"], types["blk.1.ffn_down_exps.weight"]) == ("Q6_K", "Q4_K")
    assert (types["blk.3.attn_v.weight"], types["blk.3.attn_q.weight"]) == ("Q6_K", "Q5_K")
    assert (types["blk.0.ssm_alpha.weight"], types["blk.0.ffn_up_shexp.weight"]) == ("Q8_0", "Q8_0")
    assert figures["load"]["layouts"] == ["f32", "gguf-Q4_K", "gguf-Q5_K", "gguf-Q6_K", "gguf-Q8_0"]
    # the tokenizer covers the rows in Qwen's ratio (248077 of 248320): the converter padded one row, not half
    tokens = target.fields["tokenizer.ggml.tokens"]
    assert len(tokens) == 512 and sum(t.startswith("[PAD") for t in tokens) == 1
    draft = read_local(str(work / "Qwen3.6-35B-A3B-DFlash-Q8_0.gguf"))
    assert draft.fields["general.architecture"] == "dflash"
    assert {t.dtype for t in draft.tensors} == {"Q8_0", "F32"}


def test_the_real_scale_tokenizer_converts_to_gguf(tmp_path: Path) -> None:
    """The tokenizer the real-scale pairs write, through the GGUF converter's tokenizer path at 248320 rows (a
    tokenizer of the bytes alone is refused there: 'vocab_size 248320 does not fit the tokenizer's 260 ids')."""
    rows = seed_pairs_gpu.QWEN_VOCAB_ROWS
    seed_pairs_gpu.write_byte_tokenizer(tmp_path, rows, seed_pairs_gpu.MERGES, seed_pairs_gpu.tokenizer_ids(rows))
    configs = [json.loads((tmp_path / f"{n}_config.json").read_text()) for n in ("tokenizer", "generation")]
    raw = (tmp_path / "tokenizer.json").read_bytes()
    fields = dict((k, v) for k, v, _ in gguf_tokenizer_fields(raw, *configs, None, rows, "tokenizer.json").fields)
    tokens = fields["tokenizer.ggml.tokens"]
    assert len(tokens) == rows and tokens.index("[PAD248077]") == 248077 == seed_pairs_gpu.QWEN_TOKENIZER_IDS
    assert fields["tokenizer.ggml.eos_token_id"] == 258  # <|im_end|>, the last of the special tokens after the bytes


def test_exl3_pair_draws_codes_of_the_published_bits(tmp_path: Path) -> None:
    figures = run_tiny("exl3", tmp_path)
    assert set(gates(figures)) == {"dflash-exl3"}
    assert figures["load"]["layouts"] == ["bf16", "exl3-4bpw", "exl3-6bpw"]
    work = tmp_path / "work" / "exl3"
    target = open_model(str(work / "qwen3.6-35b-a3b-exl3-4.00bpw"))
    assert target.layout("lm_head.weight") == "exl3-6bpw"
    w = target.load("layers.0.mlp.experts.down_proj.weight")  # the stack, each expert drawn apart
    assert abs(float(w.pow(2).mean().sqrt()) - seed_pairs_gpu.EXL3_SCALE) < 0.002  # codes at the intended scale
    draft = open_model(str(work / "qwen3.6-dflash-exl3-2.50bpw"))
    assert (draft.layout("layers.0.self_attn.q_proj.weight"), draft.layout("layers.0.mlp.up_proj.weight")) == (
        "exl3-3bpw",
        "exl3-2bpw",
    )
    assert draft.layout("fc.weight") == "exl3-3bpw"


def test_tiny_scale_keeps_the_published_taps_apart_and_the_layers_cut() -> None:
    config = json.loads((seed_pairs_gpu.CONFIGS / "nvidia__Qwen3.6-35B-A3B-NVFP4.json").read_text())
    tiny = seed_pairs_gpu.Scale("tiny", "cpu")
    text = tiny.text(config)
    target_layers = text["text_config"]["num_hidden_layers"] + 1
    draft_config, _ = seed_pairs_gpu.drafter_tensors(tiny, seed_pairs_gpu.ZLAB_35B, text, target_layers)
    taps = draft_config["dflash_config"]["target_layer_ids"]
    assert len(set(taps)) == len(seed_pairs_gpu.ZLAB_35B.taps) and max(taps) < 8
    quant = json.loads((seed_pairs_gpu.CONFIGS / "nvidia__Qwen3.6-35B-A3B-NVFP4.hf_quant_config.json").read_text())
    layers = tiny.quant(quant)["quantization"]["quantized_layers"]
    assert layers and all(".layers.8." not in k and ".layers.39." not in k for k in layers)
    assert any(".layers.7." in k for k in layers)


def test_122b_fp8_pair_keeps_qwens_bf16_modules_and_coral_bricks_shape(tmp_path: Path) -> None:
    """Its target generated in memory, as on the GPU machine whose disk cannot hold it: the gate runs on it through
    the app functions, the drafter written."""
    figures = run_tiny("122b-fp8", tmp_path, "--in-memory")
    assert set(gates(figures)) == {"dflash2"}
    assert figures["load"]["layouts"] == ["bf16", "fp8-block"]
    assert figures["stages"][0]["stage"].startswith("target generated in memory")
    assert figures["gate_dflash2"]["document"]["target"]["ref"] == "generated:qwen3.5-122b-a10b-fp8"
    work = tmp_path / "work" / "122b-fp8"
    assert sorted(p.name for p in work.iterdir()) == ["coral-bricks-dflash2"]  # nothing of the target on disk
    built = seed_pairs_gpu.build_122b(work, seed_pairs_gpu.Scale("tiny", "cpu", in_memory=True), lambda _: None)
    target = built.target
    assert isinstance(target, Model)
    quantization = target.hf_config["quantization_config"]
    assert (quantization["quant_method"], quantization["weight_block_size"]) == ("fp8", [128, 128])
    assert target.layout("layers.0.mlp.experts.down_proj.weight") == "fp8-block"  # experts stored one by one
    assert {target.layout(n) for n in ("layers.0.linear_attn.in_proj_a.weight", "lm_head.weight")} == {"bf16"}
    dflash = open_model(str(work / "coral-bricks-dflash2")).hf_config
    assert dflash["dflash_config"]["block_size"] == 12 and set(dflash["layer_types"]) == {"sliding_attention"}
    assert dflash["sliding_window"] == seed_pairs_gpu.TINY_DRAFT["window"]


def test_122b_fp8_target_written_where_the_disk_holds_it(tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    built = seed_pairs_gpu.build_122b(work, seed_pairs_gpu.Scale("tiny", "cpu"), lambda _: None)
    assert built.target == work / "qwen3.5-122b-a10b-fp8" and (built.target / "tokenizer.json").is_file()
    assert open_model(str(built.target)).layout("lm_head.weight") == "bf16"


def test_122b_fp8_bench_runs_on_the_in_memory_target(tmp_path: Path) -> None:
    """bench through the app function on the generated target (--only bench: a pair split over two device calls)."""
    args = ["--pair", "122b-fp8", "--scale", "tiny", "--device", "cpu", "--in-memory", "--only", "bench", "--skip-load"]
    args += ["--users", "1", "--depth", "0", "--tokens", "16", "--work", str(tmp_path / "work"), "--out", str(tmp_path)]
    assert seed_pairs_gpu.main(args) == 0
    figures = json.loads((tmp_path / "seed_pairs_122b-fp8.json").read_text())
    assert not any(k.startswith("gate_") for k in figures)
    bench = figures["bench_dflash2"]
    assert bench["exit_code"] == 0 and bench["document"]["target"]["ref"] == "generated:qwen3.5-122b-a10b-fp8"
    assert bench["command"].startswith("specpair bench generated:qwen3.5-122b-a10b-fp8 ")
    assert [r["drafted"]["identical"] for r in bench["document"]["users"]] == [True]
    assert " --at-tau 3.5 " in bench["command"] and bench["document"]["users"][0]["drafted"]["at_tau"]["tau"] == 3.5
    assert (tmp_path / "seed_pairs_122b-fp8_dflash2_depth.png").is_file()
    assert "- load: skipped (--skip-load)" in (tmp_path / "seed_pairs_122b-fp8.md").read_text()


def test_122b_fp8_gate_and_bench_share_one_load(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A generated target is loaded once for its load stage, its gate and its bench (each load draws every tensor
    again); a load asked for another placement is refused, not handed over."""
    from specpair.app.models import load_target
    from specpair.runtime import loading
    from specpair.runtime.loading import plan_load

    loads: list[str] = []
    load = loading.load

    def counted(plan, *args, **kwargs):
        loads.append(plan.model.ref)
        return load(plan, *args, **kwargs)

    monkeypatch.setattr(loading, "load", counted)
    args = ["--pair", "122b-fp8", "--scale", "tiny", "--device", "cpu", "--in-memory", "--gate-batch"]
    args += ["1", "--gate-tokens", "16", "--users", "1", "--depth", "0", "--tokens", "16"]
    assert seed_pairs_gpu.main([*args, "--work", str(tmp_path / "work"), "--out", str(tmp_path)]) == 0
    figures = json.loads((tmp_path / "seed_pairs_122b-fp8.json").read_text())
    assert figures["load"]["layouts"] == ["bf16", "fp8-block"] and figures["load"]["load_s"] > 0
    assert figures["gate_dflash2"]["document"]["identical"] is True
    assert [r["drafted"]["identical"] for r in figures["bench_dflash2"]["document"]["users"]] == [True]
    assert loads == ["generated:qwen3.5-122b-a10b-fp8"]

    built = seed_pairs_gpu.build_122b(tmp_path / "work", seed_pairs_gpu.Scale("tiny", "cpu", True), lambda _: None)
    loaded = seed_pairs_gpu.shared_load(built.target, "cpu")()
    assert load_target(plan_load(built.target, "cpu", loaded.plan.dtype), loaded=loaded) is loaded
    other = torch.float32 if loaded.plan.dtype == torch.bfloat16 else torch.bfloat16
    with pytest.raises(ValueError, match=f"was loaded on cpu as {loaded.plan.dtype}: not what this run asks"):
        load_target(plan_load(built.target, "cpu", other), loaded=loaded)


def test_reuse_needs_the_record_and_every_file_it_names(tmp_path: Path) -> None:
    work = tmp_path / "gguf"
    (work / "draft").mkdir(parents=True)
    (work / "target.gguf").write_bytes(b"GGUF")
    pair = seed_pairs_gpu.Built(work / "target.gguf", [seed_pairs_gpu.Drafted("d", work / "draft", ("--x",))], {"n": 1})
    assert seed_pairs_gpu.reused(work) is None  # nothing recorded
    (work / seed_pairs_gpu.BUILT).write_text(json.dumps(seed_pairs_gpu.built_record(pair, work)))
    assert seed_pairs_gpu.reused(work) == pair
    (work / "draft").rmdir()
    assert seed_pairs_gpu.reused(work) is None  # a file it names is gone: built again
