"""The class concepts: the table the class-synthesis family draws specs from.

Each concept is a small stateful class with a constructor and about ten independent
methods (see `class_spec` for the shapes and the placeholder rules). A method's body is
the reference solution; its probes become the unit tests and the prompt's examples,
their expected values computed by running the reference, so they agree by construction.
The concepts and their wording are this project's own.

The table is data, `data/class_concepts.json`, read once at import; only what has to be
code lives here: the *fills* (the random state a test puts into an object before it
probes it) and the one helper a probe calls. In the JSON, a probe's `expr`, `setup`
lines and `ctor`, and a concept's `ctor_args`, are the bodies of Python f-strings:
`{...}` is evaluated with `d` (the item's `Draw`), `s` (the fill's data, for probes),
`vocab` and `two_root_coeffs` in scope, and `{{`/`}}` are literal braces. They are
evaluated in the order they are listed (expr, setup lines, ctor), which is the order the
item's RNG is drawn from, so a template edit that reorders draws changes the items.
A method's `body` is its reference code, one string per line; its `summary` (and the
constructor's) is a short paraphrase of its `doc` as a bare verb phrase, which CoTs of
class synthesis version 2 say in their own words instead of restating the prompt.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from . import vocab
from .class_spec import ClassConcept, Draw, FillFn, MethodSpec, Probe, ProbeFn

TABLE = Path(__file__).with_name("data") / "class_concepts.json"


# --------------------------------------------------------------------------- fills
def _fill_account(d: Draw) -> tuple[list[str], dict[str, Any]]:
    history = [("deposit", d.int(10, 90)), ("withdraw", d.int(5, 40)), ("deposit", d.int(10, 90))]
    if d.rng.random() < 0.5:
        history.append(("withdraw", d.int(5, 60)))
    return [f"$o.$hist.extend({history!r})"], {"history": history}


def _fill_inventory(d: Draw) -> tuple[list[str], dict[str, Any]]:
    names = d.sample(vocab.PRODUCT_NOUNS, d.int(3, 5))
    items = {name: d.int(0, 30) for name in names}
    items[names[-1]] = 0 if d.rng.random() < 0.5 else items[names[-1]]
    prices = {name: d.price() for name in names}
    return [f"$o.$items.update({items!r})", f"$o.$prices.update({prices!r})"], {"names": names}


def _fill_gradebook(d: Draw) -> tuple[list[str], dict[str, Any]]:
    names = d.people(d.int(3, 5))
    scores = {name: [d.int(35, 100) for _ in range(d.int(1, 4))] for name in names}
    return [f"$o.$scores.update({scores!r})"], {"names": names}


def _fill_cart(d: Draw) -> tuple[list[str], dict[str, Any]]:
    names = d.sample(vocab.PRODUCT_NOUNS, d.int(2, 4))
    lines = {name: [d.price(100, 4000), d.int(1, 4)] for name in names}
    return [f"$o.$lines.update({lines!r})"], {"names": names}


def _fill_tasks(d: Draw) -> tuple[list[str], dict[str, Any]]:
    titles = [
        f"{d.pick(['fix', 'write', 'plan', 'review', 'call', 'clean', 'test'])} {w}" for w in d.words(d.int(3, 5))
    ]
    tasks = [
        {"id": i + 1, "title": title, "priority": d.int(1, 5), "done": d.rng.random() < 0.35}
        for i, title in enumerate(titles)
    ]
    return [f"$o.$tasks.extend({tasks!r})", f"$o.next_id = {len(tasks) + 1}"], {"titles": titles, "n": len(tasks)}


def _fill_parking(d: Draw) -> tuple[list[str], dict[str, Any]]:
    plates = [f"{d.pick('ABCDEFGHJK')}{d.pick('LMNPRSTUVW')}-{d.int(100, 999)}" for _ in range(d.int(2, 3))]
    plates = list(dict.fromkeys(plates))
    parked = {plate: d.int(6, 12) for plate in plates}
    return [f"$o.$spots.update({parked!r})"], {"plates": plates}


def _fill_library(d: Draw) -> tuple[list[str], dict[str, Any]]:
    authors = [f"{d.first()} {d.pick(vocab.LAST_NAMES)}" for _ in range(2)]
    count = d.int(3, 5)
    books = {}
    for i in range(count):
        isbn = f"978-{d.int(1000, 9999)}-{i}"
        title = f"{d.pick(vocab.BOOK_WORDS_A)} {d.pick(vocab.BOOK_WORDS_B)}"
        books[isbn] = {"title": title, "author": authors[i % 2], "available": d.rng.random() < 0.7}
    return [f"$o.$books.update({books!r})"], {"isbns": list(books), "authors": authors}


def _fill_stats(d: Draw) -> tuple[list[str], dict[str, Any]]:
    values = [d.int(1, 40) for _ in range(d.int(4, 8))]
    if d.rng.random() < 0.5:
        values.append(values[0])
    return [f"$o.$values.extend({values!r})"], {"values": values}


def _fill_weather(d: Draw) -> tuple[list[str], dict[str, Any]]:
    days = ["mon", "tue", "wed", "thu", "fri", "sat", "sun"][: d.int(3, 6)]
    readings = {day: d.int(-40, 320) / 10 for day in days}
    return [f"$o.$readings.update({readings!r})"], {"days": days}


def _fill_playlist(d: Draw) -> tuple[list[str], dict[str, Any]]:
    titles = [f"{w.capitalize()} {d.pick(vocab.WORDS).capitalize()}" for w in d.words(d.int(3, 5))]
    songs = [(title, d.int(95, 420)) for title in titles]
    return [f"$o.$songs.extend({songs!r})"], {"titles": titles}


def _fill_calendar(d: Draw) -> tuple[list[str], dict[str, Any]]:
    year = d.int(2023, 2025)
    dates = sorted({d.date(year, d.pick([3, 4])) for _ in range(d.int(3, 4))})
    events = {
        date: [
            f"{d.pick(vocab.EVENT_WORDS_B).lower()} {d.pick(['meeting', 'call', 'lunch', 'review'])}"
            for _ in range(d.int(1, 3))
        ]
        for date in dates
    }
    return [f"$o.$events.update({events!r})"], {"dates": dates, "events": events, "year": year}


def _fill_helpdesk(d: Draw) -> tuple[list[str], dict[str, Any]]:
    customers = d.people(2)
    tickets = {}
    for offset in range(d.int(3, 5)):
        tickets[100 + offset] = {
            "customer": customers[offset % 2],
            "issue": f"{d.pick(vocab.WORDS)} {d.pick(['broken', 'missing', 'slow', 'late', 'noisy'])}",
            "status": d.pick(["open", "open", "closed", "escalated"]),
        }
    return [f"$o.$tickets.update({tickets!r})", f"$o.next_id = {100 + len(tickets)}"], {
        "customers": customers,
        "ids": list(tickets),
    }


def two_root_coeffs(d: Draw) -> str:
    """Coefficients of (x - a)(x - b): a probe that has integer roots to find."""
    a, b = d.int(-4, 4), d.int(-4, 4)
    return repr([a * b, -(a + b), 1])


FILLS: dict[str, FillFn] = {
    "account": _fill_account,
    "inventory": _fill_inventory,
    "gradebook": _fill_gradebook,
    "cart": _fill_cart,
    "tasks": _fill_tasks,
    "parking": _fill_parking,
    "library": _fill_library,
    "stats": _fill_stats,
    "weather": _fill_weather,
    "playlist": _fill_playlist,
    "calendar": _fill_calendar,
    "helpdesk": _fill_helpdesk,
}
"""The fill of each concept that has one (the table names it by the concept's key)."""

_TEMPLATE_NAMES: dict[str, Any] = {"vocab": vocab, "two_root_coeffs": two_root_coeffs}


# --------------------------------------------------------------------------- loading


def _f_string(template: str) -> str:
    """Python source of an f-string whose body is `template` (see the module doc)."""
    for quote in ('"""', "'''"):
        if quote not in template and not template.endswith(quote[0]):
            return f"rf{quote}{template}{quote}"
    raise ValueError(f"no quoting fits template {template!r}")


def _compile(template: str, params: str) -> Callable[..., str]:
    """`template` as a function of `params` (e.g. "d, s") that returns the filled string.

    `eval` of source built from the package's own table, once at import: no outside text
    is ever compiled here.
    """
    return eval(f"lambda {params}: {_f_string(template)}", dict(_TEMPLATE_NAMES))


def _probe(entry: Mapping[str, Any]) -> ProbeFn:
    """A probe of the table as the function `ClassSynthesis` calls: (draw, fill data) -> Probe."""
    expr = _compile(entry["expr"], "d, s")
    setup = [_compile(line, "d, s") for line in entry.get("setup", ())]
    ctor = _compile(entry["ctor"], "d, s") if "ctor" in entry else None
    fill, raises = bool(entry.get("fill", True)), entry.get("raises")

    def probe(d: Draw, s: Mapping[str, Any]) -> Probe:
        # Drawn in this order: the expression, the setup lines, the constructor arguments.
        text = expr(d, s)
        lines = tuple(line(d, s) for line in setup)
        return Probe(text, lines, fill, ctor(d, s) if ctor is not None else None, raises)

    return probe


def _method(entry: Mapping[str, Any]) -> MethodSpec:
    return MethodSpec(
        entry["name"],
        entry["params"],
        entry["doc"],
        "\n".join(entry["body"]),
        tuple(_probe(probe) for probe in entry["probes"]),
        entry.get("summary", ""),
    )


def _concept(entry: Mapping[str, Any]) -> ClassConcept:
    extra = {"fill": FILLS[entry["fill"]]} if entry.get("fill") else {}
    return ClassConcept(
        key=entry["key"],
        class_names=tuple(entry["class_names"]),
        var=entry["var"],
        summary=entry["summary"],
        init=_method(entry["init"]),
        ctor_args=_compile(entry["ctor_args"], "d"),
        methods=tuple(_method(method) for method in entry["methods"]),
        attrs={name: tuple(options) for name, options in entry["attrs"].items()},
        imports=tuple(entry.get("imports", ())),
        **extra,
    )


def load_concepts(path: Path = TABLE) -> tuple[ClassConcept, ...]:
    """The concepts of the table at `path`, in its order (the order items draw from)."""
    return tuple(_concept(entry) for entry in json.loads(path.read_text(encoding="utf-8"))["concepts"])


CONCEPTS: tuple[ClassConcept, ...] = load_concepts()
