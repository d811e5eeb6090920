"""The product's shape: small modules, imports that point down the layers, a light `import selfspec`."""

from __future__ import annotations

import ast
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PACKAGE_ROOTS = [REPO / "selfspec", *sorted((REPO / "packages").glob("*/selfspec_*"))]
MAX_MODULE_LINES = 600

# What `import selfspec` must not pull in: optional extras and the separately installed parts.
NOT_ON_IMPORT = ("peft", "matplotlib", "fastapi", "uvicorn", "xgrammar", "scipy", "selfspec_bench", "selfspec_research")


def _runtime_imports(tree: ast.AST):
    """Import statements that run at import time or call time (not under `if TYPE_CHECKING:`)."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            continue
        if isinstance(node, ast.ImportFrom) and node.module and not node.level:
            yield node.module
        elif isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        yield from _runtime_imports(node)


def test_no_module_is_over_600_lines():
    too_long = {}
    for root in PACKAGE_ROOTS:
        for path in root.rglob("*.py"):
            lines = len(path.read_text().splitlines())
            if lines > MAX_MODULE_LINES:
                too_long[str(path.relative_to(REPO))] = lines
    assert not too_long, too_long


def test_no_import_cycle_between_subpackages():
    """Imports point down the layers: two subpackages never import each other."""
    for root in PACKAGE_ROOTS:
        name = root.name
        edges: dict[str, set[str]] = defaultdict(set)
        for path in root.rglob("*.py"):
            parts = path.relative_to(root).with_suffix("").parts
            own = parts[0] if len(parts) > 1 else parts[0]
            for module in _runtime_imports(ast.parse(path.read_text())):
                target = module.split(".")
                if target[0] == name and len(target) > 1 and target[1] != own:
                    edges[own].add(target[1])
        cycles = sorted((a, b) for a in edges for b in edges[a] if a < b and a in edges.get(b, set()))
        assert not cycles, f"{name}: subpackages that import each other: {cycles}"


def test_the_inference_package_never_imports_the_other_parts():
    for path in (REPO / "selfspec").rglob("*.py"):
        for module in _runtime_imports(ast.parse(path.read_text())):
            assert module.split(".")[0] not in ("selfspec_bench", "selfspec_research"), (path, module)


def test_public_import_is_light():
    """One import line gives the public API, without the server, LoRA, plotting or research code."""
    code = (
        "import sys\n"
        "from selfspec import LLM, SamplingParams, EngineConfig, ThinkingLimits, SSRConfig, SuffixDecodingConfig, "
        "PromptLookupConfig, DraftModelConfig, CoSpecConfig, SpecConfig, parse_spec\n"
        f"loaded = sorted({{m.split('.')[0] for m in sys.modules}} & set({NOT_ON_IMPORT!r}))\n"
        "print(','.join(loaded))\n"
    )
    # -I: isolated, so the installed package is imported, not the working directory's files by accident.
    out = subprocess.run([sys.executable, "-I", "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == "", f"import selfspec loaded {out.stdout.strip()}"


def test_spec_dicts_parse_to_their_method():
    from selfspec import DraftModelConfig, PromptLookupConfig, SSRConfig, SuffixDecodingConfig, parse_spec
    from selfspec.config import parse_baseline_spec

    assert isinstance(parse_spec({"method": "ssr", "draft_budgets": [200, 100]}), SSRConfig)
    assert parse_spec({"method": "ssr", "draft_budgets": [200, 100]}).draft_budgets == [100, 200]
    assert isinstance(parse_spec({"method": "ngram"}), PromptLookupConfig)
    assert isinstance(parse_spec({"method": "draft", "num_speculative_tokens": 4}), DraftModelConfig)
    assert isinstance(parse_baseline_spec({}), SuffixDecodingConfig)
    import pydantic
    import pytest

    with pytest.raises(pydantic.ValidationError, match="max_ngram"):
        parse_spec({"method": "ngram", "max_ngram": 0})
    with pytest.raises(pydantic.ValidationError):
        parse_spec({"method": "no-such-method"})
    with pytest.raises(pydantic.ValidationError):
        parse_spec({"method": "ssr", "draft_budget": [1]})  # a misspelled field is an error, not ignored
