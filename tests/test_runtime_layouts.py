"""The runtime on every layout `specpair convert` writes: the same tiny model as BF16, GGUF F32 / Q8_0 / Q4_K,
MLX affine, NVFP4 (ModelOpt, compressed-tensors, MLX), FP8 (block and per-tensor) and EXL3 gives logits within
that layout's error of the float32 source, and the packed path (weights kept in their stored layout, as the
kernels read them on the GPU) gives the same bits as the path that dequantizes at load.

A layout's error is measured on its weights (the largest relative Frobenius error of a canonical weight against
the source's); the logits of these small well-conditioned models stay within 4x of it.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from fixtures import save, tiny_model

from specpair.convert import converter as conv
from specpair.convert.policy import parse_keep
from specpair.runtime.loading import load, plan_load
from specpair.sources.model import open_model

AMPLIFICATION = 4.0  # logits' relative error over the worst weight's on these models (measured 1.1 to 2.8)
LAYOUTS = ["bf16", "gguf:F32", "gguf:Q8_0", "affine4", "nvfp4", "nvfp4:ct", "nvfp4:mlx", "fp8", "fp8:tensor"]
# EXL3's trellis search takes seconds per matrix on a CPU: three of the first layer's projections carry it
EXL3_KEEP = ("lm_head.weight=bf16", "*.mlp.*=bf16", "*.layers.[123].*=bf16")


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def hybrid(tmp_path_factory) -> Path:
    """Qwen3.5-MoE: Gated DeltaNet with grouped value heads (GGUF tiles them), gated attention, stacked experts."""
    return save(tiny_model("qwen3_5_moe", init=0.02), tmp_path_factory.mktemp("hybrid") / "hf", "qwen3")


def convert(source: Path, destination: Path, to: str, keep: tuple[str, ...] = ()) -> Path:
    rules = [parse_keep(k, conv.parse_layout) for k in keep]
    conv.execute(
        conv.plan(conv.open_source(str(source)), conv.parse_target(to), rules),
        str(destination),
        device="cpu",
        workers=1,
    )
    return destination


def weight_error(reference, other) -> float:
    def relative(a: torch.Tensor, b: torch.Tensor) -> float:
        return float((a - b).norm() / a.norm()) if a.norm() else float((a - b).norm())

    return max(relative(reference.load(n), other.load(n)) for n in reference.names)


def logits(model, ids: torch.Tensor) -> torch.Tensor:
    positions = torch.arange(ids.shape[1])[None]
    return model.forward(ids, positions, model.new_cache(1, ids.shape[1])).logits


def check_layout(source: Path, converted: Path) -> None:
    reference, other = open_model(str(source)), open_model(str(converted))
    ids = torch.randint(0, reference.config.vocab_size, (1, 12), generator=torch.Generator().manual_seed(0))
    expected = logits(load(plan_load(reference, "cpu")), ids)
    dequantized = logits(load(plan_load(other, "cpu", packed=False)), ids)
    packed_plan = plan_load(other, "cpu", packed=True)
    quantized = {n for n in other.names if other.layout(n) not in ("bf16", "f16", "f32")}
    assert packed_plan.packed == {n for n in quantized if packed_plan.needs[n].matmul and "exl3" not in other.layout(n)}
    # what the plan counts a packed weight as holding is what it holds (bench's memory and roofline read this)
    streamed = dict(other.stream(packed_plan.packed, packed=True))
    for name in packed_plan.packed:
        held = sum(part.nbytes for part in streamed[name].parts.values())
        assert packed_plan.resident[name] == pytest.approx(held, rel=0.01), name
    assert torch.equal(logits(load(packed_plan), ids), dequantized)
    error, bound = float((dequantized - expected).norm() / expected.norm()), weight_error(reference, other)
    assert error <= AMPLIFICATION * bound + 1e-6, (error, bound)


@pytest.mark.parametrize("to", LAYOUTS)
def test_every_layout_gives_the_sources_logits(hybrid, tmp_path, to):
    check_layout(hybrid, convert(hybrid, tmp_path / ("out.gguf" if to.startswith("gguf") else "out"), to))


def test_exl3(hybrid, tmp_path):
    converted = convert(hybrid, tmp_path / "exl3", "exl3:4", EXL3_KEEP)
    assert open_model(str(converted)).layout("layers.0.linear_attn.in_proj_qkv.weight") == "exl3-4bpw"
    check_layout(hybrid, converted)


def test_gguf_q4_k(tmp_path):
    source = save(tiny_model("qwen3", hidden=256, init=0.02), tmp_path / "hf", "qwen3")  # k-quant rows: 256
    converted = convert(source, tmp_path / "q4k.gguf", "gguf:Q4_K")
    assert open_model(str(converted)).layout("layers.0.mlp.up_proj.weight") == "gguf-Q4_K"
    check_layout(source, converted)
