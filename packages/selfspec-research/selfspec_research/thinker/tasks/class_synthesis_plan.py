"""Class synthesis, version 3 (thinker-data-long-v1): version 1's items with a terse plan for a CoT.

Why: SSR's gain over copy-based peers (prompt lookup, suffix decoding) is bounded by the
answer phase's share of the latency, and in versions 1 and 2 the CoT writes every method's
full code before the answer writes it again, so the CoT is always the longer phase. Here
the CoT settles the state as version 2 does (the class line, the constructor's code) and
then spends a line or two per method: its `def` line exactly as the answer writes it and a
short plan in varied wording (the spec in other words, the implementation notes, now and
then the example to match). Nothing is listed twice: the intro and the state sentence do
not name the methods, whose `def` lines follow. The bodies are written only in the answer, so with many methods
the answer is longer than the CoT, as in the paper's ClassEval rows.

The prompts, answers and tests are version 1's (the same random stream: `stream_version`),
so the family's checker grades these items unchanged. The answer's `def` lines, the class
line and the constructor appear in the CoT in the answer's order, so a draft forked after k
planned methods has their signatures and plans in view.
"""

from __future__ import annotations

import random
import re
from collections.abc import Sequence

from .class_spec import ClassConcept
from .class_synthesis import (
    _PLAN_NOTES,
    _V2_CONSTRUCTOR,
    _V2_OUTCOME,
    _V2_SKELETON,
    ClassSynthesisV2,
    _class_code,
    _plan_note_kinds,
    _RenderedMethod,
)
from .pyexec import UnitTest
from .wording import capitalised, pick, shuffled, spoken_list

CHECK_SHARE = 0.25
"""Share of methods whose plan also names the example to match (when it is short)."""

MAX_CHECK_CHARS = 60
"""Longest example (call plus outcome) a plan line quotes: a plan stays a line."""

_PLAN_INTROS = (
    "The methods, one line each:",
    "Now a short plan per method.",
    "Plan for the {n} methods:",
    "Each method in a line or two:",
    "The rest, method by method:",
)
_PLAN_INTROS_CLASS = (
    # version 2's intros without the list of method names (their `def` lines follow)
    "I need `{cls}` with a constructor and {n} methods.",
    "The job: class `{cls}`, `__init__` plus {n} methods.",
    "{n} methods to write for `{cls}` after its constructor.",
    "So `{cls}` gets `__init__` and {n} methods.",
)
_PLAN_STATE = (
    # version 2's state sentences without the list of method names
    "`{cls}` keeps its state in {attrs}; no method calls another.",
    "State: {attrs}.",
    "Only {attrs} {are} shared, so each method stands alone.",
    "The methods touch {attrs} and nothing else.",
)
_PLAN_SUMMARIES = (
    "{Summary}.",
    "So: {summary}.",
    "Plan: {summary}.",
    "Idea: {summary}.",
    "It should {summary}.",
    "To do: {summary}.",
)
_PLAN_CHECKS = (
    "Example: `{expr}` should {outcome}.",
    "`{expr}` must {outcome}.",
    "Target: `{expr}` has to {outcome}.",
)
_PLAN_CLOSINGS = (
    "That is the plan for all {n}; writing `{cls}` out in full.",
    "Plan done: `__init__` and {n} methods, in the spec's order.",
    "Nothing left to decide, so `{cls}` can be written out.",
    "All {n} methods planned. Now the whole class.",
)


def _check(rng: random.Random, test: UnitTest) -> str | None:
    """The example of a method as a short sentence, or None when it is too long to quote."""
    outcome = _V2_OUTCOME["raises" if test.raises else "value"].format(value=test.expected, raises=test.raises)
    if len(test.expr) + len(outcome) > MAX_CHECK_CHARS:
        return None
    return pick(rng, _PLAN_CHECKS, expr=test.expr, outcome=outcome)


def _def_line(method: _RenderedMethod) -> str:
    """The method's `def` line as the answer writes it (indented inside the class)."""
    return method.code.splitlines()[0]


class ClassSynthesisV3(ClassSynthesisV2):
    """Class synthesis, version 3 (see the module doc): version 1's items, a terse-plan CoT."""

    version = 3
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
        state = [f"`self.{name}`" for name in dict.fromkeys(re.findall(r"self\.(\w+)", init.body))]
        attrs = spoken_list(rng, state) or "nothing"
        blocks = [
            pick(rng, _PLAN_INTROS_CLASS, cls=class_name, n=n),
            pick(rng, _PLAN_STATE, cls=class_name, attrs=attrs, are="is" if len(state) == 1 else "are"),
        ]
        header = _class_code(class_name, concept.summary, []).rstrip("\n")
        blocks.append(f"{rng.choice(_V2_SKELETON)}\n{header}")
        blocks.append(f"{pick(rng, _V2_CONSTRUCTOR, sig=init.signature, summary=init.summary)}\n{init.code}")
        plans = [pick(rng, _PLAN_INTROS, n=n)]
        for method, method_tests in zip(methods, tests[1:]):
            notes = [rng.choice(_PLAN_NOTES[kind][1:]).format(**extra) for kind, extra in _plan_note_kinds(method.body)]
            if rng.random() < CHECK_SHARE:
                check = _check(rng, method_tests[0])
                notes += [check] if check else []
            summary = pick(rng, _PLAN_SUMMARIES, summary=method.summary, Summary=capitalised(method.summary))
            plans.append(f"{_def_line(method)}\n" + " ".join([summary, *shuffled(rng, notes)]))
        blocks.append("\n".join(plans))
        blocks.append(pick(rng, _PLAN_CLOSINGS, n=n, cls=class_name))
        return "\n\n".join(blocks)
