"""Route finding, version 4 (thinker-data-v4): version 3's items with a reworded search.

The networks, prompts, answers and checker are version 3's (the same random stream, so
the same seed and index give the same item); the CoT runs the same breadth-first search
back from the goal, with the start check after every new hop, but says it differently:

* **No copied listings.** Version 3 copies every line of the prompt at every visit; here a
  visit says where the station sits on each line through it ("On Tram 1, X sits between
  A and B") and names the lines that miss it in one sentence, so the neighbours are still
  written right beside the station without restating the prompt.
* **Varied phrasing.** Every step (the plan, a visit, a neighbour seen before, the start
  check, the reached set and the queue, the route, the end) picks one of several phrasings.
* **Shuffled order where it does not matter.** The lines through a station and the two
  neighbours on a line are taken in a random order, and the reached set is listed in one;
  an order is used only if the search still finds the answer's route (a different order can
  reach a later station from another neighbour first), else the listing's order is.

The hops stay "From N take <line> to <station>", the answer's own lines, and the route is
read off them at the end, so a draft forked after the search holds the answer.
"""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Callable, Mapping, Sequence

from .route_finding import RouteFindingV3, hop_line, ride
from .wording import capitalised, pick, plural, shuffled, spoken_list

ORDER_ATTEMPTS = 4
"""Random visit orders tried before the listing's order (which always finds the route)."""

_TRIPS = (
    "Start: {start}. Goal: {goal}.",
    "The trip is {start} to {goal}.",
    "I need the fewest hops from {start} to {goal}.",
    "From {start}, get to {goal}.",
)
# The plan is put together from short parts, the item's station names at its ends, so no
# part is a whole template sentence that every item repeats.
_PLAN_FROM = (
    "I search back from {goal}",
    "Breadth-first, starting at {goal}",
    "I work outwards from {goal}",
    "Backwards from {goal}, in queue order",
)
_PLAN_VISIT = (
    "each station's neighbours on its lines",
    "at each stop, its neighbours line by line",
    "every line through the station visited",
)
_PLAN_NEW = (
    "a new one gets its hop towards the station",
    "new neighbours become hops",
    "each neighbour not seen yet is written as a hop",
)
_PLAN_STOP = ("until {start} comes up.", "and I check each new one against {start}.", "till {start} turns up.")
_VISITS = ("Visit {here}{note}:", "Now {here}{note}.", "At {here}{note}:", "Next from the queue: {here}{note}.")
_BETWEEN = (
    "On {ride}, {here} sits between {a} and {b}.",
    "{Ride} has {a} and {b} on either side of {here}.",
    "{here}'s neighbours on {ride}: {a}, {b}.",
    "Along {ride}: {a}, then {here}, then {b}.",
)
_END = (
    "On {ride}, {here} is an end stop, next to {a}.",
    "{Ride} ends at {here}; the one neighbour there is {a}.",
    "{here}'s only neighbour on {ride}: {a}.",
    "{here} is the last stop of {ride}, after {a}.",
)
_MISSES = (
    "{here} is not on {either}.",
    "No stop at {here} on {either}.",
    "Skip {lines}: no {here} there.",
    "{Lines} {verb} not serve {here}.",
)
_SEEN = ("{n} already reached", "{n} was reached before.", "{n}: seen already.", "Skip {n}, reached earlier.")
_NOT_START = (
    "Is {n} the start, {start}? no",
    "{n} = {start}? No.",
    "{n} is not {start}, the start.",
    "Start check: {n} vs {start}, no.",
)
_IS_START = (
    "Is {n} the start, {start}? yes: the search stops.",
    "{n} = {start}? Yes, that is the start: stop.",
    "{n} is {start}, the start, so the search ends here.",
    "Start check: {n} vs {start}, yes. Done searching.",
)
_REACHED = ("Reached: {names}", "Reached so far: {names}", "Seen: {names}", "Known stations now: {names}")
_QUEUE = ("Queue: {names}", "Still to visit: {names}", "Next up, in order: {names}", "Waiting: {names}")
_ROUTES = (
    "Route from the start:",
    "Following the hops from {start}:",
    "Reading it off:",
    "From {start} to {goal}, then:",
)
_ENDINGS = (
    "That reaches {goal}, the goal, in {hops}.",
    "{Hops} in all, ending at {goal}.",
    "And that is {goal}: {hops}, the fewest.",
    "So {goal} is {hops} from {start}.",
)

Order = Callable[[Sequence[str]], list[str]]


def _keep(values: Sequence[str]) -> list[str]:
    return list(values)


class RouteFindingV4(RouteFindingV3):
    """Route finding, version 4 (see the module doc): version 3's items, reworded search."""

    version = 4
    stream_version = 3

    def _reworded_cot(
        self,
        rng: random.Random,
        listing: Mapping[str, Sequence[str]],
        start: str,
        goal: str,
        route: Sequence[str],
        cot: str,
    ) -> str:
        for _ in range(ORDER_ATTEMPTS):
            written = self._search(rng, listing, start, goal, route, lambda values: shuffled(rng, values))
            if written is not None:
                return written
        written = self._search(rng, listing, start, goal, route, _keep)
        assert written is not None, "the listing's order is version 3's search, which found the route"
        return written

    @staticmethod
    def _search(
        rng: random.Random,
        listing: Mapping[str, Sequence[str]],
        start: str,
        goal: str,
        route: Sequence[str],
        order: Order,
    ) -> str | None:
        """The search CoT with lines and neighbours taken in `order`; None if that order
        leads to another shortest route than the answer's."""
        trip = pick(rng, _TRIPS, start=start, goal=goal)
        parts = [rng.choice(options) for options in (_PLAN_FROM, _PLAN_VISIT, _PLAN_NEW, _PLAN_STOP)]
        plan = (parts[0] + ": " + rng.choice((", ", "; ")).join(parts[1:3]) + ", " + parts[3]).format(
            start=start, goal=goal
        )
        blocks = [" ".join([trip, plan])]
        reached, queue = [goal], deque([goal])
        towards: dict[str, tuple[str, str]] = {}  # station -> (line, next station towards the goal)
        while start not in towards:
            here = queue.popleft()
            out = [pick(rng, _VISITS, here=here, note=" (the goal)" if here == goal else "")]
            through = [line for line in listing if here in listing[line]]
            missing = [ride(line) for line in listing if line not in through]
            misses = ""
            if missing:
                missing = shuffled(rng, missing)
                names = spoken_list(rng, missing)
                misses = pick(
                    rng,
                    _MISSES,
                    here=here,
                    lines=names,
                    Lines=capitalised(names),
                    either=spoken_list(rng, missing, last="or"),
                    verb="does" if len(missing) == 1 else "do",
                )
            early = bool(misses) and rng.random() < 0.5
            if early:
                out.append(misses)
            for line in order(through):
                stops = listing[line]
                at = stops.index(here)
                neighbours = order([stops[i] for i in (at - 1, at + 1) if 0 <= i < len(stops)])
                fields = {"ride": ride(line), "Ride": capitalised(ride(line)), "here": here}
                if len(neighbours) == 2:
                    out.append(pick(rng, _BETWEEN, a=neighbours[0], b=neighbours[1], **fields))
                else:
                    out.append(pick(rng, _END, a=neighbours[0], **fields))
                for neighbour in neighbours:
                    if neighbour in reached:
                        out.append(pick(rng, _SEEN, n=neighbour))
                        continue
                    reached.append(neighbour)
                    queue.append(neighbour)
                    towards[neighbour] = (line, here)
                    out.append(hop_line(neighbour, line, here))
                    out.append(pick(rng, _IS_START if neighbour == start else _NOT_START, n=neighbour, start=start))
                    if neighbour == start:
                        break
                if start in towards:
                    break
            else:
                if misses and not early:
                    out.append(misses)
                out.append(pick(rng, _REACHED, names=", ".join(shuffled(rng, reached))))
                out.append(pick(rng, _QUEUE, names=", ".join(queue)))
            blocks.append("\n".join(out))
        found, hops = [start], []
        while found[-1] != goal:
            line, nxt = towards[found[-1]]
            hops.append(hop_line(found[-1], line, nxt))
            found.append(nxt)
        if found != list(route):
            return None
        blocks.append(pick(rng, _ROUTES, start=start, goal=goal) + "\n" + "\n".join(hops))
        count = plural(len(hops), "hop")
        blocks.append(pick(rng, _ENDINGS, goal=goal, start=start, hops=count, Hops=capitalised(count)))
        return "\n\n".join(blocks)
