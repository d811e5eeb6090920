"""Finding the content of the last ``\\boxed{...}`` in LaTeX text.

Shared by the MATH-500 loader (gold answers live in the reference solution's last
box) and the math scorers (model answers). Braces are matched by depth because
answers nest them (``\\boxed{\\frac{1}{2}}``), so a regex cannot do it.
"""

from __future__ import annotations

_BOX_COMMANDS = ("\\boxed", "\\fbox")


def last_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` / ``\\fbox{...}`` (or ``\\boxed x``), else None."""
    start = max(text.rfind(command) for command in _BOX_COMMANDS)
    if start < 0:
        return None
    command = next(c for c in _BOX_COMMANDS if text.startswith(c, start))
    rest = text[start + len(command) :]
    if rest.startswith(" ") and not rest.lstrip().startswith("{"):
        # "\boxed 5" form: the argument runs to the next "$" or whitespace.
        token = rest.strip().split("$")[0].split()
        return token[0] if token else None
    brace = rest.find("{")
    if brace < 0 or rest[:brace].strip():
        return None
    depth = 0
    for index in range(brace, len(rest)):
        char = rest[index]
        if char == "{":
            depth += 1
        elif char == "}":
            depth -= 1
            if depth == 0:
                return rest[brace + 1 : index]
    return None  # unbalanced: the answer was cut off
