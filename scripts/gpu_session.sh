#!/usr/bin/env bash
# The GPU checks of issue 5 (BENCHMARKS.md), in parts that each fit one 10-minute device call.
#
#   here, once:    bash scripts/gpu_session.sh fetch     # wheels the device image lacks -> .whl/
#                                                        # and the TRL anchor script -> shared/bench/
#   on the GPU:    bash scripts/gpu_session.sh tests     # GPU-marked tests + generation/decode/modeling tests
#                  bash scripts/gpu_session.sh standard  # 0.5b, standard shape, beside TRL
#                  bash scripts/gpu_session.sh long      # 0.5b, long shape, beside TRL
#                  bash scripts/gpu_session.sh big       # 1.5b standard shape, and a shape TRL may not fit
#
# Each GPU part installs .whl/*.whl into /tmp/site (carry .whl) and writes JSON results and logs to
# $OUT (the device tool's output folder; runs/gpu when unset).
set -euo pipefail
cd "$(dirname "$0")/.."
part=${1:?usage: gpu_session.sh fetch|tests|standard|long|big}
OUT=${OUT:-runs/gpu}
mkdir -p "$OUT"

if [ "$part" = fetch ]; then
  exclude="$(git rev-parse --git-dir)/info/exclude"   # keep the wheels and the anchor copy untracked
  mkdir -p "$(dirname "$exclude")"
  for pattern in /.whl/ /shared/; do grep -qx "$pattern" "$exclude" 2>/dev/null || echo "$pattern" >> "$exclude"; done
  mkdir -p shared/bench && cp ../shared/bench/*.py shared/bench/
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d .whl trl==1.16.0 datasets==5.2.0 dill==0.4.1 multiprocess==0.70.19 math-verify==0.9.0 \
    latex2sympy2_extended==1.11.0 antlr4-python3-runtime==4.13.2
  ls -la .whl
  exit 0
fi

python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$OUT/gpu.txt"
python3 -c "import torch, transformers, trl; print('torch', torch.__version__, 'transformers', transformers.__version__, 'trl', trl.__version__)" | tee -a "$OUT/gpu.txt"
bench() { python3 -m grpokit bench "$@"; }

case $part in
  tests)
    python3 -m pytest -q -m gpu tests 2>&1 | tee "$OUT/tests_gpu.log"
    python3 -m pytest -q -x tests/test_decode.py tests/test_generation.py tests/test_modeling.py tests/test_trainer.py 2>&1 | tee "$OUT/tests_core.log"
    bench --shape standard --model-size 0.5b --steps 3 --kv-cache dynamic --json "$OUT/standard_dynamic.json" 2>&1 | grep -v '^RESULT' | tee "$OUT/standard_dynamic.log"
    ;;
  standard)
    bench --shape standard --model-size 0.5b --steps 4 --compare trl --json "$OUT/standard.json" 2>&1 | grep -v '^RESULT' | tee "$OUT/standard.log"
    ;;
  long)
    bench --shape long --model-size 0.5b --steps 3 --compare trl --json "$OUT/long.json" 2>&1 | grep -v '^RESULT' | tee "$OUT/long.log"
    ;;
  big)
    bench --shape standard --model-size 1.5b --steps 3 --json "$OUT/standard_1.5b.json" 2>&1 | grep -v '^RESULT' | tee "$OUT/standard_1.5b.log"
    bench --shape xlong --model-size 0.5b --steps 2 --compare trl --json "$OUT/xlong.json" 2>&1 | grep -v '^RESULT' | tee "$OUT/xlong.log" || true
    ;;
  *) echo "unknown part $part" >&2; exit 2 ;;
esac
