"""Mixture-of-experts blocks on the static path: a capturable form inside static forwards only.

A CUDA graph capture refuses host syncs; transformers' "eager" experts form finds the routed experts
with `nonzero` and reads them on the host, which is what kept Qwen3-Next's static shapes uncaptured.
On the CPU a dispatch mode stands in for the capture: it records every op that syncs with the host.
"""

from __future__ import annotations

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from selfspec.engine import moe
from selfspec.engine.llm_engine import Engine, EngineConfig
from selfspec.engine.sampling import SamplingParams
from selfspec.engine.static_forward import GraphBuckets
from selfspec.testing.reference import greedy_reference, random_prompts, run_to_finish
from selfspec.testing.tiny import tiny_model

VOCAB = 128
BUCKETS = GraphBuckets(batch=(1, 2), tokens=(1, 2, 4, 8), min_keys=8)
HOST_SYNCS = ("aten.nonzero", "aten._local_scalar_dense", "aten.item")


class HostSyncs(TorchDispatchMode):
    """Counts the ops that would make the host wait for the device."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if str(func).startswith(HOST_SYNCS):
            self.count += 1
        return func(*args, **(kwargs or {}))


def _moe_model():
    model = tiny_model("qwen3_next", VOCAB, seed=1, num_layers=4)
    model.config._experts_implementation = "eager"  # the form that syncs (older transformers' default)
    return model


def _engine(model, static: bool) -> Engine:
    cfg = EngineConfig(num_slots=4, max_len=96, prefill_chunk=6, static_shapes=static, graph_buckets=BUCKETS)
    return Engine(model, None, cfg, eos_token_ids=[])


def test_static_forwards_make_no_host_sync_and_restore_the_loaded_form():
    model = _moe_model()
    assert moe.experts_modules(model), "the tiny Qwen3-Next must have dispatched experts blocks"
    engine = _engine(model, static=True)
    static = engine.runner.static
    body = static._body
    syncs = []

    def watched(forward):
        with HostSyncs() as mode:
            body(forward)
        syncs.append(mode.count)

    static._body = watched
    seq = engine.add_request([3, 9, 27, 81, 5], SamplingParams(max_tokens=6))
    run_to_finish(engine, [seq])
    assert syncs and all(n == 0 for n in syncs), syncs
    assert model.config._experts_implementation == "eager"  # restored after every static body
    assert static.stats()["experts"] == {"batched_mm": len(static.forwards)}
    # The same model's eager forward does sync: the check above can fail.
    with HostSyncs() as mode, torch.no_grad():
        model(torch.tensor([[3, 9, 27, 81, 5]]))
    assert mode.count > 0


def test_static_moe_greedy_equals_generate():
    model = _moe_model()
    prompts = random_prompts([5, 13, 9], VOCAB, 2)
    engine = _engine(model, static=True)
    seqs = [engine.add_request(p, SamplingParams(max_tokens=16)) for p in prompts]
    run_to_finish(engine, seqs)
    assert engine.runner.eager_forwards == 0
    assert [s.output_ids for s in seqs] == [greedy_reference(model, p, 16) for p in prompts]


def test_form_by_step_size_and_device(monkeypatch):
    blocks = moe.experts_modules(_moe_model())
    assert moe.static_experts(blocks, 1, 1) == "batched_mm"
    assert moe.static_experts([], 1, 1) is None
    monkeypatch.setattr(moe, "BATCHED_BYTES", 0)
    # Past the gather budget: grouped_mm wants half precision on a CUDA device; an fp32 CPU model runs as loaded.
    assert moe.static_experts(blocks, 32, 64) is None
    with moe.experts_implementation(blocks, None):
        assert blocks[0].config._experts_implementation == "eager"
