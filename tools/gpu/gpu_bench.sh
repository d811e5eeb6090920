#!/usr/bin/env bash
# One resumable slice of the H200 benchmark (issue 4), run on the lent GPU machine:
#     source scripts/device_setup.sh && bash scripts/gpu_bench.sh MODEL BENCH OFFSET LIMIT [more bench options]
# e.g.  bash scripts/gpu_bench.sh smollm2 humaneval 0 32 --modes baseline,prefix+suffix,suffix-decoding,prompt-lookup
# Records append to benchmarks/results/h200/raw/<model>_<bench>.jsonl (resume skips what is
# there) and a copy goes to $OUT; copy it back into the same path here before the next slice,
# so the next call carries it. Paper-row settings (CoT 2000, draft at 500, <= 500 draft
# tokens, answer cap per benchmark) are the CLI defaults. bf16, the dtype models are served
# in (since session 5): in fp32 SSR's batch-2 drafting steps cost ~28% more than a decode
# step against ~6% in bf16 (verifies look dearer too), which penalised the speculative
# modes, and a step costs 2.2 ms instead of 1.3. bf16 GEMM kernels
# change with the batch shape, so lossless modes can leave the baseline's tokens after a
# near-tie: the report's exact-match column shows how often; fp32 subsets (--dtype float32,
# session 4's 8 HumanEval samples) show token-exactness. One request at a time
# (--concurrency 1): with 8 samples in one batch the per-request speedups came out smaller
# (prompt lookup 1.43x vs 2.12x alone on the same 8 HumanEval samples, session 4:
# benchmarks/results/h200/session4/notes.md), so batched runs do not measure what a user
# waiting on one request gets. A later --concurrency or --dtype overrides these.
set -euo pipefail
model=$1; bench=$2; offset=$3; limit=$4; shift 4
# BENCH_RAW_DIR: write the records elsewhere (a device queue's output dir); a file of the
# same name under benchmarks/results/h200/raw/ is copied there first so the run resumes.
# BENCH_FILE: the records' file name instead of <model>_<bench>.jsonl (e.g. a rerun kept beside
# an older file, which the report then overrides record by record: the last input wins).
name=$(basename "$model"); file=${BENCH_FILE:-${name}_${bench//\//-}.jsonl}
out=${BENCH_RAW_DIR:-benchmarks/results/h200/raw}/$file
mkdir -p "$(dirname "$out")"
# Committed raw files may be gzipped (the tree travels to the GPU machine every call).
if [ ! -f "$out" ] && [ -f "benchmarks/results/h200/raw/$file" ]; then cp "benchmarks/results/h200/raw/$file" "$out"; fi
if [ ! -f "$out" ] && [ -f "benchmarks/results/h200/raw/$file.gz" ]; then zcat "benchmarks/results/h200/raw/$file.gz" > "$out"; fi
python3 -m selfspec.cli.main bench -b "$bench" --model "$model" --device cuda --dtype bfloat16 \
  --concurrency 1 --offset "$offset" --limit "$limit" --score --out "$out" "$@"
if [ -n "${OUT:-}" ]; then cp "$out" "$OUT/"; fi
