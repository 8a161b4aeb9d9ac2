#!/usr/bin/env bash
# Stage the wheel kit for the lent H200 (no network there) into .whl/ (git-ignored; carry it:
# run(..., carry=[".whl"])). The shared kit (../shared/gpu/stage-wheels.sh) lacks two of our
# dependencies, fetched here for its Python 3.12: llguidance (runtime: structured output,
# imported by xinfer.sampling) and jsonschema with its dependencies (the server tests).
# scripts/gpu_run.sh installs whatever .whl/ holds.
set -euo pipefail
cd "$(dirname "$0")/.."
../shared/gpu/stage-wheels.sh >/dev/null
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
  --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux_2_28_x86_64 -d .whl \
  llguidance jsonschema attrs jsonschema-specifications referencing rpds-py
ls .whl | wc -l | xargs echo "wheels in .whl:"
