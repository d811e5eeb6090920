"""SSR under tensor parallel 2 on vLLM's CPU backend: each rank runs its own proposer from the
plan every rank receives with the request; the output must stay plain vLLM's (TP=1).

vLLM's CPU backend binds each rank's OpenMP threads to a NUMA node by default and refuses two
ranks on one node; `VLLM_CPU_OMP_THREADS_BIND="0|1"` binds them to one core each instead.
"""

from __future__ import annotations

import os

import pytest

pytest.importorskip("vllm")
pytestmark = [pytest.mark.vllm, pytest.mark.timeout(900)]

from selfspec.engine.sampling import SamplingParams  # noqa: E402
from selfspec.integrations.vllm.engine import VLLMEngine  # noqa: E402
from selfspec.spec.ssr_core import SSRConfig  # noqa: E402
from selfspec.thinking.policy import ThinkingLimits  # noqa: E402

from .test_vllm_ssr import ENGINE_ARGS, PROMPTS, _save  # noqa: E402


def test_tensor_parallel_2_matches_plain(tmp_path, monkeypatch):
    if (os.cpu_count() or 1) < 2:
        pytest.skip("TP=2 binds one core per rank")
    monkeypatch.setenv("VLLM_CPU_OMP_THREADS_BIND", "0|1")
    path = str(_save(tmp_path / "bigram", "bigram"))
    params = SamplingParams(max_tokens=200)
    base = VLLMEngine(path, speculation=False, **ENGINE_ARGS)
    expected = base.generate(PROMPTS, params, limits=ThinkingLimits(cot_cap=20, answer_cap=24), thinking=True)
    del base
    ssr = VLLMEngine(path, speculation=True, num_speculative_tokens=8, **{**ENGINE_ARGS, "tensor_parallel_size": 2})
    got = ssr.generate(
        PROMPTS,
        params,
        limits=ThinkingLimits(cot_cap=20, answer_cap=24),
        spec=SSRConfig(draft_budgets=[8], max_draft_len=24),
    )
    assert [g.token_ids for g in got] == [e.token_ids for e in expected]
    assert sum(g.metrics["accepted_prefix"] for g in got) > 0
