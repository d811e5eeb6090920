"""flash-linear-attention kernels in the Gated DeltaNet forward, and rollback by recompute.

Where fla's kernels run, a verify forward keeps no per-position states: it keeps the chunk's
initial state and per-token inputs, and `settle` re-runs the recurrence over the accepted prefix
(`SlotStateCache` rollback `"recompute"`). On CPU the same design runs on the torch recurrence:
it must give the very state (bitwise) and tokens the per-position snapshots gave, eager and
static (two replays of a verify shape before settle), with rejections.

fla's fused recurrent kernel itself runs here under Triton's interpreter (`TRITON_INTERPRET=1`,
CPU tensors, in a subprocess so no other Triton kernel of the test process is interpreted):
against `recurrent_rule` in fp32, and inside the engine (greedy with rejected speculation equal
to `generate`). The chunked kernel autotunes, which the interpreter cannot: it is checked on a
GPU by `tools/gpu/gpu_fla_check.py`.
"""

from __future__ import annotations

import importlib.util

import pytest
import torch

from selfspec.engine import fla_kernels, state_cache
from selfspec.engine.llm_engine import Engine, EngineConfig
from selfspec.engine.model_runner import Chunk, ModelRunner
from selfspec.engine.sampling import SamplingParams
from selfspec.engine.state_cache import LinearLayerSpec, SlotStateCache
from selfspec.engine.static_forward import GraphBuckets
from selfspec.testing.interpreted import run_interpreted
from selfspec.testing.reference import ScriptedProposals, greedy_reference, random_prompts, run_to_finish
from selfspec.testing.tiny import HYBRID_FAMILIES, tiny_model

VOCAB = 128
BUCKETS = GraphBuckets(batch=(1, 2), tokens=(1, 2, 4, 8), min_keys=8)
HAS_FLA = importlib.util.find_spec("fla") is not None


def _model(family: str):
    return tiny_model(family, VOCAB, seed=1, num_layers=4)


@pytest.fixture
def recompute(monkeypatch):
    """Every state cache built meanwhile rolls back by recompute (as on a GPU with fla)."""
    monkeypatch.setattr(state_cache, "default_rollback", lambda device=None: "recompute")


def _verify_and_settle(model, kept: list[int], **runner_kw) -> tuple[ModelRunner, list]:
    """Prefill four slots, verify a 5-token chunk on each (one forward, or two replays of a
    batch-2 shape, before any settle), settle each at `kept`, decode one token."""
    runner = ModelRunner(model, num_slots=4, max_len=64, **runner_kw)
    ps = random_prompts([5, 7, 6, 8], VOCAB, 9)
    runner.run([Chunk(s, 0, p, 1) for s, p in enumerate(ps)])
    runner.run([Chunk(s, len(p), [10 + s, 20 + s, 30 + s, 40 + s, 50 + s], 5) for s, p in enumerate(ps)])
    for s, p in enumerate(ps):
        assert runner.settle(s, len(p) + kept[s])
    step = runner.run([Chunk(s, len(p) + kept[s], [3], 1) for s, p in enumerate(ps)])
    return runner, [step.logits[s].clone() for s in range(4)]


@pytest.mark.parametrize("family", HYBRID_FAMILIES)
@pytest.mark.parametrize("static", [False, True], ids=["eager", "static"])
def test_recompute_at_settle_gives_the_snapshots_state_bitwise(family, static, monkeypatch):
    model = _model(family)
    kw = {"static_shapes": BUCKETS} if static else {}
    kept = [0, 2, 4, 5]
    runs = {}
    for mode in ("snapshots", "recompute"):
        monkeypatch.setattr(state_cache, "default_rollback", lambda device=None, m=mode: m)
        runs[mode] = _verify_and_settle(model, kept, **kw)
    (snap, snap_logits), (rec, rec_logits) = runs["snapshots"], runs["recompute"]
    assert rec.state.rollback == "recompute" and snap.state.rollback == "snapshots"
    for s in range(4):
        for layer in rec.state.specs:
            assert torch.equal(rec.state.conv[layer][s], snap.state.conv[layer][s])
            assert torch.equal(rec.state.recurrent[layer][s], snap.state.recurrent[layer][s]), (s, layer)
        assert torch.equal(rec_logits[s], snap_logits[s])
    if static:
        assert rec.eager_forwards == 0 and not rec.state.recurrent_snapshots, "recompute keeps no per-position states"
        assert rec.static.snapshot_forwards[(2, 8, 16)].replays == 2, "two replays of the verify shape before settle"


def _speculate(model, good: int, bad: int, static: bool, n: int = 18):
    ps = random_prompts([7, 12, 4], VOCAB, 4)
    refs = [greedy_reference(model, p, n) for p in ps]
    cfg = EngineConfig(num_slots=4, max_len=96, prefill_chunk=6, static_shapes=static, graph_buckets=BUCKETS)
    engine = Engine(model, None, cfg, eos_token_ids=[])
    policies = [ScriptedProposals(r, good, bad, VOCAB) for r in refs]
    seqs = [engine.add_request(p, SamplingParams(max_tokens=n), policy=pol) for p, pol in zip(ps, policies)]
    run_to_finish(engine, seqs)
    return engine, seqs, refs, policies


@pytest.mark.parametrize("static", [False, True], ids=["eager", "static"])
@pytest.mark.parametrize("good,bad", [(0, 3), (2, 3)], ids=["reject-all", "accept-2-of-5"])
def test_speculation_with_recompute_rollback_matches_generate(recompute, static, good, bad):
    model = _model("qwen3_5")
    engine, seqs, refs, policies = _speculate(model, good, bad, static)
    assert engine.runner.state.rollback == "recompute"
    for s, r, pol in zip(seqs, refs, policies):
        assert s.output_ids == r
        assert pol.accepted and all(a == good for a in pol.accepted[:-1]), pol.accepted


def test_recompute_buffers_are_what_sizing_counts_and_far_smaller(recompute):
    runner = ModelRunner(_model("qwen3_5"), num_slots=2, max_len=64, static_shapes=BUCKETS)
    runner.warm_up_graphs([1], [4], 16)
    state = runner.state
    buffers = [state.conv_snapshots, state.initial_snapshots, state.input_snapshots, state.gate_snapshots]
    held = sum(t.numel() * t.element_size() for b in buffers for t in b.values())
    assert held == 3 * SlotStateCache.snapshot_bytes_per_slot(state.specs, state.dtype, 8, "recompute")
    # Qwen3.5-4B's linear layers (24 of them), 16 verify tokens, bf16: what a slot holds for rollback.
    spec = LinearLayerSpec(conv_dim=2 * 16 * 128 + 32 * 128, kernel=4, heads=32, k_dim=128, v_dim=128)
    layers = {i: spec for i in range(24)}
    snap = SlotStateCache.snapshot_bytes_per_slot(layers, torch.bfloat16, 16, "snapshots")
    rec = SlotStateCache.snapshot_bytes_per_slot(layers, torch.bfloat16, 16, "recompute")
    assert snap > 10 * rec, (snap, rec)


def test_a_verify_under_recompute_must_pass_its_inputs(recompute):
    cache = SlotStateCache({0: LinearLayerSpec(12, 4, 2, 2, 2)}, num_slots=2, dtype=torch.float32, device="cpu")
    cache.prepare_step([0], [0], [3], 3, snapshots=True)
    with pytest.raises(RuntimeError, match="must pass its chunk's inputs"):
        cache.write(0, torch.zeros(1, 12, 7), None, torch.zeros(1, 2, 2, 2))


def test_fla_is_resolved_from_the_switch_the_device_and_the_import(monkeypatch):
    monkeypatch.setenv(fla_kernels.ENV_SWITCH, "0")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert fla_kernels._resolve() == (False, "SELFSPEC_FLA=0")
    monkeypatch.delenv(fla_kernels.ENV_SWITCH)
    monkeypatch.setattr(fla_kernels, "load", lambda: (_ for _ in ()).throw(ImportError("no fla")))
    usable, reason = fla_kernels._resolve()
    assert not usable and "pip install selfspec[fla]" in reason
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert fla_kernels._resolve() == (False, "no CUDA device")
    # This machine: no CUDA, so the engine runs the torch path and keeps per-position snapshots.
    assert not fla_kernels.applies(torch.device("cpu"))
    assert state_cache.default_rollback("cpu") == "snapshots"
    # Where fla runs, an fp32 model still keeps the torch path (Triton's dots round fp32 to TF32).
    monkeypatch.setattr(fla_kernels, "USABLE", True)
    assert fla_kernels.applies(torch.device("cuda"), torch.bfloat16)
    assert not fla_kernels.applies(torch.device("cuda"), torch.float32)
    assert not fla_kernels.applies(torch.device("cpu"), torch.bfloat16)


@pytest.mark.skipif(not HAS_FLA, reason="fla-core not installed (pip install selfspec[fla])")
def test_fla_fused_recurrent_kernel_matches_recurrent_rule_interpreted():
    """Grouped heads (2 key heads, 4 value heads), a padded row (decay 0, beta 0 in front), and
    the prefix re-run `settle` does: the kernel's state after j tokens is the reference's S_j."""
    result = run_interpreted(
        """
        import json, torch
        from selfspec.engine import fla_kernels
        from selfspec.engine.linear_attention import recurrent_rule
        kernel = fla_kernels.load()[0]
        gen = torch.Generator().manual_seed(0)
        B, T, Hk, H, K, V = 2, 6, 2, 4, 16, 8
        q, k = torch.randn(B, T, Hk, K, generator=gen), torch.randn(B, T, Hk, K, generator=gen)
        v = torch.randn(B, T, H, V, generator=gen)
        g = -torch.rand(B, T, H, generator=gen)
        beta = torch.rand(B, T, H, generator=gen)
        g[1, :2] = 0
        beta[1, :2] = 0  # row 1: two padding columns
        h0 = torch.randn(B, H, K, V, generator=gen)
        out, final = fla_kernels.recurrent(q, k, v, g, beta, h0, kernel=kernel)
        ref_out, ref_final, states = recurrent_rule(q, k, v, g, beta, h0, True)
        prefix = []
        for j in range(T + 1):
            _, s_j = fla_kernels.recurrent(q[:, :j], k[:, :j], v[:, :j], g[:, :j], beta[:, :j], h0, kernel=kernel)
            prefix.append((s_j - states[j]).abs().max().item())
        print(json.dumps({
            "out": (out - ref_out).abs().max().item(),
            "final": (final - ref_final).abs().max().item(),
            "prefix": max(prefix),
            "pad_kept": (final[1] - fla_kernels.recurrent(q[1:, 2:], k[1:, 2:], v[1:, 2:], g[1:, 2:],
                         beta[1:, 2:], h0[1:], kernel=kernel)[1][0]).abs().max().item(),
            "dtype": str(final.dtype),
        }))
        """
    )
    assert result["dtype"] == "torch.float32"
    assert result["out"] < 1e-5 and result["final"] < 1e-5 and result["prefix"] < 1e-5, result
    assert result["pad_kept"] == 0.0, "padding columns must leave the state exactly as it is"


@pytest.mark.skipif(not HAS_FLA, reason="fla-core not installed (pip install selfspec[fla])")
def test_engine_on_the_fla_path_matches_generate_interpreted():
    """The engine's forward dispatching to fla with the slot kernel off (decode, prefill
    pieces and verify chunks through fla's fused recurrent kernel over gathered states,
    interpreted on CPU), rollback by recompute with rejections: greedy tokens equal
    transformers' `generate` in fp32."""
    result = run_interpreted(
        """
        import json, os, torch
        os.environ["SELFSPEC_SLOT_DELTA_RULE"] = "0"
        from selfspec.engine import fla_kernels
        kernel = fla_kernels.load()[0]
        calls = []
        def recurrent(*args, **kw):
            calls.append(args[0].shape[1])
            return fla_kernels.__dict__["_recurrent"](*args, kernel=kernel)
        fla_kernels._recurrent = fla_kernels.recurrent
        fla_kernels.recurrent = recurrent
        fla_kernels.applies = lambda device, dtype=None: True
        import tests.engine.test_fla_kernels as t
        engine, seqs, refs, policies = t._speculate(t._model("qwen3_5"), 2, 3, False, n=10)
        print(json.dumps({
            "equal": [s.output_ids == r for s, r in zip(seqs, refs)],
            "accepted": [p.accepted for p in policies],
            "rollback": engine.runner.state.rollback,
            "widths": sorted(set(calls)),
        }))
        """
    )
    assert result["rollback"] == "recompute"
    assert all(result["equal"]), result
    # 6-token verify chunks (the last token and 5 proposals), 3-column settles (2 accepted + the bonus).
    assert result["widths"] == [3, 6], "verify chunks and the settles' recompute ran the kernel"
