"""tools/gpu/gpu_logit_trace.py on a tiny fp32 model on the CPU, every step in one static shape: every
run of every lossless mode computes the baseline's bits (logits at every position, K/V at every position and layer), and the
comparison finds a difference where one is planted. On the H200 the same script locates where bf16
runs part (benchmarks/exactness/README.md)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import torch

from selfspec.engine.config import EngineConfig
from selfspec.engine.static_forward import GraphBuckets
from selfspec.llm import LLM
from selfspec.models import load_model
from selfspec.testing.tiny import save_tiny_model_dir
from selfspec_bench.datasets import load_benchmark
from selfspec_bench.modes import BenchSettings


def _script():
    path = Path(__file__).resolve().parents[2] / "tools/gpu/gpu_logit_trace.py"
    spec = importlib.util.spec_from_file_location("gpu_logit_trace", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is built
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def traced(tmp_path_factory):
    script = _script()
    model_dir = save_tiny_model_dir(tmp_path_factory.mktemp("trace") / "m", "qwen3")
    # Every step in one static shape (16 tokens, one key length), as the H200's probe found its shapes:
    # then runs may differ only through the state they leave in the cache, which is what the script
    # looks for. (Eager CPU forwards of other lengths round differently even in fp32.)
    config = EngineConfig(
        num_slots=4, max_len=512, static_shapes=True, graph_buckets=GraphBuckets(tokens=(16,), min_keys=512)
    )
    llm = LLM.from_loaded(load_model(str(model_dir)), engine_config=config)
    sample = load_benchmark("humaneval", limit=1)[0]
    settings = BenchSettings(cot_cap=40, answer_cap=30, draft_budget=12, max_draft_len=12)
    runs = ["baseline", "suffix-decoding", "prefix+suffix", "prompt-lookup", "baseline"]
    return script, script.trace_runs(llm, sample, runs, settings)


@pytest.fixture(scope="module")
def repo_script_module():
    return _script()


def test_fp32_runs_compute_the_baselines_bits_everywhere(traced):
    _, result = traced
    assert [r["mode"] for r in result["runs"]] == [
        "baseline",
        "suffix-decoding",
        "prefix+suffix",
        "prompt-lookup",
        "baseline",
    ]
    assert len({r["output_hash"] for r in result["runs"]}) == 1
    for r in result["runs"]:
        assert r["slot"] >= 0 and r["self_inconsistency"] is None and r["new_compiled_graphs"] == 0
        assert r["new_static_shapes"] == 0  # the bench warm-up built (on a CPU: ran) every shape the runs meet
    for c in result["against_first"]:
        assert c["token_divergence"] is None
        assert c["first_logits_difference"] is None, c
        assert c["first_kv_difference"] is None, c


def _trace(script, mode, tokens, rows, kv):
    t = script.RunTrace(mode, slot=0, tokens=tokens, prompt_len=2)
    t.rows = rows
    t.writes = [(0, 0, tokens[:-1], "1x1")]
    t.kv = kv
    return t


def test_compare_finds_the_first_logits_and_kv_difference(repo_script_module):
    script = repo_script_module
    tokens = [5, 6, 7, 8, 9, 10]
    kv_a = (torch.zeros(3, 5, dtype=torch.int64), torch.zeros(3, 5, dtype=torch.int64))
    kv_b = (kv_a[0].clone(), kv_a[1].clone())
    kv_b[1][2, 3] = 1  # layer 2's values at position 3
    # One decode row per position in the baseline; the other run scores positions 2-4 in one
    # verify chunk (plus a rejected token, position 5, whose row is not on the true context).
    rows_a = [(0, p, [tokens[p]], "1x1", [100 + p], [tokens[p + 1]], [1.0]) for p in range(1, 5)]
    rows_b = [
        (0, 1, [tokens[1]], "1x1", [101], [7], [1.0]),
        (0, 2, [7, 8, 9, 99], "1x4", [102, 999, 104, 5], [8, 9, 10, 3], [1.0, 0.1, 1.0, 1.0]),
    ]
    a = _trace(script, "baseline", tokens, rows_a, kv_a)
    b = _trace(script, "prompt-lookup", tokens, rows_b, kv_b)
    c = script.compare(a, b)
    assert c["token_divergence"] is None
    assert c["first_logits_difference"]["position"] == 3 and c["first_logits_difference"]["other_shape"] == "1x4"
    assert c["first_logits_difference"]["output_index"] == 2
    kv = c["first_kv_difference"]
    assert kv["position"] == 3 and kv["first_layer"] == 2 and kv["values_differ"] and not kv["keys_differ"]
    assert script.compare(a, a)["first_kv_difference"] is None


def test_rows_scored_twice_with_other_bits_are_reported(repo_script_module):
    script = repo_script_module
    tokens = [1, 2, 3, 4]
    rows = [(0, 1, [2], "1x1", [11], [3], [1.0]), (0, 1, [2, 3], "1x2", [12, 13], [3, 4], [1.0, 1.0])]
    t = _trace(script, "suffix-decoding", tokens, rows, None)
    assert script.self_inconsistency(t) == {"position": 1, "output_index": 0, "shapes": ["1x1", "1x2"]}


def test_fingerprint_tells_one_bit_apart(repo_script_module):
    x = torch.randn(3, 1000, dtype=torch.bfloat16)
    y = x.clone()
    y.view(torch.int16)[1, 500] ^= 1  # the last mantissa bit of one element
    fx, fy = repo_script_module.fingerprint(x), repo_script_module.fingerprint(y)
    assert fx[0] == fy[0] and fx[2] == fy[2] and fx[1] != fy[1]
