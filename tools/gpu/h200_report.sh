#!/usr/bin/env bash
# The running H200 benchmark report (issue 4): every committed one-request-at-a-time raw file
# (benchmarks/results/h200/raw/, bf16 since session 5) plus session 4's fp32 subset of the same
# HumanEval samples (token-exactness; the bf16 tables show near-tie divergences), rendered by
# `selfspec bench report` into benchmarks/results/h200/report/. Rerun after copying new raw
# files back from a device session. Session 3's batched (concurrency 8) files are superseded and
# left out (session4/notes.md).
set -euo pipefail
cd "$(dirname "$0")/.."
selfspec=${SELFSPEC:-selfspec}
command -v "$selfspec" >/dev/null || selfspec=.venv/bin/selfspec
"$selfspec" bench report benchmarks/results/h200/raw/*.jsonl* \
  benchmarks/results/h200/session4/raw/smollm2_humaneval_c1.jsonl.gz \
  --out-dir benchmarks/results/h200/report
