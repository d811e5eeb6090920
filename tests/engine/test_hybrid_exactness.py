"""Hybrid linear-attention models (Qwen3.5, Qwen3-Next) and Gemma-4 text on the engine, exact.

Engine greedy must equal transformers' `generate` token for token (fp32, CPU): single prompts,
batches of different lengths sharing padded forwards, forks, rejected speculation (the
recurrent state must end as if only the accepted tokens had been fed), truncation inside and
before the last chunk, and the static-shape path. Padding must never enter a row's state.
"""

from __future__ import annotations

import pytest
import torch

from selfspec.engine.architecture import UnsupportedArchitectureError
from selfspec.engine.llm_engine import Engine, EngineConfig
from selfspec.engine.model_runner import Chunk, ModelRunner
from selfspec.engine.sampling import SamplingParams
from selfspec.engine.static_forward import GraphBuckets
from selfspec.testing.reference import ScriptedProposals, greedy_reference, random_prompts, run_to_finish
from selfspec.testing.tiny import HYBRID_FAMILIES, tiny_model

VOCAB = 128
FAMILIES = [*HYBRID_FAMILIES, "gemma4"]


def _model(family: str):
    return tiny_model(family, VOCAB, seed=1, num_layers=6 if family == "gemma4" else 4)


@pytest.fixture(scope="module", params=FAMILIES)
def model(request):
    return _model(request.param)


@pytest.fixture(scope="module")
def references(model):
    """generate's greedy continuations, cached per (prompt, n) for the module."""
    cache: dict = {}

    def reference(prompt: list[int], n: int) -> list[int]:
        key = (tuple(prompt), n)
        if key not in cache:
            cache[key] = greedy_reference(model, prompt, n)
        return cache[key]

    return reference


def prompts(lengths: list[int], seed: int = 0) -> list[list[int]]:
    return random_prompts(lengths, VOCAB, seed)


run = run_to_finish


def make_engine(model, **kw) -> Engine:
    cfg = EngineConfig(**{"num_slots": 6, "max_len": 128, **kw})
    return Engine(model, None, cfg, eos_token_ids=[])


def test_single_prompt_matches_generate(model, references):
    (prompt,) = prompts([11])
    engine = make_engine(model)
    seq = engine.add_request(prompt, SamplingParams(max_tokens=24))
    run(engine, [seq])
    assert seq.output_ids == references(prompt, 24)


def test_padded_batch_of_different_lengths_matches_generate(model, references):
    """Five prompts in shared, padded forwards (prefill pieces of different lengths in one
    forward: rows right-aligned, padding in front of the short ones)."""
    ps = prompts([3, 17, 9, 30, 1], seed=1)
    engine = make_engine(model, max_padding_ratio=100.0, prefill_chunk=12)
    seqs = [engine.add_request(p, SamplingParams(max_tokens=16 + i)) for i, p in enumerate(ps)]
    engine.step()
    assert engine.runner.forwards == 1, "the first step should run every prompt in one padded forward"
    run(engine, seqs)
    for i, (p, s) in enumerate(zip(ps, seqs)):
        assert s.output_ids == references(p, 16 + i), f"prompt {i}"


def test_fork_then_continue_equals_no_fork(model, references):
    (prompt,) = prompts([13], seed=3)
    engine = make_engine(model)
    parent = engine.add_request(prompt, SamplingParams(max_tokens=30))
    while parent.num_output_tokens < 12:
        engine.step()
    child = engine.fork(parent, params=SamplingParams(max_tokens=30 - 12))
    assert child is not None and child.slot != parent.slot
    run(engine, [parent, child])
    assert parent.output_ids == references(prompt, 30)
    assert child.token_ids[len(prompt) :] == references(prompt, 30)


@pytest.mark.parametrize("good,bad", [(0, 4), (2, 3), (5, 0)], ids=["reject-all", "accept-2-of-5", "accept-all"])
def test_rejected_speculation_leaves_the_state_exact(model, references, good, bad):
    """Verify k tokens, accept j < k, continue: the output is plain greedy's, so the recurrent
    state after each verify is the one of the accepted tokens only."""
    ps = prompts([7, 12], seed=4)
    refs = [references(p, 26) for p in ps]
    engine = make_engine(model)
    policies = [ScriptedProposals(r, good, bad, VOCAB) for p, r in zip(ps, refs)]
    seqs = [engine.add_request(p, SamplingParams(max_tokens=26), policy=pol) for p, pol in zip(ps, policies)]
    run(engine, seqs)
    for s, r, pol in zip(seqs, refs, policies):
        assert s.output_ids == r
        assert pol.accepted and all(a == good for a in pol.accepted[:-1]), pol.accepted


def test_truncate_inside_and_before_the_last_chunk(model, references):
    (prompt,) = prompts([10], seed=5)
    ref = references(prompt, 30)
    engine = make_engine(model)
    # Inside the last (verify) chunk: the state is put back from that forward's snapshots.
    seq = engine.add_request(prompt, SamplingParams(max_tokens=40), policy=ScriptedProposals(ref, 4, 0, VOCAB))
    while seq.num_output_tokens < 9:
        engine.step()
    cut = len(seq.token_ids) - 2
    engine.truncate(seq, cut)
    assert seq.num_cached == cut - 1, "a cut inside the last chunk needs no recompute"
    engine.append_forced(seq, [9, 8])
    context = list(seq.token_ids)
    seq.policy = None
    run(engine, [seq])
    assert seq.token_ids[len(context) :] == references(context, 40 - (len(context) - len(prompt)))
    # Before the last chunk: a recurrent state is recomputed from position 0 (K/V just shrink).
    seq2 = engine.add_request(prompt, SamplingParams(max_tokens=40))
    while seq2.num_output_tokens < 20:
        engine.step()
    engine.truncate(seq2, len(prompt) + 6)
    assert seq2.num_cached == (0 if engine.runner.stateful else len(prompt) + 5)
    engine.append_forced(seq2, [9, 8])
    context = ref[:6]
    run(engine, [seq2])
    full = prompt + context + [9, 8]
    assert seq2.token_ids[len(full) :] == references(full, 40 - 8)


def test_static_shapes_with_speculation_match_generate(model, references):
    ps = prompts([5, 14, 9], seed=6)
    refs = [references(p, 20) for p in ps]
    engine = make_engine(model, static_shapes=True)
    policies = [ScriptedProposals(r, 2, 2, VOCAB) for p, r in zip(ps, refs)]
    seqs = [engine.add_request(p, SamplingParams(max_tokens=20), policy=pol) for p, pol in zip(ps, policies)]
    run(engine, seqs)
    for s, r in zip(seqs, refs):
        assert s.output_ids == r
    assert engine.runner.static is not None and engine.runner.static.stats()["replays"] > 0


@pytest.mark.parametrize("family", HYBRID_FAMILIES)
def test_padding_never_enters_a_rows_state(family):
    """The same row alone and right-aligned behind padding (beside a longer row) ends with the
    same conv and recurrent state, and a row's state after a verify equals the state of a
    forward over the kept tokens only."""
    model = _model(family)
    runner = ModelRunner(model, num_slots=4, max_len=64)
    prompt = prompts([6], seed=7)[0]
    runner.run([Chunk(0, 0, prompt, 1)])
    runner.run([Chunk(1, 0, prompt, 1), Chunk(2, 0, list(range(1, 20)), 1)])
    for layer in runner.state.specs:
        assert torch.equal(runner.state.conv[layer][0], runner.state.conv[layer][1])
        torch.testing.assert_close(runner.state.recurrent[layer][0], runner.state.recurrent[layer][1])
    # A 5-token verify chunk on slot 1 (padded behind a longer row), two tokens kept.
    runner.run([Chunk(1, 6, [3, 4, 5, 6, 7], 5), Chunk(2, 19, list(range(20, 28)), 1)])
    assert runner.settle(1, 8)
    runner.run([Chunk(0, 6, [3, 4], 1)])
    for layer in runner.state.specs:
        torch.testing.assert_close(runner.state.conv[layer][0], runner.state.conv[layer][1])
        torch.testing.assert_close(runner.state.recurrent[layer][0], runner.state.recurrent[layer][1])
    assert not runner.settle(1, 5), "a position before the last chunk cannot be reached"


def test_linear_attention_models_take_the_static_path():
    """No eager fallback for linear attention: static shapes are built, and CUDA graphs are
    asked of the device like for any model (on a CPU that is an error, not a silent fallback)."""
    runner = ModelRunner(_model("qwen3_5"), num_slots=2, max_len=64, static_shapes=GraphBuckets())
    assert runner.stateful and runner.static is not None and runner.static_fallback is None
    with pytest.raises(ValueError, match="CUDA graphs need a CUDA device"):
        ModelRunner(_model("qwen3_5"), num_slots=2, max_len=64, capture_graphs=True)


def test_unsupported_architectures_fail_at_load_naming_what_is_missing():
    from transformers import AutoModelForCausalLM, MambaConfig

    mamba = AutoModelForCausalLM.from_config(
        MambaConfig(vocab_size=64, hidden_size=32, state_size=4, num_hidden_layers=2, expand=2)
    )
    with pytest.raises(
        UnsupportedArchitectureError, match=r"MambaForCausalLM.*layer 0 \(MambaMixer.*not a Gated DeltaNet"
    ):
        Engine(mamba, None, EngineConfig(num_slots=2, max_len=32), eos_token_ids=[])
    hybrid = _model("qwen3_5")
    hybrid.config.layer_types = ["chunked_attention", *hybrid.config.layer_types[1:]]
    try:
        with pytest.raises(UnsupportedArchitectureError, match=r"Qwen3_5ForCausalLM.*chunked_attention"):
            Engine(hybrid, None, EngineConfig(num_slots=2, max_len=32), eos_token_ids=[])
    finally:
        hybrid.config.layer_types = ["linear_attention", *hybrid.config.layer_types[1:]]


@pytest.mark.parametrize("family", HYBRID_FAMILIES)
def test_a_gated_deltanet_layers_fused_projection_and_preparation_equal_its_own(family):
    """One GEMM over the concatenated input projections gives each projection's output, and the
    compiled preparation (conv, activation, gates) gives the eager one's, padding columns included."""
    from selfspec.engine import linear_attention
    from selfspec.engine.fusion import fused

    model = _model(family)
    layer = next(m for m in model.modules() if linear_attention.is_gated_deltanet(m))
    torch.manual_seed(0)
    hidden = torch.randn(2, 5, model.config.hidden_size)
    separate = [linear(hidden) for linear in linear_attention._input_projections(layer)]
    assert linear_attention.fuse_layers(model, backend="aot_eager")
    assert linear_attention.fuse_layers(model, backend="aot_eager") == []  # idempotent
    with fused():
        joined = linear_attention._projected(layer, hidden)
    assert [tuple(t.shape) for t in joined] == [tuple(t.shape) for t in separate]
    for a, b in zip(joined, separate):
        torch.testing.assert_close(a, b)
    mixed, _, b, a = linear_attention._projections(layer, hidden)
    spec = linear_attention.layer_spec(layer)
    conv_cache = torch.randn(4, spec.conv_dim, spec.kernel)  # four slots; rows read slots 2 and 0
    slots, fresh = torch.tensor([2, 0]), torch.tensor([False, True])
    real = torch.tensor([[False, False, True, True, True], [True] * 5])
    args = (
        mixed, conv_cache, slots, fresh, real, layer.conv1d.weight, layer.conv1d.bias, a, b, layer.A_log, layer.dt_bias,
        (layer.key_dim, layer.key_dim, layer.value_dim), (layer.head_k_dim, layer.head_k_dim, layer.head_v_dim),
        layer.activation,
    )  # fmt: skip
    eager = linear_attention.prepare_chunk(*args)
    compiled = layer._selfspec_gdn_prepare(*args)
    for x, y in zip(compiled, eager):
        torch.testing.assert_close(x, y)
    g, beta = eager[5], eager[6]
    assert (g[0, :2] == 0).all() and (beta[0, :2] == 0).all()  # padding columns leave the state alone
    window = eager[0]  # [pad | state | tokens]: row 0 reads slot 2's state, row 1 (fresh) zeros
    assert torch.equal(window[0, :, 2 : 2 + spec.kernel], conv_cache[2].to(window.dtype))
    assert (window[1, :, : spec.kernel] == 0).all()
    # One token a row (decode, concatenated rather than gathered): [state | token] per real row.
    decode = (mixed[:, -1:], *args[1:4], real[:, -1:], *args[5:7], a[:, -1:], b[:, -1:], *args[9:])
    window = linear_attention.prepare_chunk(*decode)[0]
    states = conv_cache[[2, 0]].masked_fill(fresh.view(-1, 1, 1), 0)
    assert torch.equal(window, torch.cat([states, mixed[:, -1:].transpose(1, 2)], dim=-1))
    for x, y in zip(layer._selfspec_gdn_prepare(*decode), linear_attention.prepare_chunk(*decode)):
        torch.testing.assert_close(x, y)


@pytest.mark.parametrize("family", ["qwen3_5", "qwen3_next", pytest.param("gemma4", marks=pytest.mark.slow)])
def test_fused_pointwise_path_is_exact(family):
    """The compiled twins (norms, MLP, rotary; q/k/v and gate/up as one GEMM; a Gated DeltaNet
    layer's input projections as one GEMM, its conv and gates and its gated norm compiled) on these
    architectures, through the static path with speculation (aot_eager: no compiler needed)."""
    from selfspec.engine.fusion import compile_pointwise_modules

    model = _model(family)
    ps = prompts([6, 11], seed=8)
    refs = []
    for p in ps:
        ids = torch.tensor([p])
        with torch.inference_mode():
            out = model.generate(
                ids, attention_mask=torch.ones_like(ids), max_new_tokens=14, min_new_tokens=14, do_sample=False
            )
        refs.append(out[0, len(p) :].tolist())
    wrapped = compile_pointwise_modules(model, backend="aot_eager")
    if family in HYBRID_FAMILIES:
        assert any(w.endswith("GatedDeltaNet.in_proj+prepare") for w in wrapped)
        assert any(w.endswith("RMSNormGated") for w in wrapped)
    engine = make_engine(model, static_shapes=True, compile_pointwise=True, compile_backend="aot_eager")
    assert engine.runner.fused_pointwise
    policies = [ScriptedProposals(r, 1, 2, VOCAB) for p, r in zip(ps, refs)]
    seqs = [engine.add_request(p, SamplingParams(max_tokens=14), policy=pol) for p, pol in zip(ps, policies)]
    run(engine, seqs)
    assert [s.output_ids for s in seqs] == refs


def test_chunked_rule_gets_as_many_key_as_value_heads(monkeypatch):
    """transformers 5.17's torch chunked delta rule assumes the key heads were already repeated up
    to the value heads (5.24's repeats them itself): the engine repeats them before the call, so a
    prompt prefilled by it matches `generate` under either version."""
    import sys

    model = tiny_model("qwen3_5", 128, seed=2, num_layers=2)
    modeling = sys.modules[type(model).__module__]
    rule = modeling.torch_chunk_gated_delta_rule
    calls = []

    def strict(query, key, value, *args, **kwargs):
        calls.append((key.shape[2], value.shape[2]))
        assert key.shape[2] == value.shape[2], "key heads not repeated to the value heads"
        return rule(query, key, value, *args, **kwargs)

    (prompt,) = random_prompts([12], 128, seed=4)
    want = greedy_reference(model, prompt, 8)
    monkeypatch.setattr(modeling, "torch_chunk_gated_delta_rule", strict)
    engine = Engine(model, None, EngineConfig(num_slots=2, max_len=64), eos_token_ids=[])
    seq = engine.add_request(prompt, SamplingParams(max_tokens=8, ignore_eos=True))
    run_to_finish(engine, [seq])
    assert calls and all(k == v for k, v in calls)
    assert seq.output_ids == want


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_conv_as_a_sum_over_taps_equals_the_convolution(dtype):
    """`depthwise_conv_tail` (fusable when compiled) against the depthwise `conv1d` it replaces."""
    import torch.nn.functional as F

    from selfspec.engine.linear_attention import depthwise_conv_tail

    g = torch.Generator().manual_seed(0)
    for taps, outputs in ((4, 1), (4, 9), (2, 3), (12, 5)):
        window = torch.randn(3, 24, taps - 1 + outputs + 2, generator=g).to(dtype)
        weight, bias = torch.randn(24, taps, generator=g).to(dtype), torch.randn(24, generator=g).to(dtype)
        want = F.conv1d(window, weight.unsqueeze(1), bias, groups=24)[:, :, -outputs:]
        got = depthwise_conv_tail(window, weight, bias, outputs)
        assert got.dtype == want.dtype and got.shape == want.shape
        tol = 1e-5 if dtype == torch.float32 else 2e-2
        assert torch.allclose(got.float(), want.float(), atol=tol, rtol=tol)
        assert torch.allclose(
            depthwise_conv_tail(window, weight, None, outputs).float(),
            (want - bias.unsqueeze(-1)).float(),
            atol=4 * tol,
            rtol=tol,
        )
