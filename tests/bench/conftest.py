"""Synthetic bench records for the report-side tests: the shape `selfspec bench` writes, with
paired latencies chosen so every figure the tests assert can be worked out by hand."""

from __future__ import annotations

import json
from pathlib import Path

import pytest


def _settings(budget: int = 100) -> dict:
    return {
        "cot_cap": 400,
        "answer_cap": 300,
        "draft_budget": budget,
        "draft_interval": budget,
        "max_draft_len": 300,
        "fixed_length": True,
        "suffix": {"max_depth": 4},
        "suffix_sources": ["draft"],
    }


def _rec(sample: str, mode: str, latency: float, *, model: str = "tiny", budget: int = 100, **extra) -> dict:
    rec = {
        "sample_id": sample,
        "benchmark": "humaneval",
        "mode": mode,
        "model": model,
        "settings": _settings(budget),
        "device": "cpu",
        "dtype": "float32",
        "command": "selfspec bench -b humaneval",
        "date": "2026-01-02",
        "versions": {"torch": "2.x"},
        "latency_s": latency,
        "thinking_s": latency / 2,
        "first_answer_token_s": latency / 2 + 0.1,
        "cot_tokens": 100,
        "answer_tokens": 100,
        "accepted_prefix": 0,
        "suffix_accepted_tokens": 0,
        "oracle_speedup": 2.0,
        "loop": False,
        "exact_match": True,
    }
    rec.update(extra)
    return rec


def _write(path: Path, records: list[dict], tail: str = "") -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records) + tail)
    return path


@pytest.fixture()
def settings_dict():
    """`settings_dict(budget=100)`: a run's settings as records carry them."""
    return _settings


@pytest.fixture()
def record():
    """`record(sample, mode, latency, *, model="tiny", budget=100, **fields)`: one bench record."""
    return _rec


@pytest.fixture()
def write_records():
    """`write_records(path, records, tail="")`: a JSONL file of them (`tail`: raw text after the last line)."""
    return _write
