# source tools/device/setup.sh on the GPU machine: the carried wheels into /tmp/site, the repository as the package
python3 -m pip install -q --no-index --no-deps --target /tmp/site .device/wheels/*.whl 2>&1 | grep -v WARNING
mkdir -p /tmp/pkgs && ln -sfn "$PWD" /tmp/pkgs/specpair
export PYTHONPATH=/tmp/pkgs:/tmp/site PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
