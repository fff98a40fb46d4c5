"""benchmarks/round_profile.py's accounting on the CPU: the matmul calls of one drafter round and the bytes they
read, which its roofline divides (the profile itself needs a GPU: the script runs there)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from fixtures import DFlash2, build_dflash, build_target

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

import round_profile  # noqa: E402
import step_profile  # noqa: E402

from specpair.runtime.drafters.loading import load_drafter  # noqa: E402
from specpair.runtime.loading import load, plan_load  # noqa: E402
from specpair.sources.model import open_model  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_torch_thread")
VOCAB, HIDDEN, LAYERS = 512, 64, 3


def test_a_dflash2_round_reads_each_weight_once(tmp_path):
    """A round in the steady state reads every projection of the drafter and the target's head once: the block's
    rows in one call each, and the context the last verify step left (fc's rows; each layer's q|k|v beside the
    block's rows, in the same call)."""
    target_model = open_model(str(build_target(tmp_path / "t", "qwen3", vocab_size=VOCAB, hidden=HIDDEN)))
    target = load(plan_load(target_model, "cpu"))
    draft = build_dflash(
        tmp_path / "d",
        target_layer_ids=[1, 4],
        layers=LAYERS,
        hidden=HIDDEN,
        block_size=8,
        vocab_size=VOCAB,
        mask_token_id=VOCAB - 1,
        dflash2=DFlash2(),
    )
    drafter = load_drafter(open_model(str(draft)), target_model, target)
    calls = round_profile.round_matmuls(target, drafter, 8)
    matrices = {n: w for n, w in drafter.weights.items() if w.ndim == 2 and not n.endswith("_codebook")}
    head = target.lm_head.nbytes
    assert [c["weight"] for c in calls].count(f"float32 {VOCAB}x{HIDDEN}") == 1  # the head, all 7 rows in one call
    assert sum(c["bytes"] for c in calls) == head + sum(w.nbytes for w in matrices.values())
    assert "fc.weight" in matrices and len(calls) == len(matrices) + 1  # one call each: context and block rows together


def test_the_loops_round_is_the_difference_of_two_runs():
    """What both runs do once (the first round's proposal, the last round's leftovers) cancels; a kernel only one
    run launched counts against that run; two runs of the same rounds measure no round."""
    short = {
        "rounds": 10,
        "wall_s": 0.5,
        "busy_us": 10 * 25_000.0 + 9_000.0,
        "kernels": {"verify": (10 * 3 + 7, 10 * 30.0 + 70.0), "once": (1, 5.0)},
    }
    long = {
        "rounds": 30,
        "wall_s": 1.3,
        "busy_us": 30 * 25_000.0 + 9_000.0,
        "kernels": {"verify": (30 * 3 + 7, 30 * 30.0 + 70.0), "once": (1, 5.0), "late": (20, 40.0)},
    }
    round_ms, busy_ms, kernels = round_profile.per_round(short, long)
    assert round_ms == pytest.approx(40.0) and busy_ms == pytest.approx(25.0)
    assert kernels == {"verify": [3.0, 30.0], "once": [0.0, 0.0], "late": [1.0, 2.0]}
    with pytest.raises(RuntimeError, match="the second must take more"):
        round_profile.per_round(long, {**long, "wall_s": 2.0})


def test_busy_time_counts_overlapping_kernels_once():
    """A kernel launched under programmatic dependent launch starts before the one it follows ends: the GPU is busy
    for the union of their intervals, not their sum; gaps between them are idle, in whatever order they come."""
    assert step_profile.busy_us([]) == 0.0
    assert step_profile.busy_us([(0.0, 10.0), (20.0, 25.0)]) == 15.0  # a gap of 10 idle
    assert step_profile.busy_us([(8.0, 30.0), (0.0, 10.0)]) == 30.0  # overlapping by 2, out of order
    assert step_profile.busy_us([(0.0, 30.0), (5.0, 10.0), (12.0, 20.0), (40.0, 41.0)]) == 31.0  # nested
    assert step_profile.busy_us([(0.0, 10.0), (10.0, 12.0)]) == 12.0  # touching


def test_the_loop_report_gives_idle_as_wall_less_busy():
    """Idle is the wall less the time some kernel ran, never less the kernels' own µs summed (which overlap under
    programmatic dependent launch): a round whose kernels sum past its wall still shows its true idle."""
    figures = {
        "users": 1,
        "rounds": [16, 48],
        "loop_round_ms": 6.0,
        "loop_busy_ms": 5.5,
        "loop_kernel_us": 9000.0,
        "loop_launches": 1100.0,
        "steps_round_ms": 7.0,
        "steps_busy_ms": 6.0,
        "steps_kernel_us": 10000.0,
        "steps_launches": 1050.0,
        "kernels": {
            "_gdn_kernel": {"loop_launches": 60.0, "loop_us": 700.0, "steps_launches": 60.0, "steps_us": 1100.0}
        },
    }
    text = round_profile.loop_report("t", "d", "gpu", 8, [figures])
    row = next(line for line in text.splitlines() if line.startswith("| 1 |"))
    assert (
        row == "| 1 | 6.000 ms | 5.500 | 0.500 | 9.000 | 1100.0 | 7.000 ms | 6.000 | 1.000 | 10.000 | 1050.0 | 0.857× |"
    )
    assert "| `_gdn_kernel` | 60.0 | 700.0 | 60.0 | 1100.0 | -400.0 |" in text
