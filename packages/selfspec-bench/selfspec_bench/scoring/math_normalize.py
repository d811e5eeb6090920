"""Normalizing and comparing final math answers (GSM8K numbers, MATH-500 LaTeX).

Numbers: commas, ``$``, ``%`` and units are stripped and values compared exactly as
fractions (``0.5 == 1/2 == \\frac{1}{2}``).

LaTeX: a string normalization in the style of the MATH benchmark's ``strip_string``
(Hendrycks et al.): drop ``\\left``/``\\right``, ``\\!``, spaces, ``$``, degree signs,
``\\text{...}`` wrappers and trailing units, map ``\\dfrac``/``\\tfrac`` to ``\\frac``,
brace bare ``\\frac12`` / ``\\sqrt2`` arguments, drop a leading ``x =``; then compare
the strings, or their values when both are plain numbers.

Limits (by design, no symbolic algebra): equivalent but differently written
expressions (``\\frac{\\sqrt{3}}{3}`` vs ``\\frac{1}{\\sqrt{3}}``, ``2x+2`` vs ``2(x+1)``),
reordered lists/sets and intervals written in other notation are judged unequal.
"""

from __future__ import annotations

import re
from fractions import Fraction

_NUMBER = re.compile(r"^[-+]?(?:\d+(?:\.\d*)?|\.\d+)$")
_PLAIN_FRACTION = re.compile(r"^([-+]?\d+)/(\d+)$")
_LATEX_FRACTION = re.compile(r"^([-+]?)\\frac\{([-+]?\d+(?:\.\d+)?)\}\{(\d+(?:\.\d+)?)\}$")


def parse_number(text: str) -> Fraction | None:
    """Exact value of a plain number, ``a/b`` or ``\\frac{a}{b}`` (after normalization), else None."""
    text = text.strip()
    if _NUMBER.match(text):
        return Fraction(text)
    match = _PLAIN_FRACTION.match(text)
    if match and int(match.group(2)) != 0:
        return Fraction(int(match.group(1)), int(match.group(2)))
    match = _LATEX_FRACTION.match(text)
    if match and Fraction(match.group(3)) != 0:
        value = Fraction(match.group(2)) / Fraction(match.group(3))
        return -value if match.group(1) == "-" else value
    return None


def clean_number_text(text: str) -> str:
    """Strip what GSM8K-style answers wrap numbers in: ``$``, commas, ``%``, trailing dot, units."""
    text = text.strip().replace("\\$", "").replace("$", "").replace("\\%", "").replace("%", "")
    text = text.replace(",", "").replace("\\!", "").strip().rstrip(".")
    match = re.match(r"^[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:/\d+)?", text)
    return match.group(0) if match else text


def _unwrap_command(text: str, command: str) -> str:
    """``\\text{abc}`` -> ``abc`` (balanced braces), for every occurrence."""
    needle = command + "{"
    while True:
        start = text.find(needle)
        if start < 0:
            return text
        depth, end = 0, None
        for index in range(start + len(command), len(text)):
            if text[index] == "{":
                depth += 1
            elif text[index] == "}":
                depth -= 1
                if depth == 0:
                    end = index
                    break
        if end is None:
            return text
        text = text[:start] + text[start + len(needle) : end] + text[end + 1 :]


def _brace_short_arguments(text: str) -> str:
    """``\\frac12`` -> ``\\frac{1}{2}``, ``\\frac1{2}`` -> ``\\frac{1}{2}``, ``\\sqrt3`` -> ``\\sqrt{3}``."""
    text = re.sub(r"\\sqrt(\w)", r"\\sqrt{\1}", text)
    text = re.sub(r"\\frac(\w)(\w)", r"\\frac{\1}{\2}", text)
    text = re.sub(r"\\frac(\w)\{", r"\\frac{\1}{", text)
    text = re.sub(r"\\frac\{([^{}]*)\}(\w)", r"\\frac{\1}{\2}", text)
    return text


def normalize_latex(answer: str) -> str:
    """Canonical string form of a LaTeX answer (see the module docstring for the rules)."""
    text = answer.strip()
    text = text.replace("\n", "").replace("\\!", "").replace("\\,", "").replace("\\;", "").replace("\\ ", "")
    text = text.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")
    text = text.replace("\\left", "").replace("\\right", "")
    text = text.replace("^{\\circ}", "").replace("^\\circ", "").replace("°", "")
    text = text.replace("\\$", "").replace("$", "").replace("\\%", "").replace("%", "")
    # A trailing unit in text, e.g. "\frac{270}7\text{ degrees}" -> "\frac{270}7".
    text = re.sub(r"\\(?:text|mbox)\{\s+[^{}]*\}(?:\^\{?\d\}?)?\s*$", "", text)
    for command in ("\\text", "\\textbf", "\\mathrm", "\\mbox", "\\boxed"):
        text = _unwrap_command(text, command)
    text = text.replace(" ", "")
    if text.count("=") == 1:
        lhs, rhs = text.split("=")
        if re.fullmatch(r"[a-zA-Z]\w?", lhs):  # "x=5" -> "5"; longer left sides are kept
            text = rhs
    text = _brace_short_arguments(text)
    text = text.replace("\\\\", "\\")
    text = text.rstrip(".")
    text = re.sub(r"(?<![\d.])\.(\d)", r"0.\1", text)
    if re.fullmatch(r"[-+]?\d{1,3}(?:,\d{3})+(?:\.\d+)?", text):
        text = text.replace(",", "")
    return text


def latex_equivalent(candidate: str, gold: str) -> bool:
    """Same normalized string, or same value when both normalize to plain numbers."""
    a, b = normalize_latex(candidate), normalize_latex(gold)
    if a == b:
        return True
    value_a, value_b = parse_number(a), parse_number(b)
    return value_a is not None and value_a == value_b


def as_number(text: str) -> Fraction | None:
    """Value of a GSM8K-style answer ("$1,000", "18 dollars", "0.5"), else None."""
    return parse_number(clean_number_text(text))


def numbers_equal(candidate: str, gold: str) -> bool:
    value_a, value_b = as_number(candidate), as_number(gold)
    return value_a is not None and value_a == value_b
