# keeps the carried GGUF parts on the warm GPU machine, and joins them once all three are there
mkdir -p /tmp/g && cp .device/gguf/part_* /tmp/g/ && ls /tmp/g
if [ -f /tmp/g/part_02 ] && [ ! -f /tmp/smol.gguf ]; then
  cat /tmp/g/part_00 /tmp/g/part_01 /tmp/g/part_02 > /tmp/smol.gguf && md5sum /tmp/smol.gguf
fi
