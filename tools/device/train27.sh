# issue 27's training runs on the GPU (the GGUF joined by stash.sh). PHASE=data|train|all; RUNS="name:layers:width:
# soft[:scale[:lr[:human weight[:position decay]]]] ...", trained side by side on the data in /tmp/data. Making the
# data for both prompt files takes about 300 s with 1 sampled reply (76 s of it loading and self-instruct): give
# DATA_TIMEOUT room, since a data call cut short writes nothing. INIT=DIR goes on training a drafter written before (a
# longer run over two calls of one warm machine: the first call's $OUT/NAME/drafter, copied out of $OUT before the
# call ends).
# The data goes back as $OUT/data.txz.* (xz parts under the 16 MiB a returned file may have): saved in .device/data/
# here and carried to a later session's machine with a GGUF part, stash.sh unpacks it instead of a data call.
# HUMAN_SAMPLED=N gives the people's training prompts N sampled replies more each (after SAMPLED's rounds): give them
# weight 1 in RUNS then, so that their greedy reply is not also repeated.
# One schedule over two calls of one warm machine: STEPS=N BUDGET= STOP_S=S STATE=/tmp/state-NAME.pt (each run of
# RUNS its own STATE: give one run) stops after S s and keeps its state there; the same call again goes on from it.
source tools/device/setup.sh >/dev/null
G=/tmp/smol.gguf
COMMON="--prompts 16000 --questions 40000 --question-tokens 64 --new-tokens 160 --batch 2048 --steps ${STEPS:-30000} \
    --validation 128 --human tools/demo_prompts.json tools/demo_prompts_more.json --human-validation 64 --data /tmp/data"
RUNS=${RUNS:-"w1:2:1408:0:1.25:0.001:1 w16:2:1408:0:1.25:0.001:16"}
budget=${BUDGET-290}  # BUDGET= (set, empty): no budget, --steps' schedule
if [ "${PHASE:-all}" != train ]; then
  start=$(date +%s)
  timeout ${DATA_TIMEOUT:-330} python3 tools/train_demo_dflash.py $G /tmp/datarun $COMMON --scale 1.25 \
      --sampled-replies ${SAMPLED:-1} --human-sampled-replies ${HUMAN_SAMPLED:-0} --data-budget-s ${DATA_S:-280} \
      --data-only > "$OUT/data.log" 2>&1
  echo "data rc $? in $(( $(date +%s) - start )) s"; tail -4 "$OUT/data.log"
  [ -f /tmp/data/prompts.json ] && tar -C /tmp -cf - data | xz -T0 -6 | split -b 15m - "$OUT/data.txz."
  ls -l "$OUT"/data.txz.* 2>/dev/null
fi
if [ "${PHASE:-all}" != data ]; then
  # without the data each process would make it for itself, side by side, into one folder
  [ -f /tmp/data/prompts.json ] || { echo "no data in /tmp/data: run PHASE=data, or carry .device/data to stash.sh"; exit 3; }
  for spec in $RUNS; do
    IFS=: read -r name layers width soft scale lr weight decay <<< "$spec"
    python3 tools/train_demo_dflash.py $G "$OUT/$name" $COMMON ${budget:+--budget-s $budget} \
        --layers $layers --intermediate $width --soft $soft --scale ${scale:-1.25} --lr ${lr:-0.001} \
        --human-weight ${weight:-1} ${decay:+--position-decay $decay} ${INIT:+--init "$INIT"} \
        ${STOP_S:+--stop-after-s $STOP_S} ${STATE:+--state "$STATE"} > "$OUT/$name.log" 2>&1 &
  done
  wait
  for spec in $RUNS; do name=${spec%%:*}; echo "== $name"; tail -8 "$OUT/$name.log"; done
fi
