"""Class synthesis: write a Python class from a spec of its constructor and methods.

The answer is one class in a ```python block; the CoT settles the state, then writes the
methods one after another in the spec's order (a plan note, the method's code, a check
against the spec's example), so a draft forked after k methods can already hold k of
them. The checker runs generated unit tests on the answer in a subprocess.

Expected test values come from running the *reference* class (our own template code,
rendered from `class_concepts`) in this process; answers are only ever run by
`pyexec`, in a separate time- and memory-limited process.

Version 2 (`ClassSynthesisV2`, in thinker-data-v4, at the end of this module) is version 1's
items with the CoT worded differently from item to item.
"""

from __future__ import annotations

import ast
import random
import re
import textwrap
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from string import Template
from typing import Any

from .base import CheckResult, TaskFamily, TaskItem, estimate_tokens, final_answer_text, require_range
from .class_concepts import CONCEPTS
from .class_spec import ClassConcept, Draw, MethodSpec
from .pyexec import UnitTest, run_class_tests
from .wording import capitalised, ordinal, pick, shuffled, spoken_list

INDENT = "    "
DOC_WIDTH = 84


@dataclass(frozen=True)
class _RenderedMethod:
    """A method with its placeholders filled in: what the prompt, CoT and answer show."""

    spec: MethodSpec
    signature: str  # "deposit(self, amount)"
    call_signature: str  # "deposit(amount)"
    doc: str
    body: str  # the body alone, unindented
    code: str  # the full `def`, indented one level (as inside the class)
    summary: str = ""  # the doc paraphrased, a bare verb phrase (what reworded CoTs say)


def _fill(template: str, subs: Mapping[str, str]) -> str:
    return Template(template).substitute(subs)


def _docstring(text: str, indent: str) -> list[str]:
    """A docstring for `text` (backticks dropped), wrapped to fit the class layout."""
    plain = text.replace("`", "")
    if plain.endswith('"'):
        plain += "."  # a quote right before the closing triple quote would end it early
    width = DOC_WIDTH - len(indent) - 6
    lines = textwrap.wrap(plain, width=width)
    if len(lines) == 1:
        return [f'{indent}"""{lines[0]}"""']
    return [f'{indent}"""{lines[0]}'] + [f"{indent}{line}" for line in lines[1:]] + [f'{indent}"""']


def _render_method(spec: MethodSpec, subs: Mapping[str, str]) -> _RenderedMethod:
    params = f"self, {spec.params}" if spec.params else "self"
    doc = _fill(spec.doc, subs)
    body = _fill(spec.body, subs)
    lines = [f"{INDENT}def {spec.name}({params}):"]
    lines += _docstring(doc, INDENT * 2)
    lines += [f"{INDENT * 2}{line}" if line else "" for line in body.splitlines()]
    return _RenderedMethod(
        spec,
        f"{spec.name}({params})",
        f"{spec.name}({spec.params})",
        doc,
        body,
        "\n".join(lines),
        _fill(spec.summary, subs),
    )


def _class_code(class_name: str, summary: str, methods: Sequence[_RenderedMethod]) -> str:
    header = [f"class {class_name}:"] + _docstring(summary[0].upper() + summary[1:] + ".", INDENT)
    return "\n".join(header) + "\n\n" + "\n\n".join(method.code for method in methods) + "\n"


def _reference_outcomes(code: str, class_name: str, tests: Sequence[UnitTest]) -> list[UnitTest]:
    """Fill in each test's expected value by running the reference class.

    The code is our own rendered template (never an answer), so running it here is
    safe, and it keeps expectations consistent with the reference by construction. A
    probe whose outcome contradicts its declared `raises` is a template bug and fails
    loudly instead of becoming a wrong test.
    """
    namespace: dict[str, Any] = {"__name__": f"reference_{class_name}"}
    exec(compile(code, f"<reference {class_name}>", "exec"), namespace)  # noqa: S102 - our template
    resolved = []
    for test in tests:
        scope = dict(namespace)
        try:
            for statement in test.setup:
                exec(statement, scope)  # noqa: S102 - our template
            value = eval(test.expr, scope)  # noqa: S307 - our template
        except Exception as exc:  # noqa: BLE001 - compared with the declared exception
            if test.raises and type(exc).__name__ == test.raises:
                resolved.append(test)
                continue
            raise RuntimeError(f"reference {class_name}: {test.expr} raised {exc!r}") from exc
        if test.raises:
            raise RuntimeError(f"reference {class_name}: {test.expr} should raise {test.raises}")
        expected = repr(value)
        if ast.literal_eval(expected) != value:
            raise RuntimeError(f"reference {class_name}: {test.expr} gave a non-literal {expected}")
        resolved.append(UnitTest(test.setup, test.expr, expected, None))
    return resolved


def extract_python_block(text: str) -> str:
    """The code of an answer: its first ```python block, else its first ``` block,
    else the whole answer text (a model may forget the fence)."""
    answer = final_answer_text(text)
    for pattern in (r"```python[^\n]*\n(.*?)(?:```|\Z)", r"```[^\n]*\n(.*?)(?:```|\Z)"):
        match = re.search(pattern, answer, flags=re.DOTALL)
        if match:
            return match.group(1)
    return answer


_INTROS = (
    "Implement the Python class `{cls}`: {summary}.",
    "Write a Python class named `{cls}`, {summary}.",
    "Create `{cls}`, a Python class for {summary}.",
    "I need a Python class `{cls}` that models {summary}.",
)
_OUTROS = (
    "Reply with the complete class in a single ```python code block. Use only the standard library.",
    "Give the whole class in one ```python code block; no imports are needed.",
    "Answer with the full class definition inside one ```python block.",
)
_COT_INTROS = (
    "I need `{cls}` with a constructor and {n} methods: {names}.",
    "The task: class `{cls}`, a constructor plus {n} methods ({names}).",
    "So `{cls}` gets `__init__` and {n} methods: {names}.",
)
_COT_METHOD_LEADS = (
    "Method {k} of {n}: `{sig}`.",
    "Next, method {k} of {n}, `{sig}`.",
    "Now method {k} of {n}: `{sig}`.",
)
_COT_RESTATE = ("It should {doc}", "The spec says: {doc}", "What it must do: {doc}")


def _lower_first(text: str) -> str:
    return text[:1].lower() + text[1:]


_PLAN_NOTES: dict[str, tuple[str, ...]] = {
    # note kind -> its phrasings: the first is version 1's (the only one it uses); the
    # others, short enough not to be a template sentence of their own, are version 2's
    "raises": (
        "The invalid case comes first and raises {raised}.",
        "Guard first: bad input raises {raised}.",
        "{raised} goes at the top.",
        "The error case ({raised}) comes first.",
    ),
    "none": ("The empty case returns None.", "Nothing to work on gives None.", "No data, no result: None."),
    "key": (
        "A key function settles ties the way the spec wants.",
        "Ties go through a key function.",
        "A `key=lambda` breaks ties.",
        "Tie-break: a key function.",
    ),
    "sorted": (
        "Sort the result so the order is fixed.",
        "The output gets sorted.",
        "A sort is needed.",
        "`sorted` helps.",
    ),
    "round": ("Round as specified.", "Keep the rounding asked for.", "`round` comes last.", "Rounding matters here."),
    "loop": (
        "A loop over the stored data does it.",
        "A loop does the work.",
        "One `for` loop is enough.",
        "It needs a loop.",
    ),
    "one-liner": ("That is a one-liner.", "A single line will do.", "Short: one line.", "One line suffices."),
}


def _plan_note_kinds(body: str) -> list[tuple[str, dict[str, str]]]:
    """The kinds of implementation note the reference body calls for, with their fields."""
    kinds: list[tuple[str, dict[str, str]]] = []
    raised = sorted(set(re.findall(r"raise (\w+)", body)))
    if raised:
        kinds.append(("raises", {"raised": " / ".join(raised)}))
    if "return None" in body or "else None" in body:
        kinds.append(("none", {}))
    if "key=lambda" in body:
        kinds.append(("key", {}))
    if "sorted(" in body:
        kinds.append(("sorted", {}))
    if "round(" in body:
        kinds.append(("round", {}))
    if re.search(r"^\s*for ", body, flags=re.MULTILINE):
        kinds.append(("loop", {}))
    if not kinds and body.count("\n") == 0:
        kinds.append(("one-liner", {}))
    return kinds


def _plan_notes(body: str) -> list[str]:
    """Short implementation notes read off the reference body (the "how" of the step)."""
    return [_PLAN_NOTES[kind][0].format(**fields) for kind, fields in _plan_note_kinds(body)]


def _example_text(test: UnitTest) -> tuple[str, str]:
    """The prompt's doctest-style example and the CoT's one-line reading of its outcome."""
    lines = [f">>> {statement}" for statement in test.setup] + [f">>> {test.expr}"]
    if test.raises:
        lines.append(f"{test.raises} is raised")
        return "\n".join(lines), f"`{test.expr}` must raise {test.raises}"
    lines.append(str(test.expected))
    return "\n".join(lines), f"`{test.expr}` must give {test.expected}"


class ClassSynthesis(TaskFamily):
    """Generator + checker for the class-synthesis family.

    Knobs: `min_methods`/`max_methods` (methods besides `__init__`; every concept has 10);
    methods are added beyond the drawn count while the answer is under
    `min_answer_tokens` and the concept has more.
    """

    name = "class_synthesis"
    version = 1

    def __init__(
        self, min_methods: int = 3, max_methods: int = 8, min_answer_tokens: int = 200, job_timeout_s: float = 3.0
    ) -> None:
        require_range("methods", min_methods, max_methods)
        if max_methods > min(len(concept.methods) for concept in CONCEPTS):
            raise ValueError(f"max_methods {max_methods} exceeds the smallest concept's method pool")
        self.min_methods = min_methods
        self.max_methods = max_methods
        self.min_answer_tokens = min_answer_tokens
        self.job_timeout_s = job_timeout_s

    def knobs(self) -> dict[str, Any]:
        return {
            "min_methods": self.min_methods,
            "max_methods": self.max_methods,
            "min_answer_tokens": self.min_answer_tokens,
        }

    # ------------------------------------------------------------------ generation
    def build(self, rng: random.Random) -> tuple[str, str, str, dict[str, Any]]:
        concept: ClassConcept = rng.choice(CONCEPTS)
        class_name = rng.choice(concept.class_names)
        subs = {"cls": class_name, "o": concept.var}
        subs.update({key: rng.choice(options) for key, options in concept.attrs.items()})
        pool = list(concept.methods)
        rng.shuffle(pool)
        count = rng.randint(self.min_methods, self.max_methods)
        init = _render_method(concept.init, subs)
        while True:
            chosen = pool[:count]
            methods = [_render_method(spec, subs) for spec in chosen]
            code = _class_code(class_name, concept.summary, [init, *methods])
            if estimate_tokens(f"```python\n{code}```") >= self.min_answer_tokens or count == len(pool):
                break
            count += 1

        draw = Draw(rng)
        tests_per_method = [self._draw_tests(concept, spec, draw, subs) for spec in [concept.init, *chosen]]
        flat = [test for group in tests_per_method for test in group]
        resolved = _reference_outcomes(code, class_name, flat)
        grouped, start = [], 0
        for group in tests_per_method:
            grouped.append(resolved[start : start + len(group)])
            start += len(group)

        prompt = self._prompt(rng, concept, class_name, init, methods, grouped)
        cot = self._cot(rng, concept, class_name, init, methods, grouped)
        answer = f"```python\n{code}```"
        meta = {
            "concept": concept.key,
            "class_name": class_name,
            "methods": [spec.name for spec in chosen],
            "tests": [test.to_dict() for test in resolved],
        }
        return prompt, cot, answer, meta

    @staticmethod
    def _draw_tests(concept: ClassConcept, spec: MethodSpec, draw: Draw, subs: Mapping[str, str]) -> list[UnitTest]:
        tests = []
        for probe_fn in spec.probes:
            fill_statements, fill_data = concept.fill(draw)
            probe = probe_fn(draw, fill_data)
            ctor = probe.ctor if probe.ctor is not None else concept.ctor_args(draw)
            setup = [f"$o = $cls({ctor})"] + (fill_statements if probe.fill else []) + list(probe.setup)
            tests.append(
                UnitTest(tuple(_fill(line, subs) for line in setup), _fill(probe.expr, subs), None, probe.raises)
            )
        return tests

    @staticmethod
    def _prompt(
        rng: random.Random,
        concept: ClassConcept,
        class_name: str,
        init: _RenderedMethod,
        methods: Sequence[_RenderedMethod],
        tests: Sequence[Sequence[UnitTest]],
    ) -> str:
        parts = [rng.choice(_INTROS).format(cls=class_name, summary=concept.summary)]
        ctor_params = init.spec.params
        parts.append(f"Constructor `{class_name}({ctor_params})`: {init.doc}")
        parts.append(f"Methods ({len(methods)}, implement them all):")
        for k, (method, method_tests) in enumerate(zip(methods, tests[1:]), start=1):
            example, _ = _example_text(method_tests[0])
            example = textwrap.indent(example, "       ")
            parts.append(f"{k}. `{method.call_signature}`: {method.doc}\n   Example:\n{example}")
        parts.append(rng.choice(_OUTROS))
        return "\n\n".join(parts)

    @staticmethod
    def _cot(
        rng: random.Random,
        concept: ClassConcept,
        class_name: str,
        init: _RenderedMethod,
        methods: Sequence[_RenderedMethod],
        tests: Sequence[Sequence[UnitTest]],
    ) -> str:
        n = len(methods)
        names = ", ".join(method.spec.name for method in methods)
        blocks = [rng.choice(_COT_INTROS).format(cls=class_name, n=n, names=names)]
        blocks.append(
            "Every method only reads and writes the state the constructor sets up, so I can "
            "settle the state first and then write the methods one at a time, in the order given."
        )
        header = _class_code(class_name, concept.summary, []).rstrip("\n")
        blocks.append(f"Skeleton:\n{header}")
        blocks.append(f"Constructor `{init.signature}`: {init.doc}\n{init.code}")
        for k, (method, method_tests) in enumerate(zip(methods, tests[1:]), start=1):
            lead = rng.choice(_COT_METHOD_LEADS).format(k=k, n=n, sig=method.signature)
            restate = rng.choice(_COT_RESTATE).format(doc=_lower_first(method.doc))
            notes = " ".join(_plan_notes(method.body))
            _, reading = _example_text(method_tests[0])
            check = f"Check against the example: {reading}; the code above does that."
            blocks.append(f"{lead} {restate} {notes}".rstrip() + f"\n{method.code}\n{check}")
        blocks.append(
            f"All {n} methods are written and agree with their examples. Putting the "
            f"constructor and the methods together under `class {class_name}:` gives the answer."
        )
        return "\n\n".join(blocks)

    # -------------------------------------------------------------------- checking
    def check(self, item: TaskItem, answer_text: str) -> CheckResult:
        return self.check_many([item], [answer_text])[0]

    def check_many(self, items: Sequence[TaskItem], answers: Sequence[str]) -> list[CheckResult]:
        """All answers in one subprocess (see `pyexec`): one Python start-up per batch."""
        if len(items) != len(answers):
            raise ValueError(f"{len(items)} items but {len(answers)} answers")
        codes = [extract_python_block(answer) for answer in answers]
        names = [str(item.meta["class_name"]) for item in items]
        tests = [[UnitTest.from_dict(test) for test in item.meta["tests"]] for item in items]
        outcomes = run_class_tests(codes, names, tests, job_timeout_s=self.job_timeout_s)
        results = []
        for outcome in outcomes:
            total = len(outcome.passed)
            passed = sum(outcome.passed)
            detail = f"{passed}/{total} tests passed"
            if outcome.errors:
                detail += "; " + " | ".join(outcome.errors[:3])
            results.append(CheckResult(passed == total and total > 0, outcome.fraction, detail))
        return results


# ------------------------------------------------------------------------ version 2
# Version 2 (thinker-data-v4) keeps version 1's items (prompt, answer, tests: the same
# stream) and rewords the CoT: every step picks one of several phrasings, the method's
# spec is said in other words (the concept table's `summary`) instead of being restated
# from the prompt, the implementation notes come in a shuffled order, and the example
# check sits before or after the code. The code itself is still written method by
# method in the answer's order, so a draft forked after k methods holds k of them.

_V2_INTROS = (
    "I need `{cls}` with a constructor and {n} methods: {names}.",
    "So the class is `{cls}`: `__init__` plus {n} methods, namely {names}.",
    "{n} methods to write for `{cls}` after its constructor: {names}.",
    "The job: a class `{cls}` which, besides `__init__`, has {names}.",
    "Plan for `{cls}`: the constructor first, then {names}.",
)
_V2_STATE = (
    # Every fixed run of words stays short and sits next to the item's own names, so no
    # sentence is a template that other items repeat word for word.
    "`{cls}` keeps its state in {attrs}; no method calls another.",
    "State first: {attrs}. Then {names}, in that order.",
    "Only {attrs} {are} shared, so each method of `{cls}` stands alone.",
    "The methods read and write {attrs} and nothing else, so {names} can follow one by one.",
)
_V2_SKELETON = ("Skeleton:", "The class line and its docstring:", "Header first:", "It starts like this:")
_V2_CONSTRUCTOR = (
    "Constructor `{sig}`: it has to {summary}.",
    "First `{sig}`, which should {summary}.",
    "The state comes from `{sig}`: {summary}.",
    "`{sig}` sets things up; in short, {summary}.",
)
_V2_LEADS = (
    "Method {k} of {n}: `{sig}`.",
    "Next up, `{sig}`.",
    "Now `{sig}`, the {ordinal} of {n}.",
    "On to `{name}`, number {k}.",
    "{Ordinal} method: `{sig}`.",
    "Then `{sig}`.",
)
_V2_SUMMARIES = (
    "It has to {summary}.",
    "The idea: {summary}.",
    "In short, {summary}.",
    "So: {summary}.",
    "Put simply, it should {summary}.",
    "My reading of the spec: {summary}.",
)
_V2_EXAMPLE_BEFORE = (
    "The example to match: `{expr}` should {outcome}.",
    "It must make `{expr}` {outcome}.",
    "Target behaviour: `{expr}` has to {outcome}.",
)
_V2_EXAMPLE_AFTER = (
    "Check against the example: `{expr}` {outcomes}, as required.",
    "The example agrees: `{expr}` {outcomes}.",
    "Running the example in my head, `{expr}` {outcomes}. Good.",
    "With this code `{expr}` {outcomes}, matching the spec.",
)
_V2_OUTCOME = {"value": "give {value}", "raises": "raise {raises}"}
_V2_OUTCOMES = {"value": "gives {value}", "raises": "raises {raises}"}
_V2_CLOSINGS = (
    "`{cls}` now has `__init__` and {names}; each agrees with its example.",
    "That is all {n}: {names}. Together under `class {cls}:` they are the answer.",
    "Done with {names}, so `{cls}` can be put together.",
    "Every method of `{cls}` matches its example. Time to assemble it.",
)


class ClassSynthesisV2(ClassSynthesis):
    """Class synthesis, version 2 (see the comment above): version 1's items, reworded CoT."""

    version = 2
    stream_version = 1

    @staticmethod
    def _cot(
        rng: random.Random,
        concept: ClassConcept,
        class_name: str,
        init: _RenderedMethod,
        methods: Sequence[_RenderedMethod],
        tests: Sequence[Sequence[UnitTest]],
    ) -> str:
        n = len(methods)
        names = spoken_list(rng, [f"`{method.spec.name}`" for method in methods])
        state = [f"`self.{name}`" for name in dict.fromkeys(re.findall(r"self\.(\w+)", init.body))]
        attrs = spoken_list(rng, state) or "nothing"
        blocks = [
            pick(rng, _V2_INTROS, cls=class_name, n=n, names=names),
            pick(rng, _V2_STATE, cls=class_name, attrs=attrs, names=names, are="is" if len(state) == 1 else "are"),
        ]
        header = _class_code(class_name, concept.summary, []).rstrip("\n")
        blocks.append(f"{rng.choice(_V2_SKELETON)}\n{header}")
        blocks.append(f"{pick(rng, _V2_CONSTRUCTOR, sig=init.signature, summary=init.summary)}\n{init.code}")
        for k, (method, method_tests) in enumerate(zip(methods, tests[1:]), start=1):
            fields = {"k": k, "n": n, "sig": method.signature, "name": method.spec.name, "ordinal": ordinal(k)}
            lead = pick(rng, _V2_LEADS, Ordinal=capitalised(ordinal(k)), **fields)
            kinds = _plan_note_kinds(method.body)
            notes = [rng.choice(_PLAN_NOTES[kind][1:]).format(**extra) for kind, extra in kinds]
            example = method_tests[0]
            kind = "raises" if example.raises else "value"
            outcome = {"value": example.expected, "raises": example.raises}
            before = rng.random() < 0.4
            check = pick(
                rng,
                _V2_EXAMPLE_BEFORE if before else _V2_EXAMPLE_AFTER,
                expr=example.expr,
                outcome=_V2_OUTCOME[kind].format(**outcome),
                outcomes=_V2_OUTCOMES[kind].format(**outcome),
            )
            sentences = [pick(rng, _V2_SUMMARIES, summary=method.summary)]
            sentences += shuffled(rng, notes + [check] if before else notes)
            text = " ".join([lead, *sentences]) + f"\n{method.code}"
            blocks.append(text if before else f"{text}\n{check}")
        blocks.append(pick(rng, _V2_CLOSINGS, n=n, cls=class_name, names=names))
        return "\n\n".join(blocks)
