"""Record extraction: pull records out of a messy document into a TSV table.

The document is an HTML table, HTML cards, key-value text, prose, or a ragged pipe
table, with adverts and notes between the records and fields in messy forms. The CoT
walks the records in document order, normalises each requested field (with a note when
the form changes) and writes the finished row, so a draft forked after k records holds
k rows. The checker compares rows exactly and scores row-level F1. The documents are
laid out by `record_documents`; the schemas, their values and messy forms are in
`record_schemas`.

Version 2 (`RecordExtractionV2`, in thinker-data-v2) is built for a very small model:
3-6 records, a one-comparison filter on a requested column, few adverts, and a CoT in
which every answer cell is a copy of a value written on the line above it (see the
comment before `SimpleFilter`). All versions share the checker. Version 3
(`record_extraction_v3`, in thinker-data-v4) is version 2's items with the CoT worded
differently from item to item.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .base import CheckResult, TaskFamily, TaskItem, estimate_tokens, final_answer_text, require_range
from .record_documents import RENDERERS, Shown
from .record_schemas import SCHEMAS, FilterSpec, Record, Schema, make_record


def parse_tsv(text: str) -> list[list[str]]:
    """The tab-separated lines of an answer, split into cells.

    Lines without a tab (fences, blank lines, a sentence before the table) are not
    rows: every table here has at least two columns.
    """
    return [
        [cell.strip() for cell in line.rstrip("\r").split("\t")]
        for line in final_answer_text(text).splitlines()
        if "\t" in line
    ]


def row_f1(expected: Sequence[Sequence[str]], got: Sequence[Sequence[str]]) -> float:
    """F1 over rows as a multiset: a row counts only if every cell matches."""
    if not expected and not got:
        return 1.0
    want = Counter(tuple(row) for row in expected)
    have = Counter(tuple(row) for row in got)
    hits = sum((want & have).values())
    if hits == 0:
        return 0.0
    precision, recall = hits / sum(have.values()), hits / sum(want.values())
    return 2 * precision * recall / (precision + recall)


class RecordExtraction(TaskFamily):
    """Generator + checker for the record-extraction family.

    Knobs: `min_records`/`max_records` (records in the document; more are added, up to
    twice `max_records`, while the answer is under `min_answer_tokens`),
    `min_columns`/`max_columns` requested, `filter_probability`.
    """

    name = "record_extraction"
    version = 1

    def __init__(
        self,
        min_records: int = 12,
        max_records: int = 30,
        min_columns: int = 4,
        max_columns: int = 5,
        filter_probability: float = 0.4,
        min_answer_tokens: int = 200,
    ) -> None:
        require_range("records", min_records, max_records)
        require_range("columns", min_columns, max_columns, floor=2)
        if max_columns > min(len(schema.fields) for schema in SCHEMAS):
            raise ValueError("max_columns exceeds the number of fields of a schema")
        self.min_records, self.max_records = min_records, max_records
        self.min_columns, self.max_columns = min_columns, max_columns
        self.filter_probability = filter_probability
        self.min_answer_tokens = min_answer_tokens

    def knobs(self) -> dict[str, Any]:
        return {
            "min_records": self.min_records,
            "max_records": self.max_records,
            "min_columns": self.min_columns,
            "max_columns": self.max_columns,
            "filter_probability": self.filter_probability,
            "min_answer_tokens": self.min_answer_tokens,
        }

    # ------------------------------------------------------------------ generation
    def build(self, rng: random.Random) -> tuple[str, str, str, dict[str, Any]]:
        schema: Schema = rng.choice(SCHEMAS)
        columns = self._choose_columns(rng, schema)
        record_filter = None
        if rng.random() < self.filter_probability:
            pilot = [make_record(rng, schema, {}) for _ in range(4)]
            record_filter = schema.filters(rng, pilot)
        records = self._draw_records(rng, schema, columns, record_filter)
        shown = [self._mess_up(rng, schema, record) for record in records]

        kind, renderer = rng.choice(list(RENDERERS.items()))
        title = rng.choice(schema.titles)
        document, noise_after = renderer(rng, schema, title, shown)

        kept = [record for record in records if record_filter is None or record_filter.keep(record)]
        header = "\t".join(columns)
        rows = ["\t".join(record[c] for c in columns) for record in kept]
        answer = "\n".join([header, *rows])
        prompt = self._prompt(rng, schema, columns, record_filter, kind, document)
        cot = self._cot(rng, schema, columns, record_filter, kind, records, shown, noise_after, header)
        meta = {
            "schema": schema.key,
            "source": kind,
            "columns": columns,
            "rows": [[record[c] for c in columns] for record in kept],
            "filter": record_filter.description if record_filter else None,
            "n_records": len(records),
        }
        return prompt, cot, answer, meta

    def _choose_columns(self, rng: random.Random, schema: Schema) -> list[str]:
        count = rng.randint(self.min_columns, self.max_columns)
        others = rng.sample([spec.column for spec in schema.fields[1:]], count - 1)
        if rng.random() < 0.5:  # half the time keep the schema's natural order
            order = [spec.column for spec in schema.fields]
            others.sort(key=order.index)
        return [schema.key_column, *others]

    def _draw_records(
        self, rng: random.Random, schema: Schema, columns: Sequence[str], record_filter: FilterSpec | None
    ) -> list[Record]:
        """Records in document order; with a filter, about two in three pass it.

        Each slot first decides whether its record should pass, then draws until one
        does (rejection sampling), so even a rare filter value keeps enough rows.
        """
        target = rng.randint(self.min_records, self.max_records)
        records: list[Record] = []
        taken: dict[str, set[str]] = {schema.key_column: set()}
        answer_chars = len("\t".join(columns))
        while len(records) < target or (
            estimate_tokens("x" * answer_chars) < self.min_answer_tokens and len(records) < 2 * self.max_records
        ):
            want_keep = record_filter is None or rng.random() < 0.65
            for _ in range(200):
                record = make_record(rng, schema, taken)
                if record_filter is None or record_filter.keep(record) == want_keep:
                    break
            records.append(record)
            taken[schema.key_column].add(record[schema.key_column])
            if record_filter is None or record_filter.keep(record):
                answer_chars += 1 + len("\t".join(record[c] for c in columns))
        return records

    @staticmethod
    def _mess_up(rng: random.Random, schema: Schema, record: Record) -> Shown:
        values, notes = {}, {}
        for spec in schema.fields:
            values[spec.column], notes[spec.column] = spec.messy(rng, record[spec.column])
        return Shown(values, notes)

    @staticmethod
    def _prompt(
        rng: random.Random,
        schema: Schema,
        columns: Sequence[str],
        record_filter: FilterSpec | None,
        kind: str,
        document: str,
    ) -> str:
        rules = [schema.field(c).rule for c in columns if schema.field(c).rule]
        lines = [
            rng.choice(
                (
                    "Extract the {entities} from the document below into a TSV table.",
                    "Turn the {entities} listed in the document below into a tab-separated table.",
                    "Below is a page ({kind}). Collect its {entities} into a TSV table.",
                )
            ).format(entities=schema.entities, kind=kind),
            f"Columns, in this order: {', '.join(columns)}.",
            f"One row per {schema.entity}, in the order they appear in the document"
            + (f"; {record_filter.description}." if record_filter else "."),
        ]
        if rules:
            lines.append("Write " + "; ".join(rules) + ".")
        lines.append("Answer with the TSV only: the header line, then one line per row, cells separated by tabs.")
        return "\n".join(lines) + "\n\nDocument:\n" + document

    @staticmethod
    def _cot(
        rng: random.Random,
        schema: Schema,
        columns: Sequence[str],
        record_filter: FilterSpec | None,
        kind: str,
        records: Sequence[Record],
        shown: Sequence[Shown],
        noise_after: Sequence[bool],
        header: str,
    ) -> str:
        plan = (
            f"The document is {kind} with {len(records)} {schema.entities}. I need the columns "
            f"{', '.join(columns)}, one row per {schema.entity} in document order"
        )
        plan += f", keeping {record_filter.description}." if record_filter else "."
        normalised = [c for c in columns if schema.field(c).rule]
        if normalised:
            plan += " Values to normalise: " + ", ".join(normalised) + "."
        blocks = [plan, f"Header:\n{header}"]
        kept = 0
        for k, (record, record_shown, noisy) in enumerate(zip(records, shown, noise_after), start=1):
            key_shown = record_shown.values[schema.key_column]
            leads = ("Record {k}: {key}.", "{k}. {key}.") + (("Next, record {k}: {key}.",) if k > 1 else ())
            lead = rng.choice(leads).format(k=k, key=key_shown)
            if record_filter is not None and not record_filter.keep(record):
                blocks.append(f"{lead} Skip: {record_filter.reason(record)}.")
            else:
                notes = [record_shown.notes[c] for c in columns if record_shown.notes[c]]
                text = lead + (" " + "; ".join(notes) + "." if notes else " Nothing to normalise.")
                row = "\t".join(record[c] for c in columns)
                blocks.append(f"{text}\n{row}")
                kept += 1
            if noisy:
                blocks.append("(An advert/note follows; not a record.)")
        blocks.append(f"That is every {schema.entity}: {kept} rows under the header.")
        return "\n\n".join(blocks)

    # -------------------------------------------------------------------- checking
    def check(self, item: TaskItem, answer_text: str) -> CheckResult:
        expected_header = list(item.meta["columns"])
        expected_rows = [list(row) for row in item.meta["rows"]]
        got = parse_tsv(answer_text)
        if not got:
            return CheckResult(False, 0.0, "no TSV lines found")
        header, rows = got[0], got[1:]
        score = row_f1(expected_rows, rows)
        if header != expected_header:
            return CheckResult(False, score * 0.5, f"header {header} != {expected_header}")
        if rows == expected_rows:
            return CheckResult(True, 1.0, f"{len(rows)} rows match")
        missing = len(expected_rows) - sum((Counter(map(tuple, expected_rows)) & Counter(map(tuple, rows))).values())
        order_only = sorted(map(tuple, rows)) == sorted(map(tuple, expected_rows))
        detail = (
            "rows match but in a different order"
            if order_only
            else f"{missing} expected rows missing or wrong, got {len(rows)} rows"
        )
        return CheckResult(False, score, detail)


# ------------------------------------------------------------------------ version 2
# Version 2 makes every piece of the answer a copy of text the CoT wrote just before:
# the CoT first lists the records' keys (so it knows how many there are), then walks the
# records one by one, writing each requested value on its own line (the form the document
# shows and the normalised value), then the filter evaluated on that copied value with an
# explicit keep/drop, then, for a kept record, the TSV row made of the values just
# written. Fewer records, one-comparison filters on a requested column, and less noise.

_V2_FILTERS: dict[str, tuple[tuple[str, tuple[str, ...] | None], ...]] = {
    # schema -> (column, bounds for "at least" / None for "is <a value some record has>")
    "staff": (("department", None), ("city", None)),
    "products": (("category", None), ("price", ("50", "100", "200")), ("stock", ("1", "10", "20"))),
    "events": (("venue", None), ("seats", ("200", "500", "1000"))),
    "books": (
        ("year", ("1980", "1990", "2000", "2010")),
        ("pages", ("200", "300", "400")),
        ("price", ("10", "20", "30")),
    ),
    "flights": (("origin", None), ("destination", None), ("departure", ("10:00", "12:00", "15:00"))),
    "restaurants": (("cuisine", None), ("district", None), ("rating", ("3.5", "4.0", "4.5"))),
}


def _magnitude(value: str) -> float:
    """A canonical value as a number: HH:MM times in minutes, everything else as written."""
    if ":" in value:
        hours, minutes = value.split(":")
        return int(hours) * 60 + int(minutes)
    return float(value)


@dataclass(frozen=True)
class SimpleFilter:
    """One comparison on one requested column: `column is value` or `column >= value`."""

    column: str
    op: str  # "is" | "at_least"
    value: str
    entities: str

    @property
    def is_time(self) -> bool:
        return ":" in self.value

    @property
    def description(self) -> str:
        if self.op == "is":
            return f"only {self.entities} whose {self.column} is {self.value}"
        if self.is_time:
            return f"only {self.entities} with {self.column} at {self.value} or later"
        return f"only {self.entities} with {self.column} of at least {self.value}"

    def keep(self, record: Record) -> bool:
        if self.op == "is":
            return record[self.column] == self.value
        return _magnitude(record[self.column]) >= _magnitude(self.value)

    def relation(self, record: Record) -> str:
        """How the record's value stands to the filter's ("is at least 500", "is not Boston")."""
        kept = self.keep(record)
        if self.op == "is":
            return f"is {self.value}" if kept else f"is not {self.value}"
        if self.is_time:
            return f"is {self.value} or later" if kept else f"is before {self.value}"
        return f"is at least {self.value}" if kept else f"is below {self.value}"

    def decision(self, record: Record) -> str:
        """The filter evaluated on the record's value, ending in "keep" or "drop"."""
        verdict = "keep" if self.keep(record) else "drop"
        return f"Filter: {self.column} {record[self.column]} {self.relation(record)} -> {verdict}"


class RecordExtractionV2(RecordExtraction):
    """Record extraction, version 2 (see the comment above): copy-friendly CoT.

    Knobs: `min_records`/`max_records` (records in the document; more are added, up to
    `max_records`, while the answer is under `min_answer_tokens`), `min_columns`/
    `max_columns` requested, `filter_probability`, `keep_rate` (share of records a filter
    keeps), `messy_rate` (chance a value is shown in a messy form rather than as is) and
    `noise_rate` (chance of an advert/note after a record).
    """

    version = 2

    def __init__(
        self,
        min_records: int = 3,
        max_records: int = 6,
        min_columns: int = 4,
        max_columns: int = 5,
        filter_probability: float = 0.6,
        min_answer_tokens: int = 60,
        keep_rate: float = 0.6,
        messy_rate: float = 0.5,
        noise_rate: float = 0.05,
    ) -> None:
        super().__init__(min_records, max_records, min_columns, max_columns, filter_probability, min_answer_tokens)
        for name, value in (("keep_rate", keep_rate), ("messy_rate", messy_rate), ("noise_rate", noise_rate)):
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"{name} must be within [0, 1], got {value}")
        if keep_rate == 0.0:
            raise ValueError("keep_rate must be above 0: every filtered item keeps at least one row")
        self.keep_rate, self.messy_rate, self.noise_rate = keep_rate, messy_rate, noise_rate

    def knobs(self) -> dict[str, Any]:
        return {
            **super().knobs(),
            "keep_rate": self.keep_rate,
            "messy_rate": self.messy_rate,
            "noise_rate": self.noise_rate,
        }

    # ------------------------------------------------------------------ generation
    def build(self, rng: random.Random) -> tuple[str, str, str, dict[str, Any]]:
        schema: Schema = rng.choice(SCHEMAS)
        record_filter = self._v2_filter(rng, schema) if rng.random() < self.filter_probability else None
        columns = self._v2_columns(rng, schema, record_filter)
        records = self._v2_records(rng, schema, columns, record_filter)
        shown = [self._v2_mess_up(rng, schema, record) for record in records]

        kind, renderer = rng.choice(list(RENDERERS.items()))
        title = rng.choice(schema.titles)
        document, noise_after = renderer(rng, schema, title, shown, noise=self.noise_rate)

        kept = [record for record in records if record_filter is None or record_filter.keep(record)]
        header = "\t".join(columns)
        answer = "\n".join([header, *("\t".join(record[c] for c in columns) for record in kept)])
        prompt = self._prompt(rng, schema, columns, record_filter, kind, document)  # type: ignore[arg-type]
        cot = self._record_cot(rng, schema, columns, record_filter, kind, records, shown, noise_after, header)
        meta = {
            "schema": schema.key,
            "source": kind,
            "columns": columns,
            "rows": [[record[c] for c in columns] for record in kept],
            "filter": record_filter.description if record_filter else None,
            "n_records": len(records),
        }
        return prompt, cot, answer, meta

    @staticmethod
    def _v2_filter(rng: random.Random, schema: Schema) -> SimpleFilter:
        column, bounds = rng.choice(_V2_FILTERS[schema.key])
        if bounds is None:
            pilot = [make_record(rng, schema, {}) for _ in range(4)]
            return SimpleFilter(column, "is", rng.choice(pilot)[column], schema.entities)
        return SimpleFilter(column, "at_least", rng.choice(bounds), schema.entities)

    def _v2_columns(self, rng: random.Random, schema: Schema, record_filter: SimpleFilter | None) -> list[str]:
        """The key column first, then the others; the filter's column is always requested."""
        count = rng.randint(self.min_columns, self.max_columns)
        pool = [spec.column for spec in schema.fields[1:]]
        forced = [record_filter.column] if record_filter else []
        others = forced + rng.sample([c for c in pool if c not in forced], count - 1 - len(forced))
        rng.shuffle(others)
        if rng.random() < 0.5:  # half the time keep the schema's natural order
            others.sort(key=pool.index)
        return [schema.key_column, *others]

    def _v2_records(
        self, rng: random.Random, schema: Schema, columns: Sequence[str], record_filter: SimpleFilter | None
    ) -> list[Record]:
        """Records in document order; with a filter about `keep_rate` of them pass it, at
        least one does and, from three records on, at least one does not (each slot decides
        first, then draws until a record agrees)."""
        taken: dict[str, set[str]] = {schema.key_column: set()}

        def draw(want_keep: bool) -> Record:
            for _ in range(400):
                record = make_record(rng, schema, taken)
                if record_filter is None or record_filter.keep(record) == want_keep:
                    break
            taken[schema.key_column].add(record[schema.key_column])
            return record

        target = rng.randint(self.min_records, self.max_records)
        records: list[Record] = []
        answer_chars = len("\t".join(columns))
        while len(records) < target or (
            estimate_tokens("x" * answer_chars) < self.min_answer_tokens and len(records) < self.max_records
        ):
            records.append(draw(record_filter is None or rng.random() < self.keep_rate))
            if record_filter is None or record_filter.keep(records[-1]):
                answer_chars += 1 + len("\t".join(records[-1][c] for c in columns))
        if record_filter is not None:
            verdicts = {record_filter.keep(record) for record in records}
            for missing in (True, False):
                if missing not in verdicts and (missing or len(records) >= 3):
                    at = rng.randrange(len(records))
                    taken[schema.key_column].discard(records[at][schema.key_column])
                    records[at] = draw(missing)
                    verdicts = {record_filter.keep(record) for record in records}
        return records

    def _v2_mess_up(self, rng: random.Random, schema: Schema, record: Record) -> Shown:
        values, notes = {}, {}
        for spec in schema.fields:
            if rng.random() < self.messy_rate:
                values[spec.column], notes[spec.column] = spec.messy(rng, record[spec.column])
            else:
                values[spec.column], notes[spec.column] = record[spec.column], None
        return Shown(values, notes)

    def _record_cot(
        self,
        rng: random.Random,
        schema: Schema,
        columns: Sequence[str],
        record_filter: SimpleFilter | None,
        kind: str,
        records: Sequence[Record],
        shown: Sequence[Shown],
        noise_after: Sequence[bool],
        header: str,
    ) -> str:
        """The CoT, written once the prompt is drawn: version 2's wording is fixed, so `rng`
        goes unused here; a version that rewords the CoT draws its phrasing from it."""
        return self._v2_cot(schema, columns, record_filter, kind, records, shown, noise_after, header)

    @staticmethod
    def _v2_cot(
        schema: Schema,
        columns: Sequence[str],
        record_filter: SimpleFilter | None,
        kind: str,
        records: Sequence[Record],
        shown: Sequence[Shown],
        noise_after: Sequence[bool],
        header: str,
    ) -> str:
        n = len(records)
        entity = schema.entity[0].upper() + schema.entity[1:]
        plan = f"The document is written as {kind}. Columns: {', '.join(columns)}. "
        if record_filter is None:
            plan += f"No filter: every {schema.entity} is kept."
        else:
            plan += f"Filter: {record_filter.description}."
        plan += (
            f" For each {schema.entity} I copy its {len(columns)} values in column order and normalise them"
            + (f", check the filter on its {record_filter.column}" if record_filter else "")
            + ", then write its row"
            + (" if it is kept." if record_filter else ".")
        )
        keys = [f"{k}. {record_shown.values[schema.key_column]}" for k, record_shown in enumerate(shown, start=1)]
        listing = (
            f"The {schema.entities} in the document, in order:\n"
            + "\n".join(keys)
            + f"\nThat is {n} {schema.entities}."
        )
        blocks = [plan, f"Header:\n{header}", listing]
        kept = 0
        for k, (record, record_shown, noisy) in enumerate(zip(records, shown, noise_after), start=1):
            lines = [f"{entity} {k} of {n}:"]
            for column in columns:
                value, seen = record[column], record_shown.values[column]
                lines.append(f'{column}: "{seen}" -> {value}' if seen != value else f"{column}: {value}")
            if record_filter is None:
                lines.append("No filter -> keep")
            else:
                lines.append(record_filter.decision(record))
            if record_filter is None or record_filter.keep(record):
                lines.append("\t".join(record[c] for c in columns))
                kept += 1
            if noisy:
                lines.append("(Then an advert or a note, not a record: skip it.)")
            blocks.append("\n".join(lines))
        blocks.append(f"Kept {kept} of {n} {schema.entities}: {kept} row{'s' if kept != 1 else ''} under the header.")
        return "\n\n".join(blocks)
