#!/usr/bin/env bash
# Engine device check (issue 5), for a session that is lent the H200: about 5 minutes, run once.
#   1. installs the carried wheels (.whl/) and points SURECALL_DATA at the carried tokenizers (.gpudata/);
#   2. makes `surecall` importable without pip (a symlink tree, as benchmarks/gpu/gpu_check.sh does);
#   3. pytest -m gpu on the engine: CUDA-graph replay == the same static step run eagerly, graphs in the
#      decode loop, seeded rows batch-independent on CUDA;
#   4. benchmarks/e2e.py on random-weight Qwen2-0.5B and Llama-3.2-1B shapes, batch 1/16/128, CUDA graphs on
#      (auto) and, for Qwen2, off: writes e2e_cuda_*.json/.md to benchmarks/results and $OUT.
# Here first: bash benchmarks/gpu/fetch_gpu_inputs.sh
# Then: device run `bash benchmarks/gpu/gpu_check_engine.sh` with carry [".whl", ".gpudata"], timeout_s 420.
set -uo pipefail
cd "$(dirname "$0")/../.."
source benchmarks/gpu/gpu_env.sh  # OUT, PY, carried wheels and data, the surecall symlink tree

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/engine_gpu_device.txt"
timeout 150 "$PY" -m pytest -q -m gpu tests/engine/test_engine_decode.py tests/engine/test_core_engine.py -p no:cacheprovider \
  --junitxml="$OUT/engine_gpu_pytest.xml" 2>&1 | tee "$OUT/engine_gpu_pytest.log"
TESTS_RC=${PIPESTATUS[0]}
BENCH_RC=0
for model in qwen2-0.5b llama3.2-1b; do
  timeout 140 "$PY" benchmarks/e2e.py --device cuda --model "$model" --batches 1,16,128 --max-tokens 64 \
    --out "benchmarks/results/e2e_cuda_$model" 2>&1 | tee -a "$OUT/engine_gpu_bench.log"
  [ "${PIPESTATUS[0]}" -eq 0 ] || BENCH_RC=1
done
cp benchmarks/results/e2e_cuda_*.json "$OUT/" 2>/dev/null
printf '{"check": "engine_gpu", "pytest_rc": %d, "bench_rc": %d}\n' "$TESTS_RC" "$BENCH_RC" | tee "$OUT/engine_gpu_check.json"
[ "$TESTS_RC" -eq 0 ] && [ "$BENCH_RC" -eq 0 ]
