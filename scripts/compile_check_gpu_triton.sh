#!/usr/bin/env bash
# Compile every launched kernel for sm_90 with the Triton version the lent GPU runs (3.6,
# ../shared/gpu/README.md), before a device call: CI and this machine run a newer Triton,
# and a kernel that compiles there may not compile on the GPU (2026-12-08: the Q8_0 word
# path's nine GPU tests failed on a Triton 3.6 compile error that 3.9 accepts, and the
# call was spent). Installs that Triton into /tmp/triton-gpu once (pip, from the package
# index) and puts it first on the path of this repo's Python; ~3 min on 2 cores.
# Usage: bash scripts/compile_check_gpu_triton.sh [pytest -k expression]
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
VERSION=${GPU_TRITON:-3.6.0}
DIR=/tmp/triton-gpu-$VERSION
if [ ! -d "$DIR/triton" ]; then
  "$PY" -m pip install -q --no-deps --target "$DIR" "triton==$VERSION"
fi
PYTHONPATH="$DIR:$PWD/src:$PWD/tests" "$PY" - <<PYEOF
import triton
assert triton.__version__ == "$VERSION", f"Triton {triton.__version__} on the path, not $VERSION"
print("Triton", triton.__version__, "from", triton.__file__)
PYEOF
PYTHONPATH="$DIR:$PWD/src:$PWD/tests" "$PY" -m pytest -q -p no:randomly -p no:cacheprovider \
  tests/kernels/test_kernels_compile_sm90.py ${1:+-k "$1"}
