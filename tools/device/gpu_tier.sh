# the GPU tier (tests/gpu) on this tree, its summary in $OUT/gpu_tier.txt
source tools/device/setup.sh >/dev/null
start=$(date +%s)
(cd tests && OMP_NUM_THREADS=1 timeout ${TIER_S:-420} python3 -m pytest -p no:cacheprovider -p no:benchmark -o addopts="" \
    -n 16 -q gpu/ -k "not is_transformers" 2>&1 | tail -25) > "$OUT/gpu_tier.txt"
echo "tier in $(( $(date +%s) - start )) s"; tail -4 "$OUT/gpu_tier.txt"
