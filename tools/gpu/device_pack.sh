#!/usr/bin/env bash
# Build the small files a device run carries in .device/pack/ (run here, once, or after
# the datasets or the tokenizer change):
#   data.tgz                   a copy of ../shared/datasets (the GPU machine has no ../shared)
#   gemma3-270m-tokenizer.tgz  Gemma-3-270M's tokenizer as this machine's transformers builds it
# Why the tokenizer: the GPU machine's transformers (5.17) builds Gemma-3's tokenizer from the
# GGUF wrongly (2.5 characters a token, no <bos>; selfspec/models/tokenizer_check.py), and the
# loader now refuses it. Saved here (5.24), it loads there and tokenizes identically; Gemma
# queue lines pass it with `--tokenizer /tmp/m/gemma3-270m-tokenizer` (tools/gpu/device_setup.sh
# unpacks it).
set -euo pipefail
cd "$(dirname "$0")/../.."
selfspec=${SELFSPEC:-selfspec}
command -v "$selfspec" >/dev/null || selfspec=.venv/bin/selfspec
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p .device/pack "$work/data"
cp -r ../shared/datasets "$work/data/datasets"
tar czf .device/pack/data.tgz -C "$work" data
"$selfspec" save-tokenizer gemma3-270m "$work/gemma3-270m-tokenizer"
tar czf .device/pack/gemma3-270m-tokenizer.tgz -C "$work" gemma3-270m-tokenizer
ls -l .device/pack
