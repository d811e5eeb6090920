"""Route finding: the fewest-hop route through a transit network described in text.

The network is built around a planted route: consecutive line segments from start to
goal, plus dead-end spurs and detour loops that rejoin the route later but are strictly
longer, so the shortest route is unique (verified by BFS path counting). The CoT walks
forward from the start; at each station it rules out the other branches (dead end,
longer loop, already visited) and writes the hop, so a draft forked after k steps holds
k hops. The checker validates every hop against the network and the length against
the shortest.

Version 2 (`RouteFindingV2`, in thinker-data-v2): 5-8 stations on 2-4 lines and a
breadth-first search written out step by step, bounded by construction (see the comment
before `build_small_network`). All versions share the checker. Version 3 adds a start
check after every new hop; version 4 (`route_finding_v4`, in thinker-data-v4) is version 3's
items with the search worded differently from item to item.
"""

from __future__ import annotations

import random
import re
from collections import deque
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from . import vocab
from .base import CheckResult, TaskFamily, TaskItem, estimate_tokens, final_answer_text, require_range

ALL_STATIONS = tuple(f"{a} {b}" for a in vocab.STATION_FIRST for b in vocab.STATION_SECOND)
HOP_PATTERN = re.compile(r"^From (.+?) take (.+?) to (.+?)\.?$")


@dataclass(frozen=True)
class _Branch:
    """A side chain hanging off the route: a dead-end spur or a loop between route stations."""

    kind: str  # "spur" | "loop"
    line: str
    chain: tuple[str, ...]  # the chain's own stations, from the route outward
    start: int  # route index it leaves from
    end: int | None = None  # route index a loop rejoins at


@dataclass
class Network:
    lines: dict[str, list[str]]
    route: list[str]
    route_lines: list[str]  # line of hop k (route[k] -> route[k+1])
    # (route station, first chain station) -> branch; a one-station loop touches two
    # route stations, so the station alone would not say which way the chain runs
    branches: dict[tuple[str, str], _Branch] = field(default_factory=dict)


def _line_names(rng: random.Random) -> Iterator[str]:
    names = [f"{colour} Line" for colour in vocab.LINE_COLOURS]
    names += [f"Bus {n}" for n in rng.sample(range(2, 99), 30)]
    names += [f"Tram {n}" for n in rng.sample(range(1, 30), 12)]
    rng.shuffle(names)
    return iter(names)


def ride(line: str) -> str:
    """How a hop names the line: "the Amber Line" but "Bus 12"."""
    return f"the {line}" if line.endswith(" Line") else line


def _normalise_line(text: str) -> str:
    text = text.strip()
    return text[4:] if text.lower().startswith("the ") else text


def adjacency(lines: Mapping[str, Sequence[str]]) -> dict[str, set[tuple[str, str]]]:
    """station -> {(neighbour, line)}: consecutive stops of a line are neighbours."""
    adj: dict[str, set[tuple[str, str]]] = {}
    for line, stops in lines.items():
        for a, b in zip(stops, stops[1:]):
            adj.setdefault(a, set()).add((b, line))
            adj.setdefault(b, set()).add((a, line))
    return adj


def shortest_paths(lines: Mapping[str, Sequence[str]], start: str, goal: str) -> tuple[int, int]:
    """(hops, number of distinct station paths with that many hops) by BFS."""
    adj = adjacency(lines)
    distance, ways = {start: 0}, {start: 1}
    queue = deque([start])
    while queue:
        station = queue.popleft()
        for neighbour in {n for n, _ in adj.get(station, ())}:
            if neighbour not in distance:
                distance[neighbour] = distance[station] + 1
                ways[neighbour] = ways[station]
                queue.append(neighbour)
            elif distance[neighbour] == distance[station] + 1:
                ways[neighbour] += ways[station]
    return distance.get(goal, -1), ways.get(goal, 0)


def build_network(rng: random.Random, hops: int, spur_rate: float, loop_rate: float) -> Network:
    """A network whose unique shortest route from route[0] to route[-1] has `hops` hops."""
    fresh = iter(rng.sample(ALL_STATIONS, hops + 1 + 8 * hops + 16))
    names = _line_names(rng)
    route = [next(fresh) for _ in range(hops + 1)]
    lines: dict[str, list[str]] = {}
    route_lines: list[str] = []
    branches: dict[tuple[str, str], _Branch] = {}

    def spur(line: str, at: int) -> list[str]:
        chain = [next(fresh) for _ in range(rng.randint(1, 3))]
        branches[(route[at], chain[0])] = _Branch("spur", line, tuple(chain), at)
        return chain

    start = 0
    while start < hops:  # the route: consecutive segments, each on its own line
        end = min(hops, start + rng.randint(2, 6))
        line = next(names)
        stops = route[start : end + 1]
        if rng.random() < spur_rate:
            stops = spur(line, start)[::-1] + stops
        if rng.random() < spur_rate:
            stops = stops + spur(line, end)
        lines[line] = stops
        route_lines += [line] * (end - start)
        start = end
    for _ in range(round(hops * spur_rate / 2)):  # crossing lines: dead ends both sides
        at = rng.randint(0, hops)
        line = next(names)
        left = spur(line, at)
        right = spur(line, at) if rng.random() < 0.6 else []
        lines[line] = left[::-1] + [route[at]] + right
    for _ in range(round(hops * loop_rate)):  # loops: rejoin later, strictly longer
        span = rng.randint(1, 3)
        first = rng.randint(0, hops - span)
        line = next(names)
        chain = [next(fresh) for _ in range(rng.randint(span, span + 2))]
        branches[(route[first], chain[0])] = _Branch("loop", line, tuple(chain), first, first + span)
        branches[(route[first + span], chain[-1])] = _Branch("loop", line, tuple(reversed(chain)), first + span, first)
        lines[line] = [route[first], *chain, route[first + span]]
    for line in lines:  # how a line is listed is not a hint about the route's direction
        if rng.random() < 0.5:
            lines[line].reverse()
    length, ways = shortest_paths(lines, route[0], route[-1])
    if (length, ways) != (hops, 1):
        raise RuntimeError(f"planted route is not the unique shortest: {length} hops, {ways} ways")
    return Network(lines, route, route_lines, branches)


def hop_line(origin: str, line: str, destination: str) -> str:
    return f"From {origin} take {ride(line)} to {destination}"


_LINE_STYLES = (
    "{line}: {stops}",
    "The {line} runs {stops}",
    "{line} stops (in order): {stops}",
)
_SEPARATORS = (", ", " - ", " > ")


class RouteFinding(TaskFamily):
    """Generator + checker for the route-finding family.

    Knobs: `min_hops`/`max_hops` of the shortest route (grown, up to twice `max_hops`,
    until the answer reaches `min_answer_tokens`), `spur_rate` and `loop_rate`
    (distractor branches per route segment / per hop).
    """

    name = "route_finding"
    version = 1

    def __init__(
        self,
        min_hops: int = 15,
        max_hops: int = 36,
        spur_rate: float = 0.35,
        loop_rate: float = 0.15,
        min_answer_tokens: int = 200,
    ) -> None:
        require_range("hops", min_hops, max_hops, floor=2)
        self.min_hops, self.max_hops = min_hops, max_hops
        self.spur_rate, self.loop_rate = spur_rate, loop_rate
        self.min_answer_tokens = min_answer_tokens

    def knobs(self) -> dict[str, Any]:
        return {
            "min_hops": self.min_hops,
            "max_hops": self.max_hops,
            "spur_rate": self.spur_rate,
            "loop_rate": self.loop_rate,
            "min_answer_tokens": self.min_answer_tokens,
        }

    # ------------------------------------------------------------------ generation
    def build(self, rng: random.Random) -> tuple[str, str, str, dict[str, Any]]:
        hops = rng.randint(self.min_hops, self.max_hops)
        while True:
            network = build_network(rng, hops, self.spur_rate, self.loop_rate)
            hop_lines = [hop_line(network.route[k], network.route_lines[k], network.route[k + 1]) for k in range(hops)]
            answer = "\n".join(hop_lines)
            if estimate_tokens(answer) >= self.min_answer_tokens or hops >= 2 * self.max_hops:
                break
            hops += 2
        prompt = self._prompt(rng, network)
        cot = self._cot(rng, network, hop_lines)
        meta = {
            "lines": network.lines,
            "start": network.route[0],
            "goal": network.route[-1],
            "shortest_hops": hops,
            "route": network.route,
        }
        return prompt, cot, answer, meta

    @staticmethod
    def _prompt(rng: random.Random, network: Network) -> str:
        style = rng.choice(_LINE_STYLES)
        separator = rng.choice(_SEPARATORS)
        listed = list(network.lines.items())
        rng.shuffle(listed)
        described = [
            style.format(line=ride(line) if style.startswith("The") else line, stops=separator.join(stops))
            for line, stops in listed
        ]
        if style.startswith("The"):
            described = [text[0].upper() + text[1:] for text in described]
        start, goal = network.route[0], network.route[-1]
        return "\n".join(
            [
                rng.choice(
                    (
                        "Here is a transit network. Every line runs in both directions.",
                        "A city's trains, trams and buses are listed below; each runs both ways.",
                        "The lines of a transit system, with their stops in order (services run both ways):",
                    )
                ),
                "",
                *described,
                "",
                "A hop is a ride between two neighbouring stops of one line.",
                f"Find the route from {start} to {goal} with the fewest hops.",
                'Answer with one hop per line, exactly in the form "From <station> take <line> to <station>", '
                'for example "From A take the Red Line to B" or "From B take Bus 7 to C".',
            ]
        )

    @staticmethod
    def _describe_branch(network: Network, branch: _Branch, here: int) -> str:
        chain = list(branch.chain)
        head = f"{chain[0]} ({ride(branch.line)})"
        if branch.kind == "spur":
            if len(chain) == 1:
                return f"{head} is the end of that line: a dead end."
            return f"{head} leads only on to {', '.join(chain[1:])} and stops: a dead end."
        assert branch.end is not None
        if branch.end < here:
            return f"{head} loops back to {network.route[branch.end]}, where I have already been."
        loop_hops = len(chain) + 1
        direct = branch.end - here
        via = ", ".join(network.route[here + 1 : branch.end + 1])
        return (
            f"{head} loops via {', '.join(chain[1:]) or 'nothing else'} to {network.route[branch.end]} in "
            f"{loop_hops} hops, but {network.route[branch.end]} is {direct} hop{'s' if direct > 1 else ''} "
            f"away through {via}: longer, skip."
        )

    def _cot(self, rng: random.Random, network: Network, hop_lines: Sequence[str]) -> str:
        route = network.route
        adj = adjacency(network.lines)
        start, goal = route[0], route[-1]
        blocks = [
            f"Start: {start}. Goal: {goal}. I will walk forward from {start}; at every station I "
            "look at each way out, drop branches that dead-end or loop back the long way, and "
            "write the hop once only one sensible way is left."
        ]
        for k, line in enumerate(network.route_lines):
            here, nxt = route[k], route[k + 1]
            options = sorted((n, via) for n, via in adj[here] if k == 0 or n != route[k - 1])
            rng.shuffle(options)
            listed = ", ".join(f"{n} ({ride(via)})" for n, via in options)
            lead = f"Step {k + 1}: at {here}" + (" (start)" if k == 0 else "") + "."
            if len(options) == 1:
                text = f"{lead} Only one way on: {listed}."
            else:
                came = f" besides {route[k - 1]}" if k > 0 else ""
                text = f"{lead} Ways out{came}: {listed}."
                notes = [self._describe_branch(network, network.branches[(here, n)], k) for n, _ in options if n != nxt]
                text += " " + " ".join(notes)
                text += f" That leaves {nxt}."
            if k > 0 and network.route_lines[k - 1] != line:
                text += f" Change from {ride(network.route_lines[k - 1])} to {ride(line)} here."
            blocks.append(f"{text}\n{hop_lines[k]}")
        blocks.append(
            f"Reached {goal} after {len(hop_lines)} hops. Every branch I passed was a dead end "
            "or a longer loop, so no shorter route exists."
        )
        return "\n\n".join(blocks)

    # -------------------------------------------------------------------- checking
    def check(self, item: TaskItem, answer_text: str) -> CheckResult:
        lines = {name: list(stops) for name, stops in item.meta["lines"].items()}
        by_lower = {name.lower(): name for name in lines}
        adj = adjacency(lines)
        start, goal = item.meta["start"], item.meta["goal"]
        shortest = int(item.meta["shortest_hops"])
        reference = list(zip(item.meta["route"], item.meta["route"][1:]))

        hops: list[tuple[str, str, str]] = []
        for raw in final_answer_text(answer_text).splitlines():
            text = raw.strip().strip("`").strip()
            if not text.startswith("From "):
                continue
            match = HOP_PATTERN.match(text)
            if not match:
                return CheckResult(False, 0.0, f"unparseable hop: {text!r}")
            origin, line, destination = (part.strip() for part in match.groups())
            hops.append((origin, by_lower.get(_normalise_line(line).lower(), _normalise_line(line)), destination))
        score = _lcs([(a, b) for a, _, b in hops], reference) / len(reference)
        if not hops:
            return CheckResult(False, 0.0, "no hops found")
        position = start
        for number, (origin, line, destination) in enumerate(hops, start=1):
            if origin != position:
                return CheckResult(False, score, f"hop {number} starts at {origin}, but the route is at {position}")
            if (destination, line) not in adj.get(origin, set()):
                return CheckResult(False, score, f"hop {number}: {line} does not go from {origin} to {destination}")
            position = destination
        if position != goal:
            return CheckResult(False, score, f"route ends at {position}, not {goal}")
        if len(hops) != shortest:
            return CheckResult(False, score, f"valid route of {len(hops)} hops; the shortest has {shortest}")
        return CheckResult(True, 1.0, f"shortest route, {shortest} hops")


def _lcs(a: Sequence[Any], b: Sequence[Any]) -> int:
    previous = [0] * (len(b) + 1)
    for x in a:
        current = [0] * (len(b) + 1)
        for j, y in enumerate(b, start=1):
            current[j] = previous[j - 1] + 1 if x == y else max(previous[j], current[j - 1])
        previous = current
    return previous[-1]


# ------------------------------------------------------------------------ version 2
# Version 2: a small network (5-8 stations on 2-4 lines) listed one line per row as
# "Line: A - B - C", and a CoT that runs a breadth-first search back from the goal as
# bounded, explicit steps. Each visit copies every line of the listing verbatim (so a
# station's neighbours are the names right beside it in text just written), writes for
# each new neighbour N the hop "From N take <line> to <station>" (the hop towards the
# goal), notes neighbours reached before instead of adding them again, and writes the
# queue; no station is visited twice. The search stops as soon as the start is reached;
# the route is then the chain of hop notes from the start, each a copy of one note
# (found by its "From <station> take" prefix), so it comes out in forward order.

_V2_STATION_FIRST = tuple(word for word in vocab.STATION_FIRST if word not in vocab.LINE_COLOURS)


def _v2_edges(lines: Mapping[str, Sequence[str]]) -> list[frozenset[str]]:
    return [frozenset(pair) for stops in lines.values() for pair in zip(stops, stops[1:])]


def build_small_network(rng: random.Random, n_stations: int, n_lines: int) -> dict[str, list[str]]:
    """A connected network of `n_stations` stations (distinct first words) on `n_lines`
    lines; every line after the first shares 1-2 stations with the earlier ones, and no
    two lines serve the same pair of neighbouring stations."""
    if n_stations < n_lines + 1:
        raise ValueError(f"{n_lines} lines need at least {n_lines + 1} stations")
    while True:
        stations = [
            f"{first} {rng.choice(vocab.STATION_SECOND)}" for first in rng.sample(_V2_STATION_FIRST, n_stations)
        ]
        counts = [2] + [1] * (n_lines - 1)  # new stations per line
        for _ in range(n_stations - sum(counts)):
            counts[rng.randrange(n_lines)] += 1
        names = _line_names(rng)
        fresh = iter(stations)
        lines: dict[str, list[str]] = {}
        covered: list[str] = []
        for count in counts:
            new = [next(fresh) for _ in range(count)]
            stops = list(new)
            if covered:
                stops += rng.sample(covered, min(len(covered), rng.choice((1, 1, 2))))
                rng.shuffle(stops)
            lines[next(names)] = stops
            covered += new
        edges = _v2_edges(lines)
        if len(edges) == len(set(edges)):
            return lines


def bfs_distances(lines: Mapping[str, Sequence[str]], start: str) -> dict[str, int]:
    adj = adjacency(lines)
    distance = {start: 0}
    queue = deque([start])
    while queue:
        station = queue.popleft()
        for neighbour, _ in sorted(adj.get(station, ())):
            if neighbour not in distance:
                distance[neighbour] = distance[station] + 1
                queue.append(neighbour)
    return distance


class RouteFindingV2(RouteFinding):
    """Route finding, version 2 (see the comment above): small networks, bounded BFS CoT.

    Knobs: `min_stations`/`max_stations`, `min_lines`/`max_lines`, and `min_hops` (the
    start and goal are a farthest-apart pair of the network, at least `min_hops` apart).
    """

    version = 2

    def __init__(
        self,
        min_stations: int = 5,
        max_stations: int = 8,
        min_lines: int = 2,
        max_lines: int = 4,
        min_hops: int = 2,
    ) -> None:
        require_range("stations", min_stations, max_stations, floor=3)
        require_range("lines", min_lines, max_lines)
        if min_stations < max_lines + 1:
            raise ValueError(f"min_stations must be above max_lines ({max_lines} lines need {max_lines + 1} stations)")
        if not 1 <= min_hops <= min_stations - 1:
            raise ValueError(f"min_hops must be within [1, min_stations - 1], got {min_hops}")
        self.min_stations, self.max_stations = min_stations, max_stations
        self.min_lines, self.max_lines = min_lines, max_lines
        self.min_hops = min_hops

    def knobs(self) -> dict[str, Any]:
        return {
            "min_stations": self.min_stations,
            "max_stations": self.max_stations,
            "min_lines": self.min_lines,
            "max_lines": self.max_lines,
            "min_hops": self.min_hops,
        }

    # ------------------------------------------------------------------ generation
    def build(self, rng: random.Random) -> tuple[str, str, str, dict[str, Any]]:
        n_stations = rng.randint(self.min_stations, self.max_stations)
        n_lines = rng.randint(self.min_lines, min(self.max_lines, n_stations - 1))
        for _ in range(10_000):
            lines = build_small_network(rng, n_stations, n_lines)
            for line in lines:  # how a line is listed says nothing about the route's direction
                if rng.random() < 0.5:
                    lines[line].reverse()
            distances = {station: bfs_distances(lines, station) for station in adjacency(lines)}
            far = max(d for row in distances.values() for d in row.values())
            if far >= self.min_hops:
                break
        else:
            raise RuntimeError(
                f"no network of {n_stations} stations on {n_lines} lines has a {self.min_hops}-hop route"
            )
        pairs = sorted((a, b) for a, row in distances.items() for b, d in row.items() if d == far)
        start, goal = rng.choice(pairs)
        listed = list(lines.items())
        rng.shuffle(listed)
        listing = {line: stops for line, stops in listed}
        cot, route, route_lines = self._v2_cot(listing, start, goal)
        hop_lines = [hop_line(route[k], route_lines[k], route[k + 1]) for k in range(len(route_lines))]
        answer = "\n".join(hop_lines)
        prompt = self._v2_prompt(rng, listing, start, goal)
        cot = self._reworded_cot(rng, listing, start, goal, route, cot)
        meta = {
            "lines": listing,
            "start": start,
            "goal": goal,
            "shortest_hops": far,
            "route": route,
        }
        return prompt, cot, answer, meta

    @staticmethod
    def _v2_prompt(rng: random.Random, listing: Mapping[str, Sequence[str]], start: str, goal: str) -> str:
        return "\n".join(
            [
                rng.choice(
                    (
                        "Here is a transit network. Every line runs in both directions.",
                        "A city's trains, trams and buses are listed below; each runs both ways.",
                        "The lines of a transit system, with their stops in order (services run both ways):",
                    )
                ),
                "",
                *(f"{line}: {' - '.join(stops)}" for line, stops in listing.items()),
                "",
                "A hop is a ride between two neighbouring stops of one line.",
                f"Find the route from {start} to {goal} with the fewest hops.",
                'Answer with one hop per line, exactly in the form "From <station> take <line> to <station>", '
                'for example "From A take the Red Line to B" or "From B take Bus 7 to C".',
            ]
        )

    check_start = False
    """Version 3: every new hop is followed by its own start check (see `RouteFindingV3`)."""

    def _reworded_cot(
        self,
        rng: random.Random,
        listing: Mapping[str, Sequence[str]],
        start: str,
        goal: str,
        route: Sequence[str],
        cot: str,
    ) -> str:
        """The CoT as written, `cot`: versions 2 and 3 keep their fixed wording, so `rng` goes
        unused. A version that rewords the CoT draws its phrasing from `rng` here, after the
        prompt, and must find the same `route` (the answer)."""
        return cot

    @classmethod
    def _v2_cot(cls, listing: Mapping[str, Sequence[str]], start: str, goal: str) -> tuple[str, list[str], list[str]]:
        """The BFS CoT from the goal, and the route it finds (stations, line of each hop)."""
        blocks = [
            f"Start: {start}. Goal: {goal}. I search back from the goal, visiting stations in the order "
            "they are reached. At each visit I copy every line; for each neighbour of the station on a "
            "line I write the hop from that neighbour to the station, unless the neighbour was reached "
            "before. When the start is reached, its hops lead to the goal."
        ]
        reached, queue = [goal], deque([goal])
        towards: dict[str, tuple[str, str]] = {}  # station -> (line, next station towards the goal)
        while start not in towards:
            here = queue.popleft()
            out = [f"Visit {here}" + (" (the goal)" if here == goal else "") + ":"]
            for line, stops in listing.items():
                out.append(f"{line}: {' - '.join(stops)}")
                if here not in stops:
                    out.append(f"no {here} on it")
                    continue
                at = stops.index(here)
                for neighbour in [stops[i] for i in (at - 1, at + 1) if 0 <= i < len(stops)]:
                    if neighbour in reached:
                        out.append(f"{neighbour} already reached")
                        continue
                    reached.append(neighbour)
                    queue.append(neighbour)
                    towards[neighbour] = (line, here)
                    out.append(hop_line(neighbour, line, here))
                    if cls.check_start:
                        verdict = "yes: the search stops." if neighbour == start else "no"
                        out.append(f"Is {neighbour} the start, {start}? {verdict}")
                    elif neighbour == start:
                        out.append(f"{start} is the start: the search stops.")
                    if neighbour == start:
                        break
                if start in towards:
                    break
            else:
                out.append("Reached: " + ", ".join(reached))
                out.append("Queue: " + ", ".join(queue))
            blocks.append("\n".join(out))
        route, route_lines = [start], []
        while route[-1] != goal:
            line, nxt = towards[route[-1]]
            route_lines.append(line)
            route.append(nxt)
        hops = [hop_line(route[k], route_lines[k], route[k + 1]) for k in range(len(route_lines))]
        blocks.append("Route from the start, following the hops:\n" + "\n".join(hops))
        blocks.append(f"That reaches {goal}, the goal, in {len(hops)} hop{'s' if len(hops) != 1 else ''}.")
        return "\n\n".join(blocks), route, route_lines


# ------------------------------------------------------------------------ version 3
class RouteFindingV3(RouteFindingV2):
    """Route finding, version 3: version 2's networks, prompt and answers; in the CoT every
    new hop "From N take <line> to <station>" is followed by "Is N the start, <start>? no"
    (or "yes: the search stops.").

    Why: in version 2 the search stops when the model recognises, unprompted, that the
    name it just copied is the start given at the top of the CoT. A small model that writes
    the hop to the start but not the stop line searches on over a queue that no longer
    changes, and loops. Here the decision is asked every time with both names written
    right before the answer, so it is a copy-and-compare of adjacent text, like every other
    step of the CoT.
    """

    version = 3
    check_start = True
