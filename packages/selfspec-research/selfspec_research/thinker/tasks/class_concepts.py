"""The class concepts: a hand-written table the class-synthesis family draws specs from.

Each concept is a small stateful class with a constructor and about ten independent
methods (see `class_spec` for the shapes and the placeholder rules). A method's body is
the reference solution; its probes become the unit tests and the prompt's examples,
their expected values computed by running the reference, so they agree by construction.
The concepts and their wording are this project's own.
"""

from __future__ import annotations

from typing import Any

from . import vocab
from .class_spec import ClassConcept, Draw, MethodSpec, P


# --------------------------------------------------------------------------- accounts
def _account_fill(d: Draw) -> tuple[list[str], dict[str, Any]]:
    history = [("deposit", d.int(10, 90)), ("withdraw", d.int(5, 40)), ("deposit", d.int(10, 90))]
    if d.rng.random() < 0.5:
        history.append(("withdraw", d.int(5, 60)))
    return [f"$o.$hist.extend({history!r})"], {"history": history}


ACCOUNT = ClassConcept(
    key="account",
    class_names=("BankAccount", "Wallet", "SavingsAccount", "CheckingAccount", "DebitAccount"),
    var="acct",
    summary="a bank account that tracks its owner, its balance and a history of transactions",
    attrs={"bal": ("balance", "funds"), "hist": ("history", "transactions", "ledger")},
    init=MethodSpec(
        "__init__",
        "owner, balance=0",
        "Store `owner` as `self.owner` and the opening balance as `self.$bal`, and start "
        "`self.$hist` as an empty list of `(kind, amount)` tuples.",
        "self.owner = owner\nself.$bal = balance\nself.$hist = []",
        (lambda d, s: P("[$o.owner, $o.$bal, $o.$hist]", fill=False),),
    ),
    ctor_args=lambda d: f"{d.first()!r}, {d.int(10, 60) * 10}",
    fill=_account_fill,
    methods=(
        MethodSpec(
            "deposit",
            "amount",
            "Add `amount` to the balance, append `(\"deposit\", amount)` to `self.$hist` and "
            "return the new balance. Raise `ValueError` if `amount` is not positive.",
            'if amount <= 0:\n    raise ValueError("amount must be positive")\n'
            'self.$bal += amount\nself.$hist.append(("deposit", amount))\nreturn self.$bal',
            (
                lambda d, s: P(f"$o.deposit({d.int(5, 200)})"),
                lambda d, s: P(f"$o.deposit({d.int(-50, 0)})", raises="ValueError"),
                lambda d, s: P("$o.$hist[-1]", f"$o.deposit({d.int(5, 200)})"),
            ),
        ),
        MethodSpec(
            "withdraw",
            "amount",
            "Subtract `amount` from the balance, append `(\"withdraw\", amount)` to "
            "`self.$hist` and return the new balance. Raise `ValueError` if `amount` is not "
            "positive or is larger than the balance.",
            "if amount <= 0 or amount > self.$bal:\n"
            '    raise ValueError("invalid amount")\n'
            'self.$bal -= amount\nself.$hist.append(("withdraw", amount))\nreturn self.$bal',
            (
                lambda d, s: P(f"$o.withdraw({d.int(1, 100)})"),
                lambda d, s: P(f"$o.withdraw({d.int(700, 5000)})", raises="ValueError"),
                lambda d, s: P("[$o.$bal, $o.$hist[-1]]", f"$o.withdraw({d.int(1, 90)})"),
            ),
        ),
        MethodSpec(
            "apply_interest",
            "rate",
            "Add interest of `rate` percent of the balance: round the interest to 2 "
            "decimals, add it to the balance, record `(\"interest\", interest)` in the "
            "history and return the interest.",
            "interest = round(self.$bal * rate / 100, 2)\nself.$bal += interest\n"
            'self.$hist.append(("interest", interest))\nreturn interest',
            (
                lambda d, s: P(f"$o.apply_interest({d.pick([1.5, 2, 2.5, 3, 4, 5])})"),
                lambda d, s: P("round($o.$bal, 2)", f"$o.apply_interest({d.pick([1, 2, 3.5, 10])})"),
            ),
        ),
        MethodSpec(
            "transfer_to",
            "other, amount",
            "Move `amount` from this account to `other` (another $cls). Raise `ValueError` "
            "if `amount` is not positive or exceeds this balance. Record "
            "`(\"transfer_out\", amount)` in this history and `(\"transfer_in\", amount)` in "
            "`other`'s history, and return `True`.",
            "if amount <= 0 or amount > self.$bal:\n"
            '    raise ValueError("invalid amount")\n'
            "self.$bal -= amount\nother.$bal += amount\n"
            'self.$hist.append(("transfer_out", amount))\n'
            'other.$hist.append(("transfer_in", amount))\nreturn True',
            (
                lambda d, s: P(
                    "[$o.$bal, other.$bal]",
                    f"other = $cls({d.first()!r}, {d.int(0, 50)})",
                    f"$o.transfer_to(other, {d.int(1, 90)})",
                ),
                lambda d, s: P(
                    f"$o.transfer_to(other, {d.int(800, 3000)})",
                    f"other = $cls({d.first()!r})",
                    raises="ValueError",
                ),
                lambda d, s: P(
                    "other.$hist",
                    f"other = $cls({d.first()!r})",
                    f"$o.transfer_to(other, {d.int(1, 90)})",
                ),
            ),
        ),
        MethodSpec(
            "total_deposited",
            "",
            "Return the sum of all `\"deposit\"` amounts in the history (0 if there are none).",
            'return sum(amount for kind, amount in self.$hist if kind == "deposit")',
            (
                lambda d, s: P("$o.total_deposited()"),
                lambda d, s: P("$o.total_deposited()", fill=False),
            ),
        ),
        MethodSpec(
            "largest_withdrawal",
            "",
            "Return the largest `\"withdraw\"` amount in the history, or 0 if there is none.",
            'amounts = [amount for kind, amount in self.$hist if kind == "withdraw"]\n'
            "return max(amounts) if amounts else 0",
            (
                lambda d, s: P("$o.largest_withdrawal()"),
                lambda d, s: P("$o.largest_withdrawal()", fill=False),
            ),
        ),
        MethodSpec(
            "can_afford",
            "price",
            "Return `True` if `price` is at most the current balance, otherwise `False`.",
            "return price <= self.$bal",
            (
                lambda d, s: P("$o.can_afford(5)"),
                lambda d, s: P(f"$o.can_afford({d.int(700, 9000)})"),
            ),
        ),
        MethodSpec(
            "statement",
            "",
            "Return a list with one string `\"<kind>: <amount>\"` per history entry, oldest first.",
            'return [f"{kind}: {amount}" for kind, amount in self.$hist]',
            (lambda d, s: P("$o.statement()"), lambda d, s: P("$o.statement()", fill=False)),
        ),
        MethodSpec(
            "undo_last",
            "",
            "Remove the most recent history entry and reverse its effect on the balance "
            "(kinds `\"deposit\"`, `\"interest\"` and `\"transfer_in\"` had added money, the "
            "others had taken it out). Return the removed `(kind, amount)` tuple, or `None` "
            "if the history is empty.",
            "if not self.$hist:\n    return None\nkind, amount = self.$hist.pop()\n"
            'if kind in ("deposit", "interest", "transfer_in"):\n    self.$bal -= amount\n'
            "else:\n    self.$bal += amount\nreturn (kind, amount)",
            (
                lambda d, s: P("$o.undo_last()"),
                lambda d, s: P("[$o.$bal, len($o.$hist)]", "$o.undo_last()"),
                lambda d, s: P("$o.undo_last()", fill=False),
            ),
        ),
        MethodSpec(
            "count_transactions",
            "kind=None",
            "Return the number of history entries; when `kind` is given, count only the "
            "entries of that kind.",
            "if kind is None:\n    return len(self.$hist)\n"
            "return sum(1 for entry_kind, _ in self.$hist if entry_kind == kind)",
            (
                lambda d, s: P("$o.count_transactions()"),
                lambda d, s: P(f"$o.count_transactions({d.pick(['deposit', 'withdraw'])!r})"),
            ),
        ),
    ),
)


# -------------------------------------------------------------------------- inventory
def _inventory_fill(d: Draw) -> tuple[list[str], dict[str, Any]]:
    names = d.sample(vocab.PRODUCT_NOUNS, d.int(3, 5))
    items = {name: d.int(0, 30) for name in names}
    items[names[-1]] = 0 if d.rng.random() < 0.5 else items[names[-1]]
    prices = {name: d.price() for name in names}
    return [f"$o.$items.update({items!r})", f"$o.$prices.update({prices!r})"], {"names": names}


INVENTORY = ClassConcept(
    key="inventory",
    class_names=("Inventory", "Stockroom", "Warehouse", "StockLedger", "PantryStock"),
    var="inv",
    summary="an inventory of named items with quantities and unit prices",
    attrs={"items": ("items", "stock", "quantities"), "prices": ("prices", "unit_prices")},
    init=MethodSpec(
        "__init__",
        "",
        "Take no arguments. Start `self.$items` (item name to quantity) and `self.$prices` "
        "(item name to unit price) as empty dicts.",
        "self.$items = {}\nself.$prices = {}",
        (lambda d, s: P("[$o.$items, $o.$prices]", fill=False),),
    ),
    ctor_args=lambda d: "",
    fill=_inventory_fill,
    methods=(
        MethodSpec(
            "add_item",
            "name, quantity, price",
            "Add `quantity` units of `name` to any quantity already held, set its unit price "
            "to `price`, and return the new quantity. Raise `ValueError` if `quantity` is not "
            "positive.",
            "if quantity <= 0:\n    raise ValueError(\"quantity must be positive\")\n"
            "self.$items[name] = self.$items.get(name, 0) + quantity\n"
            "self.$prices[name] = price\nreturn self.$items[name]",
            (
                lambda d, s: P(f"$o.add_item({s['names'][0]!r}, {d.int(1, 20)}, {d.price()})"),
                lambda d, s: P(f"$o.add_item('gadget', {d.int(1, 9)}, {d.price()})"),
                lambda d, s: P(f"$o.add_item('widget', {d.int(-5, 0)}, 1.0)", raises="ValueError"),
            ),
        ),
        MethodSpec(
            "remove_item",
            "name, quantity",
            "Take `quantity` units of `name` out and return the remaining quantity. Raise "
            "`KeyError` for an unknown item and `ValueError` if fewer than `quantity` units "
            "are held.",
            "if name not in self.$items:\n    raise KeyError(name)\n"
            "if quantity > self.$items[name]:\n    raise ValueError(\"not enough stock\")\n"
            "self.$items[name] -= quantity\nreturn self.$items[name]",
            (
                lambda d, s: P(f"$o.remove_item({s['names'][0]!r}, 0)"),
                lambda d, s: P("$o.remove_item('unicorn', 1)", raises="KeyError"),
                lambda d, s: P(f"$o.remove_item({s['names'][1]!r}, 99)", raises="ValueError"),
            ),
        ),
        MethodSpec(
            "quantity_of",
            "name",
            "Return the quantity held of `name`, or 0 for an unknown item.",
            "return self.$items.get(name, 0)",
            (
                lambda d, s: P(f"$o.quantity_of({s['names'][1]!r})"),
                lambda d, s: P("$o.quantity_of('unicorn')"),
            ),
        ),
        MethodSpec(
            "total_value",
            "",
            "Return the sum of quantity times unit price over all items, rounded to 2 "
            "decimals (an item without a price counts as 0).",
            "return round(sum(quantity * self.$prices.get(name, 0) "
            "for name, quantity in self.$items.items()), 2)",
            (lambda d, s: P("$o.total_value()"), lambda d, s: P("$o.total_value()", fill=False)),
        ),
        MethodSpec(
            "low_stock",
            "threshold",
            "Return the names of items whose quantity is below `threshold`, sorted "
            "alphabetically.",
            "return sorted(name for name, quantity in self.$items.items() if quantity < threshold)",
            (
                lambda d, s: P(f"$o.low_stock({d.int(5, 20)})"),
                lambda d, s: P("$o.low_stock(1)"),
            ),
        ),
        MethodSpec(
            "restock_all",
            "amount",
            "Add `amount` to the quantity of every item and return how many items there are.",
            "for name in self.$items:\n    self.$items[name] += amount\nreturn len(self.$items)",
            (
                lambda d, s: P(f"$o.restock_all({d.int(1, 9)})"),
                lambda d, s: P("$o.$items", f"$o.restock_all({d.int(1, 9)})"),
            ),
        ),
        MethodSpec(
            "most_stocked",
            "",
            "Return the name with the largest quantity (ties go to the alphabetically first "
            "name), or `None` when there are no items.",
            "if not self.$items:\n    return None\n"
            "return min(self.$items, key=lambda name: (-self.$items[name], name))",
            (lambda d, s: P("$o.most_stocked()"), lambda d, s: P("$o.most_stocked()", fill=False)),
        ),
        MethodSpec(
            "clear_empty",
            "",
            "Delete every item whose quantity is 0 (and its price) and return the deleted "
            "names, sorted alphabetically.",
            "empty = sorted(name for name, quantity in self.$items.items() if quantity == 0)\n"
            "for name in empty:\n    del self.$items[name]\n    self.$prices.pop(name, None)\n"
            "return empty",
            (
                lambda d, s: P("$o.clear_empty()", f"$o.$items[{s['names'][0]!r}] = 0"),
                lambda d, s: P("sorted($o.$items)", "$o.clear_empty()"),
            ),
        ),
        MethodSpec(
            "price_list",
            "",
            "Return a list of strings `\"<name>: <price>\"` with the price written with two "
            "decimals, sorted by name.",
            'return [f"{name}: {price:.2f}" for name, price in sorted(self.$prices.items())]',
            (lambda d, s: P("$o.price_list()"),),
        ),
        MethodSpec(
            "apply_markup",
            "percent",
            "Raise every unit price by `percent` percent, rounding each new price to 2 "
            "decimals, and return the sum of the new prices rounded to 2 decimals.",
            "for name in self.$prices:\n"
            "    self.$prices[name] = round(self.$prices[name] * (1 + percent / 100), 2)\n"
            "return round(sum(self.$prices.values()), 2)",
            (
                lambda d, s: P(f"$o.apply_markup({d.pick([10, 20, 25, 50])})"),
                lambda d, s: P(f"$o.$prices[{s['names'][0]!r}]", "$o.apply_markup(100)"),
            ),
        ),
    ),
)


# -------------------------------------------------------------------------- gradebook
def _grades_fill(d: Draw) -> tuple[list[str], dict[str, Any]]:
    names = d.people(d.int(3, 5))
    scores = {name: [d.int(35, 100) for _ in range(d.int(1, 4))] for name in names}
    return [f"$o.$scores.update({scores!r})"], {"names": names}


GRADEBOOK = ClassConcept(
    key="gradebook",
    class_names=("Gradebook", "CourseRoster", "ScoreBook", "ClassRecord", "MarkSheet"),
    var="book",
    summary="a course gradebook that keeps every student's list of scores",
    attrs={"scores": ("scores", "grades", "marks")},
    init=MethodSpec(
        "__init__",
        "course",
        "Store `course` as `self.course` and start `self.$scores` as an empty dict mapping "
        "each student's name to a list of integer scores.",
        "self.course = course\nself.$scores = {}",
        (lambda d, s: P("[$o.course, $o.$scores]", fill=False),),
    ),
    ctor_args=lambda d: repr(d.pick(["Algebra", "Biology", "History", "Chemistry", "Poetry", "Statistics"])),
    fill=_grades_fill,
    methods=(
        MethodSpec(
            "add_student",
            "name",
            "Add `name` with an empty score list and return `True`; return `False` (changing "
            "nothing) if the student already exists.",
            "if name in self.$scores:\n    return False\nself.$scores[name] = []\nreturn True",
            (
                lambda d, s: P("[$o.add_student('Newcomer'), $o.$scores['Newcomer']]"),
                lambda d, s: P(f"$o.add_student({s['names'][0]!r})"),
            ),
        ),
        MethodSpec(
            "add_score",
            "name, score",
            "Append `score` to the student's list (creating the student if needed) and return "
            "how many scores the student now has. Raise `ValueError` unless 0 <= score <= 100.",
            "if not 0 <= score <= 100:\n    raise ValueError(\"score out of range\")\n"
            "self.$scores.setdefault(name, []).append(score)\nreturn len(self.$scores[name])",
            (
                lambda d, s: P(f"$o.add_score({s['names'][0]!r}, {d.int(0, 100)})"),
                lambda d, s: P(f"$o.add_score('Newcomer', {d.int(101, 150)})", raises="ValueError"),
                lambda d, s: P("$o.$scores['Newcomer']", f"$o.add_score('Newcomer', {d.int(0, 100)})"),
            ),
        ),
        MethodSpec(
            "average",
            "name",
            "Return the student's mean score rounded to 2 decimals, or 0.0 if the student "
            "is unknown or has no scores.",
            "scores = self.$scores.get(name, [])\nif not scores:\n    return 0.0\n"
            "return round(sum(scores) / len(scores), 2)",
            (
                lambda d, s: P(f"$o.average({s['names'][1]!r})"),
                lambda d, s: P("$o.average('Nobody')"),
            ),
        ),
        MethodSpec(
            "letter_grade",
            "name",
            "Return the letter for the student's mean score: \"A\" for 90 or more, \"B\" for "
            "80 or more, \"C\" for 70 or more, \"D\" for 60 or more, otherwise \"F\" (no "
            "scores counts as a mean of 0).",
            "scores = self.$scores.get(name, [])\n"
            "mean = sum(scores) / len(scores) if scores else 0\n"
            'for cutoff, letter in ((90, "A"), (80, "B"), (70, "C"), (60, "D")):\n'
            "    if mean >= cutoff:\n        return letter\n"
            'return "F"',
            (
                lambda d, s: P(f"$o.letter_grade({s['names'][0]!r})"),
                lambda d, s: P(f"$o.letter_grade({s['names'][2]!r})"),
            ),
        ),
        MethodSpec(
            "top_student",
            "",
            "Return the student with the highest mean score (ties go to the alphabetically "
            "first name), ignoring students without scores; `None` if nobody has a score.",
            "ranked = [(sum(s) / len(s), name) for name, s in self.$scores.items() if s]\n"
            "if not ranked:\n    return None\n"
            "return min(ranked, key=lambda pair: (-pair[0], pair[1]))[1]",
            (lambda d, s: P("$o.top_student()"), lambda d, s: P("$o.top_student()", fill=False)),
        ),
        MethodSpec(
            "class_average",
            "",
            "Return the mean of every score of every student, rounded to 2 decimals, or 0.0 "
            "when there are no scores.",
            "every = [score for scores in self.$scores.values() for score in scores]\n"
            "if not every:\n    return 0.0\nreturn round(sum(every) / len(every), 2)",
            (lambda d, s: P("$o.class_average()"), lambda d, s: P("$o.class_average()", fill=False)),
        ),
        MethodSpec(
            "students_below",
            "threshold",
            "Return, sorted alphabetically, the students who have scores and whose mean "
            "score is below `threshold`.",
            "return sorted(name for name, scores in self.$scores.items()\n"
            "              if scores and sum(scores) / len(scores) < threshold)",
            (
                lambda d, s: P(f"$o.students_below({d.int(55, 85)})"),
                lambda d, s: P("$o.students_below(101)"),
            ),
        ),
        MethodSpec(
            "best_score",
            "name",
            "Return the student's highest score, or `None` if the student is unknown or has "
            "no scores.",
            "scores = self.$scores.get(name)\nreturn max(scores) if scores else None",
            (
                lambda d, s: P(f"$o.best_score({s['names'][0]!r})"),
                lambda d, s: P("$o.best_score('Nobody')"),
            ),
        ),
        MethodSpec(
            "remove_student",
            "name",
            "Delete the student and return `True`, or return `False` if there was no such "
            "student.",
            "if name not in self.$scores:\n    return False\ndel self.$scores[name]\nreturn True",
            (
                lambda d, s: P("sorted($o.$scores)", f"$o.remove_student({s['names'][0]!r})"),
                lambda d, s: P("$o.remove_student('Nobody')"),
            ),
        ),
        MethodSpec(
            "curve",
            "points",
            "Add `points` to every score, capping each at 100, and return how many scores "
            "changed.",
            "changed = 0\nfor scores in self.$scores.values():\n"
            "    for i, score in enumerate(scores):\n        new = min(100, score + points)\n"
            "        if new != score:\n            changed += 1\n        scores[i] = new\n"
            "return changed",
            (
                lambda d, s: P(f"$o.curve({d.int(3, 15)})"),
                lambda d, s: P(f"$o.$scores[{s['names'][0]!r}]", f"$o.curve({d.int(3, 30)})"),
            ),
        ),
    ),
)


# ----------------------------------------------------------------------------- text
TEXT = ClassConcept(
    key="text",
    class_names=("TextAnalyzer", "DocumentStats", "TextInspector", "ProseReport", "WordCounter"),
    var="doc",
    summary="a helper that answers questions about one piece of text",
    attrs={"text": ("text", "content", "source")},
    init=MethodSpec(
        "__init__",
        "text",
        "Store `text` as `self.$text`. Throughout, the *words* are the pieces of "
        "`self.$text.split()`, and a *clean* word is a word with the characters `.,!?;:` "
        "stripped from both ends and lowercased.",
        "self.$text = text",
        (lambda d, s: P("$o.$text"),),
    ),
    ctor_args=lambda d: repr(d.text()),
    methods=(
        MethodSpec(
            "word_count",
            "",
            "Return the number of words.",
            "return len(self.$text.split())",
            (lambda d, s: P("$o.word_count()"), lambda d, s: P("$o.word_count()", ctor="''")),
        ),
        MethodSpec(
            "unique_words",
            "",
            "Return the distinct non-empty clean words, sorted alphabetically.",
            'return sorted({w.strip(".,!?;:").lower() for w in self.$text.split()} - {""})',
            (lambda d, s: P("$o.unique_words()"),),
        ),
        MethodSpec(
            "most_common_word",
            "",
            "Return the clean word that occurs most often (ties go to the alphabetically "
            "first), or `None` if there are no words.",
            "counts = {}\nfor word in self.$text.split():\n"
            '    word = word.strip(".,!?;:").lower()\n    if word:\n'
            "        counts[word] = counts.get(word, 0) + 1\n"
            "if not counts:\n    return None\n"
            "return min(counts, key=lambda word: (-counts[word], word))",
            (
                lambda d, s: P("$o.most_common_word()"),
                lambda d, s: P("$o.most_common_word()", ctor="''"),
            ),
        ),
        MethodSpec(
            "sentence_count",
            "",
            "Return how many of the characters `.`, `!` and `?` the text contains.",
            'return sum(self.$text.count(mark) for mark in ".!?")',
            (lambda d, s: P("$o.sentence_count()"),),
        ),
        MethodSpec(
            "longest_word",
            "",
            "Return the longest clean word (the first one among ties), or an empty string "
            "if there are no words.",
            'words = [w.strip(".,!?;:").lower() for w in self.$text.split()]\n'
            'return max(words, key=len) if words else ""',
            (lambda d, s: P("$o.longest_word()"), lambda d, s: P("$o.longest_word()", ctor="''")),
        ),
        MethodSpec(
            "count_char",
            "char",
            "Return how often `char` occurs in the text, ignoring case.",
            "return self.$text.lower().count(char.lower())",
            (
                lambda d, s: P(f"$o.count_char({d.pick('aeiorstn')!r})"),
                lambda d, s: P(f"$o.count_char({d.pick('AETO')!r})"),
            ),
        ),
        MethodSpec(
            "title_case",
            "",
            "Return the words joined by single spaces, each with its first character "
            "upper-cased and the rest unchanged.",
            'return " ".join(w[:1].upper() + w[1:] for w in self.$text.split())',
            (lambda d, s: P("$o.title_case()"),),
        ),
        MethodSpec(
            "replace_word",
            "old, new",
            "Replace every word exactly equal to `old` by `new`, store the words joined by "
            "single spaces back in `self.$text`, and return how many words were replaced.",
            "words = self.$text.split()\ncount = words.count(old)\n"
            'self.$text = " ".join(new if w == old else w for w in words)\nreturn count',
            (
                lambda d, s: P("[$o.replace_word('the', 'THE'), $o.$text]"),
                lambda d, s: P("$o.replace_word('zebra', 'horse')"),
            ),
        ),
        MethodSpec(
            "average_word_length",
            "",
            "Return the mean length of the non-empty words after stripping `.,!?;:` from "
            "their ends, rounded to 2 decimals, or 0.0 if there are none.",
            'words = [w.strip(".,!?;:") for w in self.$text.split()]\n'
            "words = [w for w in words if w]\nif not words:\n    return 0.0\n"
            "return round(sum(len(w) for w in words) / len(words), 2)",
            (
                lambda d, s: P("$o.average_word_length()"),
                lambda d, s: P("$o.average_word_length()", ctor="'?! ...'"),
            ),
        ),
        MethodSpec(
            "words_starting_with",
            "letter",
            "Return the distinct clean words that start with `letter` (compared in lower "
            "case), sorted alphabetically.",
            'found = {w.strip(".,!?;:").lower() for w in self.$text.split()}\n'
            "return sorted(w for w in found if w.startswith(letter.lower()))",
            (
                lambda d, s: P(f"$o.words_starting_with({d.pick('tabsmcp')!r})"),
                lambda d, s: P("$o.words_starting_with('T')"),
            ),
        ),
        MethodSpec(
            "reverse_words",
            "",
            "Return the words in reverse order, joined by single spaces.",
            'return " ".join(reversed(self.$text.split()))',
            (lambda d, s: P("$o.reverse_words()"),),
        ),
    ),
)


# ----------------------------------------------------------------------------- cart
def _cart_fill(d: Draw) -> tuple[list[str], dict[str, Any]]:
    names = d.sample(vocab.PRODUCT_NOUNS, d.int(2, 4))
    lines = {name: [d.price(100, 4000), d.int(1, 4)] for name in names}
    return [f"$o.$lines.update({lines!r})"], {"names": names}


CART = ClassConcept(
    key="cart",
    class_names=("ShoppingCart", "Basket", "OrderCart", "CheckoutCart", "TrolleyOrder"),
    var="cart",
    summary="a shopping cart with unit prices, quantities and an optional percentage discount",
    attrs={"lines": ("lines", "entries", "contents")},
    init=MethodSpec(
        "__init__",
        "customer",
        "Store `customer` as `self.customer`, start `self.$lines` as an empty dict mapping "
        "a product name to a two-element list `[unit_price, quantity]`, and set "
        "`self.discount` (a percentage) to 0.",
        "self.customer = customer\nself.$lines = {}\nself.discount = 0",
        (lambda d, s: P("[$o.customer, $o.$lines, $o.discount]", fill=False),),
    ),
    ctor_args=lambda d: repr(d.first()),
    fill=_cart_fill,
    methods=(
        MethodSpec(
            "add",
            "name, price, quantity=1",
            "Add `quantity` of product `name` at unit price `price`; if the product is "
            "already in the cart, only increase its quantity (keep the old price). Return "
            "the product's quantity. Raise `ValueError` if `quantity` is less than 1.",
            "if quantity < 1:\n    raise ValueError(\"quantity must be at least 1\")\n"
            "if name in self.$lines:\n    self.$lines[name][1] += quantity\n"
            "else:\n    self.$lines[name] = [price, quantity]\nreturn self.$lines[name][1]",
            (
                lambda d, s: P(f"$o.add({s['names'][0]!r}, 1.0, {d.int(1, 3)})"),
                lambda d, s: P("$o.$lines['tea']", f"$o.add('tea', {d.price()})"),
                lambda d, s: P("$o.add('tea', 2.5, 0)", raises="ValueError"),
            ),
        ),
        MethodSpec(
            "remove",
            "name",
            "Remove product `name` and return `True`, or return `False` if it is not in the cart.",
            "if name not in self.$lines:\n    return False\ndel self.$lines[name]\nreturn True",
            (
                lambda d, s: P("[$o.remove(" + repr(s["names"][0]) + "), sorted($o.$lines)]"),
                lambda d, s: P("$o.remove('unicorn')"),
            ),
        ),
        MethodSpec(
            "set_quantity",
            "name, quantity",
            "Set the quantity of `name`; a quantity of 0 or less removes the product. Raise "
            "`KeyError` if the product is not in the cart. Return the number of distinct "
            "products left.",
            "if name not in self.$lines:\n    raise KeyError(name)\n"
            "if quantity <= 0:\n    del self.$lines[name]\n"
            "else:\n    self.$lines[name][1] = quantity\nreturn len(self.$lines)",
            (
                lambda d, s: P(f"$o.set_quantity({s['names'][0]!r}, 0)"),
                lambda d, s: P(f"$o.$lines[{s['names'][1]!r}]", f"$o.set_quantity({s['names'][1]!r}, {d.int(2, 9)})"),
                lambda d, s: P("$o.set_quantity('unicorn', 2)", raises="KeyError"),
            ),
        ),
        MethodSpec(
            "subtotal",
            "",
            "Return the sum of unit price times quantity over all products, rounded to 2 "
            "decimals, before any discount.",
            "return round(sum(price * quantity for price, quantity in self.$lines.values()), 2)",
            (lambda d, s: P("$o.subtotal()"), lambda d, s: P("$o.subtotal()", fill=False)),
        ),
        MethodSpec(
            "apply_discount",
            "percent",
            "Set `self.discount` to `percent` and return it. Raise `ValueError` unless "
            "0 <= percent <= 100.",
            "if not 0 <= percent <= 100:\n    raise ValueError(\"percent out of range\")\n"
            "self.discount = percent\nreturn self.discount",
            (
                lambda d, s: P(f"$o.apply_discount({d.pick([5, 10, 15, 20, 30])})"),
                lambda d, s: P(f"$o.apply_discount({d.int(101, 200)})", raises="ValueError"),
            ),
        ),
        MethodSpec(
            "total",
            "",
            "Return the subtotal reduced by `self.discount` percent, rounded to 2 decimals.",
            "subtotal = sum(price * quantity for price, quantity in self.$lines.values())\n"
            "return round(subtotal * (1 - self.discount / 100), 2)",
            (
                lambda d, s: P("$o.total()"),
                lambda d, s: P("$o.total()", f"$o.discount = {d.pick([10, 20, 25, 50])}"),
            ),
        ),
        MethodSpec(
            "item_count",
            "",
            "Return the total quantity of all products.",
            "return sum(quantity for _, quantity in self.$lines.values())",
            (lambda d, s: P("$o.item_count()"), lambda d, s: P("$o.item_count()", fill=False)),
        ),
        MethodSpec(
            "most_expensive",
            "",
            "Return the product with the highest unit price (ties go to the alphabetically "
            "first name), or `None` if the cart is empty.",
            "if not self.$lines:\n    return None\n"
            "return min(self.$lines, key=lambda name: (-self.$lines[name][0], name))",
            (lambda d, s: P("$o.most_expensive()"), lambda d, s: P("$o.most_expensive()", fill=False)),
        ),
        MethodSpec(
            "clear",
            "",
            "Empty the cart, reset the discount to 0, and return how many distinct products "
            "were removed.",
            "count = len(self.$lines)\nself.$lines = {}\nself.discount = 0\nreturn count",
            (
                lambda d, s: P("$o.clear()"),
                lambda d, s: P("[$o.$lines, $o.discount]", "$o.discount = 10", "$o.clear()"),
            ),
        ),
        MethodSpec(
            "receipt",
            "",
            "Return one string per product, sorted by name, of the form "
            "`\"<name> x<quantity> = <line total>\"` with the line total written with two "
            "decimals.",
            'return [f"{name} x{quantity} = {price * quantity:.2f}"\n'
            "        for name, (price, quantity) in sorted(self.$lines.items())]",
            (lambda d, s: P("$o.receipt()"),),
        ),
    ),
)


# ------------------------------------------------------------------------- task board
def _tasks_fill(d: Draw) -> tuple[list[str], dict[str, Any]]:
    titles = [f"{d.pick(['fix', 'write', 'plan', 'review', 'call', 'clean', 'test'])} {w}" for w in d.words(d.int(3, 5))]
    tasks = [
        {"id": i + 1, "title": title, "priority": d.int(1, 5), "done": d.rng.random() < 0.35}
        for i, title in enumerate(titles)
    ]
    return [f"$o.$tasks.extend({tasks!r})", f"$o.next_id = {len(tasks) + 1}"], {"titles": titles, "n": len(tasks)}


TASKS = ClassConcept(
    key="tasks",
    class_names=("TaskBoard", "TodoList", "ChoreTracker", "WorkQueue", "ActionList"),
    var="board",
    summary="a to-do list of numbered tasks with priorities from 1 (most urgent) to 5",
    attrs={"tasks": ("tasks", "todo", "items")},
    init=MethodSpec(
        "__init__",
        "owner",
        "Store `owner` as `self.owner`, start `self.$tasks` as an empty list of dicts with "
        "the keys `\"id\"`, `\"title\"`, `\"priority\"` and `\"done\"`, and set "
        "`self.next_id` to 1.",
        "self.owner = owner\nself.$tasks = []\nself.next_id = 1",
        (lambda d, s: P("[$o.owner, $o.$tasks, $o.next_id]", fill=False),),
    ),
    ctor_args=lambda d: repr(d.first()),
    fill=_tasks_fill,
    methods=(
        MethodSpec(
            "add_task",
            "title, priority=3",
            "Append a task with id `self.next_id`, the given title and priority, and "
            "`\"done\": False`; increase `self.next_id` and return the new task's id. Raise "
            "`ValueError` unless 1 <= priority <= 5.",
            "if not 1 <= priority <= 5:\n    raise ValueError(\"priority must be 1-5\")\n"
            'task = {"id": self.next_id, "title": title, "priority": priority, "done": False}\n'
            "self.$tasks.append(task)\nself.next_id += 1\nreturn task[\"id\"]",
            (
                lambda d, s: P(f"$o.add_task('buy {d.pick(vocab.WORDS)}', {d.int(1, 5)})"),
                lambda d, s: P("$o.$tasks[-1]", "$o.add_task('stretch')", fill=False),
                lambda d, s: P(f"$o.add_task('nap', {d.pick([0, 6, 9])})", raises="ValueError"),
            ),
        ),
        MethodSpec(
            "complete",
            "task_id",
            "Mark the task with id `task_id` as done and return `True`; return `False` if "
            "there is no such task.",
            "for task in self.$tasks:\n    if task[\"id\"] == task_id:\n"
            "        task[\"done\"] = True\n        return True\nreturn False",
            (
                lambda d, s: P("[$o.complete(1), $o.$tasks[0]['done']]"),
                lambda d, s: P("$o.complete(99)"),
            ),
        ),
        MethodSpec(
            "pending",
            "",
            "Return the titles of the tasks that are not done, in list order.",
            'return [task["title"] for task in self.$tasks if not task["done"]]',
            (lambda d, s: P("$o.pending()"),),
        ),
        MethodSpec(
            "by_priority",
            "priority",
            "Return the titles of all tasks (done or not) with the given priority, in list order.",
            'return [task["title"] for task in self.$tasks if task["priority"] == priority]',
            (lambda d, s: P(f"$o.by_priority({d.int(1, 5)})"), lambda d, s: P("$o.by_priority(3)")),
        ),
        MethodSpec(
            "completion_rate",
            "",
            "Return the percentage of tasks that are done, rounded to 1 decimal, or 0.0 when "
            "there are no tasks.",
            "if not self.$tasks:\n    return 0.0\n"
            'done = sum(1 for task in self.$tasks if task["done"])\n'
            "return round(done / len(self.$tasks) * 100, 1)",
            (lambda d, s: P("$o.completion_rate()"), lambda d, s: P("$o.completion_rate()", fill=False)),
        ),
        MethodSpec(
            "rename",
            "task_id, title",
            "Give the task with id `task_id` the new title and return `True`; return `False` "
            "if there is no such task.",
            "for task in self.$tasks:\n    if task[\"id\"] == task_id:\n"
            "        task[\"title\"] = title\n        return True\nreturn False",
            (
                lambda d, s: P("$o.$tasks[1]['title']", "$o.rename(2, 'walk the dog')"),
                lambda d, s: P("$o.rename(42, 'x')"),
            ),
        ),
        MethodSpec(
            "remove_done",
            "",
            "Delete every task that is done and return how many were deleted.",
            "before = len(self.$tasks)\n"
            'self.$tasks = [task for task in self.$tasks if not task["done"]]\n'
            "return before - len(self.$tasks)",
            (
                lambda d, s: P("$o.remove_done()"),
                lambda d, s: P("[task['id'] for task in $o.$tasks]", "$o.$tasks[0]['done'] = True", "$o.remove_done()"),
            ),
        ),
        MethodSpec(
            "next_task",
            "",
            "Return the title of the pending task with the smallest priority number (ties "
            "go to the smaller id), or `None` if nothing is pending.",
            'pending = [task for task in self.$tasks if not task["done"]]\n'
            "if not pending:\n    return None\n"
            'return min(pending, key=lambda task: (task["priority"], task["id"]))["title"]',
            (lambda d, s: P("$o.next_task()"), lambda d, s: P("$o.next_task()", fill=False)),
        ),
        MethodSpec(
            "status_counts",
            "",
            "Return a dict `{\"done\": <number done>, \"pending\": <number not done>}`.",
            'done = sum(1 for task in self.$tasks if task["done"])\n'
            'return {"done": done, "pending": len(self.$tasks) - done}',
            (lambda d, s: P("$o.status_counts()"),),
        ),
        MethodSpec(
            "titles_containing",
            "word",
            "Return the titles that contain `word`, ignoring case, in list order.",
            'return [task["title"] for task in self.$tasks if word.lower() in task["title"].lower()]',
            (
                lambda d, s: P(f"$o.titles_containing({s['titles'][0].split()[1].upper()!r})"),
                lambda d, s: P("$o.titles_containing('e')"),
            ),
        ),
    ),
)


# ------------------------------------------------------------------------ parking lot
def _parking_fill(d: Draw) -> tuple[list[str], dict[str, Any]]:
    plates = [f"{d.pick('ABCDEFGHJK')}{d.pick('LMNPRSTUVW')}-{d.int(100, 999)}" for _ in range(d.int(2, 3))]
    plates = list(dict.fromkeys(plates))
    parked = {plate: d.int(6, 12) for plate in plates}
    return [f"$o.$spots.update({parked!r})"], {"plates": plates}


PARKING = ClassConcept(
    key="parking",
    class_names=("ParkingLot", "Garage", "CarPark", "ParkingDeck", "ValetYard"),
    var="lot",
    summary="a parking lot with a fixed number of spaces that charges by the started hour",
    attrs={"spots": ("parked", "spots", "occupied")},
    init=MethodSpec(
        "__init__",
        "capacity, hourly_rate",
        "Store `capacity` and `hourly_rate` as attributes of the same names, start "
        "`self.$spots` as an empty dict mapping a licence plate to the hour (an integer) "
        "the car arrived, and set `self.earnings` to 0.",
        "self.capacity = capacity\nself.hourly_rate = hourly_rate\nself.$spots = {}\nself.earnings = 0",
        (lambda d, s: P("[$o.capacity, $o.hourly_rate, $o.$spots, $o.earnings]", fill=False),),
    ),
    ctor_args=lambda d: f"{d.int(4, 6)}, {d.int(2, 6)}",
    fill=_parking_fill,
    methods=(
        MethodSpec(
            "park",
            "plate, hour",
            "Record that `plate` arrived at `hour` and return `True`; return `False` if the "
            "lot is full or the plate is already parked.",
            "if len(self.$spots) >= self.capacity or plate in self.$spots:\n    return False\n"
            "self.$spots[plate] = hour\nreturn True",
            (
                lambda d, s: P(f"[$o.park('ZZ-{d.int(100, 999)}', 9), len($o.$spots)]"),
                lambda d, s: P(f"$o.park({s['plates'][0]!r}, 13)"),
                lambda d, s: P("$o.park('QQ-111', 9)", ctor="0, 3"),
            ),
        ),
        MethodSpec(
            "leave",
            "plate, hour",
            "Remove the car and return its fee: `hourly_rate` times the hours parked "
            "(`hour` minus the arrival hour, at least 1). Add the fee to `self.earnings`. "
            "Raise `KeyError` if the plate is not parked.",
            "if plate not in self.$spots:\n    raise KeyError(plate)\n"
            "hours = max(1, hour - self.$spots.pop(plate))\n"
            "fee = hours * self.hourly_rate\nself.earnings += fee\nreturn fee",
            (
                lambda d, s: P(f"$o.leave({s['plates'][0]!r}, {d.int(13, 20)})"),
                lambda d, s: P(f"[$o.leave({s['plates'][1]!r}, 12), $o.earnings]"),
                lambda d, s: P("$o.leave('NO-000', 12)", raises="KeyError"),
            ),
        ),
        MethodSpec(
            "is_full",
            "",
            "Return `True` if every space is taken.",
            "return len(self.$spots) >= self.capacity",
            (lambda d, s: P("$o.is_full()"), lambda d, s: P("$o.is_full()", ctor="2, 3")),
        ),
        MethodSpec(
            "free_spaces",
            "",
            "Return the number of empty spaces.",
            "return self.capacity - len(self.$spots)",
            (lambda d, s: P("$o.free_spaces()"), lambda d, s: P("$o.free_spaces()", fill=False)),
        ),
        MethodSpec(
            "plates",
            "",
            "Return the parked plates sorted alphabetically.",
            "return sorted(self.$spots)",
            (lambda d, s: P("$o.plates()"),),
        ),
        MethodSpec(
            "longest_parked",
            "",
            "Return the plate that arrived earliest (ties go to the alphabetically first "
            "plate), or `None` if the lot is empty.",
            "if not self.$spots:\n    return None\n"
            "return min(self.$spots, key=lambda plate: (self.$spots[plate], plate))",
            (lambda d, s: P("$o.longest_parked()"), lambda d, s: P("$o.longest_parked()", fill=False)),
        ),
        MethodSpec(
            "occupancy",
            "",
            "Return the percentage of spaces taken, rounded to 1 decimal.",
            "return round(len(self.$spots) / self.capacity * 100, 1)",
            (lambda d, s: P("$o.occupancy()"),),
        ),
        MethodSpec(
            "fee_for",
            "plate, hour",
            "Return what `plate` would pay if it left at `hour` (same rule as leaving) "
            "without removing it; return `None` if the plate is not parked.",
            "if plate not in self.$spots:\n    return None\n"
            "return max(1, hour - self.$spots[plate]) * self.hourly_rate",
            (
                lambda d, s: P(f"$o.fee_for({s['plates'][0]!r}, {d.int(12, 22)})"),
                lambda d, s: P("$o.fee_for('NO-000', 12)"),
            ),
        ),
        MethodSpec(
            "evict_before",
            "hour",
            "Remove, without charging, every car that arrived before `hour`, and return "
            "their plates sorted alphabetically.",
            "gone = sorted(plate for plate, arrived in self.$spots.items() if arrived < hour)\n"
            "for plate in gone:\n    del self.$spots[plate]\nreturn gone",
            (
                lambda d, s: P(f"$o.evict_before({d.int(7, 12)})"),
                lambda d, s: P("sorted($o.$spots)", "$o.evict_before(10)"),
            ),
        ),
        MethodSpec(
            "raise_rate",
            "amount",
            "Increase `hourly_rate` by `amount` and return the new rate. Raise `ValueError` "
            "if the result would be negative.",
            "if self.hourly_rate + amount < 0:\n    raise ValueError(\"rate cannot be negative\")\n"
            "self.hourly_rate += amount\nreturn self.hourly_rate",
            (
                lambda d, s: P(f"$o.raise_rate({d.int(1, 4)})"),
                lambda d, s: P("$o.raise_rate(-100)", raises="ValueError"),
            ),
        ),
    ),
)


# --------------------------------------------------------------------------- library
def _library_fill(d: Draw) -> tuple[list[str], dict[str, Any]]:
    authors = [f"{d.first()} {d.pick(vocab.LAST_NAMES)}" for _ in range(2)]
    count = d.int(3, 5)
    books = {}
    for i in range(count):
        isbn = f"978-{d.int(1000, 9999)}-{i}"
        title = f"{d.pick(vocab.BOOK_WORDS_A)} {d.pick(vocab.BOOK_WORDS_B)}"
        books[isbn] = {"title": title, "author": authors[i % 2], "available": d.rng.random() < 0.7}
    return [f"$o.$books.update({books!r})"], {"isbns": list(books), "authors": authors}


LIBRARY = ClassConcept(
    key="library",
    class_names=("LibraryCatalog", "BookShelf", "ReadingRoom", "BookCollection", "LendingDesk"),
    var="lib",
    summary="a small lending library of books identified by ISBN",
    attrs={"books": ("books", "catalog", "holdings")},
    init=MethodSpec(
        "__init__",
        "",
        "Take no arguments. Start `self.$books` as an empty dict mapping an ISBN string to "
        "a dict with the keys `\"title\"`, `\"author\"` and `\"available\"` (a bool), and "
        "set `self.loan_count` to 0.",
        "self.$books = {}\nself.loan_count = 0",
        (lambda d, s: P("[$o.$books, $o.loan_count]", fill=False),),
    ),
    ctor_args=lambda d: "",
    fill=_library_fill,
    methods=(
        MethodSpec(
            "add_book",
            "isbn, title, author",
            "Add an available book and return `True`; return `False` (changing nothing) if "
            "the ISBN is already present.",
            "if isbn in self.$books:\n    return False\n"
            'self.$books[isbn] = {"title": title, "author": author, "available": True}\n'
            "return True",
            (
                lambda d, s: P("[$o.add_book('111', 'Tides', 'Mo Li'), $o.$books['111']]"),
                lambda d, s: P(f"$o.add_book({s['isbns'][0]!r}, 'Copy', 'Someone')"),
            ),
        ),
        MethodSpec(
            "checkout",
            "isbn",
            "Lend the book: if it exists and is available, mark it unavailable, add 1 to "
            "`self.loan_count` and return `True`; otherwise return `False`.",
            "book = self.$books.get(isbn)\n"
            'if book is None or not book["available"]:\n    return False\n'
            'book["available"] = False\nself.loan_count += 1\nreturn True',
            (
                lambda d, s: P(f"[$o.checkout({s['isbns'][0]!r}), $o.loan_count]"),
                lambda d, s: P("$o.checkout('000')"),
            ),
        ),
        MethodSpec(
            "return_book",
            "isbn",
            "If the book exists and is lent out, mark it available and return `True`; "
            "otherwise return `False`.",
            "book = self.$books.get(isbn)\n"
            'if book is None or book["available"]:\n    return False\n'
            'book["available"] = True\nreturn True',
            (
                lambda d, s: P(f"$o.return_book({s['isbns'][1]!r})"),
                lambda d, s: P(f"$o.return_book({s['isbns'][0]!r})", f"$o.$books[{s['isbns'][0]!r}]['available'] = False"),
            ),
        ),
        MethodSpec(
            "available_titles",
            "",
            "Return the titles of the available books, sorted alphabetically.",
            'return sorted(book["title"] for book in self.$books.values() if book["available"])',
            (lambda d, s: P("$o.available_titles()"),),
        ),
        MethodSpec(
            "books_by",
            "author",
            "Return the titles written by `author`, sorted alphabetically.",
            'return sorted(book["title"] for book in self.$books.values() if book["author"] == author)',
            (
                lambda d, s: P(f"$o.books_by({s['authors'][0]!r})"),
                lambda d, s: P("$o.books_by('Nobody Known')"),
            ),
        ),
        MethodSpec(
            "search",
            "keyword",
            "Return the titles that contain `keyword`, ignoring case, sorted alphabetically.",
            'return sorted(book["title"] for book in self.$books.values()\n'
            '              if keyword.lower() in book["title"].lower())',
            (lambda d, s: P("$o.search('THE')"), lambda d, s: P(f"$o.search({d.pick(['ar', 'on', 'st', 'er'])!r})")),
        ),
        MethodSpec(
            "checked_out_count",
            "",
            "Return how many books are currently lent out.",
            'return sum(1 for book in self.$books.values() if not book["available"])',
            (lambda d, s: P("$o.checked_out_count()"),),
        ),
        MethodSpec(
            "remove_book",
            "isbn",
            "Delete the book and return its title, or return `None` if there is no such ISBN.",
            "book = self.$books.pop(isbn, None)\n"
            'return None if book is None else book["title"]',
            (
                lambda d, s: P(f"[$o.remove_book({s['isbns'][0]!r}), len($o.$books)]"),
                lambda d, s: P("$o.remove_book('000')"),
            ),
        ),
        MethodSpec(
            "authors",
            "",
            "Return the distinct authors, sorted alphabetically.",
            'return sorted({book["author"] for book in self.$books.values()})',
            (lambda d, s: P("$o.authors()"),),
        ),
        MethodSpec(
            "most_prolific_author",
            "",
            "Return the author with the most books (ties go to the alphabetically first), "
            "or `None` if there are no books.",
            "counts = {}\nfor book in self.$books.values():\n"
            '    counts[book["author"]] = counts.get(book["author"], 0) + 1\n'
            "if not counts:\n    return None\n"
            "return min(counts, key=lambda author: (-counts[author], author))",
            (lambda d, s: P("$o.most_prolific_author()"), lambda d, s: P("$o.most_prolific_author()", fill=False)),
        ),
    ),
)


# --------------------------------------------------------------------- running stats
def _stats_fill(d: Draw) -> tuple[list[str], dict[str, Any]]:
    values = [d.int(1, 40) for _ in range(d.int(4, 8))]
    if d.rng.random() < 0.5:
        values.append(values[0])
    return [f"$o.$values.extend({values!r})"], {"values": values}


STATS = ClassConcept(
    key="stats",
    class_names=("RunningStats", "NumberLog", "SampleSet", "StatsTracker", "Measurements"),
    var="stats",
    summary="a collector of numbers that answers simple statistical questions",
    attrs={"values": ("values", "samples", "data")},
    init=MethodSpec(
        "__init__",
        "",
        "Take no arguments and start `self.$values` as an empty list of numbers.",
        "self.$values = []",
        (lambda d, s: P("$o.$values", fill=False),),
    ),
    ctor_args=lambda d: "",
    fill=_stats_fill,
    methods=(
        MethodSpec(
            "add",
            "value",
            "Append `value` and return how many values there are.",
            "self.$values.append(value)\nreturn len(self.$values)",
            (lambda d, s: P(f"$o.add({d.int(1, 50)})"), lambda d, s: P("$o.$values[-1]", "$o.add(7)")),
        ),
        MethodSpec(
            "add_many",
            "values",
            "Append every number in the iterable `values` and return how many values there are.",
            "self.$values.extend(values)\nreturn len(self.$values)",
            (lambda d, s: P(f"$o.add_many({[d.int(1, 9) for _ in range(3)]!r})"),),
        ),
        MethodSpec(
            "mean",
            "",
            "Return the arithmetic mean rounded to 2 decimals, or `None` with no values.",
            "if not self.$values:\n    return None\n"
            "return round(sum(self.$values) / len(self.$values), 2)",
            (lambda d, s: P("$o.mean()"), lambda d, s: P("$o.mean()", fill=False)),
        ),
        MethodSpec(
            "median",
            "",
            "Return the median (the mean of the two middle values for an even count), "
            "rounded to 2 decimals, or `None` with no values.",
            "if not self.$values:\n    return None\n"
            "ordered = sorted(self.$values)\nmiddle = len(ordered) // 2\n"
            "if len(ordered) % 2:\n    return round(ordered[middle], 2)\n"
            "return round((ordered[middle - 1] + ordered[middle]) / 2, 2)",
            (
                lambda d, s: P("$o.median()"),
                lambda d, s: P("$o.median()", "$o.$values.append(1)"),
                lambda d, s: P("$o.median()", fill=False),
            ),
        ),
        MethodSpec(
            "spread",
            "",
            "Return the largest value minus the smallest, or 0 with no values.",
            "if not self.$values:\n    return 0\nreturn max(self.$values) - min(self.$values)",
            (lambda d, s: P("$o.spread()"), lambda d, s: P("$o.spread()", fill=False)),
        ),
        MethodSpec(
            "variance",
            "",
            "Return the population variance (mean squared distance from the mean) rounded "
            "to 2 decimals, or `None` with no values.",
            "if not self.$values:\n    return None\n"
            "mean = sum(self.$values) / len(self.$values)\n"
            "return round(sum((v - mean) ** 2 for v in self.$values) / len(self.$values), 2)",
            (lambda d, s: P("$o.variance()"), lambda d, s: P("$o.variance()", fill=False)),
        ),
        MethodSpec(
            "count_above",
            "threshold",
            "Return how many values are strictly greater than `threshold`.",
            "return sum(1 for v in self.$values if v > threshold)",
            (lambda d, s: P(f"$o.count_above({d.int(5, 30)})"), lambda d, s: P(f"$o.count_above({s['values'][0]})")),
        ),
        MethodSpec(
            "mode",
            "",
            "Return the most frequent value (ties go to the smallest), or `None` with no values.",
            "if not self.$values:\n    return None\n"
            "counts = {}\nfor v in self.$values:\n    counts[v] = counts.get(v, 0) + 1\n"
            "return min(counts, key=lambda v: (-counts[v], v))",
            (lambda d, s: P("$o.mode()"), lambda d, s: P("$o.mode()", fill=False)),
        ),
        MethodSpec(
            "normalized",
            "",
            "Return the values rescaled to (v - min) / (max - min), each rounded to 2 "
            "decimals, in the original order; all 0.0 when every value is equal; an empty "
            "list with no values.",
            "if not self.$values:\n    return []\nlow, high = min(self.$values), max(self.$values)\n"
            "if low == high:\n    return [0.0 for _ in self.$values]\n"
            "return [round((v - low) / (high - low), 2) for v in self.$values]",
            (
                lambda d, s: P("$o.normalized()"),
                lambda d, s: P("$o.normalized()", "$o.$values[:] = [4, 4, 4]"),
            ),
        ),
        MethodSpec(
            "remove_outliers",
            "limit",
            "Delete every value whose distance from the mean is greater than `limit` and "
            "return how many were deleted (0 with no values).",
            "if not self.$values:\n    return 0\n"
            "mean = sum(self.$values) / len(self.$values)\n"
            "kept = [v for v in self.$values if abs(v - mean) <= limit]\n"
            "removed = len(self.$values) - len(kept)\nself.$values = kept\nreturn removed",
            (
                lambda d, s: P(f"$o.remove_outliers({d.int(5, 12)})"),
                lambda d, s: P("$o.$values", "$o.remove_outliers(8)"),
            ),
        ),
    ),
)


# ------------------------------------------------------------------- temperature log
def _weather_fill(d: Draw) -> tuple[list[str], dict[str, Any]]:
    days = ["mon", "tue", "wed", "thu", "fri", "sat", "sun"][: d.int(3, 6)]
    readings = {day: d.int(-40, 320) / 10 for day in days}
    return [f"$o.$readings.update({readings!r})"], {"days": days}


WEATHER = ClassConcept(
    key="weather",
    class_names=("TemperatureLog", "WeatherLog", "ClimateDiary", "ThermoRecord", "HeatJournal"),
    var="log",
    summary="a log of daily temperatures in degrees Celsius for one city",
    attrs={"readings": ("readings", "temps", "records")},
    init=MethodSpec(
        "__init__",
        "city",
        "Store `city` as `self.city` and start `self.$readings` as an empty dict mapping "
        "a day label to a temperature in Celsius, kept in insertion order.",
        "self.city = city\nself.$readings = {}",
        (lambda d, s: P("[$o.city, $o.$readings]", fill=False),),
    ),
    ctor_args=lambda d: repr(d.pick(vocab.CITIES)),
    fill=_weather_fill,
    methods=(
        MethodSpec(
            "record",
            "day, temp",
            "Store `temp` for `day` (replacing an earlier reading of that day) and return "
            "how many days are recorded.",
            "self.$readings[day] = temp\nreturn len(self.$readings)",
            (lambda d, s: P(f"$o.record('xday', {d.int(-50, 300) / 10})"), lambda d, s: P(f"$o.record({s['days'][0]!r}, 1.5)")),
        ),
        MethodSpec(
            "average",
            "",
            "Return the mean temperature rounded to 1 decimal, or `None` with no readings.",
            "if not self.$readings:\n    return None\n"
            "return round(sum(self.$readings.values()) / len(self.$readings), 1)",
            (lambda d, s: P("$o.average()"), lambda d, s: P("$o.average()", fill=False)),
        ),
        MethodSpec(
            "hottest_day",
            "",
            "Return the day with the highest temperature (the earliest recorded among "
            "ties), or `None` with no readings.",
            "if not self.$readings:\n    return None\nreturn max(self.$readings, key=self.$readings.get)",
            (lambda d, s: P("$o.hottest_day()"), lambda d, s: P("$o.hottest_day()", fill=False)),
        ),
        MethodSpec(
            "coldest_day",
            "",
            "Return the day with the lowest temperature (the earliest recorded among "
            "ties), or `None` with no readings.",
            "if not self.$readings:\n    return None\nreturn min(self.$readings, key=self.$readings.get)",
            (lambda d, s: P("$o.coldest_day()"), lambda d, s: P("$o.coldest_day()", fill=False)),
        ),
        MethodSpec(
            "days_above",
            "limit",
            "Return, in recording order, the days whose temperature is above `limit`.",
            "return [day for day, temp in self.$readings.items() if temp > limit]",
            (lambda d, s: P(f"$o.days_above({d.int(5, 20)})"),),
        ),
        MethodSpec(
            "in_fahrenheit",
            "day",
            "Return the day's temperature in Fahrenheit (C * 9 / 5 + 32) rounded to 1 "
            "decimal. Raise `KeyError` for a day without a reading.",
            "return round(self.$readings[day] * 9 / 5 + 32, 1)",
            (
                lambda d, s: P(f"$o.in_fahrenheit({s['days'][1]!r})"),
                lambda d, s: P("$o.in_fahrenheit('never')", raises="KeyError"),
            ),
        ),
        MethodSpec(
            "temperature_range",
            "",
            "Return the highest minus the lowest temperature rounded to 1 decimal, or 0.0 "
            "with no readings.",
            "if not self.$readings:\n    return 0.0\n"
            "return round(max(self.$readings.values()) - min(self.$readings.values()), 1)",
            (lambda d, s: P("$o.temperature_range()"), lambda d, s: P("$o.temperature_range()", fill=False)),
        ),
        MethodSpec(
            "remove_day",
            "day",
            "Delete the day's reading and return it, or return `None` if the day has none.",
            "return self.$readings.pop(day, None)",
            (lambda d, s: P(f"[$o.remove_day({s['days'][0]!r}), len($o.$readings)]"), lambda d, s: P("$o.remove_day('never')")),
        ),
        MethodSpec(
            "warm_streak",
            "limit",
            "Return the length of the longest run of consecutively recorded days whose "
            "temperature is above `limit`.",
            "best = current = 0\nfor temp in self.$readings.values():\n"
            "    current = current + 1 if temp > limit else 0\n    best = max(best, current)\n"
            "return best",
            (lambda d, s: P(f"$o.warm_streak({d.int(0, 15)})"), lambda d, s: P("$o.warm_streak(100)")),
        ),
        MethodSpec(
            "summary",
            "",
            "Return `\"<city>: <n> days, mean <mean>\"` with the mean written with 1 decimal, "
            "or `\"<city>: no data\"` with no readings.",
            "if not self.$readings:\n"
            '    return f"{self.city}: no data"\n'
            "mean = sum(self.$readings.values()) / len(self.$readings)\n"
            'return f"{self.city}: {len(self.$readings)} days, mean {mean:.1f}"',
            (lambda d, s: P("$o.summary()"), lambda d, s: P("$o.summary()", fill=False)),
        ),
    ),
)


# ------------------------------------------------------------------------- playlist
def _playlist_fill(d: Draw) -> tuple[list[str], dict[str, Any]]:
    titles = [f"{w.capitalize()} {d.pick(vocab.WORDS).capitalize()}" for w in d.words(d.int(3, 5))]
    songs = [(title, d.int(95, 420)) for title in titles]
    return [f"$o.$songs.extend({songs!r})"], {"titles": titles}


PLAYLIST = ClassConcept(
    key="playlist",
    class_names=("Playlist", "MixTape", "SongQueue", "RadioSet", "TrackList"),
    var="pl",
    summary="an ordered playlist of songs with their lengths in seconds",
    attrs={"songs": ("songs", "tracks")},
    init=MethodSpec(
        "__init__",
        "name",
        "Store `name` as `self.name` and start `self.$songs` as an empty list of "
        "`(title, seconds)` tuples.",
        "self.name = name\nself.$songs = []",
        (lambda d, s: P("[$o.name, $o.$songs]", fill=False),),
    ),
    ctor_args=lambda d: repr(f"{d.pick(vocab.ADJECTIVES)} mix"),
    fill=_playlist_fill,
    methods=(
        MethodSpec(
            "add_song",
            "title, seconds",
            "Append `(title, seconds)` and return the number of songs. Raise `ValueError` if "
            "`seconds` is not positive.",
            "if seconds <= 0:\n    raise ValueError(\"length must be positive\")\n"
            "self.$songs.append((title, seconds))\nreturn len(self.$songs)",
            (
                lambda d, s: P(f"$o.add_song('Encore', {d.int(60, 300)})"),
                lambda d, s: P("$o.add_song('Silence', 0)", raises="ValueError"),
                lambda d, s: P("$o.$songs[-1]", "$o.add_song('Coda', 75)"),
            ),
        ),
        MethodSpec(
            "total_duration",
            "",
            "Return the total length as a string `\"<minutes>:<seconds>\"`, seconds always "
            "two digits (e.g. `\"7:05\"`).",
            "total = sum(seconds for _, seconds in self.$songs)\n"
            'return f"{total // 60}:{total % 60:02d}"',
            (lambda d, s: P("$o.total_duration()"), lambda d, s: P("$o.total_duration()", fill=False)),
        ),
        MethodSpec(
            "remove_song",
            "title",
            "Remove the first song with this title and return `True`, or return `False` if "
            "there is none.",
            "for i, (song_title, _) in enumerate(self.$songs):\n"
            "    if song_title == title:\n        del self.$songs[i]\n        return True\n"
            "return False",
            (
                lambda d, s: P(f"[$o.remove_song({s['titles'][1]!r}), len($o.$songs)]"),
                lambda d, s: P("$o.remove_song('Missing')"),
            ),
        ),
        MethodSpec(
            "longest_song",
            "",
            "Return the title of the longest song (the first among ties), or `None` if the "
            "playlist is empty.",
            "if not self.$songs:\n    return None\nreturn max(self.$songs, key=lambda song: song[1])[0]",
            (lambda d, s: P("$o.longest_song()"), lambda d, s: P("$o.longest_song()", fill=False)),
        ),
        MethodSpec(
            "find",
            "title",
            "Return the position of the first song with this title, or -1.",
            "for i, (song_title, _) in enumerate(self.$songs):\n"
            "    if song_title == title:\n        return i\nreturn -1",
            (lambda d, s: P(f"$o.find({s['titles'][-1]!r})"), lambda d, s: P("$o.find('Missing')")),
        ),
        MethodSpec(
            "move_to_front",
            "title",
            "Move the first song with this title to position 0 and return `True`, or return "
            "`False` if there is none.",
            "for i, song in enumerate(self.$songs):\n    if song[0] == title:\n"
            "        self.$songs.insert(0, self.$songs.pop(i))\n        return True\nreturn False",
            (
                lambda d, s: P("[song[0] for song in $o.$songs]", f"$o.move_to_front({s['titles'][-1]!r})"),
                lambda d, s: P("$o.move_to_front('Missing')"),
            ),
        ),
        MethodSpec(
            "shorter_than",
            "seconds",
            "Return, in playlist order, the titles of songs shorter than `seconds`.",
            "return [title for title, length in self.$songs if length < seconds]",
            (lambda d, s: P(f"$o.shorter_than({d.int(150, 360)})"),),
        ),
        MethodSpec(
            "sorted_by_length",
            "",
            "Return the titles ordered by length, shortest first (ties by title).",
            "return [title for title, _ in sorted(self.$songs, key=lambda song: (song[1], song[0]))]",
            (lambda d, s: P("$o.sorted_by_length()"),),
        ),
        MethodSpec(
            "average_length",
            "",
            "Return the mean song length in seconds rounded to 1 decimal, or 0.0 if empty.",
            "if not self.$songs:\n    return 0.0\n"
            "return round(sum(seconds for _, seconds in self.$songs) / len(self.$songs), 1)",
            (lambda d, s: P("$o.average_length()"), lambda d, s: P("$o.average_length()", fill=False)),
        ),
        MethodSpec(
            "swap",
            "i, j",
            "Swap the songs at positions `i` and `j` and return the list of titles. Raise "
            "`IndexError` if either position is outside 0 .. len - 1.",
            "if not (0 <= i < len(self.$songs) and 0 <= j < len(self.$songs)):\n"
            "    raise IndexError(\"position out of range\")\n"
            "self.$songs[i], self.$songs[j] = self.$songs[j], self.$songs[i]\n"
            "return [title for title, _ in self.$songs]",
            (lambda d, s: P("$o.swap(0, 2)"), lambda d, s: P("$o.swap(0, 9)", raises="IndexError")),
        ),
    ),
)


# ------------------------------------------------------------------------- calendar
def _calendar_fill(d: Draw) -> tuple[list[str], dict[str, Any]]:
    year = d.int(2023, 2025)
    dates = sorted({d.date(year, d.pick([3, 4])) for _ in range(d.int(3, 4))})
    events = {date: [f"{d.pick(vocab.EVENT_WORDS_B).lower()} {d.pick(['meeting', 'call', 'lunch', 'review'])}" for _ in range(d.int(1, 3))] for date in dates}
    return [f"$o.$events.update({events!r})"], {"dates": dates, "events": events, "year": year}


CALENDAR = ClassConcept(
    key="calendar",
    class_names=("EventCalendar", "Planner", "Agenda", "Scheduler", "DayBook"),
    var="cal",
    summary="a calendar of event titles grouped by ISO date strings (YYYY-MM-DD)",
    attrs={"events": ("events", "bookings", "schedule")},
    init=MethodSpec(
        "__init__",
        "",
        "Take no arguments and start `self.$events` as an empty dict mapping a date string "
        "`\"YYYY-MM-DD\"` to the list of event titles on that date.",
        "self.$events = {}",
        (lambda d, s: P("$o.$events", fill=False),),
    ),
    ctor_args=lambda d: "",
    fill=_calendar_fill,
    methods=(
        MethodSpec(
            "add_event",
            "date, title",
            "Append `title` to the date's list (creating it if needed) and return how many "
            "events that date now has.",
            "self.$events.setdefault(date, []).append(title)\nreturn len(self.$events[date])",
            (lambda d, s: P(f"$o.add_event({s['dates'][0]!r}, 'dentist')"), lambda d, s: P("$o.add_event('2030-01-01', 'launch')")),
        ),
        MethodSpec(
            "events_on",
            "date",
            "Return a copy of the date's list of titles (an empty list for a free date).",
            "return list(self.$events.get(date, []))",
            (lambda d, s: P(f"$o.events_on({s['dates'][-1]!r})"), lambda d, s: P("$o.events_on('1999-12-31')")),
        ),
        MethodSpec(
            "cancel",
            "date, title",
            "Remove the first occurrence of `title` on `date` and return `True`, deleting the "
            "date when its list becomes empty; return `False` if there is no such event.",
            "titles = self.$events.get(date)\nif not titles or title not in titles:\n    return False\n"
            "titles.remove(title)\nif not titles:\n    del self.$events[date]\nreturn True",
            (
                lambda d, s: P(
                    "[$o.cancel(" + repr(s["dates"][0]) + ", " + repr(s["events"][s["dates"][0]][0]) + "), sorted($o.$events)]"
                ),
                lambda d, s: P(f"$o.cancel({s['dates'][0]!r}, 'party')"),
            ),
        ),
        MethodSpec(
            "busiest_day",
            "",
            "Return the date with the most events (ties go to the earliest date), or `None` "
            "if the calendar is empty.",
            "if not self.$events:\n    return None\n"
            "return min(self.$events, key=lambda date: (-len(self.$events[date]), date))",
            (lambda d, s: P("$o.busiest_day()"), lambda d, s: P("$o.busiest_day()", fill=False)),
        ),
        MethodSpec(
            "total_events",
            "",
            "Return the number of events over all dates.",
            "return sum(len(titles) for titles in self.$events.values())",
            (lambda d, s: P("$o.total_events()"),),
        ),
        MethodSpec(
            "dates",
            "",
            "Return the dates that have events, sorted.",
            "return sorted(self.$events)",
            (lambda d, s: P("$o.dates()"),),
        ),
        MethodSpec(
            "events_between",
            "start, end",
            "Return the titles of events dated from `start` to `end` inclusive, by date and "
            "then in list order.",
            "return [title for date in sorted(self.$events) if start <= date <= end\n"
            "        for title in self.$events[date]]",
            (
                lambda d, s: P(f"$o.events_between('{s['year']}-03-10', '{s['year']}-04-15')"),
                lambda d, s: P("$o.events_between('2000-01-01', '2000-12-31')"),
            ),
        ),
        MethodSpec(
            "move_event",
            "title, old_date, new_date",
            "Move the first `title` on `old_date` to the end of `new_date`'s list (deleting "
            "`old_date` if it becomes empty) and return `True`; return `False` if there is no "
            "such event.",
            "titles = self.$events.get(old_date)\nif not titles or title not in titles:\n    return False\n"
            "titles.remove(title)\nif not titles:\n    del self.$events[old_date]\n"
            "self.$events.setdefault(new_date, []).append(title)\nreturn True",
            (
                lambda d, s: P(
                    "$o.$events",
                    f"$o.move_event({s['events'][s['dates'][0]][0]!r}, {s['dates'][0]!r}, '2031-05-05')",
                ),
                lambda d, s: P("$o.move_event('party', '2031-01-01', '2031-01-02')"),
            ),
        ),
        MethodSpec(
            "count_in_month",
            "month",
            "Return how many events fall in `month`, given as `\"YYYY-MM\"`.",
            "return sum(len(titles) for date, titles in self.$events.items() if date.startswith(month + \"-\"))",
            (lambda d, s: P(f"$o.count_in_month('{s['year']}-03')"), lambda d, s: P(f"$o.count_in_month('{s['year']}-04')")),
        ),
        MethodSpec(
            "clear_day",
            "date",
            "Delete all events of `date` and return how many were deleted.",
            "return len(self.$events.pop(date, []))",
            (lambda d, s: P(f"[$o.clear_day({s['dates'][0]!r}), len($o.$events)]"), lambda d, s: P("$o.clear_day('1999-01-01')")),
        ),
    ),
)


# --------------------------------------------------------------------------- cipher
CIPHER = ClassConcept(
    key="cipher",
    class_names=("CaesarCipher", "ShiftCipher", "SecretCodec", "LetterShifter", "RotorBox"),
    var="codec",
    summary="a Caesar-style letter-shifting codec with a few other text helpers",
    attrs={"key": ("shift", "key", "offset")},
    init=MethodSpec(
        "__init__",
        "shift",
        "Store `shift % 26` as `self.$key`.",
        "self.$key = shift % 26",
        (lambda d, s: P("$o.$key", ctor=str(d.int(27, 60))),),
    ),
    ctor_args=lambda d: str(d.int(1, 25)),
    methods=(
        MethodSpec(
            "encode",
            "text",
            "Shift every ASCII letter forward by `self.$key` places in the alphabet, "
            "wrapping around and keeping its case; leave every other character unchanged.",
            "result = []\nfor ch in text:\n    if ch.isascii() and ch.isalpha():\n"
            '        base = ord("A") if ch.isupper() else ord("a")\n'
            "        result.append(chr((ord(ch) - base + self.$key) % 26 + base))\n"
            "    else:\n        result.append(ch)\n"
            'return "".join(result)',
            (lambda d, s: P(f"$o.encode({d.sentence()!r})"), lambda d, s: P("$o.encode('xyz XYZ 123')")),
        ),
        MethodSpec(
            "decode",
            "text",
            "Undo `encode`: shift every ASCII letter back by `self.$key` places, wrapping "
            "around and keeping its case; leave every other character unchanged.",
            "result = []\nfor ch in text:\n    if ch.isascii() and ch.isalpha():\n"
            '        base = ord("A") if ch.isupper() else ord("a")\n'
            "        result.append(chr((ord(ch) - base - self.$key) % 26 + base))\n"
            "    else:\n        result.append(ch)\n"
            'return "".join(result)',
            (lambda d, s: P(f"$o.decode({d.sentence()!r})"), lambda d, s: P("$o.decode('abc, ABC!')")),
        ),
        MethodSpec(
            "set_shift",
            "shift",
            "Replace the key with `shift % 26` and return it.",
            "self.$key = shift % 26\nreturn self.$key",
            (lambda d, s: P(f"$o.set_shift({d.int(-30, 60)})"),),
        ),
        MethodSpec(
            "is_palindrome",
            "text",
            "Return `True` if the letters and digits of `text`, lowercased, read the same "
            "backwards.",
            "cleaned = [ch.lower() for ch in text if ch.isalnum()]\nreturn cleaned == cleaned[::-1]",
            (
                lambda d, s: P(f"$o.is_palindrome({d.pick(['Never odd or even', 'Step on no pets!', 'A Santa at NASA'])!r})"),
                lambda d, s: P(f"$o.is_palindrome({d.sentence()!r})"),
            ),
        ),
        MethodSpec(
            "vowel_count",
            "text",
            "Return how many characters of `text` are vowels (a, e, i, o, u in either case).",
            'return sum(1 for ch in text.lower() if ch in "aeiou")',
            (lambda d, s: P(f"$o.vowel_count({d.sentence()!r})"),),
        ),
        MethodSpec(
            "reverse_words",
            "text",
            "Return the words of `text` (split on whitespace) in reverse order, joined by "
            "single spaces.",
            'return " ".join(reversed(text.split()))',
            (lambda d, s: P(f"$o.reverse_words({d.sentence()!r})"),),
        ),
        MethodSpec(
            "letter_counts",
            "text",
            "Return a dict from each lowercase letter in `text` (case-insensitive, letters "
            "only) to its count, with keys in alphabetical order.",
            "counts = {}\nfor ch in text.lower():\n    if ch.isalpha():\n"
            "        counts[ch] = counts.get(ch, 0) + 1\nreturn dict(sorted(counts.items()))",
            (lambda d, s: P(f"$o.letter_counts({' '.join(d.words(2))!r})"),),
        ),
        MethodSpec(
            "rotate",
            "text, n",
            "Return `text` rotated left by `n` characters (n taken modulo the length); an "
            "empty text stays empty.",
            "if not text:\n    return text\nn %= len(text)\nreturn text[n:] + text[:n]",
            (lambda d, s: P(f"$o.rotate({d.pick(vocab.WORDS)!r}, {d.int(1, 12)})"), lambda d, s: P("$o.rotate('', 3)")),
        ),
        MethodSpec(
            "is_anagram",
            "first, second",
            "Return `True` if `first` and `second` contain the same letters the same number "
            "of times, ignoring case and every character that is not a letter.",
            "letters_first = sorted(ch.lower() for ch in first if ch.isalpha())\n"
            "letters_second = sorted(ch.lower() for ch in second if ch.isalpha())\n"
            "return letters_first == letters_second",
            (
                lambda d, s: P(f"$o.is_anagram({d.pick(['Listen', 'Dusty', 'Night', 'Elbow'])!r}, {d.pick(['Silent!', 'study', 'Thing', 'below'])!r})"),
                lambda d, s: P(f"$o.is_anagram({d.pick(vocab.WORDS)!r}, {d.pick(vocab.WORDS).upper()!r})"),
            ),
        ),
        MethodSpec(
            "compress",
            "text",
            "Return the run-length encoding of `text`: each run of a repeated character "
            "becomes the character followed by the run length (`\"aaab\"` gives `\"a3b1\"`).",
            'if not text:\n    return ""\nparts = []\nrun_char, run_length = text[0], 1\n'
            "for ch in text[1:]:\n    if ch == run_char:\n        run_length += 1\n    else:\n"
            '        parts.append(f"{run_char}{run_length}")\n        run_char, run_length = ch, 1\n'
            'parts.append(f"{run_char}{run_length}")\nreturn "".join(parts)',
            (
                lambda d, s: P(f"$o.compress({''.join(ch * d.int(1, 4) for ch in d.pick(vocab.WORDS))!r})"),
                lambda d, s: P("$o.compress('')"),
            ),
        ),
    ),
)


# ---------------------------------------------------------------------- help desk
def _desk_fill(d: Draw) -> tuple[list[str], dict[str, Any]]:
    customers = d.people(2)
    tickets = {}
    for offset in range(d.int(3, 5)):
        tickets[100 + offset] = {
            "customer": customers[offset % 2],
            "issue": f"{d.pick(vocab.WORDS)} {d.pick(['broken', 'missing', 'slow', 'late', 'noisy'])}",
            "status": d.pick(["open", "open", "closed", "escalated"]),
        }
    return [f"$o.$tickets.update({tickets!r})", f"$o.next_id = {100 + len(tickets)}"], {"customers": customers, "ids": list(tickets)}


HELPDESK = ClassConcept(
    key="helpdesk",
    class_names=("SupportQueue", "HelpDesk", "TicketTracker", "ServiceDesk", "IssueBoard"),
    var="desk",
    summary="a support desk that tracks numbered customer tickets and their status",
    attrs={"tickets": ("tickets", "cases", "requests")},
    init=MethodSpec(
        "__init__",
        "team",
        "Store `team` as `self.team`, start `self.$tickets` as an empty dict mapping a "
        "ticket id to a dict with the keys `\"customer\"`, `\"issue\"` and `\"status\"` "
        "(`\"open\"`, `\"closed\"` or `\"escalated\"`), and set `self.next_id` to 100.",
        "self.team = team\nself.$tickets = {}\nself.next_id = 100",
        (lambda d, s: P("[$o.team, $o.$tickets, $o.next_id]", fill=False),),
    ),
    ctor_args=lambda d: repr(d.pick(vocab.DEPARTMENTS)),
    fill=_desk_fill,
    methods=(
        MethodSpec(
            "open_ticket",
            "customer, issue",
            "Create an open ticket with id `self.next_id`, increase `self.next_id`, and "
            "return the new id.",
            "ticket_id = self.next_id\nself.next_id += 1\n"
            'self.$tickets[ticket_id] = {"customer": customer, "issue": issue, "status": "open"}\n'
            "return ticket_id",
            (
                lambda d, s: P(f"$o.open_ticket({d.first()!r}, 'printer jam')"),
                lambda d, s: P("$o.$tickets[$o.next_id - 1]", "$o.open_ticket('Ada', 'login fails')"),
            ),
        ),
        MethodSpec(
            "close_ticket",
            "ticket_id",
            "Set the ticket's status to `\"closed\"` and return `True`; return `False` if the "
            "ticket does not exist or is already closed.",
            "ticket = self.$tickets.get(ticket_id)\n"
            'if ticket is None or ticket["status"] == "closed":\n    return False\n'
            'ticket["status"] = "closed"\nreturn True',
            (
                lambda d, s: P(f"[$o.close_ticket({s['ids'][0]}), $o.$tickets[{s['ids'][0]}]['status']]"),
                lambda d, s: P("$o.close_ticket(1)"),
            ),
        ),
        MethodSpec(
            "open_count",
            "",
            "Return how many tickets have status `\"open\"`.",
            'return sum(1 for ticket in self.$tickets.values() if ticket["status"] == "open")',
            (lambda d, s: P("$o.open_count()"),),
        ),
        MethodSpec(
            "tickets_for",
            "customer",
            "Return the ids of the customer's tickets, sorted.",
            'return sorted(ticket_id for ticket_id, ticket in self.$tickets.items() if ticket["customer"] == customer)',
            (lambda d, s: P(f"$o.tickets_for({s['customers'][0]!r})"), lambda d, s: P("$o.tickets_for('Nobody')")),
        ),
        MethodSpec(
            "reopen",
            "ticket_id",
            "Set a closed ticket back to `\"open\"` and return `True`; return `False` for a "
            "missing ticket or one that is not closed.",
            "ticket = self.$tickets.get(ticket_id)\n"
            'if ticket is None or ticket["status"] != "closed":\n    return False\n'
            'ticket["status"] = "open"\nreturn True',
            (
                lambda d, s: P(f"$o.reopen({s['ids'][0]})", f"$o.$tickets[{s['ids'][0]}]['status'] = 'closed'"),
                lambda d, s: P("$o.reopen(1)"),
            ),
        ),
        MethodSpec(
            "oldest_open",
            "",
            "Return the smallest id among open tickets, or `None` if none is open.",
            'open_ids = [ticket_id for ticket_id, ticket in self.$tickets.items() if ticket["status"] == "open"]\n'
            "return min(open_ids) if open_ids else None",
            (lambda d, s: P("$o.oldest_open()"), lambda d, s: P("$o.oldest_open()", fill=False)),
        ),
        MethodSpec(
            "escalate",
            "ticket_id",
            "Set the ticket's status to `\"escalated\"` and return its previous status. "
            "Raise `KeyError` for an unknown id.",
            "ticket = self.$tickets[ticket_id]\nprevious = ticket[\"status\"]\n"
            'ticket["status"] = "escalated"\nreturn previous',
            (lambda d, s: P(f"$o.escalate({s['ids'][-1]})"), lambda d, s: P("$o.escalate(1)", raises="KeyError")),
        ),
        MethodSpec(
            "status_counts",
            "",
            "Return a dict from each status that occurs to its number of tickets, with keys "
            "in alphabetical order.",
            "counts = {}\nfor ticket in self.$tickets.values():\n"
            '    counts[ticket["status"]] = counts.get(ticket["status"], 0) + 1\n'
            "return dict(sorted(counts.items()))",
            (lambda d, s: P("$o.status_counts()"),),
        ),
        MethodSpec(
            "search_issue",
            "word",
            "Return the sorted ids of tickets whose issue contains `word`, ignoring case.",
            'return sorted(ticket_id for ticket_id, ticket in self.$tickets.items() if word.lower() in ticket["issue"].lower())',
            (lambda d, s: P("$o.search_issue('O')"), lambda d, s: P("$o.search_issue('zebra')")),
        ),
        MethodSpec(
            "purge_closed",
            "",
            "Delete every closed ticket and return how many were deleted.",
            'closed = [ticket_id for ticket_id, ticket in self.$tickets.items() if ticket["status"] == "closed"]\n'
            "for ticket_id in closed:\n    del self.$tickets[ticket_id]\nreturn len(closed)",
            (lambda d, s: P("$o.purge_closed()"), lambda d, s: P("sorted($o.$tickets)", "$o.purge_closed()")),
        ),
    ),
)


# ------------------------------------------------------------------------ polynomial
def _two_root_coeffs(d: Draw) -> str:
    """Coefficients of (x - a)(x - b): a probe that has integer roots to find."""
    a, b = d.int(-4, 4), d.int(-4, 4)
    return repr([a * b, -(a + b), 1])


POLYNOMIAL = ClassConcept(
    key="polynomial",
    class_names=("Polynomial", "PolyExpr", "CoefficientPoly", "PowerSeries", "IntPoly"),
    var="poly",
    summary="a polynomial with integer coefficients, lowest power first",
    attrs={"c": ("coeffs", "coefficients", "terms")},
    init=MethodSpec(
        "__init__",
        "coeffs",
        "Store a list copy of `coeffs` as `self.$c`, where `self.$c[i]` is the coefficient "
        "of x**i, then drop trailing zeros while more than one coefficient is left.",
        "self.$c = list(coeffs)\nwhile len(self.$c) > 1 and self.$c[-1] == 0:\n    self.$c.pop()",
        (lambda d, s: P("$o.$c", ctor=f"[{d.int(-5, 5)}, {d.int(1, 5)}, 0, 0]"),),
    ),
    ctor_args=lambda d: repr([d.int(-6, 6) for _ in range(d.int(2, 4))] + [d.int(1, 5)]),
    methods=(
        MethodSpec(
            "degree",
            "",
            "Return the degree: the number of coefficients minus one.",
            "return len(self.$c) - 1",
            (lambda d, s: P("$o.degree()"), lambda d, s: P("$o.degree()", ctor="[0, 0]")),
        ),
        MethodSpec(
            "evaluate",
            "x",
            "Return the value of the polynomial at `x` (Horner's rule works well).",
            "result = 0\nfor c in reversed(self.$c):\n    result = result * x + c\nreturn result",
            (lambda d, s: P(f"$o.evaluate({d.int(-4, 4)})"), lambda d, s: P("$o.evaluate(0)")),
        ),
        MethodSpec(
            "add",
            "other",
            "Return the coefficient list of this polynomial plus the coefficient list "
            "`other`, with trailing zeros dropped while more than one is left.",
            "size = max(len(self.$c), len(other))\n"
            "total = [(self.$c[i] if i < len(self.$c) else 0) + (other[i] if i < len(other) else 0) for i in range(size)]\n"
            "while len(total) > 1 and total[-1] == 0:\n    total.pop()\nreturn total",
            (lambda d, s: P(f"$o.add({[d.int(-5, 5) for _ in range(d.int(1, 5))]!r})"), lambda d, s: P("$o.add([])")),
        ),
        MethodSpec(
            "scale",
            "k",
            "Return the coefficient list multiplied by `k`.",
            "return [c * k for c in self.$c]",
            (lambda d, s: P(f"$o.scale({d.int(-3, 4)})"),),
        ),
        MethodSpec(
            "derivative",
            "",
            "Return the coefficient list of the derivative (`[0]` for a constant).",
            "if len(self.$c) == 1:\n    return [0]\nreturn [i * c for i, c in enumerate(self.$c)][1:]",
            (lambda d, s: P("$o.derivative()"), lambda d, s: P("$o.derivative()", ctor="[7]")),
        ),
        MethodSpec(
            "to_string",
            "",
            "Return the terms from the highest power down, skipping zero coefficients, as "
            "`\"<c>x^<i>\"` joined by `\" + \"` (e.g. `\"2x^2 + -1x^0\"`), or `\"0\"` if "
            "every coefficient is zero.",
            'terms = [f"{c}x^{i}" for i, c in reversed(list(enumerate(self.$c))) if c != 0]\n'
            'return " + ".join(terms) if terms else "0"',
            (lambda d, s: P("$o.to_string()"), lambda d, s: P("$o.to_string()", ctor="[0]")),
        ),
        MethodSpec(
            "multiply",
            "other",
            "Return the coefficient list of the product with the polynomial whose "
            "coefficient list is `other` (non-empty).",
            "product = [0] * (len(self.$c) + len(other) - 1)\n"
            "for i, a in enumerate(self.$c):\n    for j, b in enumerate(other):\n"
            "        product[i + j] += a * b\nreturn product",
            (lambda d, s: P(f"$o.multiply({[d.int(-3, 3) for _ in range(2)] + [d.int(1, 3)]!r})"),),
        ),
        MethodSpec(
            "integer_roots",
            "low, high",
            "Return, in increasing order, the integers x with low <= x <= high at which the "
            "polynomial is zero.",
            "roots = []\nfor x in range(low, high + 1):\n    value = 0\n"
            "    for c in reversed(self.$c):\n        value = value * x + c\n"
            "    if value == 0:\n        roots.append(x)\nreturn roots",
            (
                lambda d, s: P("$o.integer_roots(-5, 5)", ctor=_two_root_coeffs(d)),
                lambda d, s: P("$o.integer_roots(-3, 3)"),
            ),
        ),
        MethodSpec(
            "leading",
            "",
            "Return the coefficient of the highest power.",
            "return self.$c[-1]",
            (lambda d, s: P("$o.leading()"),),
        ),
        MethodSpec(
            "is_zero",
            "",
            "Return `True` if every coefficient is zero.",
            "return all(c == 0 for c in self.$c)",
            (lambda d, s: P("$o.is_zero()"), lambda d, s: P("$o.is_zero()", ctor="[0, 0, 0]")),
        ),
    ),
)


CONCEPTS: tuple[ClassConcept, ...] = (
    ACCOUNT, INVENTORY, GRADEBOOK, TEXT, CART, TASKS, PARKING, LIBRARY, STATS, WEATHER,
    PLAYLIST, CALENDAR, CIPHER, HELPDESK, POLYNOMIAL,
)
