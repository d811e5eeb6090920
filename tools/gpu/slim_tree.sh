#!/usr/bin/env bash
# Take the packaged weights a GPU block does not need out of the working tree, and put them back.
#
#   bash tools/gpu/slim_tree.sh out smollm2-thinker-v5 smollm2-thinker-v6   # keep only these
#   bash tools/gpu/slim_tree.sh out --records __none__                      # no weights, no bench records
#   bash tools/gpu/slim_tree.sh in                                          # every file back
#
# Why: a device call carries the whole working tree beside its `carry` paths, at most 64 MiB, and the
# tracked adapters and drafts (~9.8 MB each) are most of the tree: with them, one 16 MB model part fits
# per call; without the unneeded ones, two. Files are only deleted from the working tree, never from
# git: each is marked skip-worktree first, so `git status` stays clean and a `git commit -a` during
# the block cannot record the deletion. `in` clears the marks and restores the files. `--records` also takes
# the committed benchmark records (~20 MB) out: a call that carries one of vLLM's ~49 MiB wheel parts
# needs the tree at a few MB, and what it runs reads no records.
set -euo pipefail
weights() { git ls-files 'packages/selfspec-weights/*.safetensors' 'benchmarks/cospec/*.safetensors'; }
records() { git ls-files 'benchmarks/*/records/*'; }
hide() { git update-index --skip-worktree -- "$1" && rm -f -- "$1" && echo "slim_tree: out $1"; }
case "${1:-}" in
  out)
    shift
    with_records=0; [ "${1:-}" = --records ] && { with_records=1; shift; }
    [ $# -gt 0 ] || { echo "usage: slim_tree.sh out [--records] NAME... (the adapter or draft directories to keep)" >&2; exit 2; }
    weights | while IFS= read -r f; do
      keep=0
      for name in "$@"; do [ "$(basename "$(dirname "$f")")" = "$name" ] && keep=1; done
      [ $keep -eq 1 ] && continue
      hide "$f"
    done
    if [ $with_records -eq 1 ]; then  # ~900 files: one git call, not one per file
      records | xargs -r -d '\n' git update-index --skip-worktree --
      records | xargs -r -d '\n' rm -f --
      echo "slim_tree: out $(records | wc -l) record files"
    fi
    ;;
  in)
    weights | while IFS= read -r f; do
      git update-index --no-skip-worktree -- "$f"
      [ -f "$f" ] || { git checkout -- "$f" && echo "slim_tree: back $f"; }
    done
    records | xargs -r -d '\n' git update-index --no-skip-worktree --
    records | xargs -r -d '\n' git checkout --
    ;;
  *) echo "usage: slim_tree.sh out [--records] NAME... | in" >&2; exit 2 ;;
esac
