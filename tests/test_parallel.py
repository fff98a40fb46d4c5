"""Tensor parallelism (runtime/parallel.py) on gloo: 2 and 4 CPU processes, tiny models of every family.

The logits of a prefill, a verify step committed to a different prefix per sequence and decode steps equal the
single-process run's within 1e-5 (float32: only the summation order of the row-parallel sums differs); at TP 2
every drafter kind's drafted tokens equal the undrafted ones of the same ranks, greedy and seeded; the shard rules
cut what the model asks for; a rank that fails ends the others with a one-line error.

Packed: every quantized layout the kernels read, on a hybrid MoE target (Gated DeltaNet sections, gated attention,
stacked experts, a shared expert), keeps its weights packed on every rank, each cut along whole blocks, and gives
the single-process logits of the same packed checkpoint within 1e-5 at TP 2 and 4 (the CPU kernels dequantize:
the same values, summed in another order; measured 2e-7 to 1.2e-6 on logits up to 1.4); drafted == undrafted at TP 2
on a packed target; a rank reads its share of the weight bytes, no more; a split that would cut a block reads that
weight whole, decodes it and keeps its slice."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from drafting import FAMILIES, tiny_target
from fixtures import save, smollm2_gguf, tiny_model
from safetensors.torch import load_file
from test_runtime_layouts import convert
from test_speculative import SOLO, Workshop
from tp_worker import step_logits

from specpair.checkpoint.config import ModelConfig
from specpair.runtime.loading import LoadPlan, load, plan_load
from specpair.runtime.parallel import Parallel, launch
from specpair.sources.model import Model, open_model

WORKER = Path(__file__).with_name("tp_worker.py")


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def run_ranks(tmp_path: Path, job: dict, size: int) -> dict[str, torch.Tensor]:
    (tmp_path / "job.json").write_text(json.dumps(job))
    out = tmp_path / f"out{size}.safetensors"
    code, _, failure = launch([sys.executable, str(WORKER), str(tmp_path / "job.json"), str(out)], size)
    assert code == 0, failure
    return load_file(str(out))


@pytest.fixture(scope="module")
def splittable(tmp_path_factory) -> dict[str, Path]:
    """A target per family whose heads, KV heads and Gated DeltaNet heads all split over 4 ranks."""
    root = tmp_path_factory.mktemp("parallel")
    return {f: tiny_target(root / f, f, mtp=False, kv_heads=4, linear_key_heads=4) for f in FAMILIES}


@pytest.mark.parametrize("size", [2, 4])
def test_logits_equal_the_single_process_run(tmp_path, splittable, size):
    got = run_ranks(tmp_path, {"logits": {f: str(p) for f, p in splittable.items()}}, size)
    for family, path in splittable.items():
        want = step_logits(load(plan_load(open_model(str(path)), "cpu")))
        assert got[family].shape == want.shape
        diff = (got[family] - want).abs().max().item()
        assert diff <= 1e-5, f"{family} at TP {size}: max |diff| {diff:.2e}"
        assert not torch.equal(got[family], torch.zeros_like(want))


@pytest.fixture(scope="module")
def workshop(tmp_path_factory) -> Workshop:
    return Workshop(tmp_path_factory.mktemp("parallel_drafters"))


def test_drafted_equals_undrafted_for_every_kind_at_tp2(tmp_path, workshop):
    jobs = []
    for kind, family in SOLO.items():  # every kind, on five of the six families
        checkpoint = workshop.drafter(family, kind)
        jobs.append([f"{family}-{kind}", str(workshop.setup(family).path), str(checkpoint) if checkpoint else None])
    got = run_ranks(tmp_path, {"speculative": jobs}, 2)
    kept_drafts = 0
    for name, *_ in jobs:
        for label in ("greedy", "seeded"):
            for i in range(3):
                undrafted, drafted = got[f"{name}/{label}/{i}/undrafted"], got[f"{name}/{label}/{i}/drafted"]
                assert torch.equal(drafted, undrafted), f"{name} {label} sequence {i}"
                kept_drafts += int((got[f"{name}/{label}/{i}/committed"] > 1).sum())
    assert kept_drafts > 0  # the accept paths ran


def config_of(path: Path) -> ModelConfig:
    return open_model(str(path)).config


def test_shards_cut_what_each_rank_asks_for(splittable):
    config = config_of(splittable["qwen3_5_moe"])
    keys = config.linear_num_key_heads * config.linear_key_head_dim
    channels = 2 * keys + config.linear_num_value_heads * config.linear_value_head_dim
    qkv = torch.arange(channels * 3, dtype=torch.float32).reshape(channels, 3)
    name = "layers.0.linear_attn.in_proj_qkv.weight"
    halves = [Parallel(r, 2).region(name, (channels, 3), [(channels // 2, 3)] * 2, config).narrow(qkv) for r in (0, 1)]
    # each rank holds its half of the q, of the k and of the v channels, in that order
    q, k, v = qkv.split([keys, keys, channels - 2 * keys])
    assert torch.equal(halves[0], torch.cat([q[: keys // 2], k[: keys // 2], v[: v.shape[0] // 2]]))
    assert torch.equal(halves[1], torch.cat([q[keys // 2 :], k[keys // 2 :], v[v.shape[0] // 2 :]]))
    down = torch.randn(8, 12)
    regions = [Parallel(r, 4).region("layers.0.mlp.down_proj.weight", (8, 12), [(8, 3)] * 4, config) for r in range(4)]
    assert torch.equal(torch.cat([r.narrow(down) for r in regions], dim=1), down)
    uneven = [(8, 7), (8, 5)]  # rows of whole heads where they do not split evenly (SmolLM2: 3 KV heads at TP 2)
    regions = [Parallel(r, 2).region("layers.0.self_attn.o_proj.weight", (8, 12), uneven, config) for r in (0, 1)]
    assert [r.runs for r in regions] == [((0, 7),), ((7, 12),)]
    bias = torch.randn(8)
    assert Parallel(1, 2).region("layers.0.self_attn.o_proj.bias", (8,), [(8,)] * 2, config) is None
    assert torch.equal(Parallel(0, 2).held("layers.0.self_attn.o_proj.bias", bias), bias)
    assert not Parallel(1, 2).held("layers.0.self_attn.o_proj.bias", bias).any()
    norm = torch.randn(8)
    assert torch.equal(Parallel(1, 2).held("layers.0.input_layernorm.weight", norm), norm)
    with pytest.raises(ValueError, match="do not add up"):
        Parallel(0, 2).region("layers.0.mlp.up_proj.weight", (6, 4), [(2, 4), (2, 4)], config)


def test_heads_split_by_kv_groups_as_evenly_as_they_go(splittable):
    config = dataclasses.replace(config_of(splittable["qwen3"]), num_heads=9, num_kv_heads=3, intermediate_size=1536)
    ranks = [Parallel(r, 2).config(config, "tiny") for r in (0, 1)]
    assert [(c.num_kv_heads, c.num_heads, c.intermediate_size) for c in ranks] == [(2, 6, 768), (1, 3, 768)]
    with pytest.raises(Exception, match="num_kv_heads 3 leaves a rank of tensor parallelism 4 without one"):
        Parallel(0, 4).config(config, "tiny")
    with pytest.raises(Exception, match="vocab_size 512 does not split over tensor parallelism 3"):
        Parallel(0, 3).config(config, "tiny")


def test_a_failing_rank_ends_the_others_with_one_line(tmp_path):
    script = tmp_path / "rank.py"
    script.write_text(
        "import os, sys, time\n"
        "if os.environ['RANK'] == '1':\n"
        "    print('the shard is missing', file=sys.stderr)\n"
        "    sys.exit(3)\n"
        "time.sleep(60)\n"
    )
    start = time.monotonic()
    code, rank, failure = launch([sys.executable, str(script)], 3)
    assert (code, rank, failure) == (3, 1, "rank 1 of 3 exited with 3: the shard is missing")
    assert time.monotonic() - start < 30  # the others were ended, not waited for
    assert launch([sys.executable, "-c", "import os; assert os.environ['WORLD_SIZE'] == '2'"], 2) == (0, None, None)


def specpair_run(*args: str) -> subprocess.CompletedProcess:
    env = {"OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"}
    if "PYTHONPATH" in os.environ:  # the tree under test, where it is not the installed one
        env["PYTHONPATH"] = os.environ["PYTHONPATH"]
    return subprocess.run(
        [sys.executable, "-m", "specpair", "run", *args], capture_output=True, text=True, timeout=600, env=env
    )


def test_run_tp2_on_smollm2_writes_the_single_process_text():
    """SmolLM2's 9 heads in 3 KV groups split 6 + 3 over two ranks; in float32 the greedy text is the one-process
    text. (In bf16 each rank's partial product is rounded to bf16 before the sum, as on GPUs: the text may part.)"""
    model = str(smollm2_gguf())
    args = [model, "--prompt", "The capital of France is", "--max-tokens", "12", "--device", "cpu", "--json"]
    args += ["--dtype", "float32"]
    one, two = specpair_run(*args), specpair_run(*args, "--tp", "2")
    assert one.returncode == 0 and two.returncode == 0, one.stderr + two.stderr
    one_doc, two_doc = json.loads(one.stdout), json.loads(two.stdout)
    assert (one_doc["tensor_parallel"], two_doc["tensor_parallel"]) == (1, 2)
    assert two_doc["tokens"] == one_doc["tokens"] and len(one_doc["tokens"]) == 12


def test_a_split_every_rank_refuses_is_one_error(tmp_path, splittable):
    """At TP 3 the tiny target's vocabulary does not divide: every rank refuses it, and the user reads one error
    (rank 0's), not one per rank."""
    done = specpair_run(str(splittable["llama"]), "--prompt", "Hi", "--max-tokens", "2", "--device", "cpu")
    assert done.returncode == 0, done.stderr
    done = specpair_run(str(splittable["llama"]), "--prompt", "Hi", "--max-tokens", "2", "--device", "cpu", "--tp", "3")
    assert done.returncode == 2 and done.stdout == ""
    errors = [line for line in done.stderr.splitlines() if "error" in line]
    assert len(errors) == 1 and "does not split over tensor parallelism 3" in errors[0], done.stderr


# Layouts whose blocks along K are small (Q8_0's 32 values, NVFP4's 16, affine groups of 32, FP8 per tensor) on a
# tiny hybrid MoE whose splits at TP 4 are whole blocks; those with 128x128 FP8 tiles and 256-value K-quant blocks
# on a wider one (every rank's rows and columns a multiple of 256).
SMALL_BLOCKS = ("gguf:Q8_0", "nvfp4", "nvfp4:mlx", "affine:4:32", "affine:8:32", "fp8:tensor")
LARGE_BLOCKS = ("fp8", "gguf:Q4_K:rtn", "gguf:Q5_K:rtn", "gguf:Q6_K:rtn")
SPLITS = {"kv_heads": 4, "linear_key_heads": 4}
TINY = {**SPLITS, "linear_value_head_dim": 32, "moe_intermediate_size": 128, "shared_expert_intermediate_size": 128}
WIDE = {
    **SPLITS,
    "hidden": 256,
    "head_dim": 256,
    "linear_key_head_dim": 128,
    "linear_value_head_dim": 256,
    "moe_intermediate_size": 1024,
    "shared_expert_intermediate_size": 1024,
    "num_experts": 4,
    "num_hidden_layers": 2,
    "full_attention_interval": 2,
}


@pytest.fixture(scope="module")
def packed(tmp_path_factory) -> dict[str, Path]:
    """The float sources ("tiny", "wide") and their packed conversions (by --to)."""
    root = tmp_path_factory.mktemp("packed")
    out = {}
    for source, dims, layouts in (("tiny", TINY, SMALL_BLOCKS), ("wide", WIDE, LARGE_BLOCKS)):
        out[source] = save(tiny_model("qwen3_5_moe", init=0.02, **dims), root / source, "qwen3")
        for to in layouts:
            name = to.replace(":", "-") + (".gguf" if to.startswith("gguf") else "")
            out[to] = convert(out[source], root / name, to)
    return out


@pytest.fixture(scope="module")
def packed_logits(packed) -> dict[str, tuple[torch.Tensor, int]]:
    """Each packed checkpoint's single-process logits, and how many weights it keeps packed."""
    out = {}
    for to in (*SMALL_BLOCKS, *LARGE_BLOCKS):
        plan = plan_load(open_model(str(packed[to])), "cpu", packed=True)
        out[to] = step_logits(load(plan)), len(plan.packed)
    return out


DRAFTED = [["gguf:Q8_0", "tiny"]]  # the float model drafts for its own Q8_0 form, whose ranks hold planes


@pytest.fixture(scope="module")
def packed_ranks(packed, tmp_path_factory):
    """What the ranks of each size got: every packed checkpoint's logits; at TP 2 also DRAFTED's tokens."""
    runs: dict[int, dict[str, torch.Tensor]] = {}

    def run(size: int) -> dict[str, torch.Tensor]:
        if size not in runs:
            job = {"logits": {to: str(packed[to]) for to in (*SMALL_BLOCKS, *LARGE_BLOCKS)}, "packed": True}
            if size == 2:
                job["speculative"] = [[to, str(packed[to]), str(packed[draft])] for to, draft in DRAFTED]
            runs[size] = run_ranks(tmp_path_factory.mktemp(f"tp{size}"), job, size)
        return runs[size]

    return run


@pytest.mark.parametrize("size", [2, 4])
def test_packed_logits_equal_the_single_process_run(packed_ranks, packed_logits, size):
    got = packed_ranks(size)
    for to, (want, kept) in packed_logits.items():
        assert kept and got[f"{to}/packed"].tolist() == [kept] * size, to  # every rank keeps them packed
        diff = (got[to] - want).abs().max().item()
        assert diff <= 1e-5, f"{to} at TP {size}: max |diff| {diff:.2e}"
        assert want.abs().max() > 0.1


def test_drafted_equals_undrafted_on_a_packed_target_at_tp2(packed_ranks):
    """draft_model: a replicated drafter that mostly agrees with its target's quantized form."""
    got = packed_ranks(2)
    kept_drafts = 0
    for name, _ in DRAFTED:
        for label in ("greedy", "seeded"):
            for i in range(3):
                undrafted, drafted = got[f"{name}/{label}/{i}/undrafted"], got[f"{name}/{label}/{i}/drafted"]
                assert torch.equal(drafted, undrafted), f"{name} {label} sequence {i}"
                kept_drafts += int((got[f"{name}/{label}/{i}/committed"] > 1).sum())
    assert kept_drafts > 0


def shares(model: Model, plan: LoadPlan) -> tuple[int, int]:
    """From headers: (bytes of the stored weights every rank reads whole, bytes of those split over the ranks)."""
    split = {s for n in plan.regions for s in model.maps[n].sources}
    whole = {s for n in plan.needs if n not in plan.regions for s in model.maps[n].sources}
    nbytes = {s: model.read_nbytes(s) for s in model.weights}
    return sum(nbytes[s] for s in whole), sum(nbytes[s] for s in split - whole)


# Rows of a row-parallel weight 8192 in features wide, so that a rank's columns at TP 2 and 4 lie a page apart in bf16,
# FP8 and Q8_0 (narrower rows are read whole: regions.PAGE); heads of 256, FP8 tiles of 128 and K-quant blocks cut
# whole at both sizes.
MEDIUM = {"hidden": 256, "kv_heads": 8, "num_attention_heads": 32, "head_dim": 256, "intermediate_size": 8192}


@pytest.fixture(scope="module")
def medium(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("medium")
    out = {"bf16": save(tiny_model("qwen3", init=0.02, num_hidden_layers=1, **MEDIUM), root / "bf16", "qwen3")}
    for to in ("fp8", "gguf:Q8_0"):
        out[to] = convert(out["bf16"], root / (to.replace(":", "-") + (".gguf" if to.startswith("gguf") else "")), to)
    return out


@pytest.mark.parametrize("checkpoint", ["bf16", "fp8", "gguf:Q8_0"])
def test_a_rank_reads_its_share_of_the_bytes(medium, checkpoint, monkeypatch):
    """Every byte read of a tensor passes through os.preadv (formats/safetensors.py): counted there, a rank of N reads
    the replicated weights and 1/N of the split ones (within 1%: per-tensor scales, FP8's scale rows), no more, and
    the plan says so beforehand; the weights it gets are the whole model's regions."""
    model = open_model(str(medium[checkpoint]))
    whole = dict(model.stream())
    preadv = os.preadv
    counted: list[int] = []

    def counting(fd: int, buffers, offset: int) -> int:
        counted.append(preadv(fd, buffers, offset))
        return counted[-1]

    monkeypatch.setattr(os, "preadv", counting)
    for size in (2, 4):
        for rank in range(size):
            plan = plan_load(model, "cpu", parallel=Parallel(rank, size))
            counted.clear()
            for name, value in model.stream(plan.needs, regions=plan.regions.get):
                want = whole[name] if name not in plan.regions else plan.regions[name].narrow(whole[name])
                assert torch.equal(value, want), name
            replicated, split = shares(model, plan)
            assert sum(counted) == plan.stored_bytes and not plan.read_whole
            assert replicated + split / size <= sum(counted) <= 1.01 * (replicated + split / size), (size, rank)
            assert split > 4 * replicated  # the split weights are most of the bytes: the bound says something


def test_a_split_through_a_block_reads_that_weight_whole(splittable, tmp_path):
    """NVFP4 groups of 16 along K: the experts' down_proj (K = 32) is cut in whole groups over 2 ranks; over 4, a
    rank's 8 columns end inside a group, so every rank reads that weight whole, decodes it and keeps its columns
    (exact: the fallback costs bytes, not values), and the plan names it."""
    model = open_model(str(convert(splittable["qwen3_5_moe"], tmp_path / "nvfp4", "nvfp4")))
    name = "layers.0.mlp.experts.down_proj.weight"
    whole = dict(model.stream([name]))[name]
    for size, rank in ((2, 1), (4, 3)):
        plan = plan_load(model, "cpu", packed=True, parallel=Parallel(rank, size))
        assert (name in plan.read_whole) == (size == 4) and (name in plan.packed) == (size == 2)
        (_, got), *_ = model.stream([name], packed=plan.packed.__contains__, regions=plan.regions.get)
        if size == 4:  # the rank keeps its slice, not a view of the whole weight's memory
            assert got.untyped_storage().nbytes() == got.numel() * got.element_size()
        got = got.dequantize() if size == 2 else got
        assert torch.equal(got, plan.regions[name].narrow(whole))
