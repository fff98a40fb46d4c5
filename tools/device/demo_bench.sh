# the demo pair's `specpair bench` on the GPU (the GGUF joined by stash.sh), as JSON and as the table
source tools/device/setup.sh >/dev/null
DRAFTER=${DRAFTER:-demo/SmolLM2-135M-Instruct-DFlash}
ARGS="/tmp/smol.gguf $DRAFTER --users 1,4 --depth 0 --tokens 256 --prompts builtin --device cuda"
python3 -m specpair bench $ARGS --json > "$OUT/demo_bench.json" 2> "$OUT/demo_bench.err"
python3 -m specpair bench $ARGS 2>/dev/null | tee "$OUT/demo_bench.txt"
