#!/usr/bin/env bash
# Queues of long runs on the lent GPU machine that outlive the 10-minute `device` call.
#
#   source tools/gpu/device_setup.sh
#   bash tools/gpu/device_queue.sh start GPU QUEUE_FILE [QUEUE_FILE ...]
#                                                         # returns at once; runs the files' commands
#                                                         # one after another on GPU, file after file
#   bash tools/gpu/device_queue.sh collect SECONDS        # waits while queues run (at most
#                                                         # SECONDS), packing /tmp/out/<queue>/
#                                                         # into $OUT/<queue>.tgz every 20 s
#   bash tools/gpu/device_queue.sh skip QUEUE N [N ...]   # a running queue will not run its N-th
#                                                         # commands (1: the first non-comment line
#                                                         # as the file stands; a skipped one no
#                                                         # longer counts) when their turn comes;
#                                                         # one already started runs on
#
# `skip` is for a block that runs short of time: the queue reads its copy of the file a line at a
# time, so the command is turned into a comment in place, one byte for one, and the lines after it
# stay where the reader expects them.
#
# Why: a device call lasts at most 10 minutes, the machine is held for at most 30, and it is
# given back 30 s after a call ends. A queue started in its own process session (setsid)
# keeps running between calls; each following call only collects. Packing into one archive
# per queue keeps within the 8 files that come back per call, and what is packed at a
# call's timeout still comes back.
#
# QUEUE_FILE: one shell command per line (blank lines and # comments skipped), run with
# CUDA_VISIBLE_DEVICES=GPU and Q_OUT=/tmp/out/<queue name> (the file's basename without
# .txt). Each command's output goes to $Q_OUT/logs/NN.log; $Q_OUT/status.tsv records
# start, end and exit code per line; a failing command does not stop the queue.
#
# Several files given to one `start` run as a chain: the second starts when the first is done, so
# one call can set up a whole GPU block; each has its own $Q_OUT, logs and `done`.
#
# Commands run in a snapshot of the tree taken at `start` (/tmp/q_tree/<queue>, `.device`
# linked), not in the checkout: every later device call re-copies the checkout, and a command
# that starts while that copy is under way can import half-written modules
# (ModuleNotFoundError).
set -uo pipefail
root=${DEVICE_QUEUE_ROOT:-/tmp/out}  # overridable for tests
trees=${DEVICE_QUEUE_TREES:-/tmp/q_tree}
case "${1:-}" in
  start)
    gpu=$2; shift 2
    [ $# -gt 0 ] || { echo "usage: device_queue.sh start GPU QUEUE_FILE [QUEUE_FILE ...]" >&2; exit 2; }
    src=$(pwd); self=$(realpath --relative-to="$src" "$0")  # this script's place in the tree
    chain=()
    for queue in "$@"; do
      name=$(basename "$queue" .txt); qout=$root/$name; tree=$trees/$name
      mkdir -p "$qout/logs"; cp "$queue" "$qout/queue.txt"
      rm -rf "$tree"; mkdir -p "$tree"
      tar -C "$src" --exclude=./.device -cf - . | tar -C "$tree" -xf -
      [ -e "$src/.device" ] && ln -s "$src/.device" "$tree/.device"
      chain+=("$tree" "$qout")
    done
    # The chain runs the first snapshot's copy of this script: bash reads a script as it goes, and a
    # later call re-copies the checkout's.
    first_tree=${chain[0]}; first_qout=${chain[1]}
    setsid nohup bash "$first_tree/$self" _chain "$gpu" "$self" "${chain[@]}" >"$first_qout/logs/queue.log" 2>&1 < /dev/null &
    echo "device_queue: started $* on GPU $gpu (logs in $root/<queue>/logs)"
    ;;
  _chain)
    gpu=$2; self=$3; shift 3
    while [ $# -ge 2 ]; do
      (cd "$1" && bash "$self" _run "$gpu" "$2")
      shift 2
    done
    ;;
  _run)
    gpu=$2; qout=$3; n=0
    export CUDA_VISIBLE_DEVICES=$gpu Q_OUT=$qout
    export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"  # the snapshot's package before the checkout's
    while IFS= read -r line || [ -n "$line" ]; do
      [[ -z "${line// }" || "$line" =~ ^[[:space:]]*# ]] && continue
      n=$((n + 1)); log=$(printf '%s/logs/%02d.log' "$qout" "$n")
      start=$(date +%s)
      printf '%s\n' "$line" > "$log"
      bash -c "$line" >> "$log" 2>&1; rc=$?
      printf '%d\t%s\t%s\t%d\t%s\n' "$n" "$start" "$(date +%s)" "$rc" "$line" >> "$qout/status.tsv"
    done < "$qout/queue.txt"
    touch "$qout/done"
    ;;
  collect)
    limit=${2:-570}; t0=$(date +%s)
    pack() {
      for q in "$root"/*/; do
        [ -d "$q" ] || continue; name=$(basename "$q")
        tar czf "${OUT:-/tmp}/$name.tgz.tmp" -C "$root" "$name" && mv "${OUT:-/tmp}/$name.tgz.tmp" "${OUT:-/tmp}/$name.tgz"
      done
    }
    while :; do
      pack
      running=0
      for q in "$root"/*/; do [ -f "$q/queue.txt" ] && [ ! -f "$q/done" ] && running=1; done
      [ $running -eq 0 ] && break
      [ $(( $(date +%s) - t0 + 20 )) -ge "$limit" ] && break
      sleep 20
    done
    for q in "$root"/*/; do
      [ -d "$q" ] || continue
      echo "== $(basename "$q"): $([ -f "$q/done" ] && echo done || echo running)"
      [ -f "$q/status.tsv" ] && cut -f1,3,4,5 "$q/status.tsv" | cut -c1-160
      last=$(ls "$q"/logs/[0-9]*.log 2>/dev/null | tail -1); [ -n "$last" ] && tail -3 "$last" | cut -c1-300
    done
    ;;
  skip)
    name=${2:-}; shift 2 2>/dev/null || true
    file=$root/$name/queue.txt
    [ -n "$name" ] && [ -f "$file" ] && [ $# -gt 0 ] || { echo "usage: device_queue.sh skip QUEUE N [N ...]" >&2; exit 2; }
    started=$(ls "$root/$name"/logs/[0-9]*.log 2>/dev/null | wc -l)
    python3 - "$file" "$started" "$@" <<'PY'
import sys

path, started, wanted = sys.argv[1], int(sys.argv[2]), [int(n) for n in sys.argv[3:]]
data = bytearray(open(path, "rb").read())
offset, number, found = 0, 0, set()
for line in bytes(data).split(b"\n"):
    text = line.strip()
    if text and not text.startswith(b"#"):
        number += 1
        if number in wanted:
            found.add(number)
            if number <= started:
                print(f"device_queue: command {number} has started; it runs on")
            else:
                data[offset + line.index(text[:1])] = ord("#")  # one byte for one: the reader's offset holds
                print(f"device_queue: command {number} will not run: {text[:100].decode(errors='replace')}")
    offset += len(line) + 1
for n in sorted(set(wanted) - found):
    print(f"device_queue: no command {n} (the queue has {number})")
with open(path, "r+b") as fh:
    fh.write(data)
PY
    ;;
  *) echo "usage: device_queue.sh start GPU QUEUE_FILE | collect SECONDS | skip QUEUE N [N ...]" >&2; exit 2 ;;
esac
