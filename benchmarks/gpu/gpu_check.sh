#!/usr/bin/env bash
# Kernel device check (issue 4), for a session that is lent the H200: under 5 minutes, run once.
#   1. installs carried wheels from .whl/ (xgrammar and its needs; the GPU image lacks them), if present;
#   2. makes `surecall` importable without pip (a symlink tree: engine/ + kernels/ + grammars/);
#   3. runs the GPU tests of the kernels (pytest -m gpu tests/kernels/test_kernels_gpu.py tests/kernels/test_kernels_counted.py);
#   4. runs benchmarks/kernels.py (all shapes, plus the sweep: mask store modes x launches, whose store_mode_choice names the fastest) writing kernels_gpu.json/.md to benchmarks/results/ and $OUT.
# Fetch the wheels here first (once; .whl/ is git-ignored), then call the device tool with carry [".whl"]:
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#     --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64 \
#     --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .whl xgrammar==0.2.9 \
#     apache-tvm-ffi==0.1.15.post2 pydantic==2.14.4 pydantic_core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5
#   device run: bash benchmarks/gpu/gpu_check.sh   (timeout_s 330; it ends in under 5 minutes)
set -uo pipefail
cd "$(dirname "$0")/../.."
source benchmarks/gpu/gpu_env.sh  # OUT, PY, carried wheels and data, the surecall symlink tree

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/kernels_gpu_device.txt"
"$PY" -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, 'cuda', torch.cuda.is_available())"

timeout 120 "$PY" -m pytest -q -m gpu tests/kernels/test_kernels_gpu.py tests/kernels/test_kernels_counted.py -p no:cacheprovider \
  --junitxml="$OUT/kernels_gpu_pytest.xml" 2>&1 | tee "$OUT/kernels_gpu_pytest.log"
TESTS_RC=${PIPESTATUS[0]}

timeout 150 "$PY" benchmarks/kernels.py --sweep --out benchmarks/results --copy-to "$OUT" 2>&1 | tee "$OUT/kernels_gpu_bench.log"
BENCH_RC=${PIPESTATUS[0]}

printf '{"check": "kernels_gpu", "pytest_rc": %d, "bench_rc": %d}\n' "$TESTS_RC" "$BENCH_RC" | tee "$OUT/kernels_gpu_check.json"
[ "$TESTS_RC" -eq 0 ] && [ "$BENCH_RC" -eq 0 ]
