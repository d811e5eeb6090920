"""How many tokens to propose this step: the length that maximises expected tokens per unit cost.

A proposal of k tokens turns one step into a verify of 1 + k tokens per row. It pays when the
tokens it is expected to commit outweigh what the longer step costs:

    value(k) = E[accepted + 1 | k] / (cost(rows, 1 + k) / cost(rows, 1))

With a per-token acceptance rate α (each proposed token accepted with probability α, the
first rejection ending the run), E[accepted + 1 | k] = 1 + α + ... + α^k. The cost ratio is the
engine's own measurement (`engine.step_costs`) of a step of `rows` rows feeding 1 + k tokens
each, against a decode step of as many rows, the host's part of a step (which a longer verify
does not lengthen) on both sides: every row of a busy batch is assumed to speculate
as this one does, so the figure is the batch's throughput, not one request's latency, and a
length that would make the batch slower than plain decoding is never chosen. Where that exact
shape was not measured, a line fitted to every measured shape (a fixed cost per forward plus a
cost per fed token) stands in; before anything is measured, a prior that lets short proposals
through (so the costs get measured at all).

On top of the value rule, once the step has other rows, a per-step budget caps it at
`max_step_ratio` decode steps of the same batch, whatever the acceptance says: as the batch fills, a verify's extra tokens stop
being free (the forward turns compute-bound) and the budget shrinks every row's proposal to
nothing. k = 0 is a plain decode step.

The choice only decides how much is verified; every committed token is still the verifier's,
so outputs do not depend on it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Sequence

if TYPE_CHECKING:
    from selfspec.engine.step_costs import StepCosts

CANDIDATES: tuple[int, ...] = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64)
"""Proposal lengths considered (besides 0 and the step's room): a coarse grid is enough, the
cost model itself is bucketed by powers of two."""

TOKEN_COST_PRIOR = 0.05
"""Before any step was measured: one fed token costs this fraction of a forward's fixed part
(a GPU on a small model is nearer 0.005, a 2-core CPU nearer 0.1): short proposals get tried."""

MAX_ALPHA = 0.98
"""The acceptance rate used is at most this: a run of full acceptances must not promise
unbounded lengths."""


def expected_tokens(alpha: float, k: int) -> float:
    """E[accepted + 1] of a k-token proposal at per-token acceptance `alpha`."""
    a = min(max(alpha, 0.0), MAX_ALPHA)
    return (1.0 - a ** (k + 1)) / (1.0 - a)


MAX_POSITIONS = 64
"""Proposal positions whose acceptance is tracked one by one; beyond, the last position's rate holds."""


class AcceptanceRate:
    """One request's acceptance of one kind of proposal, position by position, exponentially weighted.

    Each verified proposal is a run: its first `accepted` tokens kept, then (if it stopped short)
    one rejection. Per position i the rate is the share of proposals that reached i - 1 and offered
    an i-th token whose i-th token was kept too, so E[accepted + 1 | k] = 1 + sum over i <= k of the
    product of the first i rates (a Kaplan-Meier estimate: a proposal shorter than i says nothing
    about position i). Why not one rate for every position: copies (prompt lookup, a draft's
    suffix) are right or wrong in runs — once the first token of a copy is kept the next ones
    nearly always are — and a single geometric rate misprices such runs: half the proposals
    keeping nothing and half all 15 tokens fit a rate of 0.94, which promises 10.3 tokens from a
    15-token proposal where 8.5 come. Each position's rate is smoothed with `prior_weight` pseudo-trials
    toward the rate of the position before it (the first position toward `prior`), so a position
    never offered goes on at the last known rate: smoothed toward the prior instead, a request that
    proposed 7 tokens would price an 8th at the prior, never try it, and never learn that its copies
    run on (prompt lookup's runs in a chain of thought keep ~0.9 of their tokens after the first).
    Recent proposals weigh most (`decay` per proposal that reached the position); steps without a proposal pull the estimate
    back toward the prior (`relax`), so a source that failed for a while gets tried again instead
    of staying off for the rest of the request."""

    def __init__(self, prior: float, *, decay: float = 0.7, prior_weight: float = 1.0, relax: float = 0.97) -> None:
        self.prior = prior
        self._prior_rate = min(prior, MAX_ALPHA)  # the rate a position with no evidence starts from
        self.decay = decay
        self.prior_weight = prior_weight
        self.relax = relax
        self.successes = 0.0  # geometric summary (reports): kept tokens
        self.trials = 0.0  # kept tokens + rejections
        # Per position i, stored divided by `_scale` (the idle fade multiplies one number, not 2 x 65):
        self._kept = [0.0] * (MAX_POSITIONS + 1)  # [i]: weighted proposals whose i-th token was kept
        self._offered = [0.0] * (MAX_POSITIONS + 1)  # [i]: ... that reached i - 1 and offered an i-th token
        self._scale = 1.0
        # E[accepted | k] for k < len(_gains), extended on demand; the product of the rates and the
        # rate of position len(_gains) - 1 (the prior before any), where the extension resumes.
        self._forget_gains()

    @property
    def value(self) -> float:
        """The per-token rate of a geometric model fitted to the same runs (for reports)."""
        return (self.successes + self.prior * self.prior_weight) / (self.trials + self.prior_weight)

    def observe(self, proposed: int, accepted: int) -> None:
        """One verified proposal of `proposed` tokens of which the first `accepted` were kept."""
        if proposed <= 0:
            return
        trials = accepted + (1 if accepted < proposed else 0)
        self.successes = self.decay * self.successes + accepted
        self.trials = self.decay * self.trials + trials
        # Each position's evidence fades only when that position is offered again: a proposal that
        # failed at its first token says nothing about the 8th, and fading the 8th for it would
        # forget the rare long runs that make long proposals pay.
        one, decay = 1.0 / self._scale, self.decay
        kept, offered = self._kept, self._offered
        for i in range(1, min(proposed, accepted + 1, MAX_POSITIONS) + 1):
            offered[i] = decay * offered[i] + one
            kept[i] = decay * kept[i] + (one if i <= accepted else 0.0)
        self._forget_gains()

    def idle(self) -> None:
        """A step without a proposal of this kind: the evidence fades a little."""
        self.successes *= self.relax
        self.trials *= self.relax
        self._fade(self.relax)

    def _fade(self, factor: float) -> None:
        self._scale *= factor
        if self._scale < 1e-200:  # renormalise long before the stored counts overflow
            self._kept = [x * self._scale for x in self._kept]
            self._offered = [x * self._scale for x in self._offered]
            self._scale = 1.0
        self._forget_gains()

    def _forget_gains(self) -> None:
        """The counts changed: the expected gains are rebuilt on the next `expected`."""
        self._gains, self._survive, self._last_rate = [0.0], 1.0, self._prior_rate

    def gains(self, k: int) -> list[float]:
        """E[accepted | j] for every j up to min(k, MAX_POSITIONS), as a list indexed by j (rebuilt
        once after the counts change, extended on demand): the length rule reads it directly."""
        gains, upto = self._gains, min(k, MAX_POSITIONS)
        if len(gains) <= upto:
            w = self.prior_weight / self._scale  # the pseudo-trials in the stored counts' scale
            survive, rate, total = self._survive, self._last_rate, gains[-1]
            kept, offered, append, cap = self._kept, self._offered, gains.append, MAX_ALPHA
            for i in range(len(gains), upto + 1):
                # Position i shrinks toward position i - 1's rate (the first toward the prior): where
                # nothing was offered yet, a copy is assumed to go on as its last known tokens did. The
                # carried rate is capped, so the pseudo-trials are never all kept: every rate stays < 1.
                carried = rate if rate < cap else cap
                rate = (kept[i] + w * carried) / (offered[i] + w)
                survive *= rate
                total += survive
                append(total)
            self._survive, self._last_rate = survive, rate
        return gains

    def expected(self, k: int) -> float:
        """E[accepted + 1] of a k-token proposal."""
        k = max(0, k)
        gains = self.gains(k)
        if k <= MAX_POSITIONS:
            return 1.0 + gains[k]
        rate, survive = min(self._last_rate, MAX_ALPHA), self._survive  # beyond: the last known rate goes on
        return 1.0 + gains[MAX_POSITIONS] + survive * rate * (1.0 - rate ** (k - MAX_POSITIONS)) / (1.0 - rate)


VERIFY_TOKENS_MAX = 64
"""Tokens per row of the longest verify a step sends; longer chunks are prefill pieces, whose
per-token cost (a compute-efficient GEMM) says nothing about a short verify's."""


def _line_fit(points: dict[int, float]) -> tuple[float, float] | None:
    """Least-squares (fixed seconds, seconds per fed token) over fed tokens -> seconds."""
    xs, ys = list(points), list(points.values())
    if len(set(xs)) < 2:
        return None
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    per_token = max(0.0, sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx)
    fixed = my - per_token * mx
    fixed = max(fixed, 1e-3 * min(ys))  # a compute-bound fit: (almost) no fixed part
    return fixed, per_token


def _verify_points(costs: "StepCosts", rows: int | None) -> dict[int, float]:
    """Fed tokens -> median step seconds of the measured verify-sized shapes (at most
    `VERIFY_TOKENS_MAX` tokens per row), of `rows` rows only, or of every row count (None)."""
    return {
        r * tokens: seconds
        for (r, tokens), seconds in costs.step_seconds().items()
        if tokens <= VERIFY_TOKENS_MAX and (rows is None or r == rows)
    }


def fitted_line(costs: "StepCosts | None", rows: int) -> tuple[float, float] | None:
    """(fixed seconds, seconds per fed token) through the measured verify-sized steps of `rows`
    rows, else of all rows; None before two sizes were measured. Prefill pieces are left out:
    their per-token cost is a GEMM's, far below a short verify's on a CPU."""
    if costs is None:
        return None
    points = costs.step_seconds()
    for wanted in (rows, None):
        fit = _line_fit(
            {
                r * tokens: seconds
                for (r, tokens), seconds in points.items()
                if tokens <= VERIFY_TOKENS_MAX and (wanted is None or r == wanted)
            }
        )
        if fit is not None:
            return fit
    return None


_NOT_GIVEN: Any = object()
_UNLIMITED = float("inf")


def cost_ratio(
    costs: "StepCosts | None", rows: int, tokens: int, line: tuple[float, float] | None = _NOT_GIVEN
) -> tuple[float, str]:
    """Seconds of a step of `rows` rows of `tokens` tokens over a decode step of `rows` rows, and
    where the figure came from: "measured" (that shape), "model" (the engine's step-cost prior,
    `StepCosts.predicted`), "fitted" (`fitted_line`; pass `line`
    when asking for several lengths at once, it takes a median per measured shape), "prior"
    (nothing measured)."""
    rows = max(1, rows)
    if tokens <= 1:
        return 1.0, "measured"
    if costs is not None:
        base, more = costs.seconds(rows, 1), costs.seconds(rows, tokens)
        if base and more:
            return max(1.0, costs.step_ratio(more, base, rows, rows)), "measured"
        if costs.prior is not None:  # a step-cost model of this model and device: every shape priced
            more, base = costs.predicted(rows, tokens), costs.predicted(rows, 1)
            return max(1.0, costs.step_ratio(more, base, rows, rows)), "model"
        if line is _NOT_GIVEN:
            line = fitted_line(costs, rows)
        if line is not None:
            fixed, per_token = line
            more, base = fixed + per_token * rows * tokens, fixed + per_token * rows
            return max(1.0, costs.step_ratio(more, base, rows, rows)), "fitted"
    q = TOKEN_COST_PRIOR
    return (1.0 + q * rows * tokens) / (1.0 + q * rows), "prior"


@dataclass(slots=True)
class LengthChoice:
    """One step's decision and the figures it rested on."""

    k: int
    budget_k: int  # the longest proposal the step budget allowed
    alpha: float
    rows: int
    value: float  # expected tokens per unit cost of the chosen k (1.0 for k = 0)
    cost_from: str


def candidate_lengths(costs: "StepCosts | None") -> list[int]:
    """The proposal lengths worth pricing. Where steps are padded to token buckets (static
    forwards) a verify costs its bucket, and a longer proposal never expects fewer tokens, so only
    the length that fills each bucket (k = bucket - 1) can win within it: those alone. Eager
    forwards cost what they feed: the coarse grid."""
    if costs is not None and costs.padded:
        return sorted({b - 1 for b in costs.token_buckets if b > 1})
    return list(CANDIDATES)


def _priced(costs: "StepCosts | None", rows: int, ks: list[int]) -> list[tuple[int, float, str]]:
    """(k, cost ratio, where it came from) per length; the fitted line at most once, and only if
    some length is unmeasured."""
    line: Any = _NOT_GIVEN
    out = []
    for k in ks:
        if line is _NOT_GIVEN and costs is not None and costs.prior is None and costs.seconds(rows, 1 + k) is None:
            line = fitted_line(costs, rows)
        out.append((k, *cost_ratio(costs, rows, 1 + k, line)))
    return out


def cost_table(costs: "StepCosts | None", rows: int) -> list[tuple[int, float, str]]:
    """Every candidate length's cost ratio at `rows` rows, computed once per `MEMO_STEPS` observed
    steps: every row of every step asks (so a hit is a dict lookup, no closure built), and the
    figures only change when steps are measured."""
    if costs is None:
        return _priced(None, rows, candidate_lengths(None))
    key = ("cost_table", rows)
    table = costs.memo_table.get(key)
    return table if table is not None else costs.memo(key, lambda: _priced(costs, rows, candidate_lengths(costs)))


def _room_price(costs: "StepCosts | None", rows: int, room: int) -> tuple[int, float, str]:
    """The cost ratio of a proposal of exactly `room` tokens (a request near its end, a proposer
    that offers fewer), memoised with the table."""
    if costs is None:
        return _priced(None, rows, [room])[0]
    key = ("room", rows, room)
    price = costs.memo_table.get(key)
    return price if price is not None else costs.memo(key, lambda: _priced(costs, rows, [room])[0])


LONGER_TOLERANCE = 0.03
"""A longer proposal is kept over a shorter one whose value is higher by at most this share.
Both values are estimates: the acceptance of the positions a cut gives up from a few recent
copies, the costs from medians over a window of steps taken at other context lengths, and on a
GPU the buckets a cut chooses between differ by 1-3% of a step (H100, 135M thinker: 1.43 ms a
step of 8 tokens, 1.44-1.57 of 16). Picking the shorter on such a margin is a coin toss that
costs forwards: on route finding (H100), cutting 8-10 token copies to 7 in 41% of its chain of
thought's steps, auto ran 2.3% more forwards than prompt lookup for 0.3% less device time per
forward. Where a cut really pays (a CPU, where a longer verify costs several decode steps) its
margin is far above this."""


def priced_lengths(
    costs: "StepCosts | None", rows: int, room: int, limit: float
) -> tuple[tuple[tuple[int, float, str], ...], int]:
    """((k, cost ratio, cost source) of every candidate length below `room` and of the room
    itself, in increasing k, cut where a step would cost more than `limit` decode steps (costs grow
    with k: longer ones are over it too); the longest length under the limit, the budget k).
    Memoised per (rows, room, limit) with the step costs' other figures: every row of every step
    asks, and between two refreshes of the costs the answer is the same list."""
    if costs is None:
        return _price_upto(None, rows, room, limit)
    key = ("priced", rows, room, limit)
    found = costs.memo_table.get(key)
    return found if found is not None else costs.memo(key, lambda: _price_upto(costs, rows, room, limit))


def _price_upto(costs: "StepCosts | None", rows: int, room: int, limit: float):
    out: list[tuple[int, float, str]] = []
    budget_k = 0
    for k, ratio, source in cost_table(costs, rows):
        at_room = k >= room
        if k > room:  # the room itself, where it is no candidate (priced last)
            k, ratio, source = _room_price(costs, rows, room)
        if ratio > limit:
            break
        budget_k = k
        out.append((k, ratio, source))
        if at_room:
            break
    return tuple(out), budget_k


def longest_near_best(
    valued: Sequence[tuple[int, float, str]], margin: float, tolerance: float = LONGER_TOLERANCE
) -> tuple[int, float, str]:
    """(k, value, cost source) among (k, expected tokens per unit cost, source) in increasing k:
    0 unless some length beats a plain step by `margin`; of those that do, the longest whose value
    is within `tolerance` of the best (`LONGER_TOLERANCE`; equal values: same bucket, same cost,
    more to accept)."""
    best = 1.0
    for _, value, _ in valued:
        if value > best:
            best = value
    if best >= margin:
        floor = best * (1.0 - tolerance)
        for k, value, source in reversed(valued):
            if value >= margin and value >= floor:
                return k, value, source
    return 0, 1.0, "measured"


def best_in_table(
    costs: "StepCosts | None",
    rows: int,
    room: int,
    limit: float,
    expected: Callable[[int], float],
    margin: float,
    tolerance: float = LONGER_TOLERANCE,
) -> tuple[int, float, str, int]:
    """(k, value, cost source, budget k): `longest_near_best` over the lengths `priced_lengths`
    gives, each valued at `expected(k)` over its cost ratio. Why lengths priced per row count and
    room, and valued on every call: a copy's length changes from step to step, its acceptance
    after every verified proposal, the costs only once per `MEMO_STEPS` steps."""
    priced, budget_k = priced_lengths(costs, rows, room, limit)
    k, value, source = longest_near_best([(k, expected(k) / ratio, src) for k, ratio, src in priced], margin, tolerance)
    return k, value, source, budget_k


def choose_length(
    costs: "StepCosts | None",
    rows: int,
    alpha: float,
    room: int,
    *,
    margin: float = 1.05,
    max_step_ratio: float = 1.5,
    expected: Callable[[int], float] | None = None,
) -> LengthChoice:
    """The k in [0, room] with the most expected tokens per unit step cost (`expected(k)`: E[accepted
    + 1] of a k-token proposal, by default the geometric one at `alpha`); 0 unless some k beats
    a plain step by `margin`, and, beside other rows, none whose step costs more than
    `max_step_ratio` decode steps (a request alone slows no one but itself: the value rule only).
    Between lengths of equal value the longer wins (same bucket, same cost: more to accept)."""
    rows = max(1, rows)
    if room <= 0:
        return LengthChoice(0, 0, alpha, rows, 1.0, "measured")
    if expected is None:
        expected = lambda k: expected_tokens(alpha, k)  # noqa: E731
    limit = max_step_ratio if rows > 1 else float("inf")  # alone, a long verify delays no one else
    best_k, best_value, best_source, budget_k = best_in_table(costs, rows, room, limit, expected, margin)
    return LengthChoice(best_k, budget_k, alpha, rows, best_value, best_source)


@dataclass(slots=True)
class _TailWatch:
    """A proposal cut to `kept` tokens, all accepted, and the `tail` of the offer it was cut from:
    `matched` of the tail's tokens were committed after it so far."""

    kind: str
    kept: int
    tail: Sequence[int]
    matched: int = 0


class LengthController:
    """Per request: an acceptance rate per kind of proposal, the length decision of each step, and
    what was proposed and accepted by source and phase (the request's `auto` metrics)."""

    def __init__(self, priors: dict[str, float], *, margin: float = 1.05, max_step_ratio: float = 1.5) -> None:
        self.rates = {kind: AcceptanceRate(prior) for kind, prior in priors.items()}
        self.margin = margin
        self.max_step_ratio = max_step_ratio
        # Plain dicts, not Counters: updated on every step of every row (a Counter's += is twice a dict's).
        self.k_counts: dict[int, int] = {}
        self.proposed: dict[str, int] = {}  # "phase/source" -> tokens
        self.accepted: dict[str, int] = {}
        self.last: tuple[int, int, int, str] | None = None  # (k, budget_k, rows, cost source) of the latest choice
        self._keys: dict[tuple[str, str], str] = {}
        self._tail: _TailWatch | None = None  # a cut offer whose counterfactual run is still being read (`record`)

    def choose(self, kind: str, costs: "StepCosts | None", rows: int, room: int) -> int:
        """This step's proposal length for a proposal of `kind`, at most `room`: `choose_length`
        with this request's acceptance of `kind`, without its record object and with the gains read
        from a list (it runs for every row of every step, and on a GPU its host time is a visible
        share of a small model's step)."""
        rate = self.rates[kind]
        rows = rows if rows > 1 else 1
        if room <= 0:
            self.last = (0, 0, rows, "measured")
            self.k_counts[0] = self.k_counts.get(0, 0) + 1
            return 0
        limit = self.max_step_ratio if rows > 1 else _UNLIMITED
        priced, budget_k = priced_lengths(costs, rows, room, limit)
        if room <= MAX_POSITIONS:  # every length tracked: the gains list read directly
            gains = rate.gains(room)
            valued = [(k, (1.0 + gains[k]) / ratio, source) for k, ratio, source in priced]
        else:
            expected = rate.expected
            valued = [(k, expected(k) / ratio, source) for k, ratio, source in priced]
        best_k, _, best_source = longest_near_best(valued, self.margin)
        self.last = (best_k, budget_k, rows, best_source)
        counts = self.k_counts
        counts[best_k] = counts.get(best_k, 0) + 1
        if best_k == 0:
            rate.idle()
        return best_k

    def record(
        self,
        kind: str,
        phase: str,
        source: str,
        proposed: int,
        accepted: int,
        tail: Sequence[int] = (),
        committed: Sequence[int] = (),
    ) -> None:
        """A verified proposal: moves the acceptance rate of `kind`, counts it under phase/source.

        `tail`: what the proposer offered beyond the `proposed` tokens the length rule kept (a copy
        cut short), with `committed` the step's committed tokens. Where every kept token was
        accepted, the rate is not told "k of k" but what the whole offer would have got, read off
        the tokens the verifier commits in this and the next steps (`follow`): a rule that keeps
        choosing short proposals otherwise never learns that its copies run on, and its estimate
        for the positions it stopped offering stays wherever its last long proposals left it."""
        if proposed <= 0:
            return
        if tail and accepted == proposed:
            self.drop_tail()  # one offer is watched at a time: an older one counts what it has seen
            self._tail = _TailWatch(kind, proposed, tail)
            self.follow(committed[accepted:])
        else:
            self.rates[kind].observe(proposed, accepted)
        key = self._keys.get((phase, source))
        if key is None:
            key = self._keys[(phase, source)] = f"{phase}/{source}"
        self.proposed[key] = self.proposed.get(key, 0) + proposed
        self.accepted[key] = self.accepted.get(key, 0) + accepted

    def follow(self, committed: Sequence[int]) -> None:
        """Tokens the verifier committed after a cut offer's kept part (see `record`): each one the
        offer's tail predicted extends its counterfactual run; the first that differs, or the tail's
        end, settles it as one observation of the whole offer."""
        watch = self._tail
        if watch is None or not committed:
            return
        tail, matched = watch.tail, watch.matched
        for token in committed:
            if matched == len(tail) or tail[matched] != token:
                break
            matched += 1
        else:
            if matched < len(tail):  # every committed token matched: wait for the next step's
                watch.matched = matched
                return
        watch.matched = matched
        self._tail = None
        # The offer's first `kept + matched` tokens would have been accepted; the next one (if the
        # tail had one) would have been rejected.
        offered = watch.kept + min(len(tail), matched + 1)
        self.rates[watch.kind].observe(offered, watch.kept + matched)

    def drop_tail(self) -> None:
        """Stop watching the cut offer (its context changed under it: a phase ended, tokens were
        forced; or a newer offer is watched): it counts what it has seen, as a proposal of that
        length fully accepted."""
        watch = self._tail
        if watch is not None:
            self._tail = None
            self.rates[watch.kind].observe(watch.kept + watch.matched, watch.kept + watch.matched)

    def report(self) -> dict:
        last = self.last
        return {
            "k_chosen": {str(k): n for k, n in sorted(self.k_counts.items())},
            "proposed_tokens": dict(self.proposed),
            "accepted_tokens": dict(self.accepted),
            "acceptance_rate": {kind: round(rate.value, 3) for kind, rate in self.rates.items()},
            "last_choice": None
            if last is None
            else {"k": last[0], "budget_k": last[1], "rows": last[2], "cost_from": last[3]},
        }
