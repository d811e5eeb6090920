"""SSR on the pinned vLLM: output token-identical to the same vLLM without speculation.

Runs only where vLLM is installed (`make test-vllm`, its own venv). Two tiny models saved
for vLLM (head_dim 32, which its CPU attention needs): a random Qwen3 (drafts rarely match:
the mismatch paths) and a "bigram" Llama whose attention output is zeroed, so its answer
after the end-of-thinking marker does not depend on the CoT and drafts do match (accepted
prefix > 0, suffix runs). Each vLLM engine takes ~20 s to build, so they are module-scoped.
"""

from __future__ import annotations

import os

import pytest

pytest.importorskip("vllm")
pytestmark = [pytest.mark.vllm, pytest.mark.timeout(1800)]

import torch  # noqa: E402

from selfspec.engine.sampling import SamplingParams  # noqa: E402
from selfspec.integrations.vllm.engine import VLLMEngine  # noqa: E402
from selfspec.spec.ssr_core import SSRConfig  # noqa: E402
from selfspec.testing.tiny import save_tiny_model_dir  # noqa: E402
from selfspec.thinking.policy import ThinkingLimits  # noqa: E402

PROMPTS = [
    "What is 12 + 30?",
    "Write a counter class",
    "Route from A to B",
    "hello",
    "Records: name=Alice, age=30",
    "def add(a, b):",
    "Let me think step by step.",
    "The quick brown fox",
]

MODES = {
    "prefix": SSRConfig(draft_budgets=[8], max_draft_len=24, reuse="prefix"),
    "suffix": SSRConfig(draft_budgets=[8], max_draft_len=24, reuse="suffix"),
    "prefix+suffix": SSRConfig(draft_budgets=[8], max_draft_len=24),
    "iterative": SSRConfig(draft_interval=5, max_draft_len=24),
    "iterative-converge": SSRConfig(draft_interval=5, max_draft_len=24, converge_tokens=4),
}

ENGINE_ARGS = dict(
    dtype="float32", max_model_len=512, max_num_seqs=32, enforce_eager=True, kv_cache_memory_bytes=1 << 28
)
if torch.cuda.is_available():  # CUDA vLLM: several engines share one GPU, each asks for a fraction of it
    ENGINE_ARGS["gpu_memory_utilization"] = 0.1
TENSOR_PARALLEL = int(os.environ.get("SELFSPEC_VLLM_TP", "1"))
"""Every engine of these tests (and of the modules that take ENGINE_ARGS) at this tensor-parallel size: the
two-GPU queue runs them at 2, plain and SSR alike (`tools/gpu/queues/vllm_tp2.txt`)."""
if TENSOR_PARALLEL > 1:
    ENGINE_ARGS["tensor_parallel_size"] = TENSOR_PARALLEL


def _save(path, which: str):
    """The random Qwen3, or the bigram Llama (attention output zeroed)."""
    if which == "random":
        return save_tiny_model_dir(path, "qwen3", seed=3, hidden=128)
    return save_tiny_model_dir(path, "llama", seed=5, hidden=128, zero_attention=True)


@pytest.fixture(scope="module", params=["bigram", "random"])
def engines(request, tmp_path_factory):
    path = _save(tmp_path_factory.mktemp(request.param), request.param)
    base = VLLMEngine(str(path), speculation=False, **ENGINE_ARGS)
    ssr = VLLMEngine(str(path), speculation=True, num_speculative_tokens=8, **ENGINE_ARGS)
    yield request.param, base, ssr
    del base, ssr


LIMITS = ThinkingLimits(cot_cap=20, answer_cap=24)


def test_ssr_modes_match_plain_vllm(engines):
    which, base, ssr = engines
    params = SamplingParams(max_tokens=200)
    expected = base.generate(PROMPTS, params, limits=ThinkingLimits(cot_cap=20, answer_cap=24), thinking=True)
    assert all(r.answer_token_ids for r in expected)
    for name, config in MODES.items():
        got = ssr.generate(PROMPTS, params, limits=ThinkingLimits(cot_cap=20, answer_cap=24), spec=config)
        for i, (g, e) in enumerate(zip(got, expected)):
            assert g.token_ids == e.token_ids, f"{which} {name} prompt {i}: output differs from plain vLLM"
            assert g.finish_reason == e.finish_reason
            assert g.metrics["drafts"] >= 1
        if which == "bigram" and name in ("prefix", "prefix+suffix", "iterative"):
            assert sum(g.metrics["accepted_prefix"] for g in got) > 0, f"{name}: no draft token accepted"
        if which == "bigram" and name == "suffix":
            assert sum(g.metrics["suffix_accepted_tokens"] for g in got) > 0
        if which == "bigram" and name == "iterative-converge":  # the bigram's drafts agree: drafting stops
            assert any(g.metrics["drafts_converged_at"] is not None for g in got)
        if which == "bigram":
            plain_forwards = sum(e.metrics["answer_forwards"] for e in expected)
            assert sum(g.metrics["answer_forwards"] for g in got) < plain_forwards, name
    assert ssr.live_requests() == {"driver": 0, "vllm": 0, "runner": 0, "proposer": 0}


def test_model_closes_thinking_itself(engines):
    """No CoT cap: thinking ends at the model's own end marker (or the request ends thinking)."""
    which, base, ssr = engines
    params = SamplingParams(max_tokens=60)
    expected = base.generate(PROMPTS, params, thinking=True)
    got = ssr.generate(PROMPTS, params, spec=SSRConfig(draft_interval=4, max_draft_len=16))
    for i, (g, e) in enumerate(zip(got, expected)):
        assert g.token_ids == e.token_ids, f"{which} prompt {i}"
        assert g.metrics["thinking_closed_by"] == e.metrics["thinking_closed_by"]


def test_plain_driver_is_plain_vllm(engines):
    """The baseline driver adds nothing: without thinking it is one vLLM request per prompt."""
    from vllm import SamplingParams as VParams
    from vllm.sampling_params import RequestOutputKind

    which, base, _ = engines
    got = base.generate(PROMPTS[:4], SamplingParams(max_tokens=30), thinking=False)
    engine = base.engine
    for i, prompt in enumerate(PROMPTS[:4]):
        ids = base.encode_prompt(prompt, thinking=False)
        engine.add_request(
            f"raw{i}",
            {"prompt_token_ids": ids},
            VParams(max_tokens=30, temperature=0.0, output_kind=RequestOutputKind.FINAL_ONLY),
        )
    raw = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                raw[out.request_id] = list(out.outputs[0].token_ids)
    assert [raw[f"raw{i}"] for i in range(4)] == [g.token_ids for g in got]


def test_children_aborted_at_end_of_thinking_leave_nothing(engines):
    """Drafts still running when the parent ends thinking are aborted, in vLLM and the worker."""
    _, _, ssr = engines
    # A draft longer than the rest of the CoT: it is still running at the cap.
    spec = SSRConfig(draft_budgets=[4], max_draft_len=200)
    req = ssr.submit(
        PROMPTS[0], SamplingParams(max_tokens=200), spec=spec, limits=ThinkingLimits(cot_cap=12, answer_cap=8)
    )
    saw_running = False
    while not req.finished:
        saw_running = saw_running or bool(req.running)
        ssr.step()
        if req.answering and not req.finished:
            assert not req.running, "a draft outlived its parent's thinking"
    assert saw_running
    assert all(d.cancelled for d in req.schedule.drafts)
    assert ssr.live_requests() == {"driver": 0, "vllm": 0, "runner": 0, "proposer": 0}


def test_parent_cancelled_mid_draft_frees_both(engines):
    _, _, ssr = engines
    spec = SSRConfig(draft_budgets=[3], max_draft_len=200)
    req = ssr.submit(PROMPTS[1], SamplingParams(max_tokens=400), spec=spec, limits=ThinkingLimits(cot_cap=300))
    while not req.running:
        ssr.step()
    ssr.step()
    assert req.running and not req.finished
    ssr.cancel(req)
    assert req.finished and req.finish_reason == "cancelled"
    assert ssr.live_requests() == {"driver": 0, "vllm": 0, "runner": 0, "proposer": 0}
