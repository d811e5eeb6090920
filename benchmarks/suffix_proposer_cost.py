"""What a suffix proposer costs on every decode step.

Scenario (SSR's answer phase): a draft of 500 or 2,000 tokens is indexed, the context
is a 2,000-token prompt + chain of thought, then the answer is generated one token
at a time and `propose` runs after every token. The answer copies the draft with 10%
of its tokens changed, so matches break and re-anchor as they would in practice.

Token streams come from Python standard-library sources split into words and
punctuation (ids assigned on the fly): real text with real repetition, no tokenizer.

Columns: `add` = building the index from the draft (µs per draft token, best of 3),
`extend` = growing a source by one token (µs, mean), `sync` = the first `propose`
after the draft appears (the matcher reads the context tail once), `p50` / `mean` /
`p99` = µs per `propose` over the answer steps (the mean includes the interpreter's
garbage-collection pauses, which the whole process shares), `prop.` = mean proposed
tokens, `hit` = mean tokens of each proposal that the answer then actually contained
(a model-free acceptance proxy).

Run: OMP_NUM_THREADS=1 python benchmarks/suffix_proposer_cost.py [--steps 1000]
"""

from __future__ import annotations

import argparse
import gc
import inspect
import json
import random
import re
import statistics
import time
from pathlib import Path
from typing import Callable

from selfspec.spec import NgramProposer, Proposer, SuffixConfig, SuffixProposer


def corpus_tokens(count: int, skip: int) -> list[int]:
    """`count` word-level token ids from standard-library source text, after `skip` tokens."""
    vocab: dict[str, int] = {}
    ids: list[int] = []
    for path in sorted(Path(inspect.getfile(json)).parent.parent.glob("*.py")):
        for word in re.findall(r"\w+|[^\w\s]", path.read_text(errors="ignore")):
            ids.append(vocab.setdefault(word, len(vocab)))
        if len(ids) >= skip + count:
            return ids[skip : skip + count]
    raise RuntimeError("not enough standard-library text")


def mutate(tokens: list[int], rate: float, rng: random.Random) -> list[int]:
    return [rng.randrange(50_000, 60_000) if rng.random() < rate else t for t in tokens]


def microseconds(fn: Callable[[], object]) -> float:
    start = time.perf_counter_ns()
    fn()
    return (time.perf_counter_ns() - start) / 1_000


def measure(make: Callable[[], Proposer], draft: list[int], cot: list[int], steps: int, seed: int) -> dict[str, float]:
    rng = random.Random(seed)
    gc.collect()
    proposer = make()
    row: dict[str, float] = {}
    if isinstance(proposer, SuffixProposer):
        builds = [make() for _ in range(3)]
        row["add"] = min(microseconds(lambda b=b: b.add_source("draft:0", draft)) for b in builds) / len(draft)
        proposer = builds[0]
        grower = make()
        grower.add_source("draft:0", [])
        per_token = [microseconds(lambda t=t: grower.extend_source("draft:0", [t])) for t in draft]
        row["extend"] = statistics.fmean(per_token)
    context = list(cot)
    row["sync"] = microseconds(lambda: proposer.propose(context, 16))
    answer = mutate(draft, 0.10, rng)[:steps]
    costs, proposed, hits = [], [], []
    for step, token in enumerate(answer):
        context.append(token)
        start = time.perf_counter_ns()
        proposal = proposer.propose(context, 16)
        costs.append((time.perf_counter_ns() - start) / 1_000)
        proposed.append(len(proposal.tokens))
        future = answer[step + 1 : step + 1 + len(proposal.tokens)]
        hit = 0
        while hit < len(future) and proposal.tokens[hit] == future[hit]:
            hit += 1
        hits.append(hit)
    costs.sort()
    row["p50"] = costs[len(costs) // 2]
    row["mean"] = statistics.fmean(costs)
    row["p99"] = costs[int(0.99 * (len(costs) - 1))]
    row["prop."] = statistics.fmean(proposed)
    row["hit"] = statistics.fmean(hits)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--steps", type=int, default=2000, help="answer tokens (propose calls), at most the draft's length"
    )
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    cot = corpus_tokens(2000, skip=0)
    proposers: dict[str, Callable[[], Proposer]] = {
        "tree (depth 4)": lambda: SuffixProposer(SuffixConfig()),
        "tree, longest sel.": lambda: SuffixProposer(SuffixConfig(select="longest")),
        "longest_match": lambda: SuffixProposer(SuffixConfig(mode="longest_match")),
        "ngram (3..1, 10)": lambda: NgramProposer(),
    }
    columns = ["add", "extend", "sync", "p50", "mean", "p99", "prop.", "hit"]
    print(f"{'proposer':<18} {'draft':>5} | " + " ".join(f"{c:>8}" for c in columns))
    print("-" * (27 + 9 * len(columns)))
    for draft_len in (500, 2000):
        draft = corpus_tokens(draft_len, skip=50_000)
        for name, make in proposers.items():
            row = measure(make, draft, cot, args.steps, args.seed)
            cells = " ".join(f"{row[c]:>8.2f}" if c in row else f"{'-':>8}" for c in columns)
            print(f"{name:<18} {draft_len:>5} | {cells}")
    print(
        "\nµs per draft token (add), per appended token (extend), per call (sync, p50, mean, p99); tokens (prop., hit)."
    )


if __name__ == "__main__":
    main()
