"""The documents record extraction reads: one renderer per source kind.

Each renderer lays the shown records out as an HTML table, HTML cards, key-value
blocks, prose or a ragged pipe table, with adverts and notes between them, and returns
the document together with, per record, whether a noise block follows it (the CoT
mentions the adverts it steps over). The family (`record_extraction`) draws the
records, decides how each value is shown, and picks the renderer.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

from . import vocab
from .record_schemas import Schema


@dataclass(frozen=True)
class Shown:
    """A record as the document shows it: messy value and normalisation note per column."""

    values: dict[str, str]
    notes: dict[str, str | None]


_NOISE = (
    "Sponsored: {adj} {noun} deals this week only!",
    "Advertisement - {adj} {noun}s from our partners",
    "Last updated {date}.",
    "Subscribe to our newsletter for more listings.",
    "Details may change without notice.",
    "Page {page} of {pages}",
    "Photo: {adj} {noun} (stock image)",
    "Tip: use the search box to filter this page.",
)
_SITES = ("cityguide.example", "intranet.example", "shop.example", "weekly.example", "hub.example")
_CARD_CLASSES = ("card", "entry", "listing-item", "tile", "result")


def _noise_line(rng: random.Random) -> str:
    return rng.choice(_NOISE).format(
        adj=rng.choice(vocab.ADJECTIVES),
        noun=rng.choice(vocab.PRODUCT_NOUNS),
        date=f"{rng.choice(('March', 'June', 'October'))} {rng.randint(1, 28)}",
        page=rng.randint(1, 3),
        pages=rng.randint(3, 6),
    )


def _labels(rng: random.Random, schema: Schema) -> dict[str, str]:
    return {spec.column: rng.choice(spec.labels) for spec in schema.fields}


def _cell(rng: random.Random, column: str, value: str, key_column: str) -> str:
    if column == key_column and rng.random() < 0.5:
        return f"<b>{value}</b>"
    if "@" in value or "[at]" in value:
        return f'<a href="#contact">{value}</a>'
    if rng.random() < 0.15:
        return f'<span class="v">{value}</span>'
    return value


def _rate(noise: float | None, default: float) -> float:
    """Per-record chance of a noise block: the renderer's own default (version 1) or `noise`."""
    return default if noise is None else noise


# Each renderer returns the document and, per record, whether a noise block follows it
# (the CoT mentions the adverts it steps over).
def _render_html_table(
    rng: random.Random, schema: Schema, title: str, shown: Sequence[Shown], noise: float | None = None
) -> tuple[str, list[bool]]:
    labels = _labels(rng, schema)
    order = [spec.column for spec in schema.fields]
    rng.shuffle(order)
    lines = [
        "<!DOCTYPE html>",
        f"<html><head><title>{title} | {rng.choice(_SITES)}</title></head>",
        "<body>",
        '<nav><a href="/">Home</a> | <a href="/about">About</a> | <a href="/contact">Contact</a></nav>',
        f"<h1>{title}</h1>",
        f'<p class="lead">{_noise_line(rng)}</p>',
        f'<table class="{rng.choice(("list", "data", "grid"))}">',
        "<thead><tr>" + "".join(f"<th>{labels[c]}</th>" for c in order) + "</tr></thead>",
        "<tbody>",
    ]
    noise_after = []
    for record in shown:
        cells = "".join(f"<td>{_cell(rng, c, record.values[c], schema.key_column)}</td>" for c in order)
        lines.append(f"<tr>{cells}</tr>")
        noisy = rng.random() < _rate(noise, 0.15)
        if noisy:
            lines.append(f'<tr class="promo"><td colspan="{len(order)}">{_noise_line(rng)}</td></tr>')
        noise_after.append(noisy)
    lines += ["</tbody>", "</table>", f"<footer>&copy; 2024 {rng.choice(_SITES)}</footer>", "</body></html>"]
    return "\n".join(lines), noise_after


def _render_html_cards(
    rng: random.Random, schema: Schema, title: str, shown: Sequence[Shown], noise: float | None = None
) -> tuple[str, list[bool]]:
    labels = _labels(rng, schema)
    others = [spec.column for spec in schema.fields[1:]]
    rng.shuffle(others)
    card_class = rng.choice(_CARD_CLASSES)
    use_list = rng.random() < 0.5
    lines = [f'<div id="main"><h2>{title}</h2>', f"<!-- {_noise_line(rng)} -->"]
    noise_after = []
    for record in shown:
        lines.append(f'<div class="{card_class}">')
        lines.append(f"  <h3>{record.values[schema.key_column]}</h3>")
        if use_list:
            lines.append("  <ul>")
            lines += [f'    <li><span class="label">{labels[c]}:</span> {record.values[c]}</li>' for c in others]
            lines.append("  </ul>")
        else:
            lines += [f"  <p><em>{labels[c]}</em> {record.values[c]}</p>" for c in others]
        lines.append("</div>")
        noisy = rng.random() < _rate(noise, 0.2)
        if noisy:
            lines.append(f'<div class="banner">{_noise_line(rng)}</div>')
        noise_after.append(noisy)
    lines.append("</div>")
    return "\n".join(lines), noise_after


def _render_key_values(
    rng: random.Random, schema: Schema, title: str, shown: Sequence[Shown], noise: float | None = None
) -> tuple[str, list[bool]]:
    labels = _labels(rng, schema)
    others = [spec.column for spec in schema.fields[1:]]
    rng.shuffle(others)
    order = [schema.key_column, *others]
    separator = rng.choice(("---", "* * *", "========", "~~"))
    lines = [title.upper(), "=" * len(title), _noise_line(rng), ""]
    noise_after = []
    for record in shown:
        lines += [f"{labels[c]}: {record.values[c]}" for c in order]
        noisy = rng.random() < _rate(noise, 0.2)
        if noisy:
            lines.append(f"Note: {_noise_line(rng)}")
        lines.append(separator)
        noise_after.append(noisy)
    return "\n".join(lines), noise_after


def _render_prose(
    rng: random.Random, schema: Schema, title: str, shown: Sequence[Shown], noise: float | None = None
) -> tuple[str, list[bool]]:
    paragraphs = [f"{title}.", _noise_line(rng)]
    noise_after = []
    for record in shown:
        paragraphs.append(rng.choice(schema.prose).format(**record.values))
        noisy = rng.random() < _rate(noise, 0.2)
        if noisy:
            paragraphs.append(_noise_line(rng))
        noise_after.append(noisy)
    return "\n\n".join(paragraphs), noise_after


def _render_pipes(
    rng: random.Random, schema: Schema, title: str, shown: Sequence[Shown], noise: float | None = None
) -> tuple[str, list[bool]]:
    labels = _labels(rng, schema)
    order = [spec.column for spec in schema.fields]
    rng.shuffle(order)
    lines = [f"## {title}", "", "| " + " | ".join(labels[c] for c in order) + " |", "|" + "---|" * len(order)]
    noise_after = []
    for record in shown:
        pad = lambda text: " " * rng.randint(0, 2) + text + " " * rng.randint(0, 2)  # noqa: E731
        lines.append("|" + "|".join(pad(record.values[c]) for c in order) + "|")
        noisy = rng.random() < _rate(noise, 0.15)
        if noisy:
            lines.append(f"> {_noise_line(rng)}")
        noise_after.append(noisy)
    return "\n".join(lines), noise_after


RENDERERS = {
    "an HTML table": _render_html_table,
    "HTML cards": _render_html_cards,
    "key-value blocks": _render_key_values,
    "paragraphs of prose": _render_prose,
    "a pipe-separated table": _render_pipes,
}
