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

Each step is also counted by the rows it fed (one, two, three or more): a request that drafts runs
its draft as a second row for part of its chain of thought, and a per-request mean cannot say
whether the extra host time is in those steps or spread over all of them.
"""

from __future__ import annotations

from selfspec.engine.step_costs import HOST_GAP_FACTOR

PHASES = ("propose", "commit", "policies", "outside")
ROW_GROUPS = ("1", "2", "3+")
"""How steps are grouped by the rows they fed (`HostPhases.by_rows`)."""


def _row_group(rows: int) -> str:
    return "1" if rows <= 1 else "2" if rows == 2 else "3+"


class HostPhases:
    """Accumulated host seconds per phase and the steps they came from (`reset` between runs)."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.seconds = dict.fromkeys(PHASES, 0.0)
        self.steps = 0
        # Per row group: [propose, commit, policies, outside seconds, steps].
        self._by_rows: dict[str, list[float]] = {group: [0.0] * (len(PHASES) + 1) for group in ROW_GROUPS}
        self._last_end: float | None = None

    def add(
        self, began: float, forward_start: float, forward_end: float, committed: float, ended: float, rows: int = 1
    ) -> None:
        """One step's clock readings: start, forward start and end, commits done, step end; and
        the rows its forward fed."""
        seconds = self.seconds
        propose, commit, policies = forward_start - began, committed - forward_end, ended - committed
        outside = 0.0
        if self._last_end is not None and began - self._last_end <= HOST_GAP_FACTOR * (forward_end - forward_start):
            outside = began - self._last_end
        seconds["propose"] += propose
        seconds["commit"] += commit
        seconds["policies"] += policies
        seconds["outside"] += outside
        group = self._by_rows[_row_group(rows)]
        group[0] += propose
        group[1] += commit
        group[2] += policies
        group[3] += outside
        group[4] += 1
        self._last_end = ended
        self.steps += 1

    def summary(self) -> dict[str, float]:
        """Milliseconds per step by phase (empty before a step), for bench records."""
        if not self.steps:
            return {}
        return {name: round(1000 * value / self.steps, 4) for name, value in self.seconds.items()}

    def by_rows(self) -> dict[str, dict[str, float]]:
        """Per row group that ran a step: its steps and milliseconds per step by phase (bench
        records: where a drafting request's extra host time goes)."""
        out: dict[str, dict[str, float]] = {}
        for group, values in self._by_rows.items():
            steps = values[-1]
            if steps:
                out[group] = {"steps": int(steps)}
                out[group].update({name: round(1000 * values[i] / steps, 4) for i, name in enumerate(PHASES)})
        return out
