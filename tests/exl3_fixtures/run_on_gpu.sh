#!/bin/bash
# Everything formats/exl3.py needs from the GPU machine, in one call (tests/exl3_fixtures/README.md):
#   run(command="bash tests/exl3_fixtures/run_on_gpu.sh", carry=[".device/wheels"])
# .device/wheels holds exllamav3 1.6.5 and the install dependencies the machine lacks. Order: the benchmark's
# CPU timings on a quiet machine; then exllamav3's extension build (all cores) beside the benchmark's GPU
# timings and the CPU/CUDA code check; then the fixtures and the model check, which need the extension.
set -u
OUT=${OUT:-/tmp/exl3_out}
mkdir -p "$OUT"
LOG="$OUT/log.txt"
stamp() { echo "== $(date +%T) $*" | tee -a "$LOG"; }

stamp install
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
    .device/wheels/*.whl >>"$LOG" 2>&1 || { stamp "pip failed"; exit 1; }
mkdir -p /tmp/pkgs .device/build && ln -sfn "$PWD" /tmp/pkgs/specpair  # the repository root is the package
export PYTHONPATH=/tmp/pkgs:/tmp/site PYTHONUNBUFFERED=1 TORCH_CUDA_ARCH_LIST=9.0 MAX_JOBS=18 \
    TORCH_EXTENSIONS_DIR="$PWD/.device/build"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv >>"$LOG" 2>&1
python3 -c "import torch, triton, os; print('torch', torch.__version__, 'triton', triton.__version__, 'cpus', os.cpu_count())" >>"$LOG" 2>&1

stamp "benchmark"
timeout 240 python3 benchmarks/exl3_encode.py --cpu-done /tmp/cpu_done >"$OUT/exl3_encode.md" 2>&1 &
bench=$!
while [ ! -e /tmp/cpu_done ] && kill -0 $bench 2>/dev/null; do sleep 1; done
stamp "build exllamav3_ext (background)"
(time python3 -c "import exllamav3.ext") >/tmp/build.txt 2>&1 &
build=$!
wait $bench
stamp "benchmark done; CPU/CUDA code check"
timeout 200 python3 tests/exl3_fixtures/check_on_gpu.py codes "$OUT" >>"$LOG" 2>&1
stamp "codes done, waiting for the build"
wait $build
tail -20 /tmp/build.txt >>"$LOG"
so=$(find .device/build -name 'exllamav3_ext*.so' | head -1)
[ -n "$so" ] && ls -la "$so" >>"$LOG" && [ "$(stat -c %s "$so")" -lt 16000000 ] && cp "$so" "$OUT/"

stamp fixtures
timeout 150 python3 tests/exl3_fixtures/make_fixtures.py "$OUT" >>"$LOG" 2>&1
stamp model
timeout 120 python3 tests/exl3_fixtures/check_on_gpu.py model "$OUT" >>"$LOG" 2>&1
stamp done
