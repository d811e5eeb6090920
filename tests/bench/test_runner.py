"""`selfspec_bench.runner`: the order of a sample's runs, warm-up, shared history, resume keys, divergence fields."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from typer.testing import CliRunner

from selfspec.cli.main import app
from selfspec.testing.tiny import save_tiny_model_dir
from selfspec_bench import cli, runner
from selfspec_bench.runner import (
    _baseline_hashes,
    compiled_graph_count,
    completed_pairs,
    divergence_fields,
    first_divergence,
)

LIMITS = ["--cot-cap", "24", "--draft-budget", "8", "--max-draft", "16", "--answer-cap", "16"]


def test_resume_and_exactness_are_keyed_by_model_and_settings(tmp_path):
    path = tmp_path / "sweep.jsonl"
    a, b = {"draft_budget": 100}, {"draft_budget": 200}
    rows = [
        {"sample_id": "s1", "mode": "baseline", "model": "m", "settings": a, "output_hash": "h1"},
        {"sample_id": "s1", "mode": "prefix", "model": "m", "settings": a, "output_hash": "h1"},
        {"sample_id": "s1", "mode": "baseline", "model": "m", "settings": b, "output_hash": "h2"},
        {"sample_id": "s1", "mode": "baseline", "model": "other", "settings": a, "output_hash": "h3"},
    ]
    path.write_text("\n".join(json.dumps(r) for r in rows) + '\n{"cut')
    assert completed_pairs(path, "m", a) == {("s1", "baseline"), ("s1", "prefix")}
    assert completed_pairs(path, "m", b) == {("s1", "baseline")}
    assert _baseline_hashes(path, "m", b) == {"s1": "h2"}
    assert _baseline_hashes(path, "other", a) == {"s1": "h3"}
    # A bf16 run does not resume from fp32 records of the same settings.
    typed = tmp_path / "typed.jsonl"
    typed.write_text(json.dumps({**rows[0], "dtype": "float32"}) + "\n")
    assert completed_pairs(typed, "m", a, "bfloat16") == set()
    assert completed_pairs(typed, "m", a, "float32") == {("s1", "baseline")}


def test_first_divergence_locates_where_a_mode_leaves_the_baseline():
    assert first_divergence([1, 2, 3], [1, 2, 3]) is None
    assert first_divergence([1, 2, 3], [1, 9, 3]) == 1
    assert first_divergence([1, 2, 3], [1, 2]) == 2 and first_divergence([1, 2], [1, 2, 3]) == 2
    assert divergence_fields([1, 2, 3, 4], 2, [1, 2, 3, 5]) == {
        "first_divergence": 3,
        "first_divergence_phase": "answer",
    }
    assert divergence_fields([1, 2, 3, 4], 2, [0, 2, 3, 4])["first_divergence_phase"] == "cot"
    assert divergence_fields([1, 2], 1, [1, 2]) == {"first_divergence": None, "first_divergence_phase": None}
    shaped = divergence_fields([1, 2, 3], 1, [1, 2, 4], ["1x1/k32"] * 3, ["1x1/k32", "1x16/k32", "1x16/k32"])
    assert shaped["first_divergence_shape"] == "1x16/k32" and shaped["baseline_shape_at_divergence"] == "1x1/k32"


def test_compiled_graph_count_sees_a_compilation():
    """Records carry `compiled_graphs` (torch.compile graphs built during the timed run): the counter
    it reads must move when something compiles."""
    f = torch.compile(lambda x: x * 3 + 1, backend="eager")
    before = compiled_graph_count()
    f(torch.ones(4))
    assert compiled_graph_count() == before + 1
    f(torch.ones(4))  # cached: nothing new
    assert compiled_graph_count() == before + 1


def test_mode_order_rotates_through_the_baseline_and_records_are_written_baseline_first(tmp_path: Path, monkeypatch):
    """The baseline takes every place in the order in turn (a run's place must not favour a
    mode), yet each sample's records are compared with its baseline and written baseline first."""
    calls: list[tuple[str, str]] = []
    real = runner.run_engine_mode

    def spy(llm, sample, mode, s):
        if s.cot_cap == 24:  # timed runs (the warm-up's are short)
            calls.append((sample.id, mode))
        return real(llm, sample, mode, s)

    monkeypatch.setattr(runner, "run_engine_mode", spy)
    model_dir = save_tiny_model_dir(tmp_path / "m", "qwen3")
    out = tmp_path / "r.jsonl"
    result = CliRunner().invoke(
        app,
        [
            "bench",
            "-b",
            "humaneval",
            "--limit",
            "2",
            "--model",
            str(model_dir),
            "--modes",
            "baseline,prefix+suffix",
            *LIMITS,
            "--out",
            str(out),
        ],
    )
    assert result.exit_code == 0, result.output + repr(result.exception)
    assert calls == [
        ("HumanEval/0", "baseline"),
        ("HumanEval/0", "prefix+suffix"),
        ("HumanEval/1", "prefix+suffix"),
        ("HumanEval/1", "baseline"),
    ]
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert [(r["sample_id"], r["mode"], r["run_position"]) for r in records] == [
        ("HumanEval/0", "baseline", 1),
        ("HumanEval/0", "prefix+suffix", 2),
        ("HumanEval/1", "baseline", 2),
        ("HumanEval/1", "prefix+suffix", 1),
    ]
    assert all(r["exact_match"] is True for r in records)
    assert records[3]["first_divergence"] is None  # compared token by token with a baseline that ran after it


def test_every_sample_gets_short_untimed_runs_before_its_timed_ones(tmp_path: Path, monkeypatch):
    """The first timed run of a sample must not pay for its prompt's first prefill or an idle
    GPU (on an H200: +7-15% per forward at place 1 in every mode): each group is warmed with
    short runs of its own samples, and `--no-group-warm-up` turns that off."""

    def run(flag: list[str]) -> list[tuple[str, str, str]]:
        calls: list[tuple[str, str, str]] = []
        real = runner.run_engine_mode

        def spy(llm, sample, mode, s):
            calls.append((sample.id, mode, "timed" if s.cot_cap == 24 else "short"))
            return real(llm, sample, mode, s)

        monkeypatch.setattr(runner, "run_engine_mode", spy)
        model_dir = save_tiny_model_dir(tmp_path / "m", "qwen3")
        out = tmp_path / f"r{len(flag)}.jsonl"
        result = CliRunner().invoke(
            app,
            [
                "bench",
                "-b",
                "humaneval",
                "--limit",
                "2",
                "--model",
                str(model_dir),
                "--modes",
                "baseline,prefix+suffix",
                *LIMITS,
                "--out",
                str(out),
                *flag,
            ],
        )
        assert result.exit_code == 0, result.output + repr(result.exception)
        records = [json.loads(line) for line in out.read_text().splitlines()]
        assert all(r["group_warm_up"] is (not flag) for r in records)
        return calls

    warmed = run([])
    second = warmed.index(("HumanEval/1", "prefix+suffix", "timed"))
    assert warmed[second - 2 : second] == [
        ("HumanEval/1", "baseline", "short"),
        ("HumanEval/1", "prefix+suffix", "short"),
    ]
    cold = run(["--no-group-warm-up"])
    assert not [c for c in cold if c[0] == "HumanEval/1" and c[2] == "short"]


def test_global_suffix_history_does_not_leak_a_sample_between_its_own_mode_runs(tmp_path: Path, monkeypatch):
    """With "global" among the suffix sources, each timed run of a sample starts from the
    shared history as it stood before that sample (an earlier mode's answer to the same prompt
    would be proposed for free), and the next sample sees the response the sample left."""
    seen: list[tuple[str, str, int, int]] = []
    real = runner.run_engine_mode

    def spy(llm, sample, mode, s):
        if s.cot_cap == 24:
            history = llm.global_history
            seen.append((sample.id, mode, len(history), history.total_tokens))
        return real(llm, sample, mode, s)

    monkeypatch.setattr(runner, "run_engine_mode", spy)
    model_dir = save_tiny_model_dir(tmp_path / "m", "qwen3")
    out = tmp_path / "r.jsonl"
    result = CliRunner().invoke(
        app,
        [
            "bench",
            "-b",
            "humaneval",
            "--limit",
            "2",
            "--model",
            str(model_dir),
            "--modes",
            "baseline,prefix+suffix,suffix",
            "--suffix-sources",
            "draft,global",
            *LIMITS,
            "--out",
            str(out),
        ],
    )
    assert result.exit_code == 0, result.output + repr(result.exception)
    first = {s[2:] for s in seen if s[0] == "HumanEval/0"}
    second = {s[2:] for s in seen if s[0] == "HumanEval/1"}
    assert first == {(0, 0)}  # the warm-up's short runs left nothing behind either
    assert len(second) == 1 and next(iter(second))[0] >= 1  # one state for every mode, holding sample 0's answer
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert all(r["exact_match"] is True for r in records)


def test_records_say_whether_other_processes_shared_the_gpu(tmp_path: Path, monkeypatch):
    """Two bench processes on one GPU make every forward take ~2x as long: a sample's records
    carry the most other processes seen on the device just before and just after its timed runs
    (asked before the warm-up and after each sample, never between a warm-up and its timed runs;
    None where the device cannot tell); a CPU run asks nothing."""
    answers = iter([None, None, 3, 0])  # before the warm-up, then after each of the 3 samples
    monkeypatch.setattr(cli, "co_tenant_probe", lambda device: lambda: next(answers))
    model_dir = save_tiny_model_dir(tmp_path / "m", "qwen3")
    out = tmp_path / "r.jsonl"
    result = CliRunner().invoke(
        app,
        [
            "bench",
            "-b",
            "humaneval",
            "--limit",
            "3",
            "--model",
            str(model_dir),
            "--modes",
            "baseline,prefix+suffix",
            *LIMITS,
            "--out",
            str(out),
        ],
    )
    assert result.exit_code == 0, result.output + repr(result.exception)
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert {(r["sample_id"], r["gpu_co_tenants"]) for r in records} == {
        ("HumanEval/0", None),
        ("HumanEval/1", 3),
        ("HumanEval/2", 3),
    }
    assert next(answers, "used up") == "used up"
    monkeypatch.undo()
    assert cli.co_tenant_probe("cpu") is None


def test_records_say_how_many_steps_decoded_ahead(tmp_path: Path):
    """A schedule recorder turns decoding ahead off (its forwards must run one at a time), so the
    plain baseline of a run with schedules decodes serially: each record says how many of its
    steps took a forward launched one ahead (None: off), alone and in a batch."""
    from selfspec.engine.config import EngineConfig
    from selfspec.engine.static_forward import GraphBuckets
    from selfspec.llm import LLM
    from selfspec.testing.tiny import tiny_model, tiny_tokenizer
    from selfspec_bench.datasets.sample import BenchSample, user_message
    from selfspec_bench.modes import BenchSettings

    tok = tiny_tokenizer()
    model = tiny_model("qwen3", len(tok), seed=3, eos_token_id=tok.eos_token_id)
    buckets = GraphBuckets(batch=(1, 2, 4), tokens=(1, 2, 4, 8, 16), min_keys=16)
    config = EngineConfig(num_slots=4, max_len=256, static_shapes=True, graph_buckets=buckets, decode_ahead=True)
    llm = LLM.from_model(model, tok, engine_config=config)
    samples = [BenchSample(f"s/{i}", "s", user_message(f"Write class number {i}")) for i in range(2)]
    settings = BenchSettings(cot_cap=24, answer_cap=16, draft_budget=8, max_draft_len=16)

    def steps(record_schedule: bool, concurrency: int, name: str) -> dict[str, list]:
        s = BenchSettings(**{**settings.__dict__, "concurrency": concurrency})
        records = runner.run_bench(
            llm,
            samples,
            ["baseline", "prompt-lookup"],
            s,
            tmp_path / name,
            progress=False,
            record_schedule=record_schedule,
        )
        return {m: [r["decode_ahead_steps"] for r in records if r["mode"] == m] for m in ("baseline", "prompt-lookup")}

    alone = steps(False, 1, "alone.jsonl")
    assert all(n > 0 for n in alone["baseline"]) and alone["prompt-lookup"] == [0, 0]
    batched = steps(False, 2, "batched.jsonl")
    assert all(n > 0 for n in batched["baseline"])
    recorded = steps(True, 1, "recorded.jsonl")
    assert recorded["baseline"] == [None, None] and recorded["prompt-lookup"] == [None, None]
