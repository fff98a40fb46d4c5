# issue 24's last item on an H200 (needs_h200): the 122B seed pair's gate at 4 concurrent and its bench, one load;
# T122 bounds it (s), DEPTH=0 leaves out the 5k row where little device time is left
source tools/device/setup.sh >/dev/null
nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200 || { echo "not an H200"; exit 3; }
PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True timeout ${T122:-560} python3 benchmarks/seed_pairs_gpu.py \
    --pair 122b-fp8 --skip-load --gate-batch 4 --gate-tokens 16 --users 1,4 --depth ${DEPTH:-0,5k} --tokens 32 \
    --work /tmp/sp --out "$OUT" 2>&1 | tail -40
