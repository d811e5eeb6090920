"""Record extraction, version 3 (thinker-data-v4): version 2's items with a reworded CoT.

The documents, prompts, answers and checker are version 2's (the same random stream, so
the same seed and index give the same item); only the CoT's wording changes. Version 2
writes every step from one template and restates the prompt's filter sentence word for
word; here each step picks one of several phrasings with the item's stream, the plan's
independent facts (format, filter) come in a shuffled order, the filter is said
in other words, and a record's filter check comes right after the value it tests or after
all its values. What the answer needs is still written the same way: the key listing,
then per record each requested value in column order (the form shown and the normalised
value), the keep/drop decision on the value just written, and the TSV row of a kept
record, so a draft forked after k records holds k rows.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from .record_documents import Shown
from .record_extraction import RecordExtractionV2, SimpleFilter
from .record_schemas import Record, Schema
from .wording import capitalised, ordinal, pick, plural, shuffled, spoken_list

# Every fixed run of words stays short and sits next to the item's own names and values,
# so no sentence is a template that other items repeat word for word.
_FORMATS = ("Format: {kind}.", "It is {kind}.", "Laid out as {kind}.", "The source: {kind}.")
_COLUMNS = ("{columns}", "{spoken}", "{spoken} in that order", "{columns} (header order)")
_NO_FILTER = (
    "No filter: every {entity} is kept.",
    "Nothing is filtered out.",
    "Every {entity} goes in; there is no condition.",
)
_FILTERS = {
    # (op, a time?) -> paraphrases of the filter (the prompt's own sentence is not reused)
    ("is", False): (
        "Keep only {entities} with {column} {value}.",
        "A row stays only if its {column} is exactly {value}.",
        "Anything whose {column} is not {value} is dropped.",
        "The condition: {column} must equal {value}.",
    ),
    ("at_least", False): (
        "Keep {column} of {value} or more.",
        "Any {entity} with {column} under {value} is dropped.",
        "The condition: {column} has to reach {value}.",
        "Rows need {column} >= {value}.",
    ),
    ("at_least", True): (
        "Keep {column} from {value} on.",
        "Any {entity} with {column} before {value} is dropped.",
        "The condition: {column} no earlier than {value}.",
        "Rows need {column} at {value} or after.",
    ),
}
_METHODS = (
    "For each {entity} I write {columns}, normalised{check}, then its row{kept}.",
    "Per {entity}: {columns}{check}; then the row{kept}.",
    "Each {entity} gets {columns}{check}, and its row{kept}.",
    "{Entity} by {entity}, I note {columns}{check}, then write the row{kept}.",
)
_METHOD_CHECKS = (", then {column} against the filter", ", checking {column}", "; {column} decides")
_METHOD_KEPT = (" if it is kept", " if it passes", " when it stays")
_HEADERS = ("Header:", "The header row:", "Column line first:", "Header line:")
_LISTINGS = ("{Entities} in the document:", "The {entities}, in order:", "Document order:", "Found these {entities}:")
_NUMBERING = ("{k}. {key}", "{k}) {key}", "#{k} {key}")
_COUNTS = ("That is {count}.", "{count} in all.", "So {count} to go through.", "Total: {count}.")
_LEADS = (
    "{Entity} {k} of {n}:",
    "Next, {entity} {k}/{n}:",
    "Now the {ordinal} {entity}:",
    "{Ordinal} of {n}:",
    "On to {entity} {k}:",
)
_PLAIN = ("{column}: {value}", "{column} = {value}", "{column} is {value}")
_MESSY = (
    '{column}: "{seen}" -> {value}',
    '{column}: {value} (written "{seen}")',
    '{column} "{seen}" becomes {value}',
    '{column}: "{seen}", i.e. {value}',
)
_DECISIONS = (
    "Filter: {column} {value} {relation} -> {verdict}",
    "{value} {relation}, so {verdict}.",
    "Check {column}: {value} {relation}: {verdict}.",
    "Does {value} pass? It {relation}: {verdict}.",
)
_NO_FILTER_DECISIONS = ("No filter -> keep", "No condition, so keep.", "Kept: nothing filters it.")
_NOISE = ("(Then an advert, not a {entity}.)", "An advert here; skip it.", "Filler follows, ignored.")
_CLOSINGS = (
    "Kept {kept} of {n} {entities}.",
    "{Rows} made it, out of {n}.",
    "So: the header plus {rows}.",
    "Done with all {n}; {rows} kept.",
)


class RecordExtractionV3(RecordExtractionV2):
    """Record extraction, version 3 (see the module doc): version 2's items, reworded CoT."""

    version = 3
    stream_version = 2

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
        n = len(records)
        names = {"entity": schema.entity, "entities": schema.entities}
        blocks = [
            self._plan(rng, schema, columns, record_filter, kind),
            f"{rng.choice(_HEADERS)}\n{header}",
            self._listing(rng, schema, shown),
        ]
        plain, messy = rng.choice(_PLAIN), rng.choice(_MESSY)  # one notation per item, as a writer keeps one
        kept = 0
        for k, (record, record_shown, noisy) in enumerate(zip(records, shown, noise_after), start=1):
            lead = pick(
                rng,
                _LEADS,
                k=k,
                n=n,
                ordinal=ordinal(k),
                Ordinal=capitalised(ordinal(k)),
                Entity=capitalised(schema.entity),
                **names,
            )
            lines = [lead]
            for column in columns:
                value, seen = record[column], record_shown.values[column]
                style = messy if seen != value else plain
                lines.append(style.format(column=column, value=value, seen=seen))
            decision = self._decision(rng, record_filter, record)
            if record_filter is not None and rng.random() < 0.5:  # right after the value it tests
                lines.insert(2 + columns.index(record_filter.column), decision)
            else:
                lines.append(decision)
            if record_filter is None or record_filter.keep(record):
                lines.append("\t".join(record[c] for c in columns))
                kept += 1
            if noisy:
                lines.append(pick(rng, _NOISE, entity=schema.entity))
            blocks.append("\n".join(lines))
        rows = plural(kept, "row")
        blocks.append(pick(rng, _CLOSINGS, kept=kept, n=n, rows=rows, Rows=capitalised(rows), **names))
        return "\n\n".join(blocks)

    @staticmethod
    def _plan(
        rng: random.Random, schema: Schema, columns: Sequence[str], record_filter: SimpleFilter | None, kind: str
    ) -> str:
        """The plan: format and filter in a shuffled order, then how each record goes (its columns)."""
        names = {"entity": schema.entity, "entities": schema.entities}
        if record_filter is None:
            condition = pick(rng, _NO_FILTER, **names)
        else:
            condition = pick(
                rng,
                _FILTERS[(record_filter.op, record_filter.is_time)],
                column=record_filter.column,
                value=record_filter.value,
                **names,
            )
        facts = [pick(rng, _FORMATS, kind=kind), condition]
        wanted = pick(rng, _COLUMNS, columns=", ".join(columns), spoken=spoken_list(rng, columns))
        check = pick(rng, _METHOD_CHECKS, column=record_filter.column) if record_filter else ""
        kept = rng.choice(_METHOD_KEPT) if record_filter else ""
        entity = capitalised(schema.entity)
        method = pick(rng, _METHODS, columns=wanted, check=check, kept=kept, Entity=entity, **names)
        return " ".join([*shuffled(rng, facts), method])

    @staticmethod
    def _listing(rng: random.Random, schema: Schema, shown: Sequence[Shown]) -> str:
        """The records' keys in document order, numbered, with their count."""
        numbering = rng.choice(_NUMBERING)
        keys = [numbering.format(k=k, key=one.values[schema.key_column]) for k, one in enumerate(shown, start=1)]
        lead = pick(rng, _LISTINGS, entities=schema.entities, Entities=capitalised(schema.entities))
        count = pick(rng, _COUNTS, count=plural(len(shown), schema.entity, schema.entities))
        return "\n".join([lead, *keys, count])

    @staticmethod
    def _decision(rng: random.Random, record_filter: SimpleFilter | None, record: Record) -> str:
        """The keep/drop decision, on the record's value of the filter column."""
        if record_filter is None:
            return rng.choice(_NO_FILTER_DECISIONS)
        return pick(
            rng,
            _DECISIONS,
            column=record_filter.column,
            value=record[record_filter.column],
            relation=record_filter.relation(record),
            verdict="keep" if record_filter.keep(record) else "drop",
        )
