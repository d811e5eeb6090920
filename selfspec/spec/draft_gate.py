"""Whether an SSR draft can pay on this device, at this load, from measured step costs.

A draft is one more row in every step while it runs. It costs the batch the extra row
(`row_cost`, a fraction of a step, paid by every request in the step: `rows` of them) on each of
its steps, and a draft writes `draft_steps` steps per token (below 1: with its own speculation a
draft writes several tokens a step). What it saves is answer time, and not against plain
decoding: without the draft the answer would still be speculated by copying (prompt lookup over
prompt + CoT), which commits several tokens a step wherever the answer restates its CoT, and the
tokens a draft gets right are mostly those. So the gate prices a draft token at `saving`: the
answer steps drafts saved against the copy path, per draft token written, over this LLM's
finished requests. Each finished request replays prompt lookup over its own answer
(`copy_steps`: greedy decoding makes the answer the one the copy path would have produced, so the
count is exact up to the per-step length rule) and records that count less the answer steps it
took. A draft pays when

    saving > margin * rows * row_cost * draft_steps

Before anything is recorded, `saving` is its prior, the acceptance prior times a decode step
less a verified token's cost (`verify_cost`; what a draft saves against plain decoding), and
`draft_steps` is 1; both move to the record as it grows (weighted like `SAVING_PRIOR_TOKENS`
draft tokens), so on a workload whose drafts do not beat copying the gate stops forking them,
all but one fork in `EXPLORE_EVERY`, which keeps the record current.
The acceptance itself (draft tokens the answers took / written) is kept for the prior and the
reports. Before the
extra row has ever been measured, the draft is forked as a probe and re-judged once it has run
`gate_probe_steps` steps: a device where a second row is expensive (a CPU on a slow BLAS path)
then loses a few steps, not the whole draft.

The gate only decides whether to fork and when to cancel; every token the parent commits is
still verified, so outputs are unchanged by it.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import asdict, dataclass, replace
from typing import TYPE_CHECKING, Sequence

if TYPE_CHECKING:
    from selfspec.engine.step_costs import StepCosts
    from selfspec.spec.ssr_core import SSRConfig

PRIOR_WEIGHT_TOKENS = 256
"""The acceptance prior counts as this many draft tokens against the measured history: a
couple of requests' drafts move the estimate, one short draft does not."""
SAVING_PRIOR_TOKENS = 64
"""The saving's prior counts as this many draft tokens. Lighter than the acceptance's: the prior
(what a draft saves against plain decoding) is known to overstate the saving wherever the copy path
copies, so one or two requests' measured savings should outweigh it."""
EXPLORE_EVERY = 16
"""After this many forks the gate declined in a row on one LLM, the next is forked anyway: a
declined draft records nothing, and without a probe a workload that changed would never be
measured again."""

VERIFY_COST_PRIOR = 0.25
"""Fraction of a decode step per verified token before any long verify was measured: a
64-token chunk at 16 decode steps, pessimistic for a GPU (~0.02) and for this CPU (~0.1)."""


@dataclass(frozen=True)
class GateVerdict:
    """One decision: fork (or keep) the draft or not, and the figures it rested on."""

    action: str  # "fork", "probe" (fork, costs unknown), "explore" (fork, declined too often), "skip", "cancel", "keep"
    cot_tokens: int
    rows: int
    row_cost: float | None
    verify_cost: float
    acceptance: float
    reason: str
    saving: float = 0.0  # answer steps a draft token saves against the copy path
    draft_steps: float = 1.0  # forwards a draft runs per token it writes

    @property
    def drafts(self) -> bool:
        return self.action in ("fork", "probe", "explore", "keep")


COPY_TOKENS = 32
"""Prompt lookup's longest copy in `copy_steps` (auto's copy path proposes up to as many)."""

ANSWER_LENGTHS_KEPT = 32
"""Recent answer lengths the draft length cap looks at."""
CAP_MIN_ANSWERS = 4
"""Answers recorded before their lengths cap a draft (before that, `max_draft_len` alone)."""
CAP_SLACK = 1.25
"""A draft may run to this many times the longest recent answer (+ `CAP_MIN_TOKENS`)."""
CAP_MIN_TOKENS = 32


def copy_steps(context: Sequence[int], answer: Sequence[int], max_tokens: int = COPY_TOKENS) -> int:
    """Forwards prompt lookup (`NgramProposer`) takes to produce `answer` after `context` when
    every forward verifies its whole copy: each step commits the copy's longest prefix that
    matches `answer`, plus the model's own token."""
    from selfspec.spec.ngram import NgramProposer

    proposer = NgramProposer(num_tokens=max_tokens)
    tokens = list(context)
    steps = pos = 0
    while pos < len(answer):
        copy = proposer.propose(tokens, max_tokens).tokens
        agreed = 0
        for a, b in zip(copy, answer[pos:]):
            if a != b:
                break
            agreed += 1
        take = min(agreed + 1, len(answer) - pos)
        tokens.extend(answer[pos : pos + take])
        pos += take
        steps += 1
    return steps


class AcceptanceHistory:
    """Over one LLM's finished SSR requests (one per LLM: the model, its tasks and its prompts
    decide how well drafts match): draft tokens written and those the answers used; answer tokens
    and the forwards the copy path would have taken for them; the recent answers' lengths."""

    def __init__(self) -> None:
        self.drafted = 0
        self.accepted = 0
        self.requests = 0
        self.answer_tokens = 0
        self.copy_steps = 0
        self.answer_lengths: deque[int] = deque(maxlen=ANSWER_LENGTHS_KEPT)
        self._length_cap: int | None = None  # draft_length_cap's figure until the next answer is recorded
        self.priced_drafted = 0  # draft tokens of the requests whose saving was counted
        self.saved_steps = 0  # their answer steps saved against the copy path (may be negative)
        self.draft_forwards = 0  # forwards their drafts ran
        self.declined_in_a_row = 0  # forks the gate declined since it last let one through

    def record(
        self,
        drafted: int,
        accepted: int,
        *,
        answer_tokens: int = 0,
        copy_steps: int | None = None,
        answer_steps: int | None = None,
        draft_forwards: int = 0,
    ) -> None:
        """One finished request: `accepted` of its `drafted` draft tokens became answer tokens
        (prefix-accepted plus suffix-accepted, at most `drafted`: suffix decoding can reuse a
        draft's tokens, but the gate prices each written token once), its drafts ran
        `draft_forwards` forwards; its answer of `answer_tokens` tokens took `answer_steps`
        forwards and would have taken `copy_steps` on the copy path (None: not counted)."""
        if answer_tokens > 0:
            self.answer_lengths.append(answer_tokens)
            self._length_cap = None
            if copy_steps is not None:
                self.answer_tokens += answer_tokens
                self.copy_steps += min(max(1, copy_steps), answer_tokens)
        if drafted <= 0:
            return
        if copy_steps is not None and answer_steps is not None:
            self.priced_drafted += drafted
            self.saved_steps += copy_steps - answer_steps
            self.draft_forwards += max(0, draft_forwards)
        self.drafted += drafted
        self.accepted += min(max(0, accepted), drafted)
        self.requests += 1

    def estimate(self, prior: float, weight: int = PRIOR_WEIGHT_TOKENS) -> float:
        """The expected accepted fraction: the prior, as `weight` tokens, blended with the record."""
        return (self.accepted + prior * weight) / (self.drafted + weight)

    def saving(self, prior: float, weight: int = SAVING_PRIOR_TOKENS) -> float:
        """Answer steps saved against the copy path per draft token written, the prior as `weight`
        draft tokens blended with the record."""
        return (self.saved_steps + prior * weight) / (self.priced_drafted + weight)

    def draft_steps(self, weight: int = SAVING_PRIOR_TOKENS) -> float:
        """Forwards a draft runs per token it writes (1.0 before any was recorded)."""
        return (self.draft_forwards + weight) / (self.priced_drafted + weight)

    def draft_length_cap(self) -> int | None:
        """Draft tokens worth writing: past the longest recent answer (with slack) a draft's
        tokens are not verified. None until `CAP_MIN_ANSWERS` answers were recorded."""
        if self._length_cap is None and len(self.answer_lengths) >= CAP_MIN_ANSWERS:
            # Asked on every step a draft runs: the maximum is taken once per recorded answer.
            self._length_cap = math.ceil(CAP_SLACK * max(self.answer_lengths)) + CAP_MIN_TOKENS
        return self._length_cap


class DraftGate:
    """Judges each fork and each running draft of one request (see the module docstring)."""

    def __init__(self, config: "SSRConfig", history: AcceptanceHistory | None = None) -> None:
        self.prior = config.gate_acceptance
        self.history = history
        self.acceptance = self.prior  # the estimate the last verdict used
        self.margin = config.gate_margin
        self.probe_steps = config.gate_probe_steps
        self.verdicts: list[GateVerdict] = []
        self._next_check = 0  # draft length at which the running draft is judged again
        self._failed_checks = 0  # consecutive checks of the running draft that said it cannot pay
        self._exploring = False  # the running draft was forked to measure, not because it pays

    def before_fork(self, costs: "StepCosts | None", rows: int, cot_tokens: int, other_drafts: int = 0) -> GateVerdict:
        """Fork a draft now, beside `rows` rows that are no draft (this request's included) and
        `other_drafts` other requests' drafts? After `EXPLORE_EVERY` declined forks in a row on
        this LLM, one is forked anyway ("explore")."""
        verdict = self._judge(costs, rows, cot_tokens, other_drafts, when_unknown="probe", when_pays="fork")
        history = self.history
        if history is not None:
            if verdict.action != "skip":
                history.declined_in_a_row = 0
            elif history.declined_in_a_row + 1 >= EXPLORE_EVERY:
                history.declined_in_a_row = 0
                verdict = replace(verdict, action="explore", reason=f"explore: {verdict.reason}")
            else:
                history.declined_in_a_row += 1
        self._exploring = verdict.action == "explore"  # an explored draft runs to its end: it is a measurement
        self.verdicts.append(verdict)
        self._next_check = self.probe_steps
        return verdict

    def judge(self, costs: "StepCosts | None", rows: int, cot_tokens: int = 0, other_drafts: int = 0) -> GateVerdict:
        """What `before_fork` would decide now, recording nothing and counting no decline."""
        return self._judge(costs, rows, cot_tokens, other_drafts, when_unknown="probe", when_pays="fork")

    def due(self, draft_tokens: int) -> bool:
        """Whether `while_drafting` would judge a running draft of `draft_tokens` tokens now (the
        caller measures the step costs only then: it runs on every step of a drafting request)."""
        return not self._exploring and draft_tokens >= self._next_check

    def while_drafting(
        self, costs: "StepCosts | None", rows: int, cot_tokens: int, draft_tokens: int, other_drafts: int = 0
    ) -> GateVerdict | None:
        """Re-judge a running draft every `probe_steps` of its tokens (`rows` excludes it and every
        other draft, `other_drafts` counts the other requests' ones).
        Returns a verdict when one was made, None between checks (and for an explored draft)."""
        if not self.due(draft_tokens):
            return None
        self._next_check = draft_tokens + self.probe_steps
        verdict = self._judge(costs, rows, cot_tokens, other_drafts, when_unknown="keep", when_pays="keep")
        if verdict.action == "cancel":
            # A cancelled draft is lost work, and one window of a busy machine (another process
            # taking a core) can make any row look dear: cancel on the second failing check in a row.
            self._failed_checks += 1
            if self._failed_checks < 2:
                return None
        else:
            self._failed_checks = 0
        if verdict.action != "keep" or not any(v.action == "keep" for v in self.verdicts):
            self.verdicts.append(verdict)  # the first confirmation and the cancellation
        return verdict

    def _judge(
        self,
        costs: "StepCosts | None",
        rows: int,
        cot_tokens: int,
        other_drafts: int,
        *,
        when_unknown: str,
        when_pays: str,
    ) -> GateVerdict:
        rows = max(1, rows)
        history = self.history
        self.acceptance = a = history.estimate(self.prior) if history is not None else self.prior
        row_cost = _draft_row_cost(costs, rows, max(0, other_drafts))
        measured_verify = costs.verify_token_cost() if costs is not None else None
        verify_cost = min(1.0, measured_verify if measured_verify is not None else VERIFY_COST_PRIOR)
        prior_saving = a * (1.0 - verify_cost)
        saving = history.saving(prior_saving) if history is not None else prior_saving
        steps = history.draft_steps() if history is not None else 1.0
        figures = (cot_tokens, rows, row_cost, verify_cost, a)
        if row_cost is None:
            return GateVerdict(when_unknown, *figures, "extra row not measured yet", saving, steps)
        cost = self.margin * rows * row_cost * steps
        text = (
            f"an extra row costs {row_cost:.1%} of a step x {rows} row(s) x {steps:.2f} draft steps per token; "
            f"a draft token saves {saving:.3f} of a step against the copy path (acceptance {a:.2f})"
        )
        if saving > cost:
            return GateVerdict(when_pays, *figures, text, saving, steps)
        action = "skip" if when_pays == "fork" else "cancel"
        return GateVerdict(action, *figures, f"cannot pay: {text}", saving, steps)

    def draft_length_cap(self) -> int | None:
        """The draft length past which its tokens would not be verified (`AcceptanceHistory`)."""
        return self.history.draft_length_cap() if self.history is not None else None

    def report(self) -> list[dict]:
        """Every decision, in order, as plain dicts (for the request's metrics)."""
        return [asdict(v) for v in self.verdicts]


def drafts_cannot_pay(
    config: "SSRConfig", history: AcceptanceHistory | None, costs: "StepCosts | None", rows: int
) -> GateVerdict | None:
    """The gate's verdict that no draft of a request starting now can pay (None: one may, or it
    is this LLM's turn to measure again). A caller that then runs the request without drafting
    machinery counts it as a declined fork, so after `EXPLORE_EVERY` declines in a row the next
    request drafts again and its first fork is forked to measure ("explore"): the record stays
    current when the workload changes. Only for the cost gate; None without measured costs."""
    if config.gate != "cost" or costs is None:
        return None
    verdict = DraftGate(config, history).judge(costs, rows)
    if verdict.action != "skip":
        return None
    if history is not None:
        if history.declined_in_a_row + 1 >= EXPLORE_EVERY:
            return None  # left at the threshold: the request's own gate explores its first fork
        history.declined_in_a_row += 1
    return verdict


def _draft_row_cost(costs: "StepCosts | None", rows: int, other_drafts: int) -> float | None:
    """A draft row's share of what the drafts add to a step of `rows` rows that are no draft:
    every running draft (the other requests' and this one) pays alike. Priced at its marginal
    row, a draft beside others that already crossed a batch bucket would look free, and drafts
    would pile up in the dearer bucket, each one declined alone. Where the no-draft shape is
    unmeasured (drafts have run all along), the marginal row at the current size."""
    if costs is None:
        return None
    shared = costs.row_cost(rows, other_drafts + 1)
    if shared is None and other_drafts > 0:
        shared = costs.row_cost(rows + other_drafts)
    return shared
