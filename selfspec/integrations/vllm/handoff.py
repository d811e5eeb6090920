"""What the driver hands the proposer, inside a request's `SamplingParams.extra_args`.

vLLM's public way to give one request data that its workers can read is `extra_args`: it is
serialised with the request to the engine core and to every tensor-parallel worker, so no
side channel (and no ordering race between a side channel and the request) is needed. A plan
is plain JSON (ints, strings, lists), as `extra_args` requires:

- a draft child: the earlier drafts it may speculate from (iterative drafting);
- a parent's answer request: the SSR config, the usable drafts, the end-marker variants and
  where the answer starts in its token ids.
A request without a plan is decoded plainly (the proposer proposes nothing for it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from selfspec.spec.ssr_core import Draft, SSRConfig

PLAN_KEY = "selfspec_ssr"
"""The `extra_args` key of a plan (namespaced: other extensions may use `extra_args` too)."""


@dataclass
class DraftPlan:
    """A draft child: speculate from these earlier drafts (oldest first)."""

    config: SSRConfig
    earlier: list[Draft]


@dataclass
class AnswerPlan:
    """A parent's answer: verify the newest draft from `answer_start`, then suffix-decode."""

    config: SSRConfig
    drafts: list[Draft]
    end_variants: list[list[int]]
    answer_start: int
    key: str  # the driver's id of the request: vLLM may suffix the ids its workers see


def _draft_json(draft: Draft) -> dict[str, Any]:
    return {"index": draft.index, "cot": draft.cot_tokens, "anchor": list(draft.anchor), "tokens": list(draft.tokens)}


def _draft_from(data: dict[str, Any]) -> Draft:
    return Draft(
        index=int(data["index"]),
        cot_tokens=int(data["cot"]),
        seq=None,
        anchor=[int(t) for t in data["anchor"]],
        tokens=[int(t) for t in data["tokens"]],
    )


def draft_args(config: SSRConfig, earlier: list[Draft]) -> dict[str, Any]:
    return {
        PLAN_KEY: {
            "role": "draft",
            "config": config.model_dump(mode="json"),
            "earlier": [_draft_json(d) for d in earlier],
        }
    }


def answer_args(
    config: SSRConfig, drafts: list[Draft], end_variants: list[list[int]], answer_start: int, key: str
) -> dict[str, Any]:
    return {
        PLAN_KEY: {
            "role": "answer",
            "config": config.model_dump(mode="json"),
            "drafts": [_draft_json(d) for d in drafts],
            "end_variants": [list(v) for v in end_variants],
            "answer_start": int(answer_start),
            "key": key,
        }
    }


def read_plan(extra_args: dict[str, Any] | None) -> DraftPlan | AnswerPlan | None:
    """The plan in a request's `extra_args` (None: not an SSR request)."""
    data = (extra_args or {}).get(PLAN_KEY)
    if not data:
        return None
    config = SSRConfig.model_validate(data["config"])
    if data["role"] == "draft":
        return DraftPlan(config, [_draft_from(d) for d in data["earlier"]])
    if data["role"] == "answer":
        return AnswerPlan(
            config,
            [_draft_from(d) for d in data["drafts"]],
            [list(v) for v in data["end_variants"]],
            int(data["answer_start"]),
            str(data["key"]),
        )
    raise ValueError(f"unknown SSR plan role {data['role']!r}")
