"""The gated delta rule in the cache slots (`slot_delta_rule`) against the torch recurrence.

The kernel runs here under Triton's interpreter (`TRITON_INTERPRET=1`, CPU tensors, in a
subprocess so no other Triton kernel of the test process is interpreted): rows mapped to
scattered slots, a fresh row whose slot holds NaN, grouped heads, padding columns, a value dim
that is no multiple of the block; then inside the engine with it switched on, where every
recurrent use of the rule (decode, verify chunks, the settles' recompute) goes through it, greedy with rejected
speculation equal to `generate`. On a GPU `tools/gpu/gpu_fla_check.py` checks it layer by layer.
"""

from __future__ import annotations

import importlib.util

import pytest
import torch

from selfspec.engine import slot_delta_rule
from selfspec.testing.interpreted import run_interpreted
from selfspec.testing.ptx import compile_for_hopper

HAS_TRITON = importlib.util.find_spec("triton") is not None


@pytest.mark.skipif(not HAS_TRITON, reason="triton not installed")
def test_kernel_in_slots_matches_the_torch_recurrence_interpreted():
    result = run_interpreted(
        """
        import json, torch
        from selfspec.engine import slot_delta_rule
        from selfspec.engine.linear_attention import recurrent_rule
        gen = torch.Generator().manual_seed(0)
        B, T, Hk, H, K, V, S = 3, 6, 2, 4, 16, 40, 5
        q, k = torch.randn(B, T, Hk, K, generator=gen), torch.randn(B, T, Hk, K, generator=gen)
        v = torch.randn(B, T, H, V, generator=gen)
        g, beta = -torch.rand(B, T, H, generator=gen), torch.rand(B, T, H, generator=gen)
        g[1, :2] = 0
        beta[1, :2] = 0  # row 1: two padding columns in front
        states = torch.randn(S, H, K, V, generator=gen)
        states[4] = float("nan")  # row 2 is fresh: whatever its slot holds, it starts from zero
        # The slots as a strided view, as a static forward passes them (a column of its packed inputs).
        slots, fresh = torch.tensor([[3, 9], [0, 9], [4, 9]])[:, 0], torch.tensor([False, False, True])
        before = states.clone()
        h0 = before[slots].clone()
        h0[2] = 0
        ref_out, ref_final, ref_states = recurrent_rule(q, k, v, g, beta, h0, True)
        out, initial = slot_delta_rule.run(q, k, v, g, beta, states, slots, fresh, keep_initial=True)
        prefix = []
        for j in range(1, T + 1):  # what a settle recomputes: the state after j tokens
            _, s_j = slot_delta_rule.recurrent(q[:, :j], k[:, :j], v[:, :j], g[:, :j], beta[:, :j], h0)
            prefix.append((s_j - ref_states[j]).abs().max().item())
        unpadded = slot_delta_rule.recurrent(q[1:2, 2:], k[1:2, 2:], v[1:2, 2:], g[1:2, 2:], beta[1:2, 2:], h0[1:2])[1]
        print(json.dumps({
            "out": (out - ref_out).abs().max().item(),
            "final": (states[slots] - ref_final).abs().max().item(),
            "initial": (initial - h0).abs().max().item(),
            "prefix": max(prefix),
            "pad_kept": (states[0] - unpadded[0]).abs().max().item(),
            "other_slots_untouched": torch.equal(states[[1, 2]], before[[1, 2]]),
            "h0_untouched": not torch.equal(h0[0], states[3]),
            "out_dtype": str(out.dtype),
        }))
        """
    )
    assert result["out_dtype"] == "torch.float32"
    assert result["out"] < 1e-5 and result["final"] < 1e-5 and result["prefix"] < 1e-5, result
    assert result["initial"] == 0.0, "the kept initial state is the slot's (zero for the fresh row)"
    assert result["pad_kept"] == 0.0, "padding columns must leave the state exactly as it is"
    assert result["other_slots_untouched"] and result["h0_untouched"]


@pytest.mark.skipif(not HAS_TRITON, reason="triton not installed")
def test_prefetching_loop_gives_the_same_bits_interpreted():
    """The loop that loads token t's inputs during token t - 1 (the default) and the one that loads
    them when t starts compute the same outputs and states, bit for bit, for 1 and 7 tokens."""
    result = run_interpreted(
        """
        import json, torch
        from selfspec.engine import slot_delta_rule
        gen = torch.Generator().manual_seed(3)
        same = []
        for T in (1, 7):
            B, Hk, H, K, V, S = 2, 2, 4, 16, 40, 4
            q, k = torch.randn(B, T, Hk, K, generator=gen), torch.randn(B, T, Hk, K, generator=gen)
            v = torch.randn(B, T, H, V, generator=gen)
            g, beta = -torch.rand(B, T, H, generator=gen), torch.rand(B, T, H, generator=gen)
            states = torch.randn(S, H, K, V, generator=gen)
            slots, fresh = torch.tensor([2, 0]), torch.tensor([False, True])
            runs = []
            for prefetch in (True, False):
                slot_delta_rule.PREFETCH = prefetch
                mine = states.clone()
                out, initial = slot_delta_rule.run(q, k, v, g, beta, mine, slots, fresh, keep_initial=True)
                runs.append((out, initial, mine))
            same.append(all(torch.equal(a, b) for a, b in zip(*runs)))
        print(json.dumps({"same": same}))
        """
    )
    assert result["same"] == [True, True], result


@pytest.mark.skipif(not HAS_TRITON, reason="triton not installed")
@pytest.mark.parametrize("static", [False, True], ids=["eager", "static"])
def test_engine_with_the_rule_in_slots_matches_generate_interpreted(static):
    """Prefill pieces and verify chunks through the kernel, eager and in static forwards (the
    snapshot buffers), rollback by recompute with rejections (the settles recompute with the same
    kernel): greedy tokens equal `generate`."""
    result = run_interpreted(
        f"""
        import json, os, torch
        os.environ["SELFSPEC_SLOT_DELTA_RULE"] = "1"
        from selfspec.engine import fla_kernels, slot_delta_rule
        widths = []
        run = slot_delta_rule.run
        def counted(query, *args, **kw):
            widths.append(query.shape[1])
            return run(query, *args, **kw)
        slot_delta_rule.run = counted
        fla_kernels.applies = lambda device, dtype=None: True
        def no_fla(*args, **kw):
            raise AssertionError("fla's recurrent kernel ran where the slot kernel applies")
        fla_kernels.recurrent = no_fla
        import tests.engine.test_fla_kernels as t
        engine, seqs, refs, policies = t._speculate(t._model("qwen3_5"), 2, 3, {static}, n=10)
        print(json.dumps({{
            "equal": [s.output_ids == r for s, r in zip(seqs, refs)],
            "accepted": [p.accepted for p in policies],
            "rollback": engine.runner.state.rollback,
            "widths": sorted(set(widths)),
        }}))
        """
    )
    assert result["rollback"] == "recompute"
    assert all(result["equal"]), result
    # 6-token prefill pieces and verify chunks (8-token buckets in static forwards), 3-column
    # settles (2 accepted + the bonus).
    assert 3 in result["widths"] and max(result["widths"]) >= 6, result


def test_the_kernel_applies_only_where_fla_would_and_its_switch_is_on(monkeypatch):
    from selfspec.engine import fla_kernels

    monkeypatch.setattr(fla_kernels, "applies", lambda device, dtype=None: device.type == "cuda")
    monkeypatch.delenv(slot_delta_rule.ENV_SWITCH, raising=False)
    assert not slot_delta_rule.applies(torch.device("cpu"), torch.bfloat16)
    if slot_delta_rule.triton is not None:
        assert slot_delta_rule.applies(torch.device("cuda"), torch.bfloat16), "on by default where fla would run"
    monkeypatch.setenv(slot_delta_rule.ENV_SWITCH, "1")
    assert not slot_delta_rule.applies(torch.device("cpu"), torch.bfloat16)
    if slot_delta_rule.triton is not None:
        assert slot_delta_rule.applies(torch.device("cuda"), torch.bfloat16)
    monkeypatch.setenv(slot_delta_rule.ENV_SWITCH, "0")
    assert not slot_delta_rule.applies(torch.device("cuda"), torch.bfloat16)


def test_states_that_are_not_contiguous_float32_are_refused():
    if slot_delta_rule.triton is None:
        pytest.skip("triton not installed")
    q = torch.zeros(1, 1, 1, 4)
    v = torch.zeros(1, 1, 1, 4)
    g = torch.zeros(1, 1, 1)
    with pytest.raises(ValueError, match="contiguous float32"):
        slot_delta_rule.run(q, q, v, g, g, torch.zeros(2, 1, 4, 4, dtype=torch.bfloat16), torch.tensor([0]), g.bool())


@pytest.mark.skipif(not HAS_TRITON, reason="triton not installed")
def test_kernel_compiles_for_hopper_without_a_gpu():
    """Triton's front end and PTX back end run without a device: what the interpreter lets through
    (a loop-carried value whose type changes, a scalar mask) fails here, not on the GPU. Both token
    loops, with and without keeping the initial state, at Qwen3.5-4B's head sizes."""
    pointers = {"q": "bf16", "k": "bf16", "v": "bf16", "g": "fp32", "beta": "bf16", "out": "bf16"}
    pointers.update({"states": "fp32", "slots": "i64", "fresh": "i1", "initial": "fp32"})
    signature = {name: f"*{kind}" for name, kind in pointers.items()}
    signature.update({"scale": "fp32", "T": "i32", "slot_stride": "i32"})
    sizes = {"H": 16, "HV": 32, "K": 128, "V": 128, "BK": 128, "BV": slot_delta_rule.BLOCK_V}
    for keep_initial in (False, True):
        for prefetch in (False, True):
            constexprs = {**sizes, "KEEP_INITIAL": keep_initial, "PREFETCH": prefetch}
            assert "ptx" in compile_for_hopper(slot_delta_rule._slot_delta_rule_kernel, signature, constexprs)
