"""Record schemas for the record-extraction family: what a record is and how sources mangle it.

A record has a canonical value per field (what the TSV must say) and, in the source
document, a *messy* form: "Lopez, Ana" for "Ana Lopez", "$1,299.00" for "1299.00",
"March 7, 2024" for "2024-03-07". Each messy form comes with the note the CoT writes
when it normalises the value, so the CoT's work per record is explicit and checkable.
Filters ("only products in stock") give the CoT records to skip, with a reason.
"""

from __future__ import annotations

import datetime as dt
import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from . import vocab

Record = dict[str, str]
MONTHS = (
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
)


@dataclass(frozen=True)
class FieldSpec:
    """One column.

    `make(rng, record_so_far)` draws the canonical value (it may depend on earlier
    fields, e.g. an email built from the name); `messy(rng, value)` returns the form a
    source shows and the CoT's normalisation note (None when the value is shown as is).
    `rule` is the prompt's format rule for the column, if it has one.
    """

    column: str
    labels: tuple[str, ...]
    make: Callable[[random.Random, Record], str]
    messy: Callable[[random.Random, str], tuple[str, str | None]]
    rule: str = ""


@dataclass(frozen=True)
class FilterSpec:
    """A condition on canonical values: `keep(record)`; `reason(record)` explains a skip."""

    description: str
    keep: Callable[[Record], bool]
    reason: Callable[[Record], str]


@dataclass(frozen=True)
class Schema:
    key: str
    entity: str
    entities: str
    titles: tuple[str, ...]
    fields: tuple[FieldSpec, ...]
    filters: Callable[[random.Random, list[Record]], FilterSpec]
    prose: tuple[str, ...]  # sentence templates over {column} slots (messy values)

    @property
    def key_column(self) -> str:
        return self.fields[0].column

    def field(self, column: str) -> FieldSpec:
        return next(f for f in self.fields if f.column == column)


# ----------------------------------------------------------------- messy renderers
def _as_is(rng: random.Random, value: str) -> tuple[str, str | None]:
    return value, None


def _messy_name(rng: random.Random, value: str) -> tuple[str, str | None]:
    first, last = value.split(" ", 1)
    form = rng.choice(("plain", "comma", "comma_upper", "plain"))
    if form == "comma":
        shown = f"{last}, {first}"
    elif form == "comma_upper":
        shown = f"{last.upper()}, {first}"
    else:
        return value, None
    return shown, f'name "{shown}" becomes {value}'


def _messy_price(rng: random.Random, value: str) -> tuple[str, str | None]:
    amount = float(value)
    whole = f"{amount:,.2f}"
    form = rng.choice(("dollar", "usd_after", "usd_before", "plain", "dollar_round"))
    if form == "dollar":
        shown = f"${whole}"
    elif form == "usd_after":
        shown = f"{whole} USD"
    elif form == "usd_before":
        shown = f"USD {whole}"
    elif form == "dollar_round" and value.endswith(".00"):
        shown = f"${int(amount):,}"
    else:
        shown = value
    if shown == value:
        return value, None
    return shown, f'price "{shown}" becomes {value}'


def _messy_date(rng: random.Random, value: str) -> tuple[str, str | None]:
    day = dt.date.fromisoformat(value)
    month = MONTHS[day.month - 1]
    form = rng.choice(("long", "short", "weekday", "iso", "day_first"))
    if form == "long":
        shown = f"{month} {day.day}, {day.year}"
    elif form == "short":
        shown = f"{month[:3]} {day.day}, {day.year}"
    elif form == "weekday":
        shown = f"{day.strftime('%A')}, {day.day} {month} {day.year}"
    elif form == "day_first":
        shown = f"{day.day} {month} {day.year}"
    else:
        return value, None
    return shown, f'date "{shown}" becomes {value}'


def _messy_phone(rng: random.Random, value: str) -> tuple[str, str | None]:
    area, exchange, line = value.split("-")
    form = rng.choice(("paren", "dots", "intl", "plain"))
    if form == "paren":
        shown = f"({area}) {exchange}-{line}"
    elif form == "dots":
        shown = f"{area}.{exchange}.{line}"
    elif form == "intl":
        shown = f"+1 {area} {exchange} {line}"
    else:
        return value, None
    return shown, f'phone "{shown}" becomes {value}'


def _messy_email(rng: random.Random, value: str) -> tuple[str, str | None]:
    user, domain = value.split("@")
    form = rng.choice(("mixed", "at", "plain", "plain"))
    if form == "mixed":
        shown = ".".join(part.capitalize() for part in user.split(".")) + "@" + domain.capitalize()
    elif form == "at":
        shown = f"{user} [at] {domain}"
    else:
        return value, None
    return shown, f'email "{shown}" becomes {value}'


def _messy_count(unit: str) -> Callable[[random.Random, str], tuple[str, str | None]]:
    def render(rng: random.Random, value: str) -> tuple[str, str | None]:
        number = int(value)
        form = rng.choice(("comma", "unit", "plain"))
        if form == "comma" and number >= 1000:
            shown = f"{number:,}"
        elif form == "unit":
            shown = f"{number:,} {unit}"
        else:
            return value, None
        return shown, f'"{shown}" becomes {value}'

    return render


def _messy_stock(rng: random.Random, value: str) -> tuple[str, str | None]:
    number = int(value)
    if number == 0:
        shown = rng.choice(("sold out", "out of stock", "0"))
    else:
        shown = rng.choice((f"{number} in stock", f"only {number} left", str(number)))
    if shown == value:
        return value, None
    return shown, f'stock "{shown}" becomes {value}'


def _messy_time(rng: random.Random, value: str) -> tuple[str, str | None]:
    hour, minute = (int(part) for part in value.split(":"))
    form = rng.choice(("ampm", "dot", "plain"))
    if form == "ampm":
        suffix = "PM" if hour >= 12 else "AM"
        shown = f"{(hour - 1) % 12 + 1}:{minute:02d} {suffix}"
    elif form == "dot":
        shown = f"{hour}.{minute:02d}"
    else:
        return value, None
    return shown, f'time "{shown}" becomes {value}'


def _messy_rating(rng: random.Random, value: str) -> tuple[str, str | None]:
    form = rng.choice(("out_of", "stars", "plain"))
    if form == "out_of":
        shown = f"{value}/5"
    elif form == "stars":
        shown = f"{value} stars"
    else:
        return value, None
    return shown, f'rating "{shown}" becomes {value}'


def _messy_upper(rng: random.Random, value: str) -> tuple[str, str | None]:
    form = rng.choice(("lower", "hash", "plain"))
    if form == "lower":
        shown = value.lower()
    elif form == "hash":
        shown = f"#{value}"
    else:
        return value, None
    return shown, f'code "{shown}" becomes {value}'


# ------------------------------------------------------------------ value makers
def _person(rng: random.Random, record: Record) -> str:
    return f"{rng.choice(vocab.FIRST_NAMES)} {rng.choice(vocab.LAST_NAMES)}"


def _email_for(rng: random.Random, record: Record) -> str:
    first, last = record["name"].lower().split(" ", 1)
    user = rng.choice((f"{first}.{last}", f"{first[0]}{last}", f"{first}{rng.randint(1, 99)}"))
    return f"{user}@{rng.choice(vocab.EMAIL_DOMAINS)}"


def _phone(rng: random.Random, record: Record) -> str:
    return f"{rng.randint(201, 989)}-555-{rng.randint(100, 9999):04d}"


def _price(low: int, high: int) -> Callable[[random.Random, Record], str]:
    def make(rng: random.Random, record: Record) -> str:
        cents = rng.randint(low, high) * 100 + rng.choice((0, 0, 49, 50, 95, 99))
        return f"{cents / 100:.2f}"

    return make


def _date(rng: random.Random, record: Record) -> str:
    start = dt.date(2024, 1, 1) + dt.timedelta(days=rng.randint(0, 700))
    return start.isoformat()


def _pick(options: tuple[str, ...]) -> Callable[[random.Random, Record], str]:
    return lambda rng, record: rng.choice(options)


def _int_range(low: int, high: int, step: int = 1) -> Callable[[random.Random, Record], str]:
    return lambda rng, record: str(rng.randrange(low, high + 1, step))


def _product(rng: random.Random, record: Record) -> str:
    return f"{rng.choice(vocab.ADJECTIVES).capitalize()} {rng.choice(vocab.PRODUCT_NOUNS)}"


def _sku(rng: random.Random, record: Record) -> str:
    letters = "ABCDEFGHJKLMNPRSTUVWXYZ"
    return f"{rng.choice(letters)}{rng.choice(letters)}-{rng.randint(1000, 9999)}"


def _event(rng: random.Random, record: Record) -> str:
    return f"{rng.choice(vocab.EVENT_WORDS_A)} {rng.choice(vocab.EVENT_WORDS_B)} {rng.choice(vocab.EVENT_WORDS_C)}"


def _time(rng: random.Random, record: Record) -> str:
    return f"{rng.randint(7, 22):02d}:{rng.choice((0, 15, 30, 45)):02d}"


def _book(rng: random.Random, record: Record) -> str:
    return f"{rng.choice(vocab.BOOK_WORDS_A)} {rng.choice(vocab.BOOK_WORDS_B)}"


def _flight(rng: random.Random, record: Record) -> str:
    return f"{rng.choice(vocab.AIRLINE_CODES)}{rng.randint(100, 989)}"


def _destination(rng: random.Random, record: Record) -> str:
    return rng.choice([city for city in vocab.AIRPORT_CITIES if city != record.get("origin")])


def _restaurant(rng: random.Random, record: Record) -> str:
    return f"The {rng.choice(vocab.RESTAURANT_WORDS_A)} {rng.choice(vocab.RESTAURANT_WORDS_B)}"


def _rating(rng: random.Random, record: Record) -> str:
    return f"{rng.randint(25, 50) / 10:.1f}"


# ----------------------------------------------------------------------- filters
def _equals_filter(column: str, noun: str) -> Callable[[random.Random, list[Record]], FilterSpec]:
    def make(rng: random.Random, records: list[Record]) -> FilterSpec:
        wanted = rng.choice(records)[column]
        return FilterSpec(
            f"only {noun} whose {column} is {wanted}",
            lambda record: record[column] == wanted,
            lambda record: f"{column} is {record[column]}, not {wanted}",
        )

    return make


def _at_least_filter(
    column: str, noun: str, values: tuple[float, ...]
) -> Callable[[random.Random, list[Record]], FilterSpec]:
    def make(rng: random.Random, records: list[Record]) -> FilterSpec:
        bound = rng.choice(values)
        shown = f"{bound:g}"
        return FilterSpec(
            f"only {noun} with {column} of at least {shown}",
            lambda record: float(record[column]) >= bound,
            lambda record: f"{column} {record[column]} is below {shown}",
        )

    return make


def _in_stock(rng: random.Random, records: list[Record]) -> FilterSpec:
    return FilterSpec(
        "only products that are in stock (stock above 0)",
        lambda record: int(record["stock"]) > 0,
        lambda record: "sold out",
    )


def _year_from(rng: random.Random, records: list[Record]) -> FilterSpec:
    year = rng.choice((2024, 2025))
    return FilterSpec(
        f"only events dated in {year}",
        lambda record: record["date"].startswith(f"{year}-"),
        lambda record: f"dated {record['date'][:4]}, not {year}",
    )


def _departs_from(rng: random.Random, records: list[Record]) -> FilterSpec:
    hour = rng.choice(("10:00", "12:00", "15:00"))
    return FilterSpec(
        f"only flights departing at {hour} or later",
        lambda record: record["departure"] >= hour,
        lambda record: f"departs {record['departure']}, before {hour}",
    )


def _one_of(
    *makers: Callable[[random.Random, list[Record]], FilterSpec],
) -> Callable[[random.Random, list[Record]], FilterSpec]:
    return lambda rng, records: rng.choice(makers)(rng, records)


# ----------------------------------------------------------------------- schemas
NAME = FieldSpec("name", ("Name", "Full name", "Employee", "Person"), _person, _messy_name, 'names as "First Last"')
PHONE = FieldSpec(
    "phone", ("Phone", "Tel.", "Telephone", "Direct line"), _phone, _messy_phone, "phone numbers as 415-555-0142"
)

SCHEMAS: tuple[Schema, ...] = (
    Schema(
        key="staff",
        entity="staff member",
        entities="staff members",
        titles=("Staff directory", "Who's who", "Team contacts", "Our people", "Internal phone list"),
        fields=(
            NAME,
            FieldSpec("department", ("Department", "Dept.", "Team", "Unit"), _pick(vocab.DEPARTMENTS), _as_is),
            FieldSpec(
                "email", ("Email", "E-mail", "Mail", "Contact"), _email_for, _messy_email, "emails in lower case with @"
            ),
            PHONE,
            FieldSpec("city", ("City", "Office", "Location", "Based in"), _pick(vocab.CITIES), _as_is),
        ),
        filters=_one_of(_equals_filter("department", "staff members"), _equals_filter("city", "staff members")),
        prose=(
            "{name} works in {department} at the {city} office; write to {email} or call {phone}.",
            "From the {city} office, {name} ({department}) can be reached on {phone} and at {email}.",
            "Our {department} colleague {name}, based in {city}, answers {email} and {phone}.",
        ),
    ),
    Schema(
        key="products",
        entity="product",
        entities="products",
        titles=("Catalogue", "New arrivals", "Shop listing", "Price list", "Clearance corner"),
        fields=(
            FieldSpec(
                "sku", ("SKU", "Item code", "Ref.", "Article no."), _sku, _messy_upper, "SKUs in upper case, without #"
            ),
            FieldSpec("product", ("Product", "Item", "Article", "Name"), _product, _as_is),
            FieldSpec("category", ("Category", "Section", "Aisle", "Range"), _pick(vocab.CATEGORIES), _as_is),
            FieldSpec(
                "price",
                ("Price", "Cost", "Our price", "Now"),
                _price(4, 450),
                _messy_price,
                "prices as plain numbers with two decimals (1299.00)",
            ),
            FieldSpec(
                "stock",
                ("Stock", "Availability", "On hand", "Qty"),
                lambda rng, r: str(rng.choice((0, 0, rng.randint(1, 60), rng.randint(1, 60), rng.randint(1, 60)))),
                _messy_stock,
                "stock as a whole number (0 when sold out)",
            ),
        ),
        filters=_one_of(
            _in_stock, _equals_filter("category", "products"), _at_least_filter("price", "products", (50, 100, 200))
        ),
        prose=(
            "The {product} ({sku}) from our {category} range costs {price}, stock: {stock}.",
            "In {category}: {product}, code {sku}, priced at {price} ({stock}).",
            "Item {sku} is the {product}; it sits in {category}, sells for {price} and is {stock}.",
        ),
    ),
    Schema(
        key="events",
        entity="event",
        entities="events",
        titles=("What's on", "Events calendar", "Upcoming events", "Season programme", "This month in town"),
        fields=(
            FieldSpec("event", ("Event", "Title", "What", "Programme"), _event, _as_is),
            FieldSpec("date", ("Date", "When", "Day", "On"), _date, _messy_date, "dates as YYYY-MM-DD"),
            FieldSpec("time", ("Time", "Starts", "Doors", "Start"), _time, _messy_time, "times as 24-hour HH:MM"),
            FieldSpec("venue", ("Venue", "Where", "Place", "Location"), _pick(vocab.VENUES), _as_is),
            FieldSpec(
                "seats",
                ("Seats", "Capacity", "Places", "Tickets"),
                _int_range(40, 2400, 20),
                _messy_count("seats"),
                "seat counts as plain whole numbers",
            ),
        ),
        filters=_one_of(
            _year_from, _at_least_filter("seats", "events", (200, 500, 1000)), _equals_filter("venue", "events")
        ),
        prose=(
            "{event} comes to the {venue} on {date}, starting {time}, with {seats} available.",
            "On {date} at {time} the {venue} hosts {event} (capacity {seats}).",
            "Save the date: {event}, {date}, {time}, {venue}; {seats}.",
        ),
    ),
    Schema(
        key="books",
        entity="book",
        entities="books",
        titles=("Reading list", "New in the library", "Staff picks", "Second-hand shelf", "Book club archive"),
        fields=(
            FieldSpec("title", ("Title", "Book", "Work", "Name"), _book, _as_is),
            FieldSpec(
                "author", ("Author", "By", "Writer", "Written by"), _person, _messy_name, 'authors as "First Last"'
            ),
            FieldSpec("year", ("Year", "Published", "First edition", "Pub. year"), _int_range(1950, 2024), _as_is),
            FieldSpec(
                "pages",
                ("Pages", "Length", "Extent", "pp."),
                _int_range(96, 1180),
                _messy_count("pages"),
                "page counts as plain whole numbers",
            ),
            FieldSpec(
                "price",
                ("Price", "Cost", "Our price", "Now"),
                _price(3, 60),
                _messy_price,
                "prices as plain numbers with two decimals (1299.00)",
            ),
        ),
        filters=_one_of(
            _at_least_filter("year", "books", (1980, 1990, 2000, 2010)),
            _at_least_filter("pages", "books", (200, 300, 400)),
        ),
        prose=(
            "{title} by {author} ({year}) runs to {pages} and sells for {price}.",
            "First published in {year}, {author}'s {title} has {pages}; price {price}.",
            "We have {title} ({pages}, {year}), written by {author}, for {price}.",
        ),
    ),
    Schema(
        key="flights",
        entity="flight",
        entities="flights",
        titles=("Departures", "Flight board", "Timetable", "Schedule changes", "Today's flights"),
        fields=(
            FieldSpec(
                "flight",
                ("Flight", "Flight no.", "Service", "No."),
                _flight,
                _messy_upper,
                "flight numbers in upper case, without #",
            ),
            FieldSpec("origin", ("From", "Origin", "Departs", "Leaving"), _pick(vocab.AIRPORT_CITIES), _as_is),
            FieldSpec("destination", ("To", "Destination", "Arrives", "Going to"), _destination, _as_is),
            FieldSpec("date", ("Date", "Day", "On", "Departure date"), _date, _messy_date, "dates as YYYY-MM-DD"),
            FieldSpec(
                "departure", ("Dep.", "Departure", "Leaves", "Time"), _time, _messy_time, "times as 24-hour HH:MM"
            ),
        ),
        filters=_one_of(_equals_filter("origin", "flights"), _departs_from),
        prose=(
            "Flight {flight} leaves {origin} for {destination} on {date} at {departure}.",
            "{flight}: {origin} to {destination}, {date}, departing {departure}.",
            "On {date}, {flight} departs at {departure} from {origin}, bound for {destination}.",
        ),
    ),
    Schema(
        key="restaurants",
        entity="restaurant",
        entities="restaurants",
        titles=("Where to eat", "Restaurant guide", "Local food finds", "Dining reviews", "Best tables in town"),
        fields=(
            FieldSpec("restaurant", ("Restaurant", "Name", "Place", "Spot"), _restaurant, _as_is),
            FieldSpec("cuisine", ("Cuisine", "Food", "Kitchen", "Style"), _pick(vocab.CUISINES), _as_is),
            FieldSpec("district", ("District", "Area", "Neighbourhood", "Where"), _pick(vocab.DISTRICTS), _as_is),
            FieldSpec(
                "rating",
                ("Rating", "Score", "Stars", "Our verdict"),
                _rating,
                _messy_rating,
                "ratings as plain numbers with one decimal (4.5)",
            ),
            PHONE,
        ),
        filters=_one_of(
            _at_least_filter("rating", "restaurants", (3.5, 4.0)), _equals_filter("cuisine", "restaurants")
        ),
        prose=(
            "{restaurant} serves {cuisine} food in {district}; rating {rating}, bookings on {phone}.",
            "In {district}, {restaurant} ({cuisine}) earns {rating} - phone {phone}.",
            "For {cuisine} try {restaurant} in {district} ({rating}; {phone}).",
        ),
    ),
)


def make_record(rng: random.Random, schema: Schema, taken: Mapping[str, set[str]]) -> Record:
    """A record whose key value is not in `taken[key_column]` (keys identify rows)."""
    key = schema.key_column
    for _ in range(100):
        record: Record = {}
        for spec in schema.fields:
            record[spec.column] = spec.make(rng, record)
        if record[key] not in taken.get(key, set()):
            return record
    raise RuntimeError(f"could not draw a fresh {schema.entity}; the vocabulary is too small")
