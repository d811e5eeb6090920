"""SSR's thinking phase, for both backends (this package's engine and vLLM): fork a draft at each
budget, cancel superseded drafts, judge running ones (the cost gate, early convergence), and stop
at the close. It acts through a `ssr_core.DraftBackend` and sees no model or cache."""

from __future__ import annotations

from typing import Any, Callable

from selfspec.spec.draft_gate import AcceptanceHistory, DraftGate
from selfspec.spec.ssr_core import Draft, DraftBackend, SSRConfig


def _measured(backend: DraftBackend) -> tuple[Any, int, int]:
    """The backend's (step costs, rows that are no draft, other requests' running drafts);
    (None, 1, 0) if it measures nothing."""
    step_costs = getattr(backend, "step_costs", None)
    measured = step_costs() if step_costs is not None else None
    return measured if measured is not None else (None, 1, 0)


class DraftSchedule:
    """The thinking phase: fork at each budget, cancel superseded drafts, stop at the close."""

    def __init__(
        self, config: SSRConfig, cot_cap: int | None, thinking: bool, history: AcceptanceHistory | None = None
    ) -> None:
        self.config = config
        self.budgets = config.budgets_up_to(cot_cap) if thinking else []
        self.drafts: list[Draft] = []
        self.fork_failures = 0
        self.converged_at: int | None = None  # CoT length at which two drafts agreed (converge_tokens)
        self.gate = DraftGate(config, history) if config.gate == "cost" else None
        # Running drafts are watched every CoT step: by the gate, and for an early convergence.
        self._early = config.converge_early and config.converge_tokens is not None
        self._watch = self.gate is not None or self._early
        self._pending_pair = False  # two newest drafts not yet judged against each other (`_settle_pair`)

    def wants_step(self, cot_tokens: int, running: Callable[[Draft], bool]) -> bool:
        """Whether `on_cot` has anything to do at `cot_tokens`: a budget reached, or a draft still
        running (`running`, the backend's `draft_running`) that the gate or `converge_early`
        judges every step. Asked every CoT step before the backend `on_cot` needs is built, so a
        parent with nothing pending pays a comparison, not a backend and a gate."""
        if self.budgets and cot_tokens >= self.budgets[0]:
            return True
        if self._watch:
            for draft in self.drafts:
                if running(draft):
                    return True
        return False

    def on_cot(self, cot_tokens: int, anchor: list[int], backend: DraftBackend) -> None:
        """The parent has `cot_tokens` CoT tokens and still thinks: fork every budget reached
        (with the cost gate: where a draft pays, and cancel a running one that does not)."""
        if self._watch:
            self._watch_running(cot_tokens, backend)
        while self.budgets and cot_tokens >= self.budgets[0]:
            self.budgets.pop(0)
            if self._converged():
                self.converged_at = cot_tokens
                self.budgets = []
                break
            if self.gate is not None:
                costs, rows, others = _measured(backend)
                if not self.gate.before_fork(costs, rows, cot_tokens, other_drafts=others).drafts:
                    continue
            self.fork(cot_tokens, anchor, backend)

    def _converged(self) -> bool:
        """The two newest drafts (the newest may still run) agree on their first `converge_tokens`."""
        n = self.config.converge_tokens
        if n is None or len(self.drafts) < 2:
            return False
        older, newer = self.drafts[-2].tokens, self.drafts[-1].tokens
        return len(older) >= n and len(newer) >= n and older[:n] == newer[:n]

    def _watch_running(self, cot_tokens: int, backend: DraftBackend) -> None:
        running = [d for d in self.drafts if backend.draft_running(d)]
        if not running:
            return
        if self._pending_pair:
            if self._settle_pair(cot_tokens, backend):
                return
            running = [d for d in running if backend.draft_running(d)]  # the pair's verdict may cancel one
        if self.gate is None or not running:
            return
        newest = running[-1]
        cap = self.gate.draft_length_cap()
        if cap is not None and len(newest.tokens) >= cap:
            # Longer than any answer this LLM has given lately: the rest would not be verified.
            self.cancel_running(backend, f"draft gate: {len(newest.tokens)} tokens, past this LLM's answers")
            return
        if not self.gate.due(len(newest.tokens)):
            return
        costs, rows, others = _measured(backend)
        verdict = self.gate.while_drafting(costs, rows, cot_tokens, len(newest.tokens), other_drafts=others)
        if verdict is not None and not verdict.drafts:
            # The device cannot carry a draft at this load: no later budget would do better.
            self.cancel_running(backend, f"draft gate: {verdict.reason}")
            self.budgets = []

    def _settle_pair(self, cot_tokens: int, backend: DraftBackend) -> bool:
        """`converge_early`: judge the two newest drafts once each has written `converge_tokens`
        tokens or ended. Agreeing, the newer one is a repeat: cancelled, dropped, and no later draft
        forked, the older one running on to the answer's end. Differing, the newer one stands and
        the older is cancelled. Returns whether drafting has converged."""
        n = self.config.converge_tokens
        older, newer = self.drafts[-2], self.drafts[-1]
        older_running, newer_running = backend.draft_running(older), backend.draft_running(newer)
        if (len(older.tokens) < n and older_running) or (len(newer.tokens) < n and newer_running):
            return False  # not enough said yet
        self._pending_pair = False
        if self._converged():
            newer.dropped = True
            if newer_running:
                newer.cancelled = True
                backend.cancel_draft(newer, "converged: repeats the draft before it")
            self.converged_at = cot_tokens
            self.budgets = []
            return True
        if older_running:
            older.cancelled = True
            backend.cancel_draft(older, "superseded by a newer draft")
        return False

    def fork(self, cot_tokens: int, anchor: list[int], backend: DraftBackend) -> Draft | None:
        if self.config.cancel_older_drafts:
            # With `converge_early` the newest draft runs on beside the new one until their first
            # tokens say which stands (`_settle_pair`): cancelled now, a repeat would leave it cut.
            keep = self.drafts[-1] if self._early and self.drafts else None
            self.cancel_running(backend, "superseded by a newer draft", keep=keep)
        draft = Draft(index=len(self.drafts), cot_tokens=cot_tokens, seq=None, anchor=list(anchor))
        handle = backend.fork_draft(draft, list(self.drafts))
        if handle is None:
            self.fork_failures += 1
            return None
        draft.seq = handle
        self.drafts.append(draft)
        self._pending_pair = self._early and len(self.drafts) >= 2
        return draft

    def cancel_running(self, backend: DraftBackend, reason: str, keep: Draft | None = None) -> None:
        for draft in self.drafts:
            if draft is not keep and backend.draft_running(draft):
                draft.cancelled = True
                backend.cancel_draft(draft, reason)

    def close(self, backend: DraftBackend) -> list[Draft]:
        """The parent ended thinking: no more forks, running drafts cancelled (what they wrote
        stays usable). Returns the drafts with tokens, oldest first."""
        self.cancel_running(backend, "parent ended thinking")
        self.budgets = []
        return [d for d in self.drafts if d.tokens and not d.dropped]

    def report(self) -> dict:
        return {
            "drafts": len(self.drafts),
            "draft_tokens": sum(len(d.tokens) for d in self.drafts),
            "draft_fork_cot": [d.cot_tokens for d in self.drafts],
            "fork_failures": self.fork_failures,
            "drafts_converged_at": self.converged_at,
            "drafts_dropped": sum(1 for d in self.drafts if d.dropped),
            **({"draft_gate": self.gate.report()} if self.gate is not None else {}),
        }
