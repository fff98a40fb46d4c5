"""Tensor parallelism (runtime/parallel.py) on gloo: 2 and 4 CPU processes, tiny models of every family.

The logits of a prefill, a verify step committed to a different prefix per sequence and decode steps equal the
single-process run's within 1e-5 (float32: only the summation order of the row-parallel sums differs); at TP 2
every drafter kind's drafted tokens equal the undrafted ones of the same ranks, greedy and seeded; the shard rules
cut what the model asks for; a rank that fails ends the others with a one-line error."""

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
from fixtures import smollm2_gguf
from safetensors.torch import load_file
from test_speculative import SOLO, Workshop
from tp_worker import step_logits

from specpair.checkpoint.config import ModelConfig
from specpair.runtime.loading import load, plan_load
from specpair.runtime.parallel import Parallel, launch
from specpair.sources.model import open_model

WORKER = Path(__file__).with_name("tp_worker.py")


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


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
    shapes = [(channels // 2, 3)] * 2
    halves = [Parallel(r, 2).shard("layers.0.linear_attn.in_proj_qkv.weight", qkv, shapes, config) for r in (0, 1)]
    # each rank holds its half of the q, of the k and of the v channels, in that order
    q, k, v = qkv.split([keys, keys, channels - 2 * keys])
    assert torch.equal(halves[0], torch.cat([q[: keys // 2], k[: keys // 2], v[: v.shape[0] // 2]]))
    assert torch.equal(halves[1], torch.cat([q[keys // 2 :], k[keys // 2 :], v[v.shape[0] // 2 :]]))
    down = torch.randn(8, 12)
    parts = [Parallel(r, 4).shard("layers.0.mlp.down_proj.weight", down, [(8, 3)] * 4, config) for r in range(4)]
    assert torch.equal(torch.cat(parts, dim=1), down)
    uneven = [(8, 7), (8, 5)]  # rows of whole heads where they do not split evenly (SmolLM2: 3 KV heads at TP 2)
    parts = [Parallel(r, 2).shard("layers.0.self_attn.o_proj.weight", down, uneven, config) for r in (0, 1)]
    assert [p.shape[1] for p in parts] == [7, 5] and torch.equal(torch.cat(parts, dim=1), down)
    bias = torch.randn(8)
    assert torch.equal(Parallel(0, 2).shard("layers.0.self_attn.o_proj.bias", bias, [(8,)] * 2, config), bias)
    assert not Parallel(1, 2).shard("layers.0.self_attn.o_proj.bias", bias, [(8,)] * 2, config).any()
    norm = torch.randn(8)
    assert torch.equal(Parallel(1, 2).shard("layers.0.input_layernorm.weight", norm, [(8,)] * 2, config), norm)
    with pytest.raises(ValueError, match="do not add up"):
        Parallel(0, 2).shard("layers.0.mlp.up_proj.weight", torch.randn(6, 4), [(2, 4), (2, 4)], config)


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
    """SmolLM2's 9 heads in 3 KV groups split 6 + 3 over two ranks; the greedy text is the one-process text."""
    model = str(smollm2_gguf())
    args = [model, "--prompt", "The capital of France is", "--max-tokens", "12", "--device", "cpu", "--json"]
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
