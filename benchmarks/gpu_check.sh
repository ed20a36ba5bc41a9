#!/usr/bin/env bash
# One command for the GPU: the CUDA tests and one GPU benchmark row (see benchmarks/gpu_check.py).
# Usage: bash benchmarks/gpu_check.sh [--out DIR] [more gpu_check.py options]; PYTHON=... picks the interpreter.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -z "${PYTHON:-}" ]; then
    if [ -x .venv/bin/python ]; then PYTHON=.venv/bin/python; else PYTHON=python3; fi
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
exec "$PYTHON" benchmarks/gpu_check.py "$@"
