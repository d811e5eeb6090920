#!/usr/bin/env bash
# The wheels tools/gpu/queues/fla_check.txt installs on the GPU machine (torch 2.11, transformers 5.17, triton; no
# registry): fla-core 0.6.0 and its one requirement einops (pure Python) in the ignored .device/fla/, and, if
# .device/tf/ holds none yet, transformers 5.24 (Qwen3.5's modeling; its requirements are in the image) in .device/tf/.
# Usage, from the repository root: bash tools/gpu/fla_wheels.sh   (then carry .device/fla and .device/tf)
set -euo pipefail
PIP="${PIP:-python3 -m pip}"
mkdir -p .device/fla .device/tf
$PIP download --no-deps --only-binary=:all: -d .device/fla fla-core==0.6.0 einops==0.8.2
if ! ls .device/tf/*.whl >/dev/null 2>&1; then
    $PIP download --no-deps --only-binary=:all: -d .device/tf transformers==5.24.0
fi
ls -l .device/fla .device/tf
