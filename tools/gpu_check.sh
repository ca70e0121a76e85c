#!/usr/bin/env bash
# The GPU checks in one run, for a CUDA machine whose python3 already has torch and Triton
# (no network there): the tests marked gpu, then bench/bench_runners.py and bench/bench_kernels.py.
#   tools/gpu_check.sh OUT_DIR
# Packages that python3 lacks travel as wheels in .whl/ (pip download --only-binary=:all:
# --python-version 3.12 for the versions in constraints.txt: pydantic, gguf, transformers and
# what it needs); they go to /tmp/site, ahead of the machine's own.
set -uo pipefail
out=${1:?usage: tools/gpu_check.sh OUT_DIR}
mkdir -p "$out"
if compgen -G ".whl/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || exit 2
  export PYTHONPATH=/tmp/site
fi
python3 -m pip install -q --no-index --no-deps --no-build-isolation -e . >"$out/install.log" 2>&1 \
  || { tail -20 "$out/install.log"; exit 2; }
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  python3 -c "import torch, triton, transformers; print('torch', torch.__version__, \
'triton', triton.__version__, 'transformers', transformers.__version__)"; } | tee "$out/machine.txt"
export PYTHONUNBUFFERED=1
status=0
# The gpu-marked tests live in these files; collecting only them keeps the run short.
timeout 330 python3 -m pytest -m gpu -q -p no:cacheprovider -o timeout=200 -rfE --durations=15 \
  tests/runners/graphs/test_gpu_graphs.py tests/kernels/test_bench_kernels.py \
  tests/runners/test_tensor_parallel.py 2>&1 | tee "$out/pytest-gpu.log" | tail -60 || status=1
timeout 90 python3 bench/bench_runners.py --reps 3 2>&1 | tee "$out/bench_runners.log" | tail -25
timeout 90 python3 bench/bench_kernels.py --quick 2>&1 | tee "$out/bench_kernels.log" | tail -45
exit $status
