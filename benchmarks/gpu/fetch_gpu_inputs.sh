#!/usr/bin/env bash
# Prepare what the GPU image lacks, here, before a device check (issues 4 and 5):
#   .whl/      wheels for Python 3.12 x86-64: outlines-core, xgrammar, pydantic, jsonschema-rs, rfc8785, and the
#              outlines peer (outlines + its needs the image lacks)
#   .gpudata/  the tokenizer folders the engine GPU tests and benchmark use (qwen2, llama3, mistral-v0.3)
# Both folders are git-ignored and travel with `carry: [".whl", ".gpudata"]`. Run once: bash benchmarks/gpu/fetch_gpu_inputs.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
DATA="${SURECALL_DATA:-../shared/data}"
PY="${PYTHON:-.venv/bin/python}"
mkdir -p .whl .gpudata/tokenizers
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64 \
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .whl \
  xgrammar==0.2.9 apache-tvm-ffi==0.1.15.post2 outlines-core==0.2.14 pydantic==2.14.4 pydantic_core==2.50.5 \
  annotated-types==0.8.0 typing-inspection==0.4.5 typing_extensions==4.16.0 jsonschema-rs rfc8785 \
  outlines==1.3.3 genson==1.4.0 diskcache==5.6.3 jsonschema==4.26.0 jsonschema-specifications==2025.9.1 \
  referencing==0.37.0 rpds-py==2026.9.1
for name in qwen2 llama3 mistral-v0.3; do cp -r "$DATA/tokenizers/$name" .gpudata/tokenizers/; done
cp "$DATA/tokenizers/manifest.json" .gpudata/tokenizers/
du -sh .whl .gpudata
