"""What a forward costs on the device the engine runs on, measured as it runs.

A speculation policy that may add work to a step (SSR's draft rides as one more row in every
step while it drafts; a verify chunk feeds k tokens instead of one) pays off only where that
extra work is cheap next to what it saves. How cheap differs by orders of magnitude between
devices: on an H200 a second decode row costs ~1-5% of a step, on a 2-core CPU it was measured
anywhere from 6% to 110% depending on the BLAS path. So the engine does not assume: it keeps
the wall time of its own forwards by shape, and policies read the ratios.

Two ways a step's time maps to a shape, by how the engine runs it:

- static forwards (CUDA graphs, `token_buckets` given): a step is padded to its rows' longest
  chunk's token bucket, so it costs that bucket's forward whatever its rows feed. Every step,
  mixed or not, is a sample of (rows, bucket), kept as the step's seconds.
- eager forwards (a CPU): a step costs what it feeds. Only homogeneous steps are recorded (every
  row feeds the same number of tokens), as seconds per fed token, so a sample is the cost of
  exactly one shape; token counts are grouped by powers of two.

Medians over a window keep a noisy machine's stalls (another process, a page fault) out of the
estimate; each shape's median is computed once per change of its samples (policies ask for
a dozen shapes per row and step).

A step is more than its forward: between two forwards the host proposes, verifies, commits and
runs the policies, and the device waits (the forward ends in a synchronising copy). That gap is
kept too (`host_seconds`), because what a longer verify or one more row adds has to be weighed
against the whole step: on an H100 a 135M model's forward is ~1.4 ms and the host's part 0.05-0.13 ms,
and a ratio of forwards alone overstates every extra token's and row's price by that share. The gap
is kept per row count as well: every row is proposed for, verified, committed and reacted to on the
host, so a second row adds host time as well as forward time, and on a GPU running a small model
the host's share is the larger one (an H100, 135M thinker: a draft row added ~0.7% to the forward
and ~0.07 ms, about 4% of a step, to the host's part). A row's price (`row_cost`) takes each
shape's own gap; a longer verify of the same rows leaves it as it is.
"""

from __future__ import annotations

import statistics
from collections import deque
from typing import TYPE_CHECKING, Any, Callable, Sequence

if TYPE_CHECKING:
    from selfspec.engine.cost_model import StepCostModel

WINDOW = 48
"""Samples kept per shape: enough for a stable median, few enough to follow a change of load."""
MIN_SAMPLES = 4
"""Samples a shape needs before its median is used."""
HOST_GAP_FACTOR = 4.0
"""A gap between forwards longer than this many times the forward before it is the engine idling
(no request, a new request's admission, a caller between `generate` calls), not a step's host work."""
MEMO_STEPS = 64
"""Derived figures (`memo`) are recomputed after this many observations, or at once when a shape
becomes measured: medians over a 48-step window move slowly, and recomputing a cost table on every
step cost a large share of a GPU step's host time (every 16 steps it was still ~8 µs per step on a
CPU: a rebuild prices every candidate length of every row count asked)."""


def _bucket(tokens: int) -> int:
    """Token counts rounded up to a power of two: verify chunks of 33 and 40 cost alike."""
    return 1 if tokens <= 1 else 1 << (tokens - 1).bit_length()


class StepCosts:
    """Wall seconds of a step by (rows, tokens-per-row bucket), over the last `WINDOW` steps of
    each shape (module docstring: padded steps by their bucket, eager ones per fed token)."""

    def __init__(
        self,
        token_buckets: Sequence[int] | None = None,
        *,
        prior: "StepCostModel | None" = None,
        prior_keys: int = 1024,
        frozen: bool = False,
    ) -> None:
        """`prior`: a step-cost model fitted on this model shape and device (`engine.cost_model`),
        which prices shapes not measured yet (`predicted`), scaled to this engine by the measured
        one-row decode step once there is one; `prior_keys` the key length it is asked at.
        `frozen`: observations are ignored (what-if runs that decide as a given device would)."""
        self.token_buckets = tuple(token_buckets) if token_buckets else None
        # The padded bucket of every row width up to the widest, by index (`bucket` runs for every
        # priced length of every cost table).
        self._bucket_of: list[int | None] = (
            [min((b for b in self.token_buckets if b >= t), default=None) for t in range(max(self.token_buckets) + 1)]
            if self.token_buckets
            else []
        )
        self.prior = prior
        self.prior_keys = prior_keys
        self.frozen = frozen
        self._samples: dict[tuple[int, int], deque[float]] = {}
        self._medians: dict[tuple[int, int], float] = {}
        self._memo: dict[Any, Any] = {}
        self._host: deque[float] = deque(maxlen=WINDOW)  # seconds between a forward's end and the next's start
        self._host_median: float | None = None
        # The same gaps by the row count of the forward they preceded, and their medians.
        self._host_by_rows: dict[int, deque[float]] = {}
        self._host_medians: dict[int, float] = {}
        self._last_end: float | None = None
        self.version = 0  # observations so far
        self._memo_version = 0  # when the memo was last cleared

    @property
    def padded(self) -> bool:
        """Whether steps cost their padded bucket (static forwards) rather than what they feed."""
        return self.token_buckets is not None

    def bucket(self, tokens: int) -> int | None:
        """The shape bucket of a row of `tokens` tokens (None: beyond the static forwards' buckets,
        a step that runs eagerly and is not a verify)."""
        if self.token_buckets is None:
            return _bucket(tokens)
        table = self._bucket_of
        return table[tokens if tokens > 0 else 0] if tokens < len(table) else None

    def observe(self, row_tokens: list[int], seconds: float, started: float | None = None) -> None:
        """One step ran rows feeding `row_tokens` tokens each in `seconds`, its forward starting at
        `started` (a `time.perf_counter()` reading; given, the host time since the previous forward
        ended is kept as well)."""
        if self.frozen or not row_tokens or seconds <= 0:
            return
        if started is not None:
            if self._last_end is not None and 0.0 <= started - self._last_end <= HOST_GAP_FACTOR * seconds:
                gap, rows = started - self._last_end, len(row_tokens)
                self._host.append(gap)
                self._host_median = None
                by_rows = self._host_by_rows.get(rows)
                if by_rows is None:
                    by_rows = self._host_by_rows[rows] = deque(maxlen=WINDOW)
                by_rows.append(gap)
                self._host_medians.pop(rows, None)
            self._last_end = started + seconds
        if self.padded:
            bucket = self.bucket(max(row_tokens))
            if bucket is None:
                return
            value = seconds
        else:
            if min(row_tokens) != max(row_tokens):
                return  # an eager mixed step's time belongs to no single shape
            bucket, value = _bucket(row_tokens[0]), seconds / row_tokens[0]
        key = (len(row_tokens), bucket)
        samples = self._samples.get(key)
        if samples is None:
            samples = self._samples[key] = deque(maxlen=WINDOW)
        samples.append(value)
        self._medians.pop(key, None)
        self.version += 1
        if len(samples) == MIN_SAMPLES or self.version - self._memo_version >= MEMO_STEPS:
            self._memo.clear()
            self._memo_version = self.version

    @property
    def memo_table(self) -> dict[Any, Any]:
        """The memo itself, for callers that look a figure up on every row of every step (a dict
        `get` with no closure to build); a miss goes through `memo`."""
        return self._memo

    def memo(self, key: Any, compute: Callable[[], Any]) -> Any:
        """`compute()` once per `MEMO_STEPS` observations (or a newly measured shape): figures
        policies derive from the samples (a fitted line, a cost table) are asked for by every row
        of every step."""
        if key not in self._memo:
            self._memo[key] = compute()
        return self._memo[key]

    def _median(self, key: tuple[int, int]) -> float:
        value = self._medians.get(key)
        if value is None:
            value = self._medians[key] = statistics.median(self._samples[key])
        return value

    def seconds(self, rows: int, tokens: int = 1, min_samples: int = MIN_SAMPLES) -> float | None:
        """Median seconds of a step of `rows` rows of `tokens` tokens each (from the steps of the
        same bucket); None until measured."""
        bucket = self.bucket(tokens)
        samples = None if bucket is None else self._samples.get((rows, bucket))
        if samples is None or len(samples) < min_samples:
            return None
        median = self._median((rows, bucket))
        return median if self.padded else median * tokens

    def host_seconds(self, rows: int | None = None) -> float:
        """Median host seconds a step spends outside its forward (proposals, verification, the
        policies), over steps of `rows` rows where `MIN_SAMPLES` of them were seen, else over every
        step; 0.0 until `MIN_SAMPLES` gaps were seen. Added to both sides of every cost ratio
        (`step_ratio`): a longer verify lengthens the forward, not this part; one more row both."""
        if rows is not None:
            samples = self._host_by_rows.get(rows)
            if samples is not None and len(samples) >= MIN_SAMPLES:
                value = self._host_medians.get(rows)
                if value is None:
                    value = self._host_medians[rows] = statistics.median(samples)
                return value
        if len(self._host) < MIN_SAMPLES:
            return 0.0
        if self._host_median is None:
            self._host_median = statistics.median(self._host)
        return self._host_median

    def step_ratio(self, more: float, base: float, rows_more: int | None = None, rows_base: int | None = None) -> float:
        """Whole-step cost of a step whose forward takes `more` seconds over one whose forward
        takes `base`: the host's part of a step (`host_seconds`) on both sides, each side's at its
        own row count where given (what one more row costs the host, `row_cost`)."""
        return (more + self.host_seconds(rows_more)) / (base + self.host_seconds(rows_base))

    def predicted(self, rows: int, tokens: int = 1) -> float | None:
        """The prior's seconds for a step of `rows` rows of `tokens` tokens, scaled by how this
        engine's measured one-row decode step compares with the prior's; None without a prior."""
        if self.prior is None:
            return None
        return self.memo(("predicted", rows, tokens), lambda: self._predicted(rows, tokens))

    def _predicted(self, rows: int, tokens: int) -> float:
        keys = max(self.prior_keys, tokens)
        scale = 1.0
        decode = self.seconds(1)
        if decode is not None:
            scale = decode / self.prior.seconds(1, 1, self.prior_keys)
        return scale * self.prior.seconds(rows, tokens, keys)

    def row_cost(self, rows: int, extra: int = 1) -> float | None:
        """What each of `extra` more rows adds to a step of `rows` rows, as a fraction of that step
        (0.05: 5% slower per row), forward and host time (`step_ratio` at each row count), at the
        tokens-per-row bucket the engine ran most often in both shapes. Plain SSR decodes (one token per row); composed with speculation in the thinking,
        parent and draft both verify several tokens per step, and rare one-token steps are no
        measure of those. `extra` > 1 shares the cost of several rows out evenly: on padded
        batches the row that crosses into the next batch bucket costs a step's worth and the rows
        after it nothing, and the drafts that ride in the larger bucket together pay for it
        together. None until both shapes of some bucket are measured (and no prior)."""
        best: tuple[int, int] | None = None  # (samples of the scarcer shape, bucket)
        for r, bucket in self._samples:
            if r != rows or (rows + extra, bucket) not in self._samples:
                continue
            count = min(len(self._samples[(rows, bucket)]), len(self._samples[(rows + extra, bucket)]))
            if count < MIN_SAMPLES:
                continue
            if best is None or (count, -bucket) > (best[0], -best[1]):
                best = (count, bucket)
        if best is None:
            if self.prior is None:
                return None
            more, base = self.predicted(rows + extra), self.predicted(rows)
        else:
            base, more = self.seconds(rows, best[1]), self.seconds(rows + extra, best[1])
        return max(0.0, (self.step_ratio(more, base, rows + extra, rows) - 1.0) / extra)

    def verify_token_cost(self) -> float | None:
        """Seconds per token of the longest measured one-row verify chunk, as a fraction of a
        one-row decode step (0.1: a 64-token verify costs 6.4 decode steps). None until measured."""
        decode = self.seconds(1)
        if decode is None:
            return None
        buckets = sorted(t for r, t in self._samples if r == 1 and t > 1)
        if not buckets:
            return None
        longest = buckets[-1]
        per_token = self._median((1, longest)) / (longest if self.padded else 1)
        return per_token / decode

    def step_seconds(self, min_samples: int = MIN_SAMPLES) -> dict[tuple[int, int], float]:
        """Median seconds of a step per measured shape (rows, tokens-per-row bucket), taking a
        row's tokens as its bucket: the points a cost model of all shapes is fitted to."""
        return {
            (rows, bucket): self._median((rows, bucket)) * (1 if self.padded else bucket)
            for (rows, bucket), s in self._samples.items()
            if len(s) >= min_samples
        }

    def summary(self) -> dict[str, float]:
        """Median milliseconds per fed token and shape bucket ("2x1": two rows of one token, a
        decode step; "1x64": one row of a 64-token bucket), and the host's part of a step
        ("host"), for reports."""
        out = {
            f"{rows}x{tokens}": round(1000 * self._median((rows, tokens)) / (tokens if self.padded else 1), 3)
            for (rows, tokens), s in sorted(self._samples.items())
            if s
        }
        if self._host:
            out["host"] = round(1000 * statistics.median(self._host), 3)
        return out


def engine_step_costs(runner, model, device_name: str | None = None) -> StepCosts:
    """The step costs an engine keeps: per padded bucket where it runs static forwards, with the
    packaged step-cost prior of this model shape on this device where one was measured."""
    from selfspec.engine.cost_model import packaged_prior
    from selfspec.run_info import device_name as name_of

    static = runner.static
    prior = None
    if runner.device.type == "cuda":
        prior = packaged_prior(getattr(model, "config", None), device_name or name_of(runner.device))
    return StepCosts(static.buckets.tokens if static is not None else None, prior=prior)
