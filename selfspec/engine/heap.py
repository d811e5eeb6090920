"""Keep the garbage collector's full passes off a GPU engine's steps: freeze what it was built with.

Why: a process that imported torch, transformers and Triton and built an engine tracks ~0.4 M
container objects (428,130 with the SmolLM2 thinker loaded on the CPU here), and a full
(oldest-generation) collection walks every one of them: 200-250 ms measured here, landing
in the middle of whichever step allocated past the threshold. On an H100 one bench request
spent 0.48 s between two forwards where every other request spent under 0.07 s in all. What
lives as long as the engine (modules, compiled and captured graphs, imported code) never
becomes garbage, so it is moved into the permanent generation no collection visits
(`gc.freeze()`, as vLLM's engine core does after start-up); what requests allocate is
collected as before. Frozen objects are not freed while frozen: each freeze first thaws what
an earlier one froze and collects, so an engine dropped since (a script that builds several in
turn) is freed at the next engine's construction or warm-up. Only for engines on a GPU, where
a step is milliseconds and a stall is a user waiting; a CPU process (tests, the demo) keeps the
default collector. `SELFSPEC_GC_FREEZE=0` turns it off.
"""

from __future__ import annotations

import gc
import os

import torch

ENV = "SELFSPEC_GC_FREEZE"


def freeze_long_lived(device: torch.device) -> bool:
    """After building or warming up an engine on `device`: thaw what an earlier call froze,
    collect what is garbage now, then freeze everything else. Returns whether it froze (a GPU
    device, not switched off)."""
    if device.type != "cuda" or os.environ.get(ENV, "1").strip() == "0":
        return False
    gc.unfreeze()
    gc.collect()
    gc.freeze()
    return True
