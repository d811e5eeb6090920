"""`engine.host_phases`: each step's host time split by phase, and the engine keeping it."""

from __future__ import annotations

import pytest

from selfspec.engine.host_phases import PHASES, HostPhases
from selfspec.engine.llm_engine import Engine, EngineConfig
from selfspec.engine.sampling import SamplingParams
from selfspec.testing.tiny import tiny_model


def test_phases_split_each_step_and_idle_gaps_are_not_counted():
    phases = HostPhases()
    # step 1: propose 0.2, forward 1.0, commit 0.1, policies 0.3 (ms as seconds / 1000)
    phases.add(0.0, 0.0002, 0.0012, 0.0013, 0.0016)
    # step 2 starts 0.05 ms after step 1 ended: the caller's loop, counted as "outside"
    phases.add(0.00165, 0.00175, 0.00275, 0.00285, 0.00295)
    # step 3 starts 1 s later: idling (longer than a forward), not host work
    phases.add(1.0, 1.0001, 1.0011, 1.0012, 1.0013)
    summary = phases.summary()
    assert set(summary) == set(PHASES)
    assert summary["propose"] == pytest.approx((0.2 + 0.1 + 0.1) / 3, abs=1e-3)
    assert summary["commit"] == pytest.approx((0.1 + 0.1 + 0.1) / 3, abs=1e-3)
    assert summary["policies"] == pytest.approx((0.3 + 0.1 + 0.1) / 3, abs=1e-3)
    assert summary["outside"] == pytest.approx(0.05 / 3, abs=1e-3)
    phases.reset()
    assert phases.summary() == {} and phases.steps == 0


def test_the_engine_accounts_every_step_it_ran():
    model = tiny_model("llama", 64, seed=0)
    engine = Engine(model, None, EngineConfig(num_slots=2, max_len=64), eos_token_ids=[])
    seq = engine.add_request([1, 2, 3, 4], SamplingParams(max_tokens=6, ignore_eos=True))
    steps = 0
    while not seq.is_finished:
        engine.step()
        steps += 1
    assert engine.host_phases.steps == steps
    summary = engine.host_phases.summary()
    assert all(summary[name] >= 0 for name in PHASES) and summary["propose"] > 0


def test_steps_are_grouped_by_the_rows_they_fed():
    phases = HostPhases()
    phases.add(0.0, 0.0002, 0.0012, 0.0013, 0.0016, rows=1)
    phases.add(0.00165, 0.00185, 0.00285, 0.00295, 0.00305, rows=2)
    phases.add(0.0031, 0.0032, 0.0042, 0.0043, 0.0044, rows=5)
    by_rows = phases.by_rows()
    assert list(by_rows) == ["1", "2", "3+"]
    assert by_rows["1"]["steps"] == 1 and by_rows["1"]["propose"] == pytest.approx(0.2, abs=1e-6)
    assert by_rows["2"]["propose"] == pytest.approx(0.2, abs=1e-6)
    assert by_rows["2"]["outside"] == pytest.approx(0.05, abs=1e-6)
    assert by_rows["3+"]["policies"] == pytest.approx(0.1, abs=1e-6)
    # the groups add up to the whole
    total = sum(g["propose"] * g["steps"] for g in by_rows.values()) / phases.steps
    assert total == pytest.approx(phases.summary()["propose"], abs=1e-3)
    phases.reset()
    assert phases.by_rows() == {}
