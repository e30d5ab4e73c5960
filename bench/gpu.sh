#!/usr/bin/env bash
# One script for whoever has a GPU machine, at most 10 minutes in all:
#   1. the CUDA tests (tests marked gpu);
#   2. every engine path that fits one rank, on one GPU with NCCL, against the CPU reference, and the MFU of
#      GPT-2 124M in bf16 next to a plain torch loop (bench/gpu_check.py).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
export PYTHONPATH="$PWD/src:$PWD/bench${PYTHONPATH:+:$PYTHONPATH}"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader || true
status=0
timeout 180 "$PY" -m pytest -q -m gpu tests/test_nccl.py || status=1
timeout 400 "$PY" bench/gpu_check.py "$@" || status=1
exit $status
