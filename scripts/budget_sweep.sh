#!/usr/bin/env bash
# Speedup against draft budget (issue 4's second plot): the same samples benchmarked once per
# draft budget, every run with its own baseline, all records in one JSONL (resume keys on the
# settings, so each budget resumes on its own), then one report whose budget plot has a point
# per budget and mode.
#
#     bash scripts/budget_sweep.sh OUT_DIR "50 100 200 400 600" [selfspec bench options]
# e.g. the thinker at natural lengths on the CPU:
#     bash scripts/budget_sweep.sh benchmarks/results/cpu_budget_sweep "50 100 200 400 600" \
#       -b thinker/class_synthesis --model smollm2-thinker-v4b --limit 12 --natural --cot-cap 2500 \
#       --answer-cap 1000 --max-draft 600 --modes baseline,prefix+suffix
# Why a run per budget rather than one baseline shared by all: the report pairs each mode with
# the baseline of its own run (same settings, same place in the rotated order), and a baseline
# measured minutes apart from the mode it is paired with would carry the machine's drift.
set -euo pipefail
cd "$(dirname "$0")/.."
out_dir=${1:?usage: budget_sweep.sh OUT_DIR "BUDGETS" [bench options]}; budgets=${2:?usage: budget_sweep.sh OUT_DIR "BUDGETS" [bench options]}; shift 2
selfspec=${SELFSPEC:-selfspec}
command -v "$selfspec" >/dev/null || selfspec=.venv/bin/selfspec
mkdir -p "$out_dir"
for budget in $budgets; do
  echo "== draft budget $budget"
  "$selfspec" bench --draft-budget "$budget" --out "$out_dir/sweep.jsonl" "$@"
done
"$selfspec" bench report "$out_dir/sweep.jsonl" --out-dir "$out_dir" > /dev/null
echo "report: $out_dir/report.md"
