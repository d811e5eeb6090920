"""Versions 2 and 3 of the thinker task families (thinker-data-v2, thinker-data-v3): picked
like knobs, deterministic, and built so that every answer piece is a copy of text the CoT
wrote just before it; version 1 (thinker-data-v1) stays what it was."""

from __future__ import annotations

import hashlib
import json
import os
import re
import statistics
import subprocess
import sys

import pytest

from selfspec.testing.tiny import tiny_tokenizer
from selfspec_research.thinker.data_versions import DATA_VERSION, DATA_VERSIONS, DEFAULT_TASK_KNOBS, data_version_knobs
from selfspec_research.thinker.examples import DataSpec
from selfspec_research.thinker.measures import has_loop
from selfspec_research.thinker.tasks import (
    TaskItem,
    check,
    check_many,
    estimate_tokens,
    families,
    format_training_text,
    generate,
    generate_split,
    get_family,
    ordered_line_coverage,
    versions,
)
from selfspec_research.thinker.tasks.arithmetic_search import apply, ordered_search
from selfspec_research.thinker.tasks.record_extraction import RecordExtraction, RecordExtractionV2, SimpleFilter
from selfspec_research.thinker.tasks.route_finding import (
    RouteFindingV2,
    adjacency,
    hop_line,
    shortest_paths,
)

N_ITEMS = 50


def _item_digest(item: TaskItem) -> str:
    return hashlib.sha256(json.dumps(item.to_dict(), sort_keys=True).encode()).hexdigest()


# =========================================================== version 2 (thinker-data-v2)
V2 = "thinker-data-v2"
V2_FAMILIES = ("record_extraction", "route_finding", "arithmetic_search")
V1_PIN = "3d6fb65fbb16fda9e0464781762fbf2e5e8db76628693a125a59719874581ce5"
"""SHA-256 of generate_split(families(), seed=7, n=3, knobs=DEFAULT_TASK_KNOBS): the
thinker-data-v1 items, which later family versions must leave unchanged."""


@pytest.fixture(scope="module")
def v2_samples() -> dict[str, list[TaskItem]]:
    """50 items per changed family with the thinker-data-v2 knobs, from one seed."""
    knobs = data_version_knobs(V2)
    return {name: [generate(name, 11, i, **knobs[name]) for i in range(N_ITEMS)] for name in V2_FAMILIES}


def test_v1_data_is_unchanged_and_still_the_default() -> None:
    digest = hashlib.sha256()
    for item in generate_split(families(), seed=7, n=3, knobs=DEFAULT_TASK_KNOBS):
        digest.update(json.dumps(item.to_dict(), sort_keys=True).encode())
    assert digest.hexdigest() == V1_PIN
    assert DATA_VERSION == "thinker-data-v1" and DataSpec().version == DATA_VERSION
    assert DataSpec().knobs == DATA_VERSIONS[DATA_VERSION] == DEFAULT_TASK_KNOBS
    assert all(item.version == 1 for item in DataSpec(items_per_family=1).items())
    assert type(get_family("record_extraction")) is RecordExtraction


def test_family_versions_are_picked_like_knobs() -> None:
    assert versions("record_extraction") == versions("arithmetic_search") == [1, 2, 3]
    assert versions("route_finding") == [1, 2, 3, 4]
    assert versions("class_synthesis") == [1, 2, 3]
    assert isinstance(get_family("record_extraction", version=2), RecordExtractionV2)
    assert isinstance(get_family("route_finding", version=2, min_stations=6), RouteFindingV2)
    with pytest.raises(KeyError, match="no version 9"):
        get_family("record_extraction", version=9)
    spec = DataSpec.for_version(V2, items_per_family=2, seed=5)
    items = spec.items()
    assert spec.version == V2 and spec.describe()["knobs"]["route_finding"]["version"] == 2
    assert {(item.family, item.version) for item in items} == {
        ("class_synthesis", 1),
        ("record_extraction", 2),
        ("route_finding", 2),
        ("arithmetic_search", 2),
    }
    # v2 items are new identities: same family/seed/index as v1, other uid and content
    v1 = DataSpec.for_version(DATA_VERSION, items_per_family=2, seed=5).items()
    for old, new in zip(v1, items):
        if old.family in V2_FAMILIES:
            assert old.uid != new.uid and old.prompt != new.prompt
        else:
            assert old == new
    with pytest.raises(KeyError, match="unknown data version"):
        DataSpec.for_version("thinker-data-v9")


@pytest.mark.parametrize("family", V2_FAMILIES)
def test_v2_items_are_deterministic_per_seed(family: str) -> None:
    knobs = data_version_knobs(V2)[family]
    first, again = generate(family, 5, 3, **knobs), generate(family, 5, 3, **knobs)
    assert first == again and first.version == 2 and first.uid == f"{family}-v2-s5-i3"
    assert generate(family, 6, 3, **knobs).prompt != first.prompt
    assert generate(family, 5, 4, **knobs).prompt != first.prompt
    assert len({generate(family, 9, i, **knobs).prompt for i in range(30)}) == 30


def test_v2_items_reproduce_in_another_process_with_another_hash_seed() -> None:
    code = (
        "import hashlib, json\n"
        "from selfspec_research.thinker.examples import DataSpec\n"
        "for item in DataSpec.for_version('thinker-data-v2', seed=21, items_per_family=2).items():\n"
        "    print(hashlib.sha256(json.dumps(item.to_dict(), sort_keys=True).encode()).hexdigest())\n"
    )
    env = {**os.environ, "PYTHONHASHSEED": "999"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True, timeout=60)
    here = [_item_digest(item) for item in DataSpec.for_version(V2, seed=21, items_per_family=2).items()]
    assert out.stdout.split() == here


@pytest.mark.parametrize("family", V2_FAMILIES)
def test_v2_references_pass_and_round_trip(family: str, v2_samples: dict[str, list[TaskItem]]) -> None:
    items = v2_samples[family]
    results = check_many(items, [item.answer for item in items])
    assert [r.detail for r in results if not r.passed] == []
    assert all(result.score == 1.0 for result in results)
    restored = TaskItem.from_dict(json.loads(json.dumps(items[0].to_dict())))
    assert restored == items[0] and check(restored, format_training_text(restored)[1]).passed
    # default-knob v2 items pass too
    defaults = [generate(family, 3, i, version=2) for i in range(20)]
    assert all(result.passed for result in check_many(defaults, [item.answer for item in defaults]))


@pytest.mark.parametrize("family", V2_FAMILIES)
def test_v2_cot_holds_every_answer_line_in_order(family: str, v2_samples: dict[str, list[TaskItem]]) -> None:
    for item in v2_samples[family]:
        assert ordered_line_coverage(item.answer, item.cot) == 1.0


def _record_blocks(item: TaskItem) -> list[list[str]]:
    """The CoT's per-record blocks ("Product 2 of 5:" then the field lines ...)."""
    blocks = [block.splitlines() for block in item.cot.split("\n\n")]
    return [lines for lines in blocks if re.fullmatch(r"[A-Z][a-z ]+ \d+ of \d+:", lines[0])]


def _field_value(line: str) -> str:
    """The normalised value of a CoT field line: `col: value` or `col: "shown" -> value`."""
    rest = line.split(": ", 1)[1]
    return rest.rsplit(" -> ", 1)[1] if rest.startswith('"') else rest


def test_v2_record_rows_are_copies_of_the_values_written_just_before(v2_samples: dict[str, list[TaskItem]]) -> None:
    for item in v2_samples["record_extraction"]:
        columns = item.meta["columns"]
        blocks = _record_blocks(item)
        assert len(blocks) == item.meta["n_records"]
        rows = []
        for k, lines in enumerate(blocks, start=1):
            assert lines[0].endswith(f" {k} of {len(blocks)}:")
            fields = lines[1 : 1 + len(columns)]
            assert [line.split(": ", 1)[0] for line in fields] == columns
            values = [_field_value(line) for line in fields]
            decision = lines[1 + len(columns)]
            assert decision.endswith(("-> keep", "-> drop"))
            if item.meta["filter"]:
                column = decision.removeprefix("Filter: ").split(" ", 1)[0]
                assert decision.startswith(f"Filter: {column} {values[columns.index(column)]} ")  # the copied value
            if decision.endswith("-> keep"):
                assert lines[2 + len(columns)] == "\t".join(values)  # the row is the values just written
                rows.append(values)
            else:
                assert all("\t" not in line for line in lines)
        assert rows == item.meta["rows"]


def test_v2_record_filters_are_one_comparison_that_keeps_and_drops() -> None:
    at_least = SimpleFilter("price", "at_least", "100", "products")
    assert at_least.keep({"price": "100.00"}) and not at_least.keep({"price": "99.99"})
    assert at_least.decision({"price": "49.50"}) == "Filter: price 49.50 is below 100 -> drop"
    later = SimpleFilter("departure", "at_least", "12:00", "flights")
    assert later.keep({"departure": "12:00"}) and not later.keep({"departure": "09:45"})
    assert later.decision({"departure": "13:30"}) == "Filter: departure 13:30 is 12:00 or later -> keep"
    equals = SimpleFilter("city", "is", "Boston", "staff members")
    assert equals.description == "only staff members whose city is Boston"
    assert equals.decision({"city": "Denver"}) == "Filter: city Denver is not Boston -> drop"
    items = [generate("record_extraction", 2, i, version=2) for i in range(60)]
    filtered = [item for item in items if item.meta["filter"]]
    assert 0.4 * len(items) < len(filtered) < 0.8 * len(items)
    for item in filtered:
        assert 1 <= len(item.meta["rows"]) < item.meta["n_records"]  # something kept, something dropped
    assert all(3 <= item.meta["n_records"] <= 6 for item in items)


def test_v2_record_checker_rejects_corruptions_and_rows_the_filter_drops(v2_samples: dict[str, list[TaskItem]]) -> None:
    extra_checked = 0
    for item in v2_samples["record_extraction"]:
        header, *rows = item.answer.split("\n")
        if len(rows) >= 2:
            assert not check(item, "\n".join([header, rows[1], rows[0], *rows[2:]])).passed
        assert not check(item, "\n".join([header, *rows[:-1]])).passed
        cells = rows[-1].split("\t")
        cells[1] = cells[1] + "x"
        assert not check(item, "\n".join([header, *rows[:-1], "\t".join(cells)])).passed
        assert not check(item, "\n".join(["\t".join(reversed(header.split("\t"))), *rows])).passed
        dropped = [b for b in _record_blocks(item) if b[1 + len(item.meta["columns"])].endswith("-> drop")]
        if dropped:  # keeping a record the filter drops fails
            values = [_field_value(line) for line in dropped[0][1 : 1 + len(item.meta["columns"])]]
            kept_too = check(item, "\n".join([item.answer, "\t".join(values)]))
            assert not kept_too.passed and kept_too.score < 1.0
            extra_checked += 1
    assert extra_checked >= 10


def test_v2_route_networks_are_small_and_the_search_is_bounded(v2_samples: dict[str, list[TaskItem]]) -> None:
    knobs = data_version_knobs(V2)["route_finding"]
    for item in v2_samples["route_finding"]:
        lines = item.meta["lines"]
        stations = {s for stops in lines.values() for s in stops}
        assert knobs["min_stations"] <= len(stations) <= knobs["max_stations"]
        assert knobs["min_lines"] <= len(lines) <= knobs["max_lines"]
        assert (
            shortest_paths(lines, item.meta["start"], item.meta["goal"])[0]
            == item.meta["shortest_hops"]
            >= knobs["min_hops"]
        )
        # the prompt lists every line as "Line: A - B - C"
        for line, stops in lines.items():
            assert f"\n{line}: {' - '.join(stops)}\n" in item.prompt
        blocks = item.cot.split("\n\n")
        visits = [b.splitlines() for b in blocks if b.startswith("Visit ")]
        visited = [v[0].removeprefix("Visit ").split(":")[0].removesuffix(" (the goal)") for v in visits]
        assert len(visited) == len(set(visited)) <= len(stations) - 1  # no station twice
        assert visited[0] == item.meta["goal"]
        listing = [f"{line}: {' - '.join(stops)}" for line, stops in lines.items()]
        adj = adjacency(lines)
        notes = []
        for here, body in zip(visited, visits):
            copies = [text for text in body if ": " in text and text.split(": ", 1)[0] in lines]
            assert all(text in listing for text in copies)  # each line copied verbatim
            for text in body:
                if text.startswith("From "):
                    notes.append(text)
                    origin, rest = text.removeprefix("From ").split(" take ", 1)
                    assert rest.endswith(f" to {here}")
                    line = rest.removesuffix(f" to {here}").removeprefix("the ")
                    assert (here, line) in adj[origin]  # a real hop towards the station visited
        assert len(notes) == len({n.split(" take ")[0] for n in notes})  # each station reached once
        assert item.answer.splitlines() == [n for n in _route_walk(notes, item.meta["start"], item.meta["goal"])]
        # bounded by construction: a visit per station at most, a fixed number of lines per visit
        assert len(item.cot.splitlines()) <= 8 + len(stations) * (4 + 3 * len(lines)) + item.meta["shortest_hops"]


def _route_walk(notes: list[str], start: str, goal: str) -> list[str]:
    by_origin = {n.removeprefix("From ").split(" take ")[0]: n for n in notes}
    walk, here = [], start
    while here != goal:
        walk.append(by_origin[here])
        here = by_origin[here].rsplit(" to ", 1)[1]
    return walk


def test_v2_route_checker_rejects_corruptions(v2_samples: dict[str, list[TaskItem]]) -> None:
    for item in v2_samples["route_finding"]:
        hops = item.answer.split("\n")
        assert not check(item, "\n".join([hops[1], hops[0], *hops[2:]])).passed
        assert not check(item, "\n".join(hops[:-1])).passed
        invented = hops[1].rsplit(" to ", 1)[0] + " to Nowhere Central"
        assert not check(item, "\n".join([hops[0], invented, *hops[2:]])).passed
        first, second = item.meta["route"][:2]
        other_line = next(
            line for line in item.meta["lines"] if (second, line) not in adjacency(item.meta["lines"])[first]
        )
        wrong = check(item, "\n".join([hop_line(first, other_line, second), *hops[1:]]))
        assert not wrong.passed and "does not go" in wrong.detail
        looped = [hops[0], hop_line(second, _line_of(hops[0]), first), *hops]
        assert not check(item, "\n".join(looped)).passed  # valid but longer


def _line_of(hop: str) -> str:
    return hop.split(" take ", 1)[1].rsplit(" to ", 1)[0].removeprefix("the ")


def test_v2_reference_traces_do_not_loop() -> None:
    tokenizer = tiny_tokenizer()
    for item in DataSpec.for_version(V2, families=V2_FAMILIES, seed=4, items_per_family=15).items():
        assert not has_loop(tokenizer.encode(f"{item.cot}\n</think>\n\n{item.answer}", add_special_tokens=False)), (
            item.uid
        )


def test_v2_length_statistics() -> None:
    """Sizes of thinker-data-v2 items (printed; run pytest -s to see them, or
    `python -m selfspec_research.thinker.lengths --data-version thinker-data-v2`)."""
    from selfspec_research.thinker.lengths import format_stats, length_stats, smollm2_tokenizer

    spec = DataSpec.for_version(V2, families=V2_FAMILIES, seed=0, items_per_family=40)
    items = spec.items()
    tokenizer = smollm2_tokenizer()
    if tokenizer is not None:
        stats = length_stats(tokenizer, items)
        print("\n" + format_stats(stats, "SmolLM2", 40))
        records, routes = stats["record_extraction"], stats["route_finding"]
        assert records["answer"]["median"] >= 100 and records["example"]["max"] <= 3072
        assert routes["cot"]["max"] <= 1500 and routes["example"]["max"] <= 2000
    by_family = {name: [item for item in items if item.family == name] for name in V2_FAMILIES}
    est = {
        name: {part: [estimate_tokens(getattr(i, part)) for i in group] for part in ("prompt", "cot", "answer")}
        for name, group in by_family.items()
    }
    print(
        {
            name: {part: (min(v), statistics.median(v), max(v)) for part, v in parts.items()}
            for name, parts in est.items()
        }
    )
    assert statistics.median(est["record_extraction"]["answer"]) >= 45
    assert max(est["route_finding"]["cot"]) <= 1200  # 4-character tokens


def test_v2_arithmetic_cot_writes_every_try_correctly_and_stops_at_the_first_hit(
    v2_samples: dict[str, list[TaskItem]],
) -> None:
    equation = re.compile(r"(\d+) ([-+*]) (\d+) (?:= (\d+)|not allowed)")
    for item in v2_samples["arithmetic_search"]:
        blocks = item.cot.split("\n\n")[1:-1]
        assert len(blocks) == len(item.meta["puzzles"])
        for block, puzzle in zip(blocks, item.meta["puzzles"]):
            lines = block.splitlines()
            assert lines[0] == f"Puzzle {blocks.index(block) + 1}: target {puzzle['target']}"
            tries = [line for line in lines[2:] if line.endswith((". Yes.", ". No.", "not allowed."))]
            assert 1 <= len(tries) <= 3 and tries[-1].endswith(". Yes.")
            assert all(not t.endswith(". Yes.") for t in tries[:-1])
            for left, op, right, result in equation.findall(block):
                assert apply(int(left), op, int(right)) == (int(result) if result else None), block
            expected = ordered_search(puzzle["numbers"], puzzle["target"])[1]
            assert lines[-2:] == [str(step) for step in expected]  # the equations right after the hit


def test_v2_arithmetic_checker_rejects_corruptions(v2_samples: dict[str, list[TaskItem]]) -> None:
    for item in v2_samples["arithmetic_search"]:
        lines = item.answer.split("\n")
        first = next(i for i, line in enumerate(lines) if "=" in line)
        left, result = lines[first].rsplit(" = ", 1)
        assert not check(item, "\n".join(lines[:first] + [f"{left} = {int(result) + 1}"] + lines[first + 1 :])).passed
        assert not check(item, "\n".join(lines[:-1])).passed  # the last puzzle stops short of its target
        a, _, c = item.meta["puzzles"][0]["numbers"]
        reused = [lines[0], f"{c} + {c} = {2 * c}"] if a != c else [lines[0], f"{a} + {a} = {2 * a}"]
        assert not check(item, "\n".join(reused + lines[3:])).passed
    assert (
        get_family("arithmetic_search", version=2)
        .check(v2_samples["arithmetic_search"][0], v2_samples["arithmetic_search"][0].answer)
        .passed
    )


# =========================================================== thinker-data-v3: route finding version 3
def test_v3_data_is_v2_with_route_finding_version_3() -> None:
    v2 = DataSpec.for_version(V2, items_per_family=3, seed=5).items()
    v3 = DataSpec.for_version("thinker-data-v3", items_per_family=3, seed=5).items()
    for old, new in zip(v2, v3):
        if old.family == "route_finding":
            assert new.version == 3 and new.uid == old.uid.replace("-v2-", "-v3-")
        else:
            assert old == new


def test_v3_route_cot_checks_every_new_hop_against_the_start() -> None:
    """After each new hop's line comes its start check; the last check says yes and stops the
    search; the answer, checker and networks are version 2's."""
    knobs = data_version_knobs("thinker-data-v3")["route_finding"]
    for index in range(30):
        item = generate("route_finding", 7, index, **knobs)
        start = item.meta["start"]
        assert (
            item.version == 3
            and check(item, item.answer).passed
            and check(item, item.cot + "\n</think>\n" + item.answer).passed
        )
        lines = item.cot.splitlines()
        hops = [i for i, line in enumerate(lines) if line.startswith("From ") and " take " in line]
        searched = [i for i in hops if i + 1 < len(lines) and lines[i + 1].startswith("Is ")]
        assert searched, item.cot
        for i in searched:
            origin = lines[i].removeprefix("From ").split(" take ")[0]
            assert lines[i + 1] == f"Is {origin} the start, {start}? " + (
                "yes: the search stops." if origin == start else "no"
            )
        yes = [line for line in lines if line.endswith("? yes: the search stops.")]
        assert len(yes) == 1 and "is the start: the search stops." not in item.cot
        # the search visits no station twice and stops at the first yes
        visits = [line for line in lines if line.startswith("Visit ")]
        assert len(visits) == len(set(visits))
        assert lines.index(yes[0]) < lines.index("Route from the start, following the hops:")
