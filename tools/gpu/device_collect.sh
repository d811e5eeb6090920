#!/usr/bin/env bash
# File the queue archives a device run returned (run here, after the last `collect` call
# returned its <queue>.tgz files):
#
#     bash tools/gpu/device_collect.sh /work/.device/N [LABEL]
#
# Why: results come back as one archive per queue; filing them by hand (bench records
# gzipped where the next run resumes them, logs without progress-bar noise, the rest kept
# for review) is slow and invites slips. What goes where:
#   bench JSONL (queue root or raw/) -> the committed benchmarks/<topic>/records/<device>/<name>.jsonl.gz
#                                  of the same name, replaced (the device run resumed from that
#                                  file, so it holds it all); a name not committed anywhere goes
#                                  to $RECORDS_DIR if set, else to the review folder below
#   logs and status.tsv         -> .device/collected/<LABEL>/logs/<queue>_*   (not tracked)
#   any other directory         -> .device/collected/<LABEL>/<queue>_<dir>/   (not tracked: CoSpec
#                                  runs, thinker adapters and evals, diagnostics; review them,
#                                  then move what is kept into its topic's records/ by hand)
# LABEL defaults to the date and time.
set -euo pipefail
src=${1:?usage: device_collect.sh FILES_AT_DIR [LABEL]}
label=${2:-$(date +%Y-%m-%d-%H%M%S)}
root=$(cd "$(dirname "$0")/../.." && pwd)
review=$root/.device/collected/$label
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$review/logs"
shopt -s nullglob
archives=("$src"/*.tgz)
[ ${#archives[@]} -gt 0 ] || { echo "device_collect: no .tgz archives in $src" >&2; exit 2; }
for archive in "${archives[@]}"; do tar xzf "$archive" -C "$work"; done
for q in "$work"/*/; do
  queue=$(basename "$q")
  [ -f "$q/status.tsv" ] && cp "$q/status.tsv" "$review/logs/${queue}_status.tsv"
  for log in "$q"/logs/[0-9]*.log; do
    # Progress bars redraw with carriage returns: keep the lines a reader wants.
    sed 's/\r/\n/g' "$log" | grep -v -E '[0-9]+%\|.*\| *[0-9]+/[0-9]+ \[' \
      > "$review/logs/${queue}_$(basename "$log")" || true
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
    name=$(basename "$f").gz
    committed=("$root"/benchmarks/*/records/*/"$name")
    if [ ${#committed[@]} -gt 1 ]; then
      echo "device_collect: $name is committed more than once (${committed[*]}); left in $review" >&2
      dest=$review/records/$name
    elif [ ${#committed[@]} -eq 1 ]; then
      dest=${committed[0]}
    elif [ -n "${RECORDS_DIR:-}" ]; then
      dest=$RECORDS_DIR/$name
    else
      dest=$review/records/$name
    fi
    mkdir -p "$(dirname "$dest")"
    gzip -9 -n -c "$f" > "$dest"
    echo "bench records: $(wc -l < "$f") lines -> ${dest#"$root"/}"
  done
  for d in "$q"/*/; do
    name=$(basename "$d")
    case "$name" in
      logs|raw) ;;
      *) rm -rf "$review/${queue}_$name"; cp -r "$d" "$review/${queue}_$name"
         echo "$name -> ${review#"$root"/}/${queue}_$name (review, then move what is kept)" ;;
    esac
  done
done
echo "status:"; cat "$review"/logs/*_status.tsv 2>/dev/null | cut -f1,3,4,5 | cut -c1-150
