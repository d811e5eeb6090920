"""LongProc Path Traversal: does the route equal the gold route, hop by hop?

The route is the last ``<Route>`` block (else the whole reply), read as lines
``From <A>, take a <transit> to <B>.``. Exact = the hops equal the gold hops; the
score otherwise is the fraction of gold hops matched before the first wrong one (as
LongProc's partial accuracy). The detail also says whether the route is *valid* in
the item's graph (each hop an existing one-way connection, starting at the source
and ending at the destination), which tells a wrong turn from a made-up edge.
"""

from __future__ import annotations

import re
from typing import Any

from ...datasets.sample import BenchSample
from ..extract import last_tagged, strip_reasoning
from ..result import ScoreResult

Hop = tuple[str, str, str]

_HOP = re.compile(r"From\s+(.+?),\s*take\s+an?\s+(\w+)\s+to\s+(.+?)\s*\.?\s*$", re.IGNORECASE)
_EDGE_SENTENCE = re.compile(r"You can travel from (.+?) to (.+?) by (\w+)\.")


def parse_hops(text: str) -> list[Hop]:
    hops = []
    for line in text.splitlines():
        match = _HOP.search(line.strip().strip("*`").strip())
        if match:
            hops.append((match.group(1).strip(), match.group(2).lower(), match.group(3).strip()))
    return hops


def graph_edges(reference: dict[str, Any]) -> dict[str, tuple[str, str]] | None:
    """src -> (dst, transit), from the structured edges or, failing that, the city descriptions."""
    edges = reference.get("edges")
    if edges:
        return {edge["src"]: (edge["dst"], edge["transit"].lower()) for edge in edges}
    context = reference.get("city_context")
    if context:
        found = {m.group(1): (m.group(2), m.group(3).lower()) for m in _EDGE_SENTENCE.finditer(context)}
        return found or None
    return None


def route_is_valid(hops: list[Hop], src: str, dst: str, edges: dict[str, tuple[str, str]]) -> bool:
    if not hops or hops[0][0] != src or hops[-1][2] != dst:
        return False
    for index, (here, transit, there) in enumerate(hops):
        if edges.get(here) != (there, transit):
            return False
        if index + 1 < len(hops) and hops[index + 1][0] != there:
            return False
    return True


def score_path_traversal(sample: BenchSample, completion_text: str, *, timeout_s: float = 10.0) -> ScoreResult:
    ref = sample.reference
    answer = strip_reasoning(completion_text)
    block = last_tagged(answer, "Route")
    hops = parse_hops(block if block is not None else answer)
    gold = parse_hops(ref["reference_output"])
    prefix = 0
    for predicted, expected in zip(hops, gold):
        if predicted != expected:
            break
        prefix += 1
    exact = hops == gold and bool(gold)
    edges = graph_edges(ref)
    validity = (
        "graph unavailable"
        if edges is None
        else ("valid route" if route_is_valid(hops, ref["src_city"], ref["dst_city"], edges) else "invalid route")
    )
    source = "<Route> block" if block is not None else "untagged reply"
    detail = f"{'exact' if exact else 'not exact'}: {prefix}/{len(gold)} gold hops matched, {len(hops)} given; {validity} ({source})"
    return ScoreResult(passed=exact, score=1.0 if exact else (prefix / len(gold) if gold else 0.0), detail=detail)
