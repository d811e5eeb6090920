"""CPU linears as `W @ x.T`: the same outputs as `nn.Linear`, only inside the runner's forwards."""

from __future__ import annotations

import pytest
import torch

from selfspec.engine import cpu_linear
from selfspec.engine.cpu_linear import plain_linears, weight_major_linear, weight_major_linears
from selfspec.engine.fusion import compile_pointwise_modules
from selfspec.engine.llm_engine import Engine, EngineConfig
from selfspec.engine.sampling import SamplingParams
from selfspec.testing.tiny import tiny_model


@pytest.mark.parametrize("rows", [1, 2, 3, 8, cpu_linear.MAX_ROWS + 1])
@pytest.mark.parametrize("bias", [False, True])
def test_weight_major_linear_matches_f_linear(rows, bias):
    torch.manual_seed(0)
    lin = torch.nn.Linear(24, 40, bias=bias)
    x = torch.randn(rows, 1, 24)
    got = weight_major_linear(x, lin.weight, lin.bias)
    assert got.shape == (rows, 1, 40) and got.is_contiguous()
    torch.testing.assert_close(got, lin(x), rtol=1e-5, atol=1e-5)


def test_every_plain_linear_is_swapped_and_restored():
    model = tiny_model("qwen3", 96)
    linears = plain_linears(model)
    head = model.get_output_embeddings()
    assert head in linears and len(linears) == 1 + 7 * model.config.num_hidden_layers
    hidden = torch.randn(3, 2, head.in_features)
    want = torch.nn.functional.linear(hidden, head.weight, head.bias)
    with weight_major_linears(linears):
        assert all("forward" in vars(m) for m in linears)
        torch.testing.assert_close(head(hidden), want, rtol=1e-5, atol=1e-5)
    assert not any("forward" in vars(m) for m in linears)  # outside, transformers' own forward runs
    torch.testing.assert_close(head(hidden), want, rtol=0, atol=0)


def test_fused_projections_keep_their_route():
    model = tiny_model("llama", 96, num_layers=1)
    compile_pointwise_modules(model, backend="aot_eager")
    attn = model.model.layers[0].self_attn
    fused_q = vars(attn.q_proj)["forward"]
    linears = plain_linears(model)
    assert attn.q_proj not in linears
    with weight_major_linears(linears):
        assert vars(attn.q_proj)["forward"] is fused_q
    assert vars(attn.q_proj)["forward"] is fused_q


def test_engine_uses_it_on_cpu_and_env_turns_it_off(monkeypatch):
    model = tiny_model("llama", 96, num_layers=2)
    on = Engine(model, None, EngineConfig(num_slots=2, max_len=64), eos_token_ids=[])
    assert on.runner.cpu_linears
    monkeypatch.setenv(cpu_linear.ENV, "0")
    off = Engine(model, None, EngineConfig(num_slots=2, max_len=64), eos_token_ids=[])
    assert not off.runner.cpu_linears
    outputs = []
    for engine in (on, off):
        seqs = [engine.add_request([5, 9, 13 + i], SamplingParams(max_tokens=12)) for i in range(2)]
        while not all(s.is_finished for s in seqs):
            engine.step()
        outputs.append([s.output_ids for s in seqs])
    assert outputs[0] == outputs[1]


@pytest.mark.parametrize("threads", [1, 2])
def test_a_lone_row_matches_on_one_thread_and_several(threads):
    torch.manual_seed(1)
    lin = torch.nn.Linear(32, 48)
    x = torch.randn(1, 1, 32)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        got = weight_major_linear(x, lin.weight, lin.bias)
    finally:
        torch.set_num_threads(before)
    assert got.shape == (1, 1, 48)
    torch.testing.assert_close(got, lin(x), rtol=1e-5, atol=1e-5)
