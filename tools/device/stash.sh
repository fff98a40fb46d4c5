# keeps the carried GGUF parts on the warm GPU machine, and joins them once all three are there; unpacks carried
# training data (.device/data: a data call's xz parts, 10 MB, which fit a call beside one GGUF part but not the wheels)
mkdir -p /tmp/g && cp .device/gguf/part_* /tmp/g/ && ls /tmp/g
if [ -f /tmp/g/part_02 ] && [ ! -f /tmp/smol.gguf ]; then
  cat /tmp/g/part_00 /tmp/g/part_01 /tmp/g/part_02 > /tmp/smol.gguf && md5sum /tmp/smol.gguf
fi
if [ ! -f /tmp/data/prompts.json ] && ls .device/data/data.txz.* >/dev/null 2>&1; then
  cat .device/data/data.txz.* | xz -d | tar -C /tmp -xf - && echo "data unpacked into /tmp/data"
fi
