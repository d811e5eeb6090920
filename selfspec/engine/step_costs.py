"""What a forward costs on the device the engine runs on, measured as it runs.

A speculation policy that may add work to a step (SSR's draft rides as one more row in every
step while it drafts; a verify chunk feeds k tokens instead of one) pays off only where that
extra work is cheap next to what it saves. How cheap differs by orders of magnitude between
devices: on an H200 a second decode row costs ~1-5% of a step, on a 2-core CPU it was measured
anywhere from 6% to 110% depending on the BLAS path. So the engine does not assume: it keeps
the wall time of its own forwards by shape, and policies read the ratios.

Only homogeneous steps are recorded (every row feeds the same number of tokens), so a sample
is the cost of exactly one shape: `rows` rows of `tokens` tokens each. Medians over a window
keep a noisy machine's stalls (another process, a page fault) out of the estimate.
"""

from __future__ import annotations

import statistics
from collections import deque

WINDOW = 48
"""Samples kept per shape: enough for a stable median, few enough to follow a change of load."""
MIN_SAMPLES = 4
"""Samples a shape needs before its median is used."""


def _bucket(tokens: int) -> int:
    """Token counts rounded up to a power of two: verify chunks of 33 and 40 cost alike."""
    return 1 if tokens <= 1 else 1 << (tokens - 1).bit_length()


class StepCosts:
    """Wall seconds per forward and fed token, by (rows, tokens per row bucket), over the last
    `WINDOW` steps of each. For decode steps (one token per row) that is the step's time."""

    def __init__(self) -> None:
        self._samples: dict[tuple[int, int], deque[float]] = {}

    def observe(self, row_tokens: list[int], seconds: float) -> None:
        """One step ran rows feeding `row_tokens` tokens each in `seconds`. Mixed steps are
        ignored: their time belongs to no single shape."""
        if not row_tokens or seconds <= 0 or min(row_tokens) != max(row_tokens):
            return
        key = (len(row_tokens), _bucket(row_tokens[0]))
        samples = self._samples.get(key)
        if samples is None:
            samples = self._samples[key] = deque(maxlen=WINDOW)
        samples.append(seconds / row_tokens[0])

    def seconds(self, rows: int, tokens: int = 1, min_samples: int = MIN_SAMPLES) -> float | None:
        """Median seconds of a step of `rows` rows of `tokens` tokens each (from the steps of the
        same token bucket); None until measured."""
        samples = self._samples.get((rows, _bucket(tokens)))
        if samples is None or len(samples) < min_samples:
            return None
        return statistics.median(samples) * tokens

    def row_cost(self, rows: int) -> float | None:
        """What one more row adds to a step of `rows` rows, as a fraction of that step (0.05: 5%
        slower), at the tokens-per-row bucket the engine ran most often in both shapes. Plain SSR
        decodes (one token per row); composed with speculation in the thinking, parent and draft
        both verify several tokens per step, and rare one-token steps are no measure of those.
        None until both shapes of some bucket are measured."""
        best: tuple[int, int] | None = None  # (samples of the scarcer shape, bucket)
        for r, bucket in self._samples:
            if r != rows or (rows + 1, bucket) not in self._samples:
                continue
            count = min(len(self._samples[(rows, bucket)]), len(self._samples[(rows + 1, bucket)]))
            if count < MIN_SAMPLES:
                continue
            if best is None or (count, -bucket) > (best[0], -best[1]):
                best = (count, bucket)
        if best is None:
            return None
        base, more = self.seconds(rows, best[1]), self.seconds(rows + 1, best[1])
        return max(0.0, more / base - 1.0)

    def verify_token_cost(self) -> float | None:
        """Seconds per token of the longest measured one-row verify chunk, as a fraction of a
        one-row decode step (0.1: a 64-token verify costs 6.4 decode steps). None until measured."""
        decode = self.seconds(1)
        if decode is None:
            return None
        buckets = sorted(t for r, t in self._samples if r == 1 and t > 1)
        if not buckets:
            return None
        per_token = statistics.median(self._samples[(1, buckets[-1])])
        return per_token / decode

    def step_seconds(self, min_samples: int = MIN_SAMPLES) -> dict[tuple[int, int], float]:
        """Median seconds of a step per measured shape (rows, tokens-per-row bucket), taking a
        row's tokens as its bucket: the points a cost model of all shapes is fitted to."""
        return {
            (rows, bucket): statistics.median(s) * bucket
            for (rows, bucket), s in self._samples.items()
            if len(s) >= min_samples
        }

    def summary(self) -> dict[str, float]:
        """Median milliseconds per fed token and shape bucket ("2x1": two rows of one token, a
        decode step; "1x64": one row of 33-64 tokens), for reports."""
        return {
            f"{rows}x{tokens}": round(1000 * statistics.median(s), 3)
            for (rows, tokens), s in sorted(self._samples.items())
            if s
        }
