"""Forward schedules (`selfspec.engine.schedule`) and their replay (`selfspec_bench.replay`):
the codec, complete recording on real runs of every kind of mode, a replay that leaves the
slot cache exactly as the run did, and the CLI's errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from selfspec.cli.main import app
from selfspec.config import PromptLookupConfig, SuffixDecodingConfig
from selfspec.engine.config import EngineConfig
from selfspec.engine.sampling import SamplingParams
from selfspec.engine.schedule import (
    MAX_STALLS,
    STALL_SECONDS,
    Forward,
    Free,
    Rollback,
    Row,
    Schedule,
    ScheduleError,
    ScheduleRecorder,
    SlotCopy,
    decode,
    encode,
)
from selfspec.llm import LLM
from selfspec.spec.ssr import SSRConfig
from selfspec.testing.tiny import save_tiny_model_dir, tiny_model, tiny_tokenizer
from selfspec.thinking.policy import ThinkingLimits
from selfspec_bench import shapes
from selfspec_bench.replay import replay, replay_runner

LIMITS = ["--cot-cap", "24", "--draft-budget", "8", "--max-draft", "16", "--answer-cap", "16"]
TINY_SHAPE = dict(
    family="llama",
    vocab_size=128,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=8,
    max_position_embeddings=1024,
)


def _roundtrip(schedule: Schedule) -> Schedule:
    return decode(json.loads(json.dumps(encode(schedule))))


def test_codec_round_trips_every_event_and_collapses_repeated_forwards():
    events = [
        Forward((Row(0, 0, 20, 0, False),)),  # a prefill piece: no logits
        Forward((Row(0, 20, 4, 1, True),)),  # the prompt's tail, its logits copied out
        *[Forward((Row(0, 24 + i, 1, 1, False),)) for i in range(50)],
        SlotCopy(0, 1, 74),
        Forward((Row(0, 74, 9, 9, False), Row(1, 74, 3, 1, True))),
        Rollback(0, 77),
        Forward((Row(0, 77, 5, 5, True), Row(1, 77, 1, 1, False))),
        Free(1),
        Forward((Row(0, 10, 2, 2, False),)),  # a recompute from an earlier position
        Free(0),
    ]
    schedule = Schedule(events, num_slots=4, max_len=512, static=True, buckets=[1, 4, 16], gpu_s=0.5, host_s=0.25)
    back = _roundtrip(schedule)
    assert back.events == events
    assert (back.num_slots, back.max_len, back.static, back.buckets) == (4, 512, True, [1, 4, 16])
    assert (back.gpu_s, back.host_s) == (0.5, 0.25)
    data = encode(schedule)
    assert [50, [[0, 0, 1]]] in data["ops"]  # fifty decode steps in one entry
    assert data["forwards"] == 55 and data["tokens"] == 20 + 4 + 50 + 12 + 6 + 2
    with_ids = Schedule([Forward((Row(0, 0, 2, 1, False),), ((5, 6),))] * 3, num_slots=1, max_len=8)
    assert _roundtrip(with_ids).events == with_ids.events


class _FakeRunner:
    recorder = None
    static = None
    num_slots = 1
    max_len = 64


class _Chunk:
    slot, start, token_ids, num_logits = 0, 0, (1,), 1


def test_long_gaps_between_forwards_are_kept_one_by_one_and_round_trip():
    """A host stall (a collection, a capture, a slow proposer) shows as its own entry with the
    forward it delayed; ordinary gaps only add to the host sum; only the longest are kept."""
    now = [0.0]
    recorder = ScheduleRecorder(clock=lambda: now[0]).attach(_FakeRunner())
    gaps = [0.0001] * 5 + [STALL_SECONDS * 4] + [0.0001] * 3 + [STALL_SECONDS * 2]
    gaps += [STALL_SECONDS * 1.5] * (MAX_STALLS + 3)
    for gap in gaps:
        started = now[0] + gap
        now[0] = started + 0.001
        recorder.forward([_Chunk()], None, started, now[0])
    schedule = recorder.finish()
    assert len(schedule.stalls) == MAX_STALLS
    assert schedule.stalls[:2] == [(5, pytest.approx(STALL_SECONDS * 4)), (9, pytest.approx(STALL_SECONDS * 2))]
    assert all(index >= 10 for index, _ in schedule.stalls[2:])  # the shortest of the equal rest dropped
    back = _roundtrip(schedule)
    assert [i for i, _ in back.stalls] == [i for i, _ in schedule.stalls]
    assert back.stalls[0][1] == pytest.approx(STALL_SECONDS * 4, rel=1e-3)
    assert "stalls" not in encode(Schedule([], num_slots=1, max_len=8))


@pytest.mark.parametrize(
    "data",
    [{"v": 2, "ops": []}, {"v": 1, "slots": 1, "max_len": 8, "want": 0, "ops": [["z", 1]]}, {"v": 1}, []],
)
def test_a_schedule_of_another_version_or_malformed_is_refused(data):
    with pytest.raises(ScheduleError):
        decode(data)


@pytest.fixture(scope="module")
def tiny():
    tok = tiny_tokenizer()
    return tiny_model("qwen3", len(tok), seed=3, eos_token_id=tok.eos_token_id), tok


MODES = {
    "baseline": None,
    "prompt lookup": PromptLookupConfig(),
    "suffix decoding": SuffixDecodingConfig(),
    "ssr": SSRConfig(draft_interval=16, max_draft_len=24),
}


@pytest.mark.parametrize("mode", list(MODES))
def test_recording_is_complete_and_a_replay_leaves_the_same_cache(tiny, mode):
    """Every forward and cache operation of a real run is in its schedule: replaying it with the
    recorded token ids on a fresh runner of the same model runs the same forwards (recorded again,
    identical) and leaves every slot's K/V bit for bit as the run left it."""
    _check_replay(*tiny, mode)


def _check_replay(model, tok, mode: str, static: bool = False) -> None:
    config = EngineConfig(num_slots=4, max_len=256, static_shapes=static)
    llm = LLM.from_model(model, tok, engine_config=config)
    recorder = ScheduleRecorder(keep_tokens=True).attach(llm.engine.runner)
    limits = ThinkingLimits(cot_cap=60, answer_cap=30, fixed_length=True)
    llm.generate(["Write a counter class"], SamplingParams(max_tokens=120), spec=MODES[mode], limits=limits)
    schedule = recorder.finish()
    assert llm.engine.runner.recorder is None
    assert len(schedule.forwards) == llm.engine.steps
    kinds = {type(e) for e in schedule.events}
    if mode == "ssr":
        assert SlotCopy in kinds and Rollback in kinds  # forks, and rejected proposals rolled back
    elif mode != "baseline":
        assert Rollback in kinds
    assert schedule.fed_tokens() > 90 and schedule.gpu_s > 0 and schedule.host_s > 0

    fresh = replay_runner(model, [_roundtrip(schedule)])
    assert (fresh.static is not None) == static
    again = ScheduleRecorder().attach(fresh)
    timed = replay(fresh, _roundtrip(schedule), token_ids=True)
    replayed = again.finish()
    assert timed.forwards == len(schedule.forwards) and timed.tokens == schedule.fed_tokens()
    assert encode(replayed)["ops"] == encode(schedule)["ops"]
    assert fresh.forwards == llm.engine.runner.forwards  # the same groups, so the same padding rows
    for mine, theirs in zip(
        fresh.cache.keys + fresh.cache.values, llm.engine.runner.cache.keys + llm.engine.runner.cache.values
    ):
        assert (mine is None and theirs is None) or torch.equal(mine, theirs)  # None: a layer without K/V
    # Arbitrary token ids run the same forwards (what a replay at another size times).
    _same_state(fresh, llm.engine.runner)
    zeros = replay_runner(model, [schedule])
    assert replay(zeros, schedule).forwards == timed.forwards and zeros.forwards == fresh.forwards


def _same_state(mine, theirs) -> None:
    """Linear-attention models: the same conv and recurrent state per slot (settles replayed in order)."""
    assert (mine.state is None) == (theirs.state is None)
    if mine.state is not None:
        for layer in mine.state.conv:
            assert torch.equal(mine.state.conv[layer], theirs.state.conv[layer])
            assert torch.equal(mine.state.recurrent[layer], theirs.state.recurrent[layer])


@pytest.mark.parametrize("mode", ["prompt lookup", "ssr"])
def test_a_hybrid_models_replay_restores_the_same_states(mode):
    """Rollbacks are `settle` calls: on a linear-attention model they put the state back from the
    verify forward's snapshots, so they must replay in order for the states to end alike."""
    tok = tiny_tokenizer()
    model = tiny_model("qwen3_5", len(tok), seed=4, eos_token_id=tok.eos_token_id)
    _check_replay(model, tok, mode)


def test_a_replay_on_static_forwards_leaves_the_same_cache(tiny):
    """The bucketed static path (a GPU's, uncaptured here): the replay's runner buckets alike."""
    _check_replay(*tiny, "ssr", static=True)


def _invoke(args: list[str]):
    return CliRunner().invoke(app, args)


@pytest.fixture()
def tiny_shape(monkeypatch):
    monkeypatch.setitem(shapes.SHAPES, "tiny-test", TINY_SHAPE)
    return "tiny-test"


def test_bench_records_carry_schedules_that_replay_into_a_report(tmp_path: Path, tiny_shape):
    model_dir = save_tiny_model_dir(tmp_path / "m", "qwen3")
    out = tmp_path / "r.jsonl"
    modes = "baseline,prompt-lookup,suffix-decoding,prefix+suffix"
    result = _invoke(
        ["bench", "-b", "humaneval", "--limit", "1", "--model", str(model_dir), "--modes", modes, *LIMITS]
        + ["--out", str(out)]
    )
    assert result.exit_code == 0, result.output + repr(result.exception)
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(records) == 4
    for rec in records:
        schedule = decode(rec["schedule"])
        assert schedule.gpu_s + schedule.host_s <= rec["latency_s"] * 1.5
        assert schedule.forwards and schedule.num_slots == 4
        # where the host time between forwards went, per step, beside the schedule's host sum
        assert set(rec["host_ms"]) == {"propose", "commit", "policies", "outside"}
        assert sum(rec["host_ms"].values()) * len(schedule.forwards) / 1000 <= schedule.host_s * 1.5 + 1e-3
    ssr = next(r for r in records if r["mode"] == "prefix+suffix")
    assert any(isinstance(e, SlotCopy) for e in decode(ssr["schedule"]).events)

    projected = tmp_path / "p.jsonl"
    result = _invoke(["bench", "replay", str(out), "--shape", tiny_shape, "--out", str(projected), "--host-scale", "2"])
    assert result.exit_code == 0, result.output + repr(result.exception)
    back = [json.loads(line) for line in projected.read_text().splitlines()]
    assert [(r["sample_id"], r["mode"], r["model"], r["settings"]) for r in back] == [
        (r["sample_id"], r["mode"], r["model"], r["settings"]) for r in records
    ]
    for rec, new in zip(records, back):
        info = new["replay"]
        assert new["measured_latency_s"] == rec["latency_s"] and "schedule" not in new
        assert info["shape"] == tiny_shape and info["host_scale"] == 2.0
        assert info["forwards"] == rec["schedule"]["forwards"] and info["tokens"] == rec["schedule"]["tokens"]
        assert info["measured_host_s"] == pytest.approx(rec["latency_s"] - rec["schedule"]["gpu_s"])
        assert new["latency_s"] == pytest.approx(info["gpu_s"] + 2 * info["measured_host_s"])
        assert new["thinking_s"] is None and new["measured_thinking_s"] == rec["thinking_s"]
    result = _invoke(["bench", "report", str(projected), "--out-dir", str(tmp_path / "report")])
    assert result.exit_code == 0, result.output + repr(result.exception)
    assert "prefix+suffix" in result.output


def test_a_record_without_a_schedule_is_named(tmp_path: Path, tiny_shape, record, write_records):
    path = write_records(tmp_path / "r.jsonl", [record("HumanEval/7", "baseline", 1.0)])
    result = _invoke(["bench", "replay", str(path), "--shape", tiny_shape, "--out", str(tmp_path / "o.jsonl")])
    assert result.exit_code == 2
    text = " ".join(result.output.split())
    assert "r.jsonl:1" in text and "HumanEval/7" in text and "baseline" in text and "no forward schedule" in text
    assert not (tmp_path / "o.jsonl").exists()


def test_an_unknown_shape_exits_2_listing_the_shapes(tmp_path: Path):
    result = _invoke(["bench", "replay", str(tmp_path / "r.jsonl"), "--shape", "gpt-9", "--out", str(tmp_path / "o")])
    assert result.exit_code == 2
    text = " ".join(result.output.split())
    assert "gpt-9" in text and "qwen3-8b" in text and "smollm2" in text


def test_a_paced_replay_keeps_the_recorded_host_gaps_out_of_the_forward_time(tiny):
    """`pace`: the host stays busy between forwards for the recorded mean gap, the same forwards
    run, and the timed forward time does not include the gaps."""
    import time

    model, tok = tiny
    llm = LLM.from_model(model, tok, engine_config=EngineConfig(num_slots=2, max_len=128))
    recorder = ScheduleRecorder().attach(llm.engine.runner)
    llm.generate(["count"], SamplingParams(max_tokens=12, ignore_eos=True))
    schedule = recorder.finish()
    n = len(schedule.forwards)
    paced_schedule = Schedule(schedule.events, schedule.num_slots, schedule.max_len, host_s=0.02 * n)
    runner = replay_runner(model, [schedule])
    plain = replay(runner, schedule)
    began = time.perf_counter()
    paced = replay(runner, paced_schedule, pace=True)
    wall = time.perf_counter() - began
    assert (paced.forwards, paced.tokens) == (plain.forwards, plain.tokens) == (n, schedule.fed_tokens())
    assert wall >= 0.02 * n  # every gap was kept
    assert paced.gpu_s < wall - 0.02 * n * 0.9  # and none of it counted as forward time
