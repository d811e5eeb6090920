"""Where the host's time between forwards goes, per engine step, by phase.

Why: on a GPU a small model's forward is ~1.4 ms and the engine's Python around it 0.05-0.2 ms
per step, and a speculation policy that saves forwards can lose them again there (on an H100
the default policy's forwards cost no more GPU time than prompt lookup's, while its time
between forwards was 0.05-0.11 ms more per forward). A per-request host sum says how much, not
where; these accumulators say which part of a step it is, at four clock reads per step.

Phases of `Engine.step`:
- `propose`: from the step's start to its forward's: scheduling, every row's proposal, grammar masks;
- `commit`: from the forward's end to the policies: verification, commits, settles, siblings;
- `policies`: the policies' `on_step` (bookkeeping, drafts forked or cancelled, gate verdicts);
- `outside`: from the previous step's end to this one's start: the caller's loop (streaming,
  results, admissions), counted only where the gap is not idling (the same rule as the step costs'
  host time: at most `HOST_GAP_FACTOR` times the forward).
"""

from __future__ import annotations

from selfspec.engine.step_costs import HOST_GAP_FACTOR

PHASES = ("propose", "commit", "policies", "outside")


class HostPhases:
    """Accumulated host seconds per phase and the steps they came from (`reset` between runs)."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.seconds = dict.fromkeys(PHASES, 0.0)
        self.steps = 0
        self._last_end: float | None = None

    def add(self, began: float, forward_start: float, forward_end: float, committed: float, ended: float) -> None:
        """One step's clock readings: start, forward start and end, commits done, step end."""
        seconds = self.seconds
        seconds["propose"] += forward_start - began
        seconds["commit"] += committed - forward_end
        seconds["policies"] += ended - committed
        if self._last_end is not None and began - self._last_end <= HOST_GAP_FACTOR * (forward_end - forward_start):
            seconds["outside"] += began - self._last_end
        self._last_end = ended
        self.steps += 1

    def summary(self) -> dict[str, float]:
        """Milliseconds per step by phase (empty before a step), for bench records."""
        if not self.steps:
            return {}
        return {name: round(1000 * value / self.steps, 4) for name, value in self.seconds.items()}
