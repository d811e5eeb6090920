"""Where our mode gains and loses against the best peer: the chain of thought and the answer apart.

Why: SSR pays in the thinking (a draft row beside the parent, the policy's bookkeeping) and gains
in the answer (the draft's prefix and suffix); a latency ratio nets the two. On short answers the
thinking is ~95% of the time, so a few percent lost there outweigh a much faster answer, and which
of the two to work on is not visible in the total. This splits each paired latency difference into
the two phases (`thinking_s`, `answer_s` of each record), as shares of the peer's total latency:
our latency / peer's = 1 + thinking share + answer share (+ what neither phase holds: queueing,
the prompt).
"""

from __future__ import annotations

from typing import Any

from selfspec_bench.peers import peer_comparison
from selfspec_bench.records import Group
from selfspec_bench.tables import markdown


def _phases(record: dict) -> tuple[float, float, float] | None:
    thinking, answer, latency = record.get("thinking_s"), record.get("answer_s"), record.get("latency_s")
    if thinking is None or answer is None or latency is None or latency <= 0:
        return None
    return float(thinking), float(answer), float(latency)


def phase_split(group: Group) -> dict[str, dict[str, Any]]:
    """Per mode of ours that has a best peer in the run: over the samples both have phase times,
    the summed thinking and answer seconds of each, and each phase's difference as a share of the
    peer's summed latency. Empty where the run has no such pair."""
    comparison = peer_comparison(group)
    if comparison is None:
        return {}
    peer = comparison["best_peer"]
    by_mode = group.by_mode()
    peer_records = {r["sample_id"]: p for r in by_mode.get(peer, []) if (p := _phases(r)) is not None}
    out: dict[str, dict[str, Any]] = {}
    for mode in comparison["ours"]:
        pairs = [
            (peer_records[r["sample_id"]], p)
            for r in by_mode.get(mode, [])
            if r["sample_id"] in peer_records and (p := _phases(r)) is not None
        ]
        if not pairs:
            continue
        sums = [[sum(x[side][i] for x in pairs) for i in range(3)] for side in (0, 1)]
        (p_think, p_answer, p_total), (o_think, o_answer, o_total) = sums
        out[mode] = {
            "best_peer": peer,
            "n": len(pairs),
            "peer_thinking_s": p_think,
            "peer_answer_s": p_answer,
            "thinking_s": o_think,
            "answer_s": o_answer,
            "thinking_ratio": o_think / p_think if p_think > 0 else None,
            "answer_ratio": o_answer / p_answer if p_answer > 0 else None,
            "thinking_share": (o_think - p_think) / p_total,
            "answer_share": (o_answer - p_answer) / p_total,
            "latency_ratio": o_total / p_total,
        }
    return out


def phase_lines(split: dict[str, dict[str, Any]]) -> list[str]:
    """`phase_split` as a table, or nothing."""
    if not split:
        return []

    def ratio(value: float | None) -> str:
        return "–" if value is None else f"{value:.3f}"

    rows = [
        [
            mode,
            s["best_peer"],
            s["n"],
            f"{s['peer_thinking_s']:.2f} → {s['thinking_s']:.2f}",
            ratio(s["thinking_ratio"]),
            f"{100 * s['thinking_share']:+.1f}%",
            f"{s['peer_answer_s']:.2f} → {s['answer_s']:.2f}",
            ratio(s["answer_ratio"]),
            f"{100 * s['answer_share']:+.1f}%",
            f"{s['latency_ratio']:.3f}",
        ]
        for mode, s in split.items()
    ]
    return [
        "### Against the best peer, by phase",
        "",
        "Summed over the samples both ran: the chain of thought's and the answer's seconds, the peer's then ours, "
        "our time over the peer's per phase, and what each phase adds to (+) or takes from (−) our latency as a share "
        "of the peer's; *latency* is our summed latency over the peer's (a ratio of sums, not the paired mean above).",
        "",
        markdown(
            [
                "mode",
                "best peer",
                "n",
                "thinking s",
                "thinking ours/peer",
                "thinking share",
                "answer s",
                "answer ours/peer",
                "answer share",
                "latency ours/peer",
            ],
            rows,
        ),
        "",
    ]
