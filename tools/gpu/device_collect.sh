#!/usr/bin/env bash
# Bring a device session's queue archives into the repository (run here, after the last
# `collect` call returned its <queue>.tgz files):
#
#     bash scripts/device_collect.sh /work/.device/N session6
#
# Why: each session's results came back as one archive per queue, and filing them by hand
# (logs without progress-bar noise, bench JSONL gzipped where the next session resumes them,
# CoSpec eval journals, the arbitrator run) took a quarter of an hour and invited slips.
# What goes where:
#   logs and status            -> benchmarks/results/h200/<session>/logs/<queue>_*
#   bench JSONL (queue root or raw/) -> benchmarks/results/h200/raw/<name>.jsonl.gz (replaced:
#                                  the device run resumed from the committed file, so it holds it all)
#   arbitrator_run/            -> benchmarks/results/cospec/h200/arbitrator_run/ (replaced)
#   any other directory        -> benchmarks/results/h200/<session>/<queue>_<dir>/ (CoSpec eval
#                                  output, thinker adapters and evals: reviewed, then moved by hand)
set -euo pipefail
src=${1:?usage: device_collect.sh FILES_AT_DIR SESSION_NAME}; session=${2:?usage: device_collect.sh FILES_AT_DIR SESSION_NAME}
root=$(cd "$(dirname "$0")/.." && pwd)
dest=$root/benchmarks/results/h200/$session
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$dest/logs" "$root/benchmarks/results/h200/raw"
shopt -s nullglob
archives=("$src"/*.tgz)
[ ${#archives[@]} -gt 0 ] || { echo "device_collect: no .tgz archives in $src" >&2; exit 2; }
for archive in "${archives[@]}"; do tar xzf "$archive" -C "$work"; done
for q in "$work"/*/; do
  queue=$(basename "$q")
  [ -f "$q/status.tsv" ] && cp "$q/status.tsv" "$dest/logs/${queue}_status.tsv"
  for log in "$q"/logs/[0-9]*.log; do
    # Progress bars redraw with carriage returns: keep the lines a reader wants.
    sed 's/\r/\n/g' "$log" | grep -v -E '[0-9]+%\|.*\| *[0-9]+/[0-9]+ \[' \
      > "$dest/logs/${queue}_$(basename "$log")" || true
  done
  for f in "$q"/*.jsonl "$q"/raw/*.jsonl; do
    # An archive taken while a run appended can end in a torn line: keep whole lines only
    # (the runner writes a sample's records in one piece, so no partial sample remains).
    python3 -c 'import json, sys
keep = []
for line in open(sys.argv[1]):
    try:
        json.loads(line)
    except ValueError:
        print(f"device_collect: dropped a torn line of {sys.argv[1]}", file=sys.stderr)
        continue
    if line.endswith("\n"):
        keep.append(line)
open(sys.argv[1], "w").write("".join(keep))' "$f"
    gzip -9 -c "$f" > "$root/benchmarks/results/h200/raw/$(basename "$f").gz"
    echo "bench records: $(wc -l < "$f") lines -> benchmarks/results/h200/raw/$(basename "$f").gz"
  done
  for d in "$q"/*/; do
    name=$(basename "$d")
    case "$name" in
      logs|raw) ;;
      arbitrator_run)
        rm -rf "$root/benchmarks/results/cospec/h200/arbitrator_run"
        cp -r "$d" "$root/benchmarks/results/cospec/h200/arbitrator_run"
        echo "arbitrator run -> benchmarks/results/cospec/h200/arbitrator_run ($(ls "$d" | tr '\n' ' '))" ;;
      *)
        rm -rf "$dest/${queue}_$name"; cp -r "$d" "$dest/${queue}_$name"
        echo "$name -> benchmarks/results/h200/$session/${queue}_$name" ;;
    esac
  done
done
echo "status:"; cat "$dest"/logs/*_status.tsv | cut -f1,3,4,5 | cut -c1-150
