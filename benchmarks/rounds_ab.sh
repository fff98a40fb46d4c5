#!/bin/bash
# The 35B seed pair's drafter rounds on the GPU machine: this tree against another one in the same run (the ratio
# the runtime's changes are judged by), each drafter's round with PDL and with plain launches (each kernel's own
# time), then the gate on this tree. One device call, about 6 minutes on an H100:
#   run(command="BASE=.device/base bash benchmarks/rounds_ab.sh", carry=[".device"])
# .device (git-ignored) holds the wheels the machine lacks (.device/wheels: gguf and orjson for cp312, pip download
# --only-binary) and BASE, the tree to compare with (`git archive REV | tar -x -C .device/base`, its demo/,
# catalog/, tests/ and benchmarks/results/ removed to travel light). Without BASE only this tree runs.
# Writes $OUT/{base,this,this-plain}/round_profile.{md,json} for DFlash2 (block 8, affine-4; MTP: DRAFTER=mtp) and
# $OUT/gate/seed_pairs_35b-nvfp4.{md,json} (GATE=0: no gate, about half the call); prints the rounds and their ratio
# last.
set -u -o pipefail
OUT=${OUT:-/tmp/out}
DRAFTER=${DRAFTER:-dflash2}
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .device/wheels/*.whl 2>&1 | grep -v WARNING
mkdir -p /tmp/pkgs && ln -sfn "$PWD" /tmp/pkgs/specpair  # the repository root is the package
export PYTHONPATH=/tmp/pkgs:/tmp/site PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
work=/tmp/seed-pairs
timeout 120 python3 benchmarks/seed_pairs_gpu.py --pair 35b-nvfp4 --only build --work $work --out /tmp/build >/dev/null
pair=$work/35b-nvfp4
target=$pair/qwen3.6-35b-a3b-nvfp4-mtp
if [ "$DRAFTER" = mtp ]; then
  drafter=(--block 4)
else
  drafter=(--draft "$pair/incoai-dflash2" --draft-bits 4 --block 8)
fi
if [ -n "${BASE:-}" ]; then
  mkdir -p /tmp/base-pkgs && ln -sfn "$PWD/$BASE" /tmp/base-pkgs/specpair
  (cd "$BASE" && PYTHONPATH=/tmp/base-pkgs:/tmp/site timeout 120 python3 benchmarks/round_profile.py "$target" \
    "${drafter[@]}" --out "$OUT/base" >/dev/null)
fi
timeout 120 python3 benchmarks/round_profile.py "$target" "${drafter[@]}" --out "$OUT/this" >/dev/null
SPECPAIR_PDL=0 timeout 120 python3 benchmarks/round_profile.py "$target" "${drafter[@]}" --out "$OUT/this-plain" >/dev/null
if [ "${GATE:-1}" != 0 ]; then
  timeout 240 python3 benchmarks/seed_pairs_gpu.py --pair 35b-nvfp4 --reuse --only gate --skip-load --work $work \
    --out "$OUT/gate" | grep -E "identical|FAILED"
fi
python3 - "$OUT" <<'EOF'
import json, sys
from pathlib import Path

out = Path(sys.argv[1])
runs = {n: json.loads((out / n / "round_profile.json").read_text()) for n in ("base", "this", "this-plain")
        if (out / n / "round_profile.json").exists()}
for name, r in runs.items():
    print(f"{name:10} round {r['step_ms']['round']:.3f} ms, wall {r['profile']['round_ms']:.3f}, "
          f"{r['profile']['launches']:.0f} kernels; decode {r['step_ms']['decode']:.3f} ms ({r['gpu']})")
if "base" in runs:
    print(f"this / base: {runs['this']['step_ms']['round'] / runs['base']['step_ms']['round']:.3f}x (round), "
          f"{runs['this']['profile']['round_ms'] / runs['base']['profile']['round_ms']:.3f}x (wall of 50)")
EOF
