"""benchmarks/step_profile.py's accounting on the CPU (and the weight sizes it counts, Packed.nbytes): the matmul calls it pairs with a profiled step's launches
(one per linear.matmul / matmul_experts call, each with the bytes it reads), and their grouping by weight. The
profile itself needs a GPU (the script runs there). And benchmarks/tiles_sweep.py's logic at tiny shapes under the
interpreter (its timing needs the GPU)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from fixtures import build_target

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

import step_profile  # noqa: E402
import tiles_sweep  # noqa: E402

from specpair.formats.codecs import codec  # noqa: E402
from specpair.formats.packed import Packed  # noqa: E402
from specpair.runtime.loading import load, plan_load  # noqa: E402
from specpair.sources.model import open_model  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def decode_calls(target: Path, tokens: int = 1) -> tuple[list[dict], object]:
    model = load(plan_load(open_model(str(target)), "cpu", torch.float32))
    cache = model.new_cache(1, 16)
    ids = torch.arange(1, tokens + 1)[None]
    with step_profile.recorded_matmuls() as calls:
        model.forward(ids, torch.arange(tokens)[None], cache)
    return calls, model


def vector_bytes(model) -> int:
    """The bytes of the model's 1-D weights (norms): read by a step, by no matmul."""
    seen: dict[int, int] = {}

    def walk(obj) -> None:
        if isinstance(obj, torch.Tensor):
            if obj.dim() == 1:
                seen[obj.data_ptr()] = obj.nbytes
        elif isinstance(obj, (list, tuple)):
            for x in obj:
                walk(x)
        elif hasattr(obj, "__dict__"):
            for x in vars(obj).values():
                walk(x)

    walk([model.layers, model.norm])
    return sum(seen.values())


def test_a_dense_step_calls_every_weight_once(tmp_path: Path) -> None:
    """The calls' bytes and the norms' add up to the bytes step_bytes counts: every weight but the embedding, once."""
    calls, model = decode_calls(build_target(tmp_path / "dense", layers=2))
    assert calls and all("experts" not in c["weight"] for c in calls)
    assert sum(c["bytes"] for c in calls) + vector_bytes(model) == step_profile.step_bytes(model)
    assert calls[-1]["weight"] == f"float32 {model.config.vocab_size}x{model.config.hidden_size}"  # the LM head


def test_a_routed_call_reads_the_experts_its_tokens_name(tmp_path: Path) -> None:
    """Of a stack of 8 experts, the distinct experts its tokens name: 2 a token (top 2), at most 2·T."""
    target = build_target(tmp_path / "moe", "qwen3_moe", layers=2, experts=8, experts_per_token=2, hidden=64)
    for tokens in (1, 3):
        calls, model = decode_calls(target, tokens)
        routed = [c for c in calls if "experts" in c["weight"]]
        assert len(routed) == 2 * (len(model.layers[0].mlp.gate_up) + 1)  # gate and up (or gate|up), down
        for call in routed:
            shape, touched = call["weight"].removeprefix("float32 8 experts of ").split(", ")
            n, k = (int(d) for d in shape.split("x"))
            touched = int(touched.removesuffix(" touched"))
            assert 2 <= touched <= 2 * tokens
            assert call["bytes"] == touched * n * k * 4
        assert len(calls) - len(routed) == 2 * 3 + 1  # q|k|v, o and the router a layer; the LM head


def test_launches_group_by_weight_slowest_first() -> None:
    calls = [{"weight": "a", "bytes": 100.0}, {"weight": "b", "bytes": 10.0}, {"weight": "a", "bytes": 100.0}]
    groups = step_profile.matmuls_by_weight(calls, [1.0, 5.0, 2.0], bandwidth=1e8)
    assert [(g["weight"], g["calls"], g["us"], g["bytes"]) for g in groups] == [
        ("b", 1, 5.0, 10.0),
        ("a", 2, 3.0, 200.0),
    ]
    assert groups[1]["of_copy"] == pytest.approx(200.0 / 3e-6 / 1e8)
    with pytest.raises(ValueError):  # a step whose launches do not pair with its calls
        step_profile.matmuls_by_weight(calls, [1.0, 2.0], bandwidth=1e8)


def test_the_tile_sweep_runs_each_case_and_candidate(tmp_path: Path) -> None:
    """--smoke: the runtime tiles and a candidate for a routed and a dense case, each candidate's product checked
    against the runtime tiles' (a WRONG cell, exit 1)."""
    script = Path(__file__).resolve().parent.parent / "benchmarks" / "tiles_sweep.py"
    out = tmp_path / "tiles.md"
    args = ["--smoke", "--candidates", "splits=2", "--cases", "experts gate|up,GDN b|a", "--out", str(out)]
    env = os.environ | {"TRITON_INTERPRET": "1"}
    done = subprocess.run([sys.executable, str(script), *args], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = [line for line in out.read_text().splitlines() if line.startswith(("| experts", "| GDN"))]
    assert [r.split(" | ")[2].split(" (")[0] for r in rows] == ["runtime", "splits=2"] * 2
    assert "WRONG" not in out.read_text()


def test_the_tile_sweep_times_a_dense_case_in_other_layouts(tmp_path: Path) -> None:
    """--layouts: a dense case's weight also in other layouts, each with its own runtime tiles and its product checked
    against x times its dequantized weight; a routed case keeps its own layout only."""
    script = Path(__file__).resolve().parent.parent / "benchmarks" / "tiles_sweep.py"
    out = tmp_path / "tiles.md"
    args = ["--smoke", "--candidates", "splits=2", "--cases", "DFlash2 q|k|v,experts down"]
    args += ["--layouts", "nvfp4-modelopt,affine8-g64", "--out", str(out)]
    env = os.environ | {"TRITON_INTERPRET": "1"}
    done = subprocess.run([sys.executable, str(script), *args], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = [
        line.split(" | ")[:3] for line in out.read_text().splitlines() if line.startswith(("| DFlash2", "| experts"))
    ]
    assert [(r[0], r[1], r[2].split(" (")[0]) for r in rows] == [
        ("| experts down", "nvfp4-modelopt", "runtime"),
        ("| experts down", "nvfp4-modelopt", "splits=2"),
        ("| DFlash2 q\\|k\\|v", "affine4-g64", "runtime"),
        ("| DFlash2 q\\|k\\|v", "affine4-g64", "splits=2"),
        ("| DFlash2 q\\|k\\|v", "nvfp4-modelopt", "runtime"),
        ("| DFlash2 q\\|k\\|v", "affine8-g64", "runtime"),
    ]
    assert "WRONG" not in out.read_text()


def test_a_packed_weight_counts_its_parts_bytes() -> None:
    """Packed.nbytes, as a tensor's: an NVFP4 weight's codes (half a byte a value), block scales (a byte per 16) and
    global scale; a stack of experts, each expert's times their count."""
    w = torch.randn(64, 256)
    packed = Packed(
        "model.layers.0.mlp.up_proj.weight",
        "nvfp4-modelopt",
        (64, 256),
        codec("nvfp4-modelopt").encode(w, "model.layers.0.mlp.up_proj.weight"),
    )
    assert packed.nbytes == 64 * 256 // 2 + 64 * 256 // 16 + 4
    stack = Packed(packed.name, packed.layout, (3, 64, 256), {k: torch.stack([v] * 3) for k, v in packed.parts.items()})
    assert stack.nbytes == 3 * packed.nbytes and stack.expert(1).nbytes == packed.nbytes


def test_the_tile_sweep_reads_candidates_wrapped_in_a_quoted_string() -> None:
    assert tiles_sweep.parse("splits=1;\n        block_n=16, splits=1;stages=4") == [
        {"splits": 1},
        {"block_n": 16, "splits": 1},
        {"stages": 4},
    ]
