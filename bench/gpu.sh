#!/usr/bin/env bash
# For whoever has a GPU machine (under 5 minutes): the CUDA tests, then tokens/s and MFU of gpt2() on one GPU.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader || true
timeout 240 "$PY" -m pytest -q -m gpu tests/
timeout 120 "$PY" bench/gpu_throughput.py
