# the demo pair's `specpair bench` on the GPU (the GGUF joined by stash.sh): its document in $OUT/demo_bench.json, its
# progress and a line per row in $OUT/demo_bench.err
source tools/device/setup.sh >/dev/null
python3 -m specpair bench /tmp/smol.gguf ${DRAFTER:-demo/SmolLM2-135M-Instruct-DFlash} --users 1,4 --depth 0 \
    --tokens 256 --prompts builtin --device cuda --json > "$OUT/demo_bench.json" 2> "$OUT/demo_bench.err"
echo "rc $?"; grep -E "^(users|depth)|tok/s" "$OUT/demo_bench.err"
