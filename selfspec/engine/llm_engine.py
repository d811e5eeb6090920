"""The engine loop: schedule, run one batched forward, commit tokens. Policies steer it.

`step()` is three parts, as in nano-vllm: the scheduler says what each active sequence
feeds, the runner runs it in as few forwards as padding allows, and the postprocess samples
or verifies, appends tokens, checks stop conditions and lets each sequence's policy react
(fork a draft, force the end-of-thinking marker, finish at a cap). The engine itself has no
notion of SSR or suffix decoding.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from typing import Iterable

import torch

from selfspec.engine.config import EngineConfig
from selfspec.engine.constraint import ConstraintViolation, SequenceConstraint
from selfspec.engine.decode_ahead import may_decode_ahead
from selfspec.engine.fusion import compile_pointwise_modules, use_skinny_gemms
from selfspec.engine.host_phases import HostPhases
from selfspec.engine.host_threads import limit_host_threads
from selfspec.engine.isolation import grouped_proposals, guard, prepare_verifies
from selfspec.engine.logits_processing import has_penalties, penalized, token_logprobs
from selfspec.engine.model_runner import Chunk, ModelRunner
from selfspec.engine.policy import Proposal, SequencePolicy, StepOutcome, trimmed_proposal, verify_groups
from selfspec.engine.sampling import SamplingParams, make_generator, processed_probs, sample_from
from selfspec.engine.scheduler import Scheduler
from selfspec.engine.sequence import FinishReason, Sequence, SequenceStatus
from selfspec.engine.sizing import eos_ids, model_context_length, slots_from_free_memory
from selfspec.engine.skinny_gemm import SkinnyGemmTable
from selfspec.engine.step_costs import engine_step_costs
from selfspec.engine.stop_strings import hits_stop_string
from selfspec.engine.verify import VerifyResult, verify_proposal


class PromptTooLongError(ValueError):
    """The prompt does not fit the engine's context."""


def check_prompt_ids(prompt_ids: list[int], max_len: int, vocab_size: int) -> None:
    """ValueError (PromptTooLongError for the length) unless the prompt can start a request:
    non-empty, shorter than the context, every id in the vocabulary. Our engine and the vLLM
    driver both check prompts with it."""
    if not prompt_ids:
        raise ValueError("empty prompt: at least one token is needed")
    if len(prompt_ids) >= max_len:
        raise PromptTooLongError(
            f"prompt of {len(prompt_ids)} tokens does not fit the context of {max_len} tokens "
            "(at least one position must remain for the answer)"
        )
    bad = [t for t in prompt_ids if not (0 <= int(t) < vocab_size)]
    if bad:
        raise ValueError(f"prompt holds token ids outside the vocabulary [0, {vocab_size}): {bad[:5]}")


@dataclass
class StepEvent:
    """Tokens committed to one sequence in one step (for streaming)."""

    seq: Sequence
    new_tokens: list[int]
    finished: bool


class Engine:
    """One model, one slot pool, many sequences."""

    def __init__(
        self,
        model: torch.nn.Module,
        tokenizer=None,
        config: EngineConfig | None = None,
        eos_token_ids: Iterable[int] | None = None,
    ) -> None:
        self.config = config or EngineConfig()
        self.config.validate()
        self.model = model
        self.tokenizer = tokenizer
        model_ctx = model_context_length(model.config)
        max_len = self.config.max_len or min(model_ctx, 4096)
        if self.config.clamp_max_len:
            max_len = min(max_len, model_ctx)
        if max_len > model_ctx:
            raise ValueError(f"max_len={max_len} exceeds the model's context of {model_ctx} positions")
        device = next(model.parameters()).device
        # Host ops between GPU launches stay on one thread: see `host_threads`.
        self.host_threads = limit_host_threads(device)
        padding = self.config.max_padding_ratio
        if padding is None:
            padding = 16.0 if device.type == "cuda" else 1.5
        graphs = device.type == "cuda" if self.config.cuda_graphs is None else self.config.cuda_graphs
        if graphs and device.type != "cuda":
            raise ValueError("cuda_graphs=True needs the model on a CUDA device")
        snapshot_tokens = self._snapshot_tokens() if (graphs or self.config.static_shapes) else 0
        if self.config.num_slots == 0:
            self.config.num_slots = slots_from_free_memory(
                model, max_len, device, self.config.memory_fraction, snapshot_tokens=snapshot_tokens
            )
        compile_pointwise = graphs if self.config.compile_pointwise is None else self.config.compile_pointwise
        if compile_pointwise:
            compile_pointwise_modules(model, backend=self.config.compile_backend)
        skinny = self.config.skinny_gemms
        if skinny is None:
            skinny = bool(compile_pointwise) and device.type == "cuda"
        self.skinny_gemms: SkinnyGemmTable | None = None
        if skinny:
            if not compile_pointwise:
                raise ValueError("skinny_gemms needs compile_pointwise (it reroutes the fused projections)")
            self.skinny_gemms = SkinnyGemmTable()
            use_skinny_gemms(model, self.skinny_gemms, backend=self.config.compile_backend)
        self.runner = ModelRunner(
            model,
            num_slots=self.config.num_slots,
            max_len=max_len,
            key_length_bucket=self.config.key_length_bucket,
            max_padding_ratio=padding,
            static_shapes=self.config.graph_buckets if (graphs or self.config.static_shapes) else None,
            capture_graphs=graphs,
            fused_pointwise=compile_pointwise,
            slot_attention=graphs if self.config.slot_attention is None else self.config.slot_attention,
            static_padding_budget=self.config.static_padding_budget,
            state_snapshot_tokens=snapshot_tokens or None,
            decode_ahead=graphs if self.config.decode_ahead is None else self.config.decode_ahead,
        )
        self.max_len = max_len
        self._max_proposal = self._proposal_cap()
        self._step_room = self._max_proposal  # this step's share under max_step_tokens (`_batch_room`)
        self.device = device
        self.vocab_size = int(model.get_output_embeddings().weight.shape[0])
        self.eos_token_ids = frozenset(eos_token_ids if eos_token_ids is not None else eos_ids(model, tokenizer))
        whole = max(self.runner.static.buckets.tokens) if self.runner.static is not None else 0
        config = self.config
        self.scheduler = Scheduler(config.num_slots, config.prefill_chunk, config.max_prefill_tokens_per_step, whole)
        self.steps = 0
        self.step_costs = engine_step_costs(self.runner, model)  # read by cost-aware policies
        self.host_phases = HostPhases()  # where the host's part of a step goes (bench records)
        self._by_request: dict[str, list[Sequence]] = {}
        self.failing_requests: set[str] = set()  # requests being ended by `isolation.fail_request`

    # ------------------------------------------------------------------ requests
    def add_request(
        self,
        prompt_ids: list[int],
        params: SamplingParams,
        *,
        request_id: str | None = None,
        policy: SequencePolicy | None = None,
        constraint: SequenceConstraint | None = None,
        sibling_policies: list[SequencePolicy | None] | None = None,
    ) -> Sequence:
        """Queue a request. Invalid input raises here, before it can touch other requests.

        With `params.n > 1` the returned sequence is the first sample; the other n - 1 wait in
        its `siblings` (each with its policy from `sibling_policies`, a fork of `constraint` and a
        seed of its own) and start from its prefill: they copy its KV rows and draw their first
        token from the same logits, so one prompt is prefilled once for all n samples.
        """
        params.validate()
        check_prompt_ids(prompt_ids, self.max_len, self.vocab_size)
        seq = Sequence(
            request_id=request_id or uuid.uuid4().hex,
            token_ids=[int(t) for t in prompt_ids],
            params=params,
            generator=None if params.greedy else make_generator(params.seed, self.device),
            policy=policy,
            eos_token_ids=self.eos_token_ids,
            constraint=constraint,
        )
        policies = list(sibling_policies or [])
        if params.n > 1 and len(policies) != params.n - 1:
            raise ValueError(f"n={params.n} needs {params.n - 1} sibling policies, got {len(policies)}")
        for index, sibling_policy in enumerate(policies, start=1):
            seq.siblings.append(
                Sequence(
                    request_id=seq.request_id,
                    token_ids=list(seq.token_ids),
                    params=params,
                    generator=None if params.greedy else make_generator(_sample_seed(params.seed, index), self.device),
                    policy=sibling_policy,
                    eos_token_ids=self.eos_token_ids,
                    constraint=None if constraint is None else constraint.fork(),
                )
            )
        for member in (seq, *seq.siblings):
            self._by_request.setdefault(seq.request_id, []).append(member)
        self.scheduler.add(seq)
        return seq

    def fork(
        self,
        parent: Sequence,
        extra_tokens: list[int] = (),
        *,
        params: SamplingParams | None = None,
        policy: SequencePolicy | None = None,
    ) -> Sequence | None:
        """Copy `parent` (its KV rows, no recomputation) into a free slot; None when none is free.

        The child's prompt is the parent's whole context so far; `extra_tokens` (e.g. the
        end-of-thinking marker) are appended to it as forced tokens.
        """
        if parent.slot is None or parent.is_finished:
            raise ValueError("only a running sequence with a slot can be forked")
        context = list(parent.token_ids) + [int(t) for t in extra_tokens]
        if len(context) >= self.max_len:
            return None
        params = params or parent.params
        child = Sequence(
            request_id=parent.request_id,
            token_ids=context,
            params=params,
            generator=None
            if params.greedy
            else make_generator(None if params.seed is None else params.seed + 1 + len(parent.children), self.device),
            policy=policy,
            parent=parent,
            eos_token_ids=parent.eos_token_ids,
            prompt_len=len(context),
            constraint=None if parent.constraint is None else parent.constraint.fork(),
            output_start=parent.output_start,
        )
        if not self.scheduler.admit_direct(child):
            return None
        self.runner.copy_slot(parent.slot, child.slot, parent.num_cached)
        child.num_cached = parent.num_cached
        parent.children.append(child)
        self._by_request.setdefault(child.request_id, []).append(child)
        return child

    def append_forced(self, seq: Sequence, tokens: list[int]) -> None:
        """Append tokens the model did not sample (e.g. a forced end-of-thinking marker)."""
        seq.token_ids.extend(int(t) for t in tokens)
        seq.output_shapes.extend(["forced"] * len(tokens))
        if seq.params.logprobs is not None:
            seq.logprobs.extend([None] * len(tokens))
        seq.forced_token_count += len(tokens)
        if len(seq.token_ids) >= self.max_len and not seq.is_finished:
            self.finish(seq, FinishReason.LENGTH, "context full")

    def truncate(self, seq: Sequence, length: int) -> None:
        """Drop tokens beyond `length`; their K/V become invisible (masked, then overwritten)."""
        if length < seq.prompt_len:
            raise ValueError("cannot truncate into the prompt")
        del seq.token_ids[length:]
        del seq.output_shapes[length - seq.prompt_len :]
        del seq.logprobs[length - seq.prompt_len :]
        if length - 1 < seq.num_cached:
            seq.num_cached = length - 1
            if seq.slot is not None and not seq.is_finished:
                self._settle(seq)

    def _settle(self, seq: Sequence) -> None:
        """Bring a linear-attention model's state to `seq.num_cached`. A state holds every token it
        absorbed, so it is put back from what the last forward kept (`state_cache`); a position
        before that forward's chunk cannot be reached and the context is recomputed from the start
        (K/V rewritten with the same values, the state rebuilt)."""
        if not self.runner.settle(seq.slot, seq.num_cached):
            seq.num_cached = 0

    def cancel(self, seq: Sequence, detail: str = "cancelled") -> None:
        """Cancel a sequence and, recursively, its unfinished children; frees their slots."""
        for child in list(seq.children):
            if not child.is_finished:
                self.cancel(child, detail)
        if not seq.is_finished:
            self.finish(seq, FinishReason.CANCELLED, detail)

    def abort_request(self, request_id: str) -> bool:
        """Cancel every sequence of a request (client gone, timeout). True if any was live."""
        seqs = self._by_request.get(request_id, [])
        live = [s for s in seqs if not s.is_finished]
        for s in live:
            self.cancel(s, "request aborted")
        return bool(live)

    def sequences_of(self, request_id: str) -> list[Sequence]:
        """Every sequence of a live request (samples, drafts); empty once all have finished."""
        return list(self._by_request.get(request_id, ()))

    def finish(self, seq: Sequence, reason: FinishReason, detail: str = "") -> None:
        if seq.is_finished:
            return
        seq.status = SequenceStatus.FINISHED
        seq.finish_reason = reason
        seq.finish_detail = detail
        seq.finish_time = time.perf_counter()
        if seq.slot is not None:
            self.runner.release_slot(seq.slot)
        self.scheduler.remove(seq)
        if seq.policy is not None:
            with guard(self, seq, "on_finish"):  # a failing hook fails this request only
                seq.policy.on_finish(self, seq)
        if all(s.is_finished for s in self._by_request.get(seq.request_id, [])):
            self._by_request.pop(seq.request_id, None)

    def has_unfinished(self) -> bool:
        return self.scheduler.has_work()

    @property
    def num_running(self) -> int:
        return len(self.scheduler.running)

    @property
    def num_waiting(self) -> int:
        return self.scheduler.num_waiting

    # ------------------------------------------------------------------ the loop
    def step(self) -> list[StepEvent]:
        """Schedule, run one batched forward, commit; then let each policy react. Returns what
        each sequence committed (for streaming)."""
        began = time.perf_counter()
        plan = self.scheduler.schedule()
        if not plan:
            return []
        chunks: list[Chunk] = []
        work: list[tuple[Sequence, int, Proposal | None, torch.Tensor | str | None]] = []
        # Proposals ride only on a decode step (one pending token). A step that still feeds a prompt's
        # tail or forced tokens (an end-of-thinking marker) runs exactly as in plain decoding, so those
        # tokens' K/V come from a forward of the baseline's own shape: in bf16 a forward of another
        # length rounds differently, and every later logit would carry other bits. Speculation
        # resumes one step later.
        proposing = [seq for seq, take in plan if len(seq.token_ids) - seq.num_cached == 1]
        self._step_room = self._batch_room(plan, len(proposing))
        grouped = grouped_proposals(self, proposing)
        for seq, take in plan:
            if seq.is_finished:  # its request failed while this step was planned (`isolation`)
                continue
            pending = len(seq.token_ids) - seq.num_cached
            if take < pending:
                chunk = seq.token_ids[seq.num_cached : seq.num_cached + take]
                chunks.append(Chunk(seq.slot, seq.num_cached, chunk, 0))
                work.append((seq, take, None, None))
                continue
            proposal = mask = None
            if pending == 1:
                with guard(self, seq, "propose"):
                    proposal = grouped.pop(seq.seq_id) if seq.seq_id in grouped else self._proposal_for(seq)
            if seq.constraint is not None and not seq.is_finished:
                with guard(self, seq, "grammar"):
                    proposal, mask = self._constrained(seq, proposal)
            if seq.is_finished:  # failed above: this row is not fed
                continue
            tokens = seq.token_ids[seq.num_cached :] + (proposal.tokens if proposal else [])
            chunks.append(Chunk(seq.slot, seq.num_cached, tokens, 1 + (len(proposal.tokens) if proposal else 0)))
            work.append((seq, pending, proposal, mask))
        # Rows of a request that failed after they were planned are not fed either.
        rows = [i for i, item in enumerate(work) if not item[0].is_finished]
        chunks, work = [chunks[i] for i in rows], [work[i] for i in rows]
        failed = [StepEvent(seq, [], True) for seq, _ in plan if seq.finish_reason is FinishReason.ERROR]
        if not chunks:
            return failed
        started = time.perf_counter()
        want = [_needs_logits(seq) for seq, _, _, _ in work]
        forward = self.runner.run(chunks, want, look_ahead=may_decode_ahead(self, work, want))
        # The runner's host copy of the greedy tokens has synchronised the device: wall time is the step's.
        ended = time.perf_counter()
        if not self.runner.overlapped:  # a forward launched a step earlier: its wait is not its cost
            self.step_costs.observe([len(c.token_ids) for c in chunks], ended - started, started)
        self.steps += 1
        prepare_verifies(self, verify_groups([(s, forward.argmax[i], p) for i, (s, _, p, _) in enumerate(work) if p]))
        events: list[tuple[StepEvent, StepOutcome]] = []
        for i, ((seq, fed, proposal, mask), chunk) in enumerate(zip(work, chunks)):
            if seq.is_finished:  # cancelled by a policy earlier in this loop, or its request failed
                continue
            if chunk.num_logits == 0:
                seq.num_cached += fed
                seq.stats.prefill_forwards += 1
                continue
            logits, argmax, shape = forward.logits[i], forward.argmax[i], forward.shapes[i]
            with guard(self, seq, "verify"):
                # Siblings first: they copy this sequence's prompt rows before its commit may free them.
                for sibling in self._start_siblings(seq, fed, proposal):
                    first = self._commit(sibling, 0, None, logits[:1], argmax[:1], shape, self._first_mask(sibling))
                    events.append((StepEvent(sibling, list(first.committed), sibling.is_finished), first))
                outcome = self._commit(seq, fed, proposal, logits, argmax, shape, mask)
                if proposal is not None and not seq.is_finished:
                    # Linear-attention state: back to the verified length (a snapshot of this forward).
                    self._settle(seq)
                events.append((StepEvent(seq, list(outcome.committed), seq.is_finished), outcome))
        # Policies react after every row is committed, so a fork sees a consistent engine.
        committed = time.perf_counter()
        for event, outcome in events:
            seq = event.seq
            if seq.policy is not None and not seq.is_finished and outcome.committed:
                with guard(self, seq, "on_step"):
                    seq.policy.on_step(self, seq, outcome)
            event.finished = seq.is_finished
        self.host_phases.add(began, started, ended, committed, time.perf_counter(), len(chunks))
        seen = {id(event.seq) for event, _ in events}
        failed += [
            StepEvent(s, [], True) for s, *_ in work if s.finish_reason is FinishReason.ERROR and id(s) not in seen
        ]
        return [event for event, _ in events] + failed

    def _batch_room(self, plan, proposing: int) -> int:
        """Proposal tokens each proposing row may add this step under `max_step_tokens`: an
        equal share of what the step's pending tokens leave (all of `_max_proposal` without it)."""
        budget = self.config.max_step_tokens
        if budget is None or proposing == 0:
            return self._max_proposal
        fed = sum(take for _, take in plan)
        return max(0, min(self._max_proposal, (budget - fed) // proposing))

    def proposal_room(self, seq: Sequence) -> int:
        """Proposal tokens `seq` may carry this step (engine cap, step share, context, max_tokens)."""
        return min(
            self._max_proposal,
            self._step_room,
            self.max_len - len(seq.token_ids) - 1,
            seq.params.max_tokens - seq.num_output_tokens - 1,
        )

    def _proposal_cap(self) -> int:
        """Proposals per verify step (fixed for the engine's life): `max_proposal_tokens`, and with
        static forwards no more than the largest token bucket holds beside the pending token: a
        longer verify chunk would run eagerly, with other kernels and so other bf16 bits than decode's."""
        static = self.runner.static
        if static is None:
            return self.config.max_proposal_tokens
        return max(1, min(self.config.max_proposal_tokens, max(static.buckets.tokens) - 1))

    def _snapshot_tokens(self) -> int:
        """The widest verify chunk static forwards get (the pending token and the proposals, in
        a token bucket): what a linear-attention model's snapshot buffers are sized for."""
        buckets = self.config.graph_buckets
        widest = min(self.config.max_proposal_tokens + 1, max(buckets.tokens))
        return buckets.token_bucket(widest) or max(buckets.tokens)

    def _proposal_for(self, seq: Sequence) -> Proposal | None:
        if seq.policy is None:
            return None
        room = self.proposal_room(seq)
        if room <= 0:
            return None
        return trimmed_proposal(seq.policy.propose(self, seq, room), room)

    def _constrained(
        self, seq: Sequence, proposal: Proposal | None
    ) -> tuple[Proposal | None, torch.Tensor | str | None]:
        """The grammar's masks for this step, and the proposal cut at its first token the grammar
        refuses (no verifier could accept it from a constrained target). A message instead of a
        mask when a committed (forced) token broke the grammar."""
        try:
            seq.constraint.sync(seq.token_ids)
        except ConstraintViolation as exc:
            return None, str(exc)
        mask, valid = seq.constraint.masks(proposal.tokens if proposal else [])
        if proposal is not None and valid < len(proposal.tokens):
            proposal = trimmed_proposal(proposal, valid) if valid > 0 else None
        return proposal, mask

    def _first_mask(self, seq: Sequence) -> torch.Tensor | str | None:
        return None if seq.constraint is None else self._constrained(seq, None)[1]

    def _start_siblings(self, seq: Sequence, fed: int, proposal: Proposal | None) -> list[Sequence]:
        """At the end of `seq`'s prefill, give its waiting siblings a slot holding a copy of the
        prompt's KV rows (a sibling finding no free slot queues and prefills by itself)."""
        if not seq.siblings or proposal is not None or seq.num_output_tokens:
            return []
        started = []
        for sibling in seq.siblings:
            if sibling.is_finished or sibling.status is not SequenceStatus.WAITING:
                continue
            if self.scheduler.admit_direct(sibling):
                self.runner.copy_slot(seq.slot, sibling.slot, seq.num_cached + fed)
                sibling.num_cached = seq.num_cached + fed
                started.append(sibling)
            else:
                self.scheduler.add(sibling)
        return started

    def _commit(
        self,
        seq: Sequence,
        fed: int,
        proposal: Proposal | None,
        logits: torch.Tensor | None,
        argmax: list[int] | None,
        shape: str,
        mask: torch.Tensor | str | None = None,
    ) -> StepOutcome:
        """Sample or verify, append, check stops; say what happened.

        `argmax` is the runner's greedy token per logits row, already on the host (one
        transfer per forward instead of one per sequence). Penalties and the grammar `mask`
        (row i: after the proposal's first i tokens) shape the logits that sampling and
        verification see; logprobs are read from the raw rows.
        """
        if proposal is None and logits is None and mask is None:
            return self._commit_greedy_token(seq, fed, argmax[0], shape)
        params = seq.params
        seq.stats.forwards += 1
        if isinstance(mask, str):
            self.finish(seq, FinishReason.ERROR, mask)
            return StepOutcome(proposal, 0, ())
        raw = logits
        if mask is not None or has_penalties(params):
            rows = 1 + (len(proposal.tokens) if proposal else 0)
            logits = logits[:rows]
            if has_penalties(params):
                start = seq.output_start
                logits = penalized(
                    logits, params, seq.token_ids[:start], seq.token_ids[start:], proposal.tokens if proposal else ()
                )
            if mask is not None:
                mask = mask.to(logits.device)
                if not bool(mask[0].any()):
                    self.finish(seq, FinishReason.STOP, "grammar complete")
                    return StepOutcome(proposal, 0, ())
                logits = logits.float().masked_fill(~mask, float("-inf"))
            if params.greedy:
                argmax = logits.argmax(dim=-1).tolist()
        probs = None if params.greedy else processed_probs(logits, params)
        if proposal is None:
            token = argmax[0] if probs is None else sample_from(probs[0], seq.generator)
            result = VerifyResult(0, token)
        else:
            if seq.policy is not None and seq.policy.custom_verify:
                result = seq.policy.verify(self, seq, logits, proposal)
            else:
                result = verify_proposal(proposal, argmax=argmax, probs=probs, generator=seq.generator)
            seq.stats.verify_steps += 1
            seq.stats.proposed_tokens += len(proposal.tokens)
            seq.stats.accepted_tokens += result.num_accepted
        valid_kv = seq.num_cached + fed + result.num_accepted
        new_tokens = (proposal.tokens[: result.num_accepted] if proposal else []) + [result.next_token]
        appended = self._append_checked(seq, new_tokens)
        seq.output_shapes.extend([shape] * len(appended))
        if params.logprobs is not None:
            seq.logprobs.extend(token_logprobs(raw, appended, params.logprobs))
        if seq.record_probs and probs is not None:
            seq.sampled_probs.extend(probs[: len(appended)])
        seq.num_cached = min(valid_kv, len(seq.token_ids) - 1)
        if seq.first_token_time is None and appended:
            seq.first_token_time = time.perf_counter()
        return StepOutcome(proposal, result.num_accepted, tuple(appended))

    def _commit_greedy_token(self, seq: Sequence, fed: int, token: int, shape: str) -> StepOutcome:
        """`_commit` of a plain greedy row (no proposal, no grammar, no logits read: `_needs_logits`
        said no penalties, logprobs or sampling): the runner's argmax is the token. Its own path
        because at 32 rows `_commit`'s checks for the other cases were a visible share of a step's
        host time, during which the device is idle."""
        seq.stats.forwards += 1
        appended = self._append_checked(seq, [token])
        if appended:
            seq.output_shapes.append(shape)
            if seq.first_token_time is None:
                seq.first_token_time = time.perf_counter()
        seq.num_cached = min(seq.num_cached + fed, len(seq.token_ids) - 1)
        return StepOutcome(None, 0, tuple(appended))

    def _append_checked(self, seq: Sequence, tokens: list[int]) -> list[int]:
        params = seq.params
        appended: list[int] = []
        for token in tokens:
            seq.token_ids.append(token)
            appended.append(token)
            produced = seq.num_output_tokens
            reason = None
            if token in params.stop_token_ids:
                reason, detail = FinishReason.STOP, "stop token"
            elif token in seq.eos_token_ids and not params.ignore_eos and produced >= params.min_tokens:
                reason, detail = FinishReason.STOP, "eos"
            elif params.stop and hits_stop_string(self.tokenizer, seq.token_ids, seq.prompt_len, params.stop):
                reason, detail = FinishReason.STOP, "stop string"
            elif produced >= params.max_tokens:
                reason, detail = FinishReason.LENGTH, "max_tokens"
            elif len(seq.token_ids) >= self.max_len:
                reason, detail = FinishReason.LENGTH, "context full"
            if reason is not None:
                self.finish(seq, reason, detail)
                break
        return appended


def _needs_logits(seq: Sequence) -> bool:
    """Whether committing `seq` reads its logits: sampling, or a policy with its own verify.
    Greedy rows otherwise use the runner's argmax alone."""
    params = seq.params
    if (
        not params.greedy
        or seq.record_probs
        or seq.constraint is not None
        or (seq.siblings and not seq.num_output_tokens)
    ):
        return True
    if params.logprobs is not None or has_penalties(params):
        return True
    return seq.policy is not None and seq.policy.custom_verify


def _sample_seed(seed: int | None, index: int) -> int | None:
    """The seed of sample `index` of a seeded n > 1 request (sample 0 keeps the request's seed, so
    its output equals the n = 1 request's); None stays unseeded."""
    if seed is None:
        return None
    return hash((seed, index)) & (2**63 - 1)
