"""Run benchmark samples through every mode, interleaved, one JSONL record per (sample, mode).

Interleaving modes per sample (in an order rotated from sample to sample, the baseline
included) spreads machine noise and any cost of a run's place in the order over all modes
instead of biasing whichever ran first or last. A sample's records are appended once all its
modes have run, so a run killed by a time limit resumes at that sample (`--resume`).
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
import time
from collections import Counter
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

import torch
from tqdm import tqdm

from selfspec.engine.sampling import SamplingParams
from selfspec.engine.schedule import ScheduleRecorder, encode
from selfspec.llm import LLM
from selfspec.thinking.policy import ThinkingLimits
from selfspec_bench.datasets import BenchSample
from selfspec_bench.degeneration import distinct_ngram_ratio, loop_kind
from selfspec_bench.end_of_text import end_of_text_fields
from selfspec_bench.engine_counters import compiled_graph_count, decode_ahead_taken
from selfspec_bench.jsonl import append_jsonl, iter_jsonl
from selfspec_bench.modes import EXTERNAL_MODES, SKIPPED, BenchSettings, spec_for
from selfspec_bench.scoring import score as score_sample


def token_hash(tokens: list[int]) -> str:
    return hashlib.sha256(json.dumps(tokens).encode()).hexdigest()[:16]


def _limits(s: BenchSettings) -> ThinkingLimits:
    return ThinkingLimits(cot_cap=s.cot_cap, answer_cap=s.answer_cap, fixed_length=s.fixed_length)


def _params(s: BenchSettings) -> SamplingParams:
    budget = s.cot_cap + s.answer_cap + 64
    return SamplingParams(max_tokens=budget, temperature=s.temperature, seed=s.seed, ignore_eos=s.fixed_length)


def check_settings(modes: Sequence[str], s: BenchSettings) -> None:
    """Build every object a run of `modes` under `s` will build, so that a bad knob (a negative
    cap, a suffix depth of 0, a draft length below 1) fails here, before the model loads and
    before any record is written, and not as a traceback after the baseline of the first
    sample has run. Raises ValueError (pydantic's ValidationError is one) naming the knob."""
    _limits(s)
    _params(s)
    for mode in modes:
        if mode not in EXTERNAL_MODES:
            spec_for(mode, s)


def run_engine_mode(llm: LLM, sample: BenchSample, mode: str, s: BenchSettings) -> dict[str, Any]:
    _sync(llm)
    compiled = compiled_graph_count()
    llm.engine.host_phases.reset()
    ahead = decode_ahead_taken(llm)
    start = time.perf_counter()
    (r,) = llm.generate([sample.messages], _params(s), spec=spec_for(mode, s), limits=_limits(s), thinking=True)
    _sync(llm)
    record = _engine_record(r, time.perf_counter() - start, llm)
    record["compiled_graphs"] = compiled_graph_count() - compiled
    record["decode_ahead_steps"] = None if ahead is None else decode_ahead_taken(llm) - ahead
    return record


def run_engine_mode_batch(llm: LLM, samples: list[BenchSample], mode: str, s: BenchSettings) -> list[dict[str, Any]]:
    """Every sample's request of one mode submitted at once: they share the engine's batch.

    Each record's latency is its own request's arrival-to-finish time. With SSR, drafts add
    rows to the same batch, exactly as they would for concurrent users.
    """
    _sync(llm)
    compiled = compiled_graph_count()
    llm.engine.host_phases.reset()
    ahead = decode_ahead_taken(llm)
    began = time.perf_counter()
    seqs = [
        llm.submit(sample.messages, _params(s), spec=spec_for(mode, s), limits=_limits(s), thinking=True)
        for sample in samples
    ]
    llm.run_until_done(seqs)
    _sync(llm)
    wall = time.perf_counter() - began  # submission to the last request's end: the batch's throughput
    results = [llm.result(seq) for seq in seqs]
    compiled = compiled_graph_count() - compiled  # the batch's, given to each of its records
    steps = None if ahead is None else decode_ahead_taken(llm) - ahead  # the batch's too
    return [
        {**_engine_record(r, r.timings.total, llm), "compiled_graphs": compiled, "batch_wall_s": wall}
        | {"decode_ahead_steps": steps}
        for r in results
    ]


def _engine_record(r, latency: float, llm: LLM) -> dict[str, Any]:
    m = r.metrics
    answer = r.answer_token_ids or []
    cot = m.get("cot_tokens", 0)
    record = {
        "latency_s": latency,
        "prompt_tokens": len(r.prompt_token_ids),  # shows what the tokenizer made of the prompt
        "ttft_s": r.timings.ttft,
        "thinking_s": r.timings.thinking,
        "first_answer_token_s": r.timings.first_answer_token,
        "answer_s": r.timings.answer,
        "output_tokens": len(r.token_ids),
        "cot_tokens": cot,
        "answer_tokens": len(answer),
        "finish_reason": r.finish_reason,
        "thinking_closed_by": m.get("thinking_closed_by"),
        "forwards": m.get("forwards"),
        "proposed_tokens": m.get("proposed_tokens"),
        "accepted_tokens": m.get("accepted_tokens"),
        "accepted_prefix": m.get("accepted_prefix", 0),
        "suffix_accepted_tokens": m.get("suffix_accepted_tokens", 0),
        "drafts": m.get("drafts", 0),
        "draft_tokens": m.get("draft_tokens", 0),
        "draft_forwards": m.get("draft_forwards", 0),
        "drafts_converged_at": m.get("drafts_converged_at"),  # iterative drafting: CoT length where drafts agreed
        "drafts_dropped": m.get("drafts_dropped", 0),  # repeats of the draft before them, never verified
        "mean_acceptance_length": m.get("mean_acceptance_length"),
        # Per-phase forwards and the cost gate's decisions (SSR modes): where a composed mode's time went.
        "thinking_verify_steps": m.get("thinking_verify_steps"),
        "answer_forwards": m.get("answer_forwards"),
        "draft_gate": m.get("draft_gate"),
        "auto": m.get("auto"),  # what the default policy chose and why (path, lengths, per-source counts)
        "oracle_speedup": (cot + len(answer)) / (cot + 1) if cot else None,
        "output_hash": token_hash(r.token_ids),
        "answer_distinct4": distinct_ngram_ratio(answer),
        "answer_text": r.answer_text,
        "forward_shapes": shape_counts(r.output_shapes),
        # The engine's measured step costs when the request ended (ms per fed token by shape, and the
        # host's part of a step): what the speculation policy priced its choices with.
        "step_ms": llm.engine.step_costs.summary(),
        # Where the host's part of each step went since the run began (ms per step by phase; a batch
        # run's records share their batch's figures).
        "host_ms": llm.engine.host_phases.summary(),
        "host_ms_by_rows": llm.engine.host_phases.by_rows(),  # the same, by the rows each step fed
        "_token_ids": list(r.token_ids),  # for first_divergence; not written
        "_token_shapes": list(r.output_shapes),
    }
    record["loop_kind"] = loop_kind(record)
    record["loop"] = record["loop_kind"] is not None
    record.update(end_of_text_fields(answer, llm.engine.eos_token_ids, llm.tokenizer))
    return record


def run_external_mode(llm: LLM, sample: BenchSample, mode: str, s: BenchSettings) -> dict[str, Any]:
    """transformers `generate` with the same fixed-length shape: CoT to the cap, close, answer."""
    model, fmt = llm.model, llm.thinking_format
    prompt = llm.encode_prompt(sample.messages, thinking=True)
    extra = {"prompt_lookup_num_tokens": 10} if mode == "hf-prompt-lookup" else {}
    if not s.fixed_length:
        raise ValueError("external modes support the fixed-length setting only")
    _sync(llm)
    start = time.perf_counter()
    with torch.inference_mode():
        ids = torch.tensor([prompt], device=llm.engine.device)
        cot = model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=s.cot_cap,
            min_new_tokens=s.cot_cap,
            do_sample=False,
            eos_token_id=None,
            pad_token_id=0,
            **extra,
        )
        closed = torch.cat([cot, torch.tensor([list(fmt.close_ids)], device=cot.device)], dim=1)
        full = model.generate(
            closed,
            attention_mask=torch.ones_like(closed),
            max_new_tokens=s.answer_cap,
            min_new_tokens=s.answer_cap,
            do_sample=False,
            eos_token_id=None,
            pad_token_id=0,
            **extra,
        )
    _sync(llm)
    latency = time.perf_counter() - start
    out = full[0, len(prompt) :].tolist()
    answer = full[0, closed.shape[1] :].tolist()
    record = {
        "latency_s": latency,
        "prompt_tokens": len(prompt),
        "output_tokens": len(out),
        "cot_tokens": s.cot_cap,
        "answer_tokens": len(answer),
        "output_hash": token_hash(out),
        "answer_distinct4": distinct_ngram_ratio(answer),
        "answer_text": llm.tokenizer.decode(answer, skip_special_tokens=True),
        **end_of_text_fields(answer, llm.engine.eos_token_ids, llm.tokenizer),
        "_token_ids": out,
    }
    record["loop_kind"] = loop_kind(record)
    record["loop"] = record["loop_kind"] is not None
    return record


def _sync(llm: LLM) -> None:
    if llm.engine.device.type == "cuda":
        torch.cuda.synchronize()


def _matching_records(
    path: Path, model: str, settings: dict[str, Any], dtype: str | None = None
) -> Iterable[dict[str, Any]]:
    """Records of this file made with the same model, settings and (if given) dtype (a file may hold a sweep)."""
    if not path.exists():
        return
    for _, rec in iter_jsonl(path, bad_lines="skip"):  # a line cut by a killed run is simply redone
        if (
            rec.get("model") == model
            and rec.get("settings") == settings
            and (dtype is None or rec.get("dtype") == dtype)
        ):
            yield rec


def completed_pairs(path: Path, model: str, settings: dict[str, Any], dtype: str | None = None) -> set[tuple[str, str]]:
    return {(r["sample_id"], r["mode"]) for r in _matching_records(path, model, settings, dtype)}


class ResumeMismatchError(ValueError):
    """The file to resume holds records of the same run made with another tokenizer."""


def check_resume_tokenizer(
    path: Path, model: str, settings: dict[str, Any], dtype: str | None, summary: dict[str, Any] | None
) -> None:
    """Refuse to resume onto records whose `tokenizer_summary` differs from this run's.

    Why: resuming keys on model, settings and dtype, not on how prompts were tokenized. A GGUF
    whose tokenizer transformers builds wrongly (Gemma-3's, which `selfspec.models.tokenizer_check`
    detects) gives the same model name other prompt tokens; appending right-tokenizer records to
    such a file would mix two experiments under one name. Records without a summary cannot tell
    and are let through.
    """
    if summary is None:
        return
    for rec in _matching_records(path, model, settings, dtype):
        theirs = rec.get("tokenizer_summary")
        if theirs is not None and theirs != summary:
            raise ResumeMismatchError(
                f"{path} holds records of this run made with another tokenizer ({theirs}; this run's: {summary}); "
                "resume into another --out file, or start over with --fresh"
            )


def run_bench(
    llm: LLM,
    samples: list[BenchSample],
    modes: list[str],
    settings: BenchSettings,
    out_path: Path,
    *,
    resume: bool = True,
    score: bool = False,
    meta: dict[str, Any] | None = None,
    progress: bool = True,
    warm_each_group: bool = True,
    co_tenant_probe: Callable[[], int | None] | None = None,
    record_schedule: bool = False,
) -> list[dict[str, Any]]:
    """Run every (sample, mode) not yet recorded; append records; return the new ones.
    `warm_each_group`: short untimed runs of each group before its timed ones (see below).
    `co_tenant_probe`: how many other processes share the device (`run_info.gpu_co_tenants`),
    asked before the warm-up and after each group's timed runs; a group's records carry the larger
    of the answers before and after it. Never asked between a warm-up and the timed runs it warms:
    the nvidia-smi call would leave the GPU idle just where the warm-up keeps it busy.
    `record_schedule`: each timed run of one request keeps its forward schedule (`schedule`, for
    `selfspec bench replay`); a batched run keeps the batch's one schedule on its first record
    (`batch_schedule`: device and host time under load, not one request's)."""
    out_path.parent.mkdir(parents=True, exist_ok=True)
    model_name = getattr(llm, "model_name", "custom")
    settings_key = json.loads(json.dumps(settings.to_dict()))  # as it reads back from JSON
    dtype = (meta or {}).get("dtype")
    if resume:
        check_resume_tokenizer(out_path, model_name, settings_key, dtype, (meta or {}).get("tokenizer_summary"))
    done = completed_pairs(out_path, model_name, settings_key, dtype) if resume else set()
    if not resume and out_path.exists():
        out_path.unlink()
    if "baseline" in modes:
        modes = ["baseline"] + [m for m in modes if m != "baseline"]
    tenants_before = co_tenant_probe() if co_tenant_probe is not None else None
    before_warm_up = _SharedHistory(llm, "global" in settings.suffix_sources)
    _warm_up(llm, samples[: max(1, settings.concurrency)], settings, modes)
    before_warm_up.rewind()  # the warm-up's short answers are not past responses
    todo = [(s, m) for s in samples for m in modes if (s.id, m) not in done]
    bar = tqdm(total=len(todo), desc="bench", unit="run") if progress else None
    baseline_hash = _baseline_hashes(out_path, model_name, settings_key, dtype) if resume else {}
    baseline_tokens: dict[str, tuple[list[int], int]] = {}  # this process's baselines: where modes leave them
    new: list[dict[str, Any]] = []
    group_size = max(1, settings.concurrency)
    groups = [samples[j : j + group_size] for j in range(0, len(samples), group_size)]
    for i, group in enumerate(groups):
        pending_modes = [m for m in modes if any((sample.id, m) not in done for sample in group)]
        # Every mode, the baseline too, takes each place in the order in turn: a place that costs
        # more per forward must not flatter or penalise one mode. On an H200 the baseline, always
        # first, ran ~9% slower per forward than the same steps in later runs (thinker v4b on
        # HumanEval at natural lengths); the report's place table shows what each place costs.
        k = i % len(pending_modes) if pending_modes else 0
        order = pending_modes[k:] + pending_modes[:k]
        history = _SharedHistory(llm, "global" in settings.suffix_sources)
        if i > 0 and warm_each_group:
            # With the order rotated, the first timed run of a sample still cost more per forward
            # in every mode (H200, thinker v4b on HumanEval: +7% baseline, +15% ssr+think at place
            # 1 of the report's place table). Likely causes: the previous group's scoring leaves the
            # GPU idle, and this prompt's prefill shape has not run yet. Short untimed runs of this
            # group put that cost outside the timed runs, so no mode pays it for its place.
            _short_runs(
                llm,
                [sample for sample in group if any((sample.id, m) not in done for m in modes)],
                settings,
                pending_modes,
            )
            history.rewind()
        ran: dict[str, list[tuple[BenchSample, dict[str, Any]]]] = {}
        for position, mode in enumerate(order, start=1):
            todo_samples = [sample for sample in group if (sample.id, mode) not in done]
            if mode in EXTERNAL_MODES:
                recs = [run_external_mode(llm, sample, mode, settings) for sample in todo_samples]
            elif group_size == 1:
                recorder = ScheduleRecorder().attach(llm.engine.runner) if record_schedule else None
                try:
                    recs = [run_engine_mode(llm, todo_samples[0], mode, settings)]
                finally:
                    schedule = recorder.finish() if recorder is not None else None
                if schedule is not None:
                    recs[0]["schedule"] = encode(schedule)
            else:
                recorder = ScheduleRecorder().attach(llm.engine.runner) if record_schedule else None
                try:
                    recs = run_engine_mode_batch(llm, todo_samples, mode, settings)
                finally:
                    schedule = recorder.finish() if recorder is not None else None
                if schedule is not None and recs:
                    # One schedule for the whole batch (its forwards carry every request's rows),
                    # kept once, on the batch's first record: the report's device and host table
                    # counts it once; a replay, which projects one request's latency, leaves it be.
                    recs[0]["batch_schedule"] = encode(schedule)
            for rec in recs:
                rec["run_position"] = position  # place in the group's order (the report can check for bias)
                if group_size > 1:
                    rec["batch"] = i  # the group it was submitted with (the report's throughput)
                rec["group_warm_up"] = warm_each_group
            ran[mode] = list(zip(todo_samples, recs))
            history.ran()
            if bar is not None:
                bar.update(len(recs))
        history.close()
        if co_tenant_probe is not None and ran:
            tenants_after = co_tenant_probe()
            seen = [n for n in (tenants_before, tenants_after) if n is not None]
            for _, rec in (pair for pairs in ran.values() for pair in pairs):
                rec["gpu_co_tenants"] = max(seen) if seen else None  # None: the device could not tell
            tenants_before = tenants_after
        # Scored after every timed run of the group, then written in one piece, baseline first
        # (its tokens are the exactness reference): a group cut short — in its runs or in its
        # scoring — leaves no records, and a copy of the file taken while it grows (a device
        # call's archive) holds at most a torn last line, not a part of a group.
        grades: dict[tuple[str, str], Any] = {}  # lossless modes write the same answers: grade each text once
        finished = [
            _finish_record(rec, sample, mode, model_name, settings, meta, baseline_hash, score, baseline_tokens, grades)
            for mode in pending_modes
            for sample, rec in ran[mode]
        ]
        append_jsonl(out_path, finished)
        new.extend(finished)
    if bar is not None:
        bar.close()
    return new


def _finish_record(
    rec: dict[str, Any],
    sample: BenchSample,
    mode: str,
    model_name: str,
    settings: BenchSettings,
    meta: dict[str, Any] | None,
    baseline_hash: dict[str, str],
    score: bool,
    baseline_tokens: dict[str, tuple[list[int], int]] | None = None,
    grades: dict[tuple[str, str], Any] | None = None,
) -> dict[str, Any]:
    """Label, compare with the baseline, score (the caller writes the group's records).
    `grades`: checker results by (sample, answer text), shared by the records of a group."""
    tokens = rec.pop("_token_ids", None)
    shapes = rec.pop("_token_shapes", None)
    rec.update(
        sample_id=sample.id,
        benchmark=sample.benchmark,
        mode=mode,
        model=model_name,
        settings=settings.to_dict(),
        **(meta or {}),
    )
    if mode == "baseline":
        baseline_hash[sample.id] = rec["output_hash"]
    ref = baseline_hash.get(sample.id)
    rec["exact_match"] = None if ref is None else rec["output_hash"] == ref
    if baseline_tokens is not None and tokens is not None:
        if mode == "baseline":
            baseline_tokens[sample.id] = (tokens, rec.get("cot_tokens") or 0, shapes)
        elif sample.id in baseline_tokens:
            reference, reference_cot, reference_shapes = baseline_tokens[sample.id]
            rec.update(divergence_fields(reference, reference_cot, tokens, reference_shapes, shapes))
    if score and rec.get("answer_text") is not None:
        grades = {} if grades is None else grades

        def grade(text: str):  # each checker run is a subprocess; equal answers need only one
            if (sample.id, text) not in grades:
                grades[(sample.id, text)] = score_sample(sample, text)
            return grades[(sample.id, text)]

        result = grade(rec["answer_text"])
        rec.update(passed=result.passed, score=result.score, score_detail=result.detail[:200])
        # What a user would have received: the answer cut at the model's own end-of-text (the same
        # as the full answer when nothing was forced past it).
        if rec.get("answer_text_at_eos") is not None:
            at_eos = grade(rec["answer_text_at_eos"])
            rec.update(passed_at_eos=at_eos.passed, score_at_eos=at_eos.score)
        else:
            rec.update(passed_at_eos=result.passed, score_at_eos=result.score)
    return rec


def first_divergence(reference: list[int], tokens: list[int]) -> int | None:
    """Index of the first output token where `tokens` leaves `reference`; None if they are equal."""
    for index, (a, b) in enumerate(zip(reference, tokens)):
        if a != b:
            return index
    return None if len(reference) == len(tokens) else min(len(reference), len(tokens))


def shape_counts(shapes: list[str]) -> dict[str, int]:
    """Output tokens per forward shape, key length left out ("1x1": 1,800, "1x16": 190, ...)."""
    return dict(Counter(shape.split("/")[0] for shape in shapes))


def divergence_fields(
    reference: list[int],
    reference_cot_tokens: int,
    tokens: list[int],
    reference_shapes: list[str] | None = None,
    shapes: list[str] | None = None,
) -> dict[str, Any]:
    """Where a mode's output first leaves the baseline's of the same run, in which phase, and the
    forward shapes that chose the two differing tokens.

    Why: an inexact lossless run in bf16 is a near-tie that flipped; whether flips cluster late in
    long sequences (long key lengths), right after the forced end of thinking, or in forwards of one
    shape (a token bucket, two sequences in one forward) says which kernels round differently — the
    hash alone cannot."""
    index = first_divergence(reference, tokens)
    if index is None:
        return {"first_divergence": None, "first_divergence_phase": None}
    fields: dict[str, Any] = {
        "first_divergence": index,
        "first_divergence_phase": "cot" if index < reference_cot_tokens else "answer",
    }
    if shapes is not None and index < len(shapes):
        fields["first_divergence_shape"] = shapes[index]
    if reference_shapes is not None and index < len(reference_shapes):
        fields["baseline_shape_at_divergence"] = reference_shapes[index]
    return fields


def _baseline_hashes(path: Path, model: str, settings: dict[str, Any], dtype: str | None = None) -> dict[str, str]:
    return {
        r["sample_id"]: r["output_hash"]
        for r in _matching_records(path, model, settings, dtype)
        if r["mode"] == "baseline"
    }


class _SharedHistory:
    """Keeps the "global" suffix source (past responses shared by all requests) from leaking
    one sample's outputs between its own mode runs.

    Why: every mode of a sample runs on the same prompt; a later mode whose global history
    already holds an earlier mode's answer to that very prompt would be proposed the answer
    for free. Each timed run starts from the history as it was before the sample, and the
    sample leaves behind the history of a mode run that added its response (the lossless
    modes add the same tokens): one response per prompt, as a server would hold. Does
    nothing when no SSR mode lists "global" among its sources.
    """

    def __init__(self, llm: LLM, active: bool) -> None:
        self.llm = llm
        self.active = active and getattr(llm, "global_history", None) is not None
        self.start = copy.deepcopy(llm.global_history) if self.active else None
        self.kept = None

    def rewind(self) -> None:
        """Back to the history as it was when this object was made."""
        if self.active:
            self.llm.global_history = copy.deepcopy(self.start)

    def ran(self) -> None:
        """A timed run ended: keep its history if it grew, then rewind for the next one."""
        if not self.active:
            return
        now = self.llm.global_history
        if now.keys != self.start.keys:  # a response added (and, when full, the oldest evicted)
            self.kept = now
        self.rewind()

    def close(self) -> None:
        """The group is done: what the next group starts from."""
        if self.active:
            self.llm.global_history = self.kept if self.kept is not None else self.start


def _warm_up(llm: LLM, group: list[BenchSample], s: BenchSettings, modes: list[str]) -> None:
    """First-call costs out of the numbers: CUDA graphs for every shape the runs can meet
    (rows up to 3 per request, verify chunks, key lengths up to the cache), then every
    engine mode once, short, on a whole first group of samples. The group matters: on the
    H200 a warm-up with one sample left the batched prefill's first compilations in the
    first timed group (its baseline ran ~1.6x slower per step than the later groups')."""
    if not group:
        return
    runner = llm.engine.runner
    if runner.static is not None and runner.static.capture:
        buckets = runner.static.buckets
        # Up to 3 rows per request (a parent, a draft, and the next draft while the two are compared):
        # every batch bucket up to the one that holds them, or the 4-row graphs are captured mid-run.
        widest = buckets.batch_bucket(3 * s.concurrency) or buckets.batch[-1]
        rows = [b for b in buckets.batch if b <= widest]
        keys = runner.max_len
        total = len(rows) * len(buckets.tokens) * len(buckets.key_buckets(keys))
        with tqdm(total=total, desc="capture CUDA graphs", unit="graph") as bar:
            runner.warm_up_graphs(rows, list(buckets.tokens), keys, progress=bar.update)
    _short_runs(llm, group, s, modes)


def _short_runs(llm: LLM, group: list[BenchSample], s: BenchSettings, modes: list[str]) -> None:
    """Every engine mode (the baseline first) once on `group`, 8 CoT and 8 answer tokens,
    untimed and unrecorded: what a first run would otherwise pay happens here."""
    if not group:
        return
    short = dataclasses.replace(
        s,
        cot_cap=8,
        answer_cap=8,
        draft_budget=4,
        max_draft_len=4,
        fixed_length=True,
        draft_interval=4 if s.draft_interval is not None else None,
    )
    engine_modes = [m for m in dict.fromkeys(["baseline", *modes]) if m not in EXTERNAL_MODES]
    for mode in engine_modes:
        if len(group) == 1:
            run_engine_mode(llm, group[0], mode, short)
        else:
            run_engine_mode_batch(llm, group, mode, short)


def record_skipped(
    out_path: Path, skipped: list[dict[str, Any]], model: str, settings: BenchSettings, meta: dict[str, Any] | None
) -> None:
    """Append one `mode: "skipped"` record per sample that did not fit the context
    (`context_fit`), unless the file already holds it: the report counts and names them."""
    if not skipped:
        return
    out_path.parent.mkdir(parents=True, exist_ok=True)
    settings_key = json.loads(json.dumps(settings.to_dict()))
    dtype = (meta or {}).get("dtype")
    known = {sid for sid, mode in completed_pairs(out_path, model, settings_key, dtype) if mode == SKIPPED}
    append_jsonl(
        out_path,
        [
            {**entry, "kind": SKIPPED, "mode": SKIPPED, "model": model, "settings": settings.to_dict(), **(meta or {})}
            for entry in skipped
            if entry["sample_id"] not in known
        ],
    )


def mismatches(records: Iterable[dict[str, Any]]) -> list[tuple[str, str]]:
    """(sample, mode) pairs whose output differs from the baseline's."""
    return [(r["sample_id"], r["mode"]) for r in records if r.get("exact_match") is False]
