"""The thinker's data versions: which generator knobs each named version of the training data uses.

A data version is never edited once an adapter was trained on it: a new one is a new entry,
so an adapter's manifest names the data it saw and that data regenerates exactly.
"""

from __future__ import annotations

from typing import Any

DATA_VERSION = "thinker-data-v1"
"""The default data version: names `DEFAULT_TASK_KNOBS` together with the task families'
own versions. A new data version is a new entry of `DATA_VERSIONS` (never an edit of an
old one), so an adapter's TRAINING.md says which data it saw and old data regenerate."""

DEFAULT_TASK_KNOBS: dict[str, dict[str, Any]] = {
    # Sized so that prompt + CoT + answer mostly fit 3k tokens: a 135M model can keep
    # that much in view, and every answer is still 100-500 tokens long (SSR needs
    # answers worth drafting).
    "class_synthesis": {"min_methods": 2, "max_methods": 4, "min_answer_tokens": 120},
    "record_extraction": {
        "min_records": 5,
        "max_records": 10,
        "min_columns": 3,
        "max_columns": 4,
        "min_answer_tokens": 100,
    },
    "route_finding": {"min_hops": 4, "max_hops": 10, "min_answer_tokens": 80},
    "arithmetic_search": {
        "min_puzzles": 3,
        "max_puzzles": 6,
        "min_numbers": 4,
        "max_numbers": 5,
        "min_steps": 2,
        "max_steps": 3,
        "min_answer_tokens": 80,
    },
}

DATA_VERSION_V2 = "thinker-data-v2"
"""Versions of the families built for what a 135M model can learn: record_extraction and
route_finding version 2, whose CoTs make every piece of the answer a copy of text written
just before it, and arithmetic_search version 2 (three small numbers in order, an
explicit bounded search); class synthesis as in v1. A family's knobs name its version with a "version" entry
(`selfspec_research.thinker.tasks.get_family` takes it); without one a family is version 1."""

V2_TASK_KNOBS: dict[str, dict[str, Any]] = {
    "class_synthesis": dict(DEFAULT_TASK_KNOBS["class_synthesis"]),
    # 3-6 records (v1: 5-10, grown to 20) with 4-5 columns, so rows stay long enough for an
    # answer of ~100 tokens; a one-comparison filter on a requested column in 60% of items,
    # keeping ~60% of records; half of the values shown messy, few adverts.
    "record_extraction": {
        "version": 2,
        "min_records": 3,
        "max_records": 6,
        "min_columns": 4,
        "max_columns": 5,
        "filter_probability": 0.6,
        "keep_rate": 0.6,
        "messy_rate": 0.5,
        "noise_rate": 0.05,
        "min_answer_tokens": 60,
    },
    # 5-8 stations on 2-4 lines (v1: 5-20 hops through ~40-stop networks); start and goal
    # a farthest pair, at least 3 hops apart; the BFS CoT visits each station at most once.
    "route_finding": {
        "version": 2,
        "min_stations": 5,
        "max_stations": 8,
        "min_lines": 2,
        "max_lines": 4,
        "min_hops": 3,
    },
    # 4-6 puzzles of three numbers 1-9 used in order, targets 10-99: the CoT writes every
    # tried operation with its result (at most 3 first steps x 3 second steps a puzzle).
    "arithmetic_search": {
        "version": 2,
        "min_puzzles": 4,
        "max_puzzles": 6,
        "max_number": 9,
        "min_target": 10,
        "max_target": 99,
    },
}

DATA_VERSION_V3 = "thinker-data-v3"
"""thinker-data-v2 with route finding version 3: a start check after every new hop of the
search, so stopping at the start is a comparison of two names written side by side."""

V3_TASK_KNOBS: dict[str, dict[str, Any]] = {
    **{name: dict(knobs) for name, knobs in V2_TASK_KNOBS.items()},
    "route_finding": {**V2_TASK_KNOBS["route_finding"], "version": 3},
}

DATA_VERSION_V4 = "thinker-data-v4"
"""thinker-data-v3's items with CoTs whose wording varies: class synthesis version 2, record
extraction version 3, route finding version 4 and arithmetic search version 3, each drawn
from the stream of the v3 version it rewords, so the same seed and index give the same
prompt and answer as in v3. Each step picks one of several phrasings, independent steps come
in a shuffled order, and the prompt is paraphrased rather than restated (route finding no
longer copies the line listing at every visit); the answer's pieces are still written in
the CoT. Why: v3's fixed templates flatter copy-based speculation, which replays whole
template sentences (`selfspec_research.thinker.copying` measures how much)."""

V4_TASK_KNOBS: dict[str, dict[str, Any]] = {
    "class_synthesis": {**V3_TASK_KNOBS["class_synthesis"], "version": 2},
    "record_extraction": {**V3_TASK_KNOBS["record_extraction"], "version": 3},
    "route_finding": {**V3_TASK_KNOBS["route_finding"], "version": 4},
    "arithmetic_search": {**V3_TASK_KNOBS["arithmetic_search"], "version": 3},
}

DATA_VERSION_HARD_V1 = "thinker-data-hard-v1"
"""Harder items of the families' latest versions (those of thinker-data-v4), knobs only:
more methods, records, stations, lines, hops and puzzles, larger numbers and targets. Why:
on v3/v4 items the thinker solves nearly everything, so nothing is left for a draft to
solve in its place; CoSpec's complementarity can only show where the target fails some
items. Records keep 5 columns (every schema has 5 fields); prompt + CoT + answer stay
mostly under ~3k SmolLM2 tokens."""

HARD_V1_TASK_KNOBS: dict[str, dict[str, Any]] = {
    "class_synthesis": {**V4_TASK_KNOBS["class_synthesis"], "min_methods": 4, "max_methods": 6},
    "record_extraction": {
        **V4_TASK_KNOBS["record_extraction"],
        "min_records": 6,
        "max_records": 9,
        "min_columns": 5,
        "max_columns": 5,
    },
    "route_finding": {
        **V4_TASK_KNOBS["route_finding"],
        "min_stations": 9,
        "max_stations": 12,
        "min_lines": 3,
        "max_lines": 5,
        "min_hops": 4,
    },
    "arithmetic_search": {
        **V4_TASK_KNOBS["arithmetic_search"],
        "min_puzzles": 6,
        "max_puzzles": 8,
        "max_number": 12,
        "max_target": 199,
    },
}

DATA_VERSION_HARD_V2 = "thinker-data-hard-v2"
"""thinker-data-hard-v1 scaled up once more (the same families and versions), so that a run
can pick the level at which the target solves some but not all items."""

HARD_V2_TASK_KNOBS: dict[str, dict[str, Any]] = {
    "class_synthesis": {**HARD_V1_TASK_KNOBS["class_synthesis"], "min_methods": 5, "max_methods": 7},
    "record_extraction": {**HARD_V1_TASK_KNOBS["record_extraction"], "min_records": 9, "max_records": 13},
    "route_finding": {
        **HARD_V1_TASK_KNOBS["route_finding"],
        "min_stations": 13,
        "max_stations": 17,
        "min_lines": 4,
        "max_lines": 6,
        "min_hops": 5,
    },
    "arithmetic_search": {
        **HARD_V1_TASK_KNOBS["arithmetic_search"],
        "min_puzzles": 8,
        "max_puzzles": 10,
        "max_number": 19,
        "max_target": 399,
    },
}

DATA_VERSION_LONG_V1 = "thinker-data-long-v1"
"""Class synthesis whose answer is longer than its CoT: version 3 of the family (a terse plan,
a line or two per method, in thinker-data-v4's varied wording; the bodies are written only in
the answer) with 7-10 methods; the other families keep their thinker-data-v4 knobs, so they
are v4's very items. Why: SSR's gain over copy-based peers is bounded by the answer phase's
share of the latency, and in v4 the CoT is about twice the answer; the paper's ClassEval rows
have answers up to twice the CoT cap. Over 50 held-out items the answer is ~1.3x the CoT
(median, SmolLM2 tokens) and prompt + CoT + answer stays mostly under ~3.5k tokens."""

LONG_V1_TASK_KNOBS: dict[str, dict[str, Any]] = {
    **{name: dict(knobs) for name, knobs in V4_TASK_KNOBS.items()},
    "class_synthesis": {"version": 3, "min_methods": 7, "max_methods": 10, "min_answer_tokens": 120},
}

DATA_VERSIONS: dict[str, dict[str, dict[str, Any]]] = {
    DATA_VERSION: DEFAULT_TASK_KNOBS,
    DATA_VERSION_V2: V2_TASK_KNOBS,
    DATA_VERSION_V3: V3_TASK_KNOBS,
    DATA_VERSION_V4: V4_TASK_KNOBS,
    DATA_VERSION_HARD_V1: HARD_V1_TASK_KNOBS,
    DATA_VERSION_HARD_V2: HARD_V2_TASK_KNOBS,
    DATA_VERSION_LONG_V1: LONG_V1_TASK_KNOBS,
}
"""The built-in data versions and their knobs (family -> knobs, "version" included)."""

HARD_DATA_VERSIONS: tuple[str, ...] = (DATA_VERSION_HARD_V1, DATA_VERSION_HARD_V2)
"""Evaluation levels beyond what the thinker was trained on, hardest last: their items are
other items than the training versions' (larger knobs draw other streams)."""


DATA_MIX_V4_LONG_V1 = "thinker-data-mix-v4-long-v1"
"""Training data for a thinker that writes long answers: the items of thinker-data-v4 and of
thinker-data-long-v1 together. A family with the same knobs in both counts once (they would
be the same items), so the mix is v4's four families plus long-v1's class synthesis. Why a
mix: the long items alone would teach the thinker only terse plans for classes; with v4's,
it keeps v4's skills and learns both CoT shapes."""

DATA_MIXES: dict[str, tuple[str, ...]] = {DATA_MIX_V4_LONG_V1: (DATA_VERSION_V4, DATA_VERSION_LONG_V1)}
"""Training data made of several built-in data versions' items (`DataSpec.for_version` unites
them); the last part is the one the mix was made for (see `data_version_knobs`)."""


def data_version_parts(version: str) -> tuple[str, ...]:
    """The built-in data versions whose items make up `version`: a mix's parts, else itself."""
    return DATA_MIXES.get(version, (version,))


def data_version_knobs(version: str) -> dict[str, dict[str, Any]]:
    """A copy of the knobs of built-in data version `version`.

    For a mix (`DATA_MIXES`), its last part's: one knob set per family is what benchmarks and
    evals take, and an adapter trained on a mix is measured on the items it was made for."""
    version = data_version_parts(version)[-1]
    try:
        knobs = DATA_VERSIONS[version]
    except KeyError:
        raise KeyError(f"unknown data version {version!r}; built in: {', '.join(DATA_VERSIONS)}") from None
    return {family: dict(values) for family, values in knobs.items()}


TRAIN_SEED = 0
"""Stream of the training split; held-out evaluation uses other seeds."""

HELDOUT_SEED = 1000
"""The held-out stream every eval and benchmark of the thinker's families defaults to."""
