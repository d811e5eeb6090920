"""Fault isolation: an exception in one request's method ends that request alone.

Why: one engine step runs every live request's method — its proposer, its grammar, its verifier
and its policy's hooks — around one batched forward. An exception in any of them used to leave
`Engine.step`, and the server failed every request of the batch (one request's prompt lookup
under a grammar could return 500 to all its neighbours). Here each per-sequence stage runs under
`guard`: an exception finishes the sequence's request with `FinishReason.ERROR` and a detail
naming the stage and the exception, cancels the request's other sequences (SSR drafts, the
other samples of n > 1, each freeing its slot), and every other sequence goes on as if the
failed request had never been there — its tokens are those it would have had alone.

A failure while planning a step (proposing, the grammar's masks) happens before the forward:
that row is not fed. One while verifying or in a hook happens after it: the other rows commit
as usual. Calls that serve several sequences at once (`propose_many`, `prepare_verify_many`)
cannot say whose fault an exception is, so they are retried one sequence at a time and the
fault lands on the sequence that raises again alone (a shared component that stays broken fails
each of its sequences). Only the batched forward itself may fail every request: `Engine.step`
lets its exception through, and the server's engine loop fails the live requests.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from selfspec.engine.policy import Proposal, trimmed_proposal
from selfspec.engine.sequence import FinishReason

if TYPE_CHECKING:
    from selfspec.engine.llm_engine import Engine
    from selfspec.engine.sequence import Sequence

log = logging.getLogger("selfspec.engine")

STAGES = {
    "propose": "proposing speculative tokens",
    "grammar": "applying the output grammar",
    "verify": "verifying the step's tokens",
    "on_step": "the speculation method's step hook",
    "on_finish": "the speculation method's finish hook",
}
"""What each guarded stage does, as the error detail names it."""


def error_detail(stage: str, exc: BaseException) -> str:
    """The finish detail of a failed request: where it failed and the exception."""
    return f"internal error while {STAGES.get(stage, stage)}: {type(exc).__name__}: {exc}"


class guard:
    """Run one sequence's stage (`with guard(engine, seq, stage): ...`); an exception fails that
    sequence's request (`fail_request`) and goes no further. The caller checks `seq.is_finished`
    afterwards. A plain class, not a generator context manager: it wraps several stages of every
    row of every step, where a generator's setup is the larger cost."""

    __slots__ = ("engine", "seq", "stage")

    def __init__(self, engine: Engine, seq: Sequence, stage: str) -> None:
        self.engine, self.seq, self.stage = engine, seq, stage

    def __enter__(self) -> None:
        return None

    def __exit__(self, exc_type, exc, tb) -> bool:
        if exc is None or not isinstance(exc, Exception):  # KeyboardInterrupt and the like go on
            return False
        fail_request(self.engine, self.seq, self.stage, exc)  # any method bug stays inside its request
        return True


def fail_request(engine: Engine, seq: Sequence, stage: str, exc: BaseException) -> None:
    """End `seq`'s request with an error: its top-level sequences (the request's samples) finish
    with `FinishReason.ERROR` and the detail, every other sequence of it (drafts) is cancelled.

    A sample that had already finished (its finish hook is what failed) is marked failed too, so
    the request's result says error. Failures while the request is being failed (a finish hook
    raising again during the cancellations) are logged and go no further."""
    request_id = seq.request_id
    detail = error_detail(stage, exc)
    if request_id in engine.failing_requests:
        log.error("request %s: a further failure while ending it: %s", request_id, detail, exc_info=exc)
        return
    log.error("request %s failed: %s", request_id, detail, exc_info=exc)
    engine.failing_requests.add(request_id)
    try:
        members = list(engine.sequences_of(request_id))
        if seq not in members:
            members.append(seq)
        for member in members:
            if member.parent is None:
                for child in list(member.children):
                    engine.cancel(child, "request failed")
                _mark_failed(engine, member, detail)
        for member in members:
            if not member.is_finished:
                engine.cancel(member, "request failed")
        _mark_failed(engine, seq, detail)
    finally:
        engine.failing_requests.discard(request_id)


def _mark_failed(engine: Engine, seq: Sequence, detail: str) -> None:
    if seq.is_finished:
        seq.finish_reason = FinishReason.ERROR
        seq.finish_detail = detail
    else:
        engine.finish(seq, FinishReason.ERROR, detail)


def grouped_proposals(engine: Engine, seqs: list[Sequence]) -> dict[int, Proposal | None]:
    """Proposals made together for sequences whose policies share a `proposal_group` key (e.g.
    one draft model: one batched draft forward per draft step instead of one per sequence).
    Groups of one are left to the engine's per-sequence `propose` (the same call). A group call
    that raises is retried per sequence (each its own `propose_many` of one), so only the
    sequence whose call raises again fails; it gets no entry."""
    groups: dict[object, list[tuple[Sequence, int]]] = {}
    for seq in seqs:
        key = seq.policy.proposal_group() if seq.policy is not None else None
        room = engine.proposal_room(seq) if key is not None else 0
        if room > 0:
            groups.setdefault(key, []).append((seq, room))
    out: dict[int, Proposal | None] = {}
    for items in groups.values():
        if len(items) < 2:
            continue
        try:
            proposals = items[0][0].policy.propose_many(engine, items)
        except Exception:  # noqa: BLE001 - pinned on a sequence below
            log.warning("a grouped proposal call failed; proposing per sequence", exc_info=True)
            proposals = []
            for seq, room in items:
                proposal = None
                with guard(engine, seq, "propose"):
                    proposal = seq.policy.propose_many(engine, [(seq, room)])[0]
                proposals.append(proposal)
        for (seq, room), proposal in zip(items, proposals):
            if not seq.is_finished:
                out[seq.seq_id] = trimmed_proposal(proposal, room)
    return out


def prepare_verifies(engine: Engine, groups: list[list[tuple[Sequence, list[int], Proposal]]]) -> None:
    """Call `prepare_verify_many` once per group (`policy.verify_groups`); a group call that
    raises is retried per sequence, and a sequence whose call raises again fails its request."""
    for items in groups:
        try:
            items[0][0].policy.prepare_verify_many(engine, items)
        except Exception:  # noqa: BLE001 - pinned on a sequence below
            log.warning("a grouped verify preparation failed; preparing per sequence", exc_info=True)
            for item in items:
                with guard(engine, item[0], "verify"):
                    item[0].policy.prepare_verify_many(engine, [item])
