"""A checkpoint served from memory (benchmarks/runtime_gpu.GeneratedFiles: each tensor drawn when it is read) loads,
through sources/model.open_files and the same reads a directory gets (formats/weights.TensorReader), to exactly the
weights of the same checkpoint written by write_checkpoint and read by path: whole, packed, and cut as a
tensor-parallel rank cuts them (formats/regions.py)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

import runtime_gpu  # noqa: E402
import seed_pairs_gpu  # noqa: E402

from specpair.formats.packed import Packed  # noqa: E402
from specpair.formats.regions import Region  # noqa: E402
from specpair.sources.model import Model, open_files, open_model  # noqa: E402

QWEN3_TINY = {
    **json.loads((runtime_gpu.CONFIGS / "Qwen__Qwen3-0.6B.json").read_text()),
    "hidden_size": 256,
    "num_hidden_layers": 2,
    "max_window_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "head_dim": 128,
    "intermediate_size": 512,
    "vocab_size": 512,
    "tie_word_embeddings": False,
}


@pytest.fixture(autouse=True)
def small_shards(monkeypatch: pytest.MonkeyPatch) -> None:
    """Shards of 256 kB: several files and an index, as a real checkpoint has them; stacks of experts drawn 3 experts
    at a time (the tiny 122B's 8: chunks of 3, 3 and 2), as the real ones are."""
    monkeypatch.setattr(runtime_gpu, "SHARD", 256 * 1024)
    monkeypatch.setattr(runtime_gpu, "CHUNK_VALUES", 3 * 256 * 256)


def checkpoint(kind: str) -> tuple[dict, list[runtime_gpu.Tensor], dict | None]:
    """(config, tensors, extra files) of a small checkpoint: Qwen3 dense with its projections in `kind`, or the
    122b-fp8 seed pair's target at tiny scale (a MoE with experts stored one by one in FP8 blocks)."""
    if kind == "122b-fp8":
        scale = seed_pairs_gpu.Scale("tiny", "cpu")
        config = scale.text(json.loads((runtime_gpu.CONFIGS / seed_pairs_gpu.QWEN35_122B).read_text()))
        fp8 = seed_pairs_gpu.FP8_KEPT
        tensors = runtime_gpu.qwen36_tensors(config, {}, lambda m: "bf16" if fp8.match(m) else "fp8-block")
    else:
        config, tensors = QWEN3_TINY, runtime_gpu.qwen3_tensors(QWEN3_TINY, kind)
    keys, files = seed_pairs_gpu.quantization_keys(tensors)
    return {**config, **keys}, tensors, files


def both(kind: str, tmp_path: Path) -> tuple[Model, Model]:
    """The checkpoint written and opened by path, and the same one opened from memory."""
    config, tensors, extra = checkpoint(kind)
    runtime_gpu.write_checkpoint(tmp_path / kind, config, tensors, extra, "cpu")
    generated = runtime_gpu.GeneratedFiles(f"generated:{kind}", config, tensors, extra, "cpu")
    return open_model(str(tmp_path / kind)), open_files(generated)


def same(a: torch.Tensor | Packed, b: torch.Tensor | Packed) -> bool:
    """Bit for bit (a Packed's every part)."""
    if isinstance(a, Packed):
        return (
            isinstance(b, Packed)
            and a.parts.keys() == b.parts.keys()
            and all(same(a.parts[k], b.parts[k]) for k in a.parts)
        )
    bits = lambda x: x.contiguous().view(torch.uint8) if x.ndim else x.reshape(1).view(torch.uint8)  # noqa: E731
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(bits(a), bits(b))


@pytest.mark.parametrize("kind", ["bf16", "fp8-block", "nvfp4-modelopt", "122b-fp8"])
def test_generated_checkpoint_loads_to_the_written_ones_weights(kind: str, tmp_path: Path) -> None:
    on_disk, in_memory = both(kind, tmp_path)
    assert len({info.file for w in on_disk.weights.values() for info in w.parts.values()}) > 1  # shards and an index
    assert (on_disk.hf_config, on_disk.names) == (in_memory.hf_config, in_memory.names)
    assert {n: w.parts for n, w in on_disk.weights.items()} == {n: w.parts for n, w in in_memory.weights.items()}
    layout = "fp8-block" if kind == "122b-fp8" else kind
    assert any(on_disk.layout(n) == layout for n in on_disk.names)
    for packed in (False, True):
        written = dict(on_disk.stream(packed=packed))
        drawn = dict(in_memory.stream(packed=packed))
        assert written.keys() == drawn.keys() == set(on_disk.names)
        assert all(same(written[n], drawn[n]) for n in written), kind
    assert same(on_disk.load("lm_head.weight"), in_memory.load("lm_head.weight"))  # a re-read draws the same bytes
    # `specpair check` reads the same metadata from both (all but where the files are)
    judged = [{k: v for k, v in m.checkpoint().to_json().items() if k != "ref"} for m in (on_disk, in_memory)]
    assert judged[0] == judged[1]


@pytest.mark.parametrize("kind", ["bf16", "fp8-block", "nvfp4-modelopt", "122b-fp8"])
def test_a_tensor_parallel_cut_reads_the_same_bytes_from_memory(kind: str, tmp_path: Path) -> None:
    """Rank 1 of 2: the second half of every matrix's rows, and of a down projection's columns."""
    on_disk, in_memory = both(kind, tmp_path)
    matrices = [n for n in on_disk.names if len(on_disk.shape(n)) >= 2 and "embed" not in n]

    def region(name: str) -> Region:
        axis = -1 if "down_proj" in name else -2
        size = on_disk.shape(name)[axis]
        return Region(axis, ((size // 2, size),))

    cuts = [n for n in matrices if any(cut is not None for _, cut in on_disk.reading(n, region(n)).reads)]
    assert len(cuts) >= len(matrices) // 2  # most are read as cuts of their stored parts, not whole
    for packed in (False, True):
        written = dict(on_disk.stream(matrices, packed=packed, regions=region))
        drawn = dict(in_memory.stream(matrices, packed=packed, regions=region))
        assert all(same(written[n], drawn[n]) for n in matrices), kind
        if not packed:  # and the cut is the region of the whole weight
            assert all(same(written[n], region(n).narrow(on_disk.load(n))) for n in matrices)
