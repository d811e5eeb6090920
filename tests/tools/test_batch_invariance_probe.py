"""tools/gpu/gpu_batch_invariance.py's probe on a tiny fp32 model on CPU: decode steps and
verify chunks give the same logits (the engine's fp32 exactness), and the probe's bookkeeping
lines positions up. On the GPU the same probe measures bf16 (benchmarks/exactness/README.md)."""

from __future__ import annotations

from selfspec.engine.config import EngineConfig
from selfspec.llm import LLM
from selfspec.testing.tiny import tiny_model, tiny_tokenizer


def test_decode_and_verify_logits_agree_in_fp32(repo_script):
    tokenizer = tiny_tokenizer()
    llm = LLM.from_model(
        tiny_model("llama", len(tokenizer)), tokenizer, engine_config=EngineConfig(num_slots=2, max_len=512)
    )
    result = repo_script("tools/gpu/gpu_batch_invariance.py").probe(llm, tokens=40, sizes=[8])
    assert result["all"]["positions"] == 39 and result["first_disagreement"] is None
    assert result["all"]["argmax_agree"] == 1.0 and result["all"]["max_abs_diff"] < 1e-4
    assert list(result["by_position"]) == ["0-511"]
    assert list(result["by_forward_size"]) == ["7", "8"]  # 39 positions: four chunks of 8, one of 7


def test_cycled_chunk_sizes_with_a_companion_sequence_line_up(repo_script):
    """Mixed verify sizes (one per token bucket) beside a second decoding sequence, SSR's shape."""
    script = repo_script("tools/gpu/gpu_batch_invariance.py")
    tokenizer = tiny_tokenizer()
    llm = LLM.from_model(
        tiny_model("llama", len(tokenizer)), tokenizer, engine_config=EngineConfig(num_slots=3, max_len=512)
    )
    result = script.probe(llm, tokens=60, sizes=script.chunk_sizes("1,6,11,20"), companion=True)
    assert result["all"]["positions"] == 59 and result["first_disagreement"] is None
    assert result["all"]["max_abs_diff"] < 1e-4
    assert sum(part["positions"] for part in result["by_forward_size"].values()) == 59
    assert {"1", "6", "11", "20"} <= set(result["by_forward_size"])


def test_chunk_sizes_rejects_nonsense(repo_script):
    import pytest

    with pytest.raises(ValueError, match="positive sizes"):
        repo_script("tools/gpu/gpu_batch_invariance.py").chunk_sizes("0,4")
