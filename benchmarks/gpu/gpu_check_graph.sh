#!/usr/bin/env bash
# Captured decode step device check (issue 16, build item 3), for a session lent the H200: under 8 minutes.
#   1. installs the carried wheels (.whl/) and points SURECALL_DATA at the carried tokenizers (.gpudata/);
#   2. pytest -m gpu on the graph step, the in-kernel RNG keys, the engine core and the kernels (150 s):
#      captured graph == eager step (tokens, logprobs, states, counters), no host sync on CUDA (sync debug
#      mode "error" around the static step), RNG keys derived in the kernel == the torch keys;
#   3. benchmarks/gpu/graph_step.py on random-weight Qwen2-0.5B and Llama-3.2-1B shapes (150 s each):
#      replay == static step run eagerly (bit-identical) and vs the engine's eager step, engine step time
#      eager vs graph, free vs constrained, at batch 1/16/128/512; JSON to $OUT/graph_step_*.json.
# Here first: bash benchmarks/gpu/fetch_gpu_inputs.sh   (.whl/ and .gpudata/, both git-ignored)
# Then: device run `bash benchmarks/gpu/gpu_check_graph.sh` with carry [".whl", ".gpudata"], timeout_s 540.
set -uo pipefail
cd "$(dirname "$0")/../.."
source benchmarks/gpu/gpu_env.sh  # OUT, PY, carried wheels and data, the surecall symlink tree

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/graph_gpu_device.txt"
"$PY" -c "import torch, triton, transformers; print('torch', torch.__version__, 'triton', triton.__version__, \
'transformers', transformers.__version__)" | tee -a "$OUT/graph_gpu_device.txt"
timeout 150 "$PY" -m pytest -q -m gpu -p no:cacheprovider tests/engine/test_core_graph_step.py \
  tests/kernels/test_kernels_rng_keys.py tests/engine/test_core_engine.py tests/kernels/test_kernels_gpu.py \
  --junitxml="$OUT/graph_gpu_pytest.xml" 2>&1 | tee "$OUT/graph_gpu_pytest.log"
TESTS_RC=${PIPESTATUS[0]}
BENCH_RC=0
for model in qwen2-0.5b llama3.2-1b; do
  timeout 150 "$PY" benchmarks/gpu/graph_step.py --device cuda --model "$model" --batches 1,16,128,512 --steps 16 \
    --out "$OUT/graph_step_$model.json" 2>&1 | tee -a "$OUT/graph_gpu_bench.log"
  [ "${PIPESTATUS[0]}" -eq 0 ] || BENCH_RC=1
done
mkdir -p benchmarks/results && cp "$OUT"/graph_step_*.json benchmarks/results/ 2>/dev/null
printf '{"check": "graph_gpu", "pytest_rc": %d, "bench_rc": %d}\n' "$TESTS_RC" "$BENCH_RC" | tee "$OUT/graph_gpu_check.json"
[ "$TESTS_RC" -eq 0 ] && [ "$BENCH_RC" -eq 0 ]
