#!/usr/bin/env bash
# The wheels `selfspec serve` needs on the GPU machine (its image has anyio, h11, httpx, click, prometheus-client,
# rich, typer; no registry): fastapi, starlette and uvicorn as this checkout's .venv tests them, and what fastapi
# 0.165 imports that the image lacks (opentelemetry-api, importlib-metadata). pydantic comes from .device/whl.
# Usage, from the repository root: bash tools/gpu/server_wheels.sh   (then carry .device/srv; ~0.5 MB)
set -euo pipefail
PIP="${PIP:-python3 -m pip}"
mkdir -p .device/srv
$PIP download --no-deps --only-binary=:all: -d .device/srv fastapi==0.165.0 starlette==1.10.0 uvicorn==0.55.0 \
    opentelemetry-api==1.45.3 importlib-metadata==10.2.0
ls -l .device/srv
