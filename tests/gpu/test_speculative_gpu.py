"""Drafted == undrafted on CUDA, bit for bit, for every drafter kind on every target family where the pair is valid,
at tiny shapes: the CPU tier's targets and drafters (tests/test_speculative.py's Workshop: drafters distilled on
their own targets so that drafts are kept and the accept and rollback paths run), loaded as `specpair run` loads
them on CUDA (bf16, packed weights) and run with CUDA graphs: greedy with 4 sequences of different lengths, and a
seeded temperature alone and in a batch."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from drafting import prompts
from gpu_tier import DEVICE
from safetensors.torch import load_file, save_file
from test_speculative import GRID, PROMPT_LENGTHS, Workshop, first_difference

from specpair.runtime.drafters.loading import load_drafter
from specpair.runtime.generate import generate
from specpair.runtime.loading import load, plan_load
from specpair.runtime.sampling import Sampling, uniform
from specpair.runtime.speculative import speculative_generate
from specpair.sources.model import open_model

TOKENS = 48
SEEDED = Sampling(temperature=0.7, top_k=40, seed=11)


@pytest.fixture(scope="module")
def workshop(tmp_path_factory) -> Workshop:
    return Workshop(tmp_path_factory.mktemp("speculative_gpu"))


def on_cuda(workshop: Workshop, family: str, kind: str):
    checkpoint = workshop.drafter(family, kind)  # trained on the CPU as the CPU tier trains it
    model = open_model(str(workshop.setup(family).path))
    target = load(plan_load(model, DEVICE))
    drafter = load_drafter(open_model(str(checkpoint)) if checkpoint else None, model, target)
    return target, drafter


@pytest.mark.parametrize("family,kind", GRID)
def test_drafted_equals_undrafted_on_cuda(workshop, family, kind):
    target, drafter = on_cuda(workshop, family, kind)
    asked = prompts(PROMPT_LENGTHS)
    for sampling, batch in ((Sampling(), asked), (SEEDED, asked), (SEEDED, asked[:1])):
        want, _ = generate(target, batch, TOKENS, sampling)
        got, timing = speculative_generate(target, drafter, batch, TOKENS, sampling)
        for g, w in zip(got, want):
            assert g.tokens == w.tokens, f"{sampling}: " + first_difference(g.tokens, w.tokens)
        assert timing.rounds > 0
    tau = sum(r.tau for r in got) / len(got)
    assert tau >= 1.0


@pytest.mark.parametrize("norms", [{"fc_norm": True, "norm_output": True}, {"norm_before_fc": True}])
def test_an_eagle31_head_drafts_the_undrafted_output_on_cuda(workshop, tmp_path, norms):
    """EAGLE-3.1's norms (runtime/drafters/eagle3.py) through the CUDA norm kernel and graphs: the CPU tier's trained
    EAGLE-3 head with the norms turned on (weights near 1, so drafts are still kept) drafts the undrafted tokens."""
    family = next(f for f, kind in GRID if kind == "eagle3")
    source = workshop.drafter(family, "eagle3")
    shutil.copytree(source, tmp_path / "eagle31")
    config = json.loads((tmp_path / "eagle31" / "config.json").read_text())
    (tmp_path / "eagle31" / "config.json").write_text(json.dumps({**config, **norms}))
    tensors = load_file(str(source / "model.safetensors"))
    width = tensors["fc.weight"].shape[1]
    g = torch.Generator().manual_seed(2)
    if "fc_norm" in norms:
        for i in range(3):
            tensors[f"fc_norm.{i}.weight"] = 1 + 0.05 * torch.randn(width // 3, generator=g)
    save_file(tensors, str(tmp_path / "eagle31" / "model.safetensors"), metadata={"format": "pt"})
    model = open_model(str(workshop.setup(family).path))
    target = load(plan_load(model, DEVICE))
    drafter = load_drafter(open_model(str(tmp_path / "eagle31")), model, target)
    asked = prompts(PROMPT_LENGTHS)
    want, _ = generate(target, asked, TOKENS, Sampling())
    got, timing = speculative_generate(target, drafter, asked, TOKENS, Sampling())
    for g_, w in zip(got, want):
        assert g_.tokens == w.tokens, first_difference(g_.tokens, w.tokens)
    assert timing.rounds > 0


def test_the_keyed_uniform_has_the_cpus_bits_on_cuda():
    """The keyed hash is integer arithmetic: on CUDA (torch's int64 ops) the bits the CPU's numpy uint32 path gives,
    for positions past 2^32 and a row of ids per position, so a seeded run draws the same tokens on either."""
    g = torch.Generator().manual_seed(5)
    positions = torch.randint(0, 1 << 34, (64,), generator=g)
    ids = torch.randint(0, 262_144, (4096,), generator=g)
    for seed, stream in ((0, 0), (11, 2), ((1 << 63) - 1, 255)):
        on_device = uniform(seed, stream, positions.to(DEVICE), ids.to(DEVICE))
        assert torch.equal(on_device.cpu(), uniform(seed, stream, positions, ids))
