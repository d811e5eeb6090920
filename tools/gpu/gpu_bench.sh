#!/usr/bin/env bash
# One resumable slice of an H200 benchmark run, on the lent GPU machine:
#     source tools/gpu/device_setup.sh && bash tools/gpu/gpu_bench.sh MODEL BENCH OFFSET LIMIT [more bench options]
# e.g.  bash tools/gpu/gpu_bench.sh smollm2 humaneval 0 32 --modes baseline,prefix+suffix,suffix-decoding,prompt-lookup
#
# Records go to $BENCH_RAW_DIR/<file> (a queue line sets BENCH_RAW_DIR=$Q_OUT/raw, which
# device_queue.sh packs), else to the records directory itself. <file> is $BENCH_FILE, else
# <model>_<bench with / as ->.jsonl. Before the run, the committed records of the same name
# ($BENCH_RECORDS/<file>.gz; BENCH_RECORDS defaults to benchmarks/ssr_paper_rows/records/h200,
# the thinker's runs use benchmarks/thinker/records/h200) are unpacked there, so `--resume`
# skips every sample already measured; `tools/gpu/device_collect.sh` files the result back
# under the same name.
#
# Fixed here, because they decide what the numbers mean (benchmarks/ssr_paper_rows/README.md):
# - bf16, the dtype the models are served in. In fp32 SSR's batch-2 drafting steps cost ~28%
#   more than a decode step against ~6% in bf16, and a step costs 2.2 ms instead of 1.3.
#   `--dtype float32` after these options overrides it (the fp32 subset shows token-exactness
#   where bf16 near-ties could flip).
# - one request at a time (--concurrency 1): with 8 HumanEval samples in one batch the
#   per-request speedups came out smaller (prompt lookup 1.432x vs 2.118x alone on the same
#   samples), so batched runs do not measure what a user waiting on one request gets.
# Paper-row lengths (CoT 2000, draft at 500, <= 500 draft tokens, answer cap per benchmark)
# are the CLI defaults; the options after LIMIT override any of these.
set -euo pipefail
model=$1; bench=$2; offset=$3; limit=$4; shift 4
records=${BENCH_RECORDS:-benchmarks/ssr_paper_rows/records/h200}
name=$(basename "$model"); file=${BENCH_FILE:-${name}_${bench//\//-}.jsonl}
out=${BENCH_RAW_DIR:-$records}/$file
mkdir -p "$(dirname "$out")"
if [ ! -f "$out" ] && [ -f "$records/$file.gz" ]; then zcat "$records/$file.gz" > "$out"; fi
python3 -m selfspec.cli.main bench -b "$bench" --model "$model" --device cuda --dtype bfloat16 \
  --concurrency 1 --offset "$offset" --limit "$limit" --score --out "$out" "$@"
if [ -n "${OUT:-}" ]; then cp "$out" "$OUT/"; fi
