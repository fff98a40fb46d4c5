"""tools/exactness_probe.py on a tiny hybrid MoE target on the CPU: every comparison it makes (taps, and the last
prompt token through a prefill or through row 0 of a step of 1..block tokens) finds the same logits."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from drafting import tiny_target

ROOT = Path(__file__).resolve().parents[1]


def test_the_probe_finds_every_path_identical_on_the_cpu(tmp_path):
    target = tiny_target(tmp_path / "target", "qwen3_5_moe", mtp=False)
    command = [sys.executable, str(ROOT / "tools" / "exactness_probe.py"), str(target), "--device", "cpu"]
    command += ["--taps", "0,1", "--prompt-tokens", "12", "--block", "3"]
    out = subprocess.run(command, capture_output=True, text=True, check=True).stdout.splitlines()
    assert out[0] == "prefill with taps: identical"
    steps = [line.split(": ")[0] for line in out[1:]]
    assert steps == [
        f"{what}{n}"
        for n in (1, 2, 3)
        for what in ("prefill of the rest, then a step of ", "the same with taps, a step of ")
    ]
    assert all(line.endswith(": identical") for line in out)
