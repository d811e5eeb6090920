#!/usr/bin/env bash
# Render `selfspec bench report` over the committed H200 bench records, one report per topic:
#
#     bash tools/gpu/h200_report.sh [OUT_DIR]      # default /tmp/selfspec-report
#
# OUT_DIR/ssr_paper_rows/  SmolLM2-135M and Gemma-3-270M on HumanEval, ClassEval, LongProc
#                          (benchmarks/ssr_paper_rows/records/h200/, one request at a time)
# OUT_DIR/thinker/         smollm2-thinker-v4b at natural lengths (benchmarks/thinker/records/h200/)
# Each gets report.md, summary.json and the PNG plots. The topic READMEs quote these reports'
# tables; the reports themselves are not committed (rebuilt from the records in ~20 s).
set -euo pipefail
cd "$(dirname "$0")/../.."
out=${1:-/tmp/selfspec-report}
selfspec=${SELFSPEC:-selfspec}
command -v "$selfspec" >/dev/null || selfspec=.venv/bin/selfspec
"$selfspec" bench report benchmarks/ssr_paper_rows/records/h200/*.jsonl.gz --out-dir "$out/ssr_paper_rows" > /dev/null
"$selfspec" bench report benchmarks/thinker/records/h200/*.jsonl.gz --out-dir "$out/thinker" > /dev/null
echo "reports: $out/ssr_paper_rows/report.md, $out/thinker/report.md"
