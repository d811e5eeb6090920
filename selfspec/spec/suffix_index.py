"""Suffix indexes over named token sources: where speculative continuations come from.

Two structures, one per `SuffixIndex` mode:

* **"tree"** — `CountsTree`, SuffixDecoding's depth-limited counts tree (arXiv
  2411.04975; ArcticInference / vLLM `method: suffix`). Every substring of length
  <= `max_depth` of every source is a path from the root; a node's count is the
  number of occurrences of its string over all sources. Proposals follow the most
  frequent child while the path probability (product of child/parent counts) stays
  >= `min_token_prob`. Because match and proposal share one root-to-leaf path,
  depth 4 proposes at most 3 tokens a step.
* **"longest_match"** — one `SuffixAutomaton` per source. A draft is one contiguous
  text; with no depth cap the longest suffix of the context that occurs in it can be
  arbitrarily long and so can the run that follows it. The context matcher is
  advanced by the context's new tokens only (O(1) amortised per token), so a call
  costs the same for a 50- or 5,000-token source or context.

Tokens are Python ints; contexts are sequences of Python ints (a torch tensor would
hash by identity in the dictionaries used here).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Literal, Sequence

from selfspec.spec.base import ContextCursor

IndexMode = Literal["tree", "longest_match"]
MatchSelection = Literal["score", "longest"]

CONTEXT_SOURCE = "context"
"""Name of the source an index keeps over the context itself (`index_context=True`)."""

_RECENCY_WALK_CAP = 64
"""Suffix-link steps per appended token spent keeping "most recent occurrence" exact.

Natural text needs a handful; only long periodic runs ("a a a a ...") go deeper, and
there a state past the cap keeps an older (still valid) occurrence instead.
"""

_RESYNC_CAP = 256
"""Longest match re-derived when a source grows after the matcher passed its end.

Beyond this a match is already specific enough: the proposal budget saturates long
before (4 * 16 = 64 tokens of match with the paper's factor)."""


@dataclass(frozen=True)
class SpeculationLimits:
    """SuffixDecoding's budget knobs: how much to propose for a match of a given length."""

    max_spec_tokens: int = 16
    spec_factor: float = 4.0
    spec_offset: float = 0.0
    min_token_prob: float = 0.0

    def budget(self, match_len: int, max_tokens: int) -> int:
        """`min(max_spec_tokens, match_len * spec_factor + spec_offset)`, also capped by the caller."""
        by_match = int(match_len * self.spec_factor + self.spec_offset + 1e-6)
        return max(0, min(self.max_spec_tokens, by_match, max_tokens))


@dataclass
class Candidate:
    """One speculation: the tokens, how they were found, and how confident the index is.

    `probs[i]` is the estimated probability of the path up to token i (tree mode;
    1.0 for every token of a contiguous longest match). `score` is their sum, the
    expected number of accepted tokens under the counts model (ArcticInference's score).
    """

    tokens: list[int]
    probs: list[float]
    score: float
    match_len: int
    source: str | None = None


# --------------------------------------------------------------------------- tree mode


class _TrieNode:
    __slots__ = ("token", "children", "count", "best", "stamp")

    def __init__(self, token: int) -> None:
        self.token = token
        self.children: dict[int, _TrieNode] = {}
        self.count = 0
        # Most frequent child (ties: most recently incremented); None = none or unknown
        # after a decrement, recomputed on demand. Keeps proposals O(1) per token.
        self.best: _TrieNode | None = None
        self.stamp = 0


class CountsTree:
    """Depth-limited suffix trie with occurrence counts, aggregated over named sources.

    Appending a token to a source costs O(max_depth): the source keeps its "active"
    nodes (the suffixes of lengths 0..max_depth-1 ending at its last token) and each
    gains a child. Removing a source replays its tokens and subtracts exactly what
    they added, dropping nodes whose count reaches zero.
    """

    def __init__(self, max_depth: int) -> None:
        if max_depth < 2:
            raise ValueError(f"max_depth must be >= 2 (match + proposal), got {max_depth}")
        self.max_depth = max_depth
        self._root = _TrieNode(-1)
        self._tokens: dict[str, list[int]] = {}
        self._active: dict[str, list[_TrieNode]] = {}
        self._clock = 0

    def __contains__(self, name: str) -> bool:
        return name in self._tokens

    @property
    def names(self) -> list[str]:
        return list(self._tokens)

    def length(self, name: str) -> int:
        return len(self._tokens[name])

    @property
    def total_tokens(self) -> int:
        return self._root.count

    def add(self, name: str, tokens: Iterable[int] = ()) -> None:
        if name in self._tokens:
            raise KeyError(f"source {name!r} already exists")
        self._tokens[name] = []
        self._active[name] = [self._root]
        self.extend(name, tokens)

    def extend(self, name: str, tokens: Iterable[int]) -> None:
        source = self._tokens[name]
        active = self._active[name]
        root, depth = self._root, self.max_depth
        for token in tokens:
            token = int(token)
            source.append(token)
            self._clock += 1
            clock = self._clock
            root.count += 1
            next_active = [root]
            for node in active:
                child = node.children.get(token)
                if child is None:
                    child = node.children[token] = _TrieNode(token)
                child.count += 1
                child.stamp = clock
                best = node.best
                if best is None or child.count >= best.count:
                    node.best = child
                if len(next_active) < depth:
                    next_active.append(child)
            active = next_active
        self._active[name] = active

    def remove(self, name: str) -> None:
        tokens = self._tokens.pop(name)
        del self._active[name]
        root, depth = self._root, self.max_depth
        active = [root]
        for token in tokens:
            root.count -= 1
            next_active = [root]
            for node in active:
                child = node.children[token]
                child.count -= 1
                if child.count == 0:
                    del node.children[token]
                if node.best is child:
                    node.best = None
                if len(next_active) < depth:
                    next_active.append(child)
            active = next_active

    def count(self, path: Sequence[int]) -> int:
        """Occurrences of `path` (length <= max_depth) over all sources."""
        node: _TrieNode | None = self._root
        for token in path:
            node = node.children.get(token)
            if node is None:
                return 0
        return node.count

    def speculate(
        self,
        context: Sequence[int],
        limits: SpeculationLimits,
        max_tokens: int,
        select: MatchSelection = "score",
    ) -> Candidate | None:
        """Propose from each matching suffix of `context` (1..max_depth-1 tokens).

        `select="score"` keeps the candidate with the highest score, ties to the
        longer match (ArcticInference); `"longest"` keeps the longest match. None
        when not even the last token occurs.
        """
        n = len(context)
        best: Candidate | None = None
        for match_len in range(1, min(self.max_depth - 1, n) + 1):
            node: _TrieNode | None = self._root
            for i in range(n - match_len, n):
                node = node.children.get(context[i])
                if node is None:
                    return best
            candidate = self._greedy_path(node, limits.budget(match_len, max_tokens), limits.min_token_prob)
            candidate.match_len = match_len
            if select == "longest" or best is None or candidate.score >= best.score:
                best = candidate
        return best

    def _greedy_path(self, node: _TrieNode, budget: int, min_token_prob: float) -> Candidate:
        tokens: list[int] = []
        probs: list[float] = []
        prob = 1.0
        while len(tokens) < budget:
            child = self._best_child(node)
            if child is None:
                break
            prob *= child.count / node.count
            if prob < min_token_prob:
                break
            tokens.append(child.token)
            probs.append(prob)
            node = child
        return Candidate(tokens=tokens, probs=probs, score=sum(probs), match_len=0)

    @staticmethod
    def _best_child(node: _TrieNode) -> _TrieNode | None:
        if node.best is None and node.children:
            node.best = max(node.children.values(), key=lambda c: (c.count, c.stamp))
        return node.best


# ------------------------------------------------------------------ longest-match mode


class SuffixAutomaton:
    """Online suffix automaton of one growing token sequence (Blumer et al.).

    Each state is a class of substrings with the same set of end positions;
    `last_end` / `prev_end` are the two most recent of them, so a match can be
    continued from its most recent occurrence that is not at the very end (one
    that has a continuation). Appending a token is O(1) amortised, plus at most
    `_RECENCY_WALK_CAP` steps keeping `last_end` exact.
    """

    def __init__(self) -> None:
        self.tokens: list[int] = []
        self.next: list[dict[int, int]] = [{}]
        self.link: list[int] = [-1]
        self.length: list[int] = [0]
        self.last_end: list[int] = [-1]
        self.prev_end: list[int] = [-1]
        self.prefix_state: list[int] = []  # state whose longest string is tokens[: i + 1]
        self.last = 0

    def _new_state(self, length: int, link: int, nxt: dict[int, int], last_end: int, prev_end: int) -> int:
        self.next.append(nxt)
        self.link.append(link)
        self.length.append(length)
        self.last_end.append(last_end)
        self.prev_end.append(prev_end)
        return len(self.length) - 1

    def append(self, token: int) -> tuple[int, int] | None:
        """Append one token; return `(split_state, clone)` when a state was split.

        A split moves the strings of `split_state` no longer than `length[clone]`
        into `clone`; matchers sitting on such a string must follow them.
        """
        nxt, link, length = self.next, self.link, self.length
        pos = len(self.tokens)
        self.tokens.append(token)
        cur = self._new_state(length[self.last] + 1, 0, {}, pos, -1)
        p = self.last
        while p != -1 and token not in nxt[p]:
            nxt[p][token] = cur
            p = link[p]
        split = None
        if p != -1:
            q = nxt[p][token]
            if length[p] + 1 == length[q]:
                link[cur] = q
            else:
                clone = self._new_state(length[p] + 1, link[q], dict(nxt[q]), self.last_end[q], self.prev_end[q])
                while p != -1 and nxt[p].get(token) == q:
                    nxt[p][token] = clone
                    p = link[p]
                link[q] = link[cur] = clone
                split = (q, clone)
        self.last = cur
        self.prefix_state.append(cur)
        # Every suffix of the sequence now also ends at `pos`: their states lie on
        # the suffix-link path of `cur`.
        v, steps = link[cur], 0
        while v > 0 and steps < _RECENCY_WALK_CAP:
            self.prev_end[v] = self.last_end[v]
            self.last_end[v] = pos
            v = link[v]
            steps += 1
        return split

    def state_of(self, end: int, match_len: int) -> int:
        """State of the substring of length `match_len` ending at position `end`."""
        v = self.prefix_state[end]
        while self.length[self.link[v]] >= match_len:
            v = self.link[v]
        return v

    def continuable_occurrence(self, state: int, match_len: int) -> tuple[int, int] | None:
        """(end, match_len) of the most recent occurrence followed by >= 1 token.

        Falls back to shorter matches (suffix links) when the match only occurs at
        the end of the sequence; None when nothing but the empty string is left.
        """
        final = len(self.tokens) - 1
        while state > 0:
            end = self.last_end[state]
            if end >= final:
                end = self.prev_end[state]
            if end >= 0:
                return end, match_len
            state = self.link[state]
            match_len = self.length[state]
        return None


class LongestMatchSource:
    """A suffix automaton over one source plus the context's matcher state on it.

    The matcher holds the longest suffix of the context that occurs in the source
    as (state, length). It is advanced by each new context token; a source that
    grows afterwards is reconciled lazily at the next `observe` (see `_RESYNC_CAP`).
    A source that *is* the context (`is_context`) needs no matcher: its longest
    earlier occurrence is found from the automaton's last state.
    """

    def __init__(self, tokens: Iterable[int] = (), is_context: bool = False) -> None:
        self.sam = SuffixAutomaton()
        self.is_context = is_context
        self.state = 0
        self.match_len = 0
        self._synced = False  # matcher must be rebuilt from the context
        self._pending_ends: list[int] = []
        self.extend(tokens)

    def __len__(self) -> int:
        return len(self.sam.tokens)

    def extend(self, tokens: Iterable[int]) -> None:
        sam = self.sam
        for token in tokens:
            split = sam.append(int(token))
            if split is not None and self.state == split[0] and self.match_len <= sam.length[split[1]]:
                self.state = split[1]
            if self._synced:
                self._pending_ends.append(len(sam.tokens) - 1)

    def reset_matcher(self) -> None:
        self.state, self.match_len, self._synced = 0, 0, False
        self._pending_ends.clear()

    def observe(self, context: Sequence[int], new_tokens: Sequence[int]) -> None:
        """Advance the matcher over `new_tokens`, the tail just appended to `context`."""
        if self.is_context:
            return
        if not self._synced:
            # The longest match cannot exceed the source, so its length of context suffices.
            self.state, self.match_len = 0, 0
            self._feed(context[max(0, len(context) - len(self.sam.tokens)) :])
            self._synced = True
            self._pending_ends.clear()
            return
        self._feed(new_tokens)
        if self._pending_ends:
            self._reconcile_growth(context)

    def _feed(self, tokens: Sequence[int]) -> None:
        nxt, link, length = self.sam.next, self.sam.link, self.sam.length
        state, match_len = self.state, self.match_len
        for token in tokens:
            while state and token not in nxt[state]:
                state = link[state]
                match_len = length[state]
            target = nxt[state].get(token)
            if target is None:
                state, match_len = 0, 0
            else:
                state, match_len = target, match_len + 1
        self.state, self.match_len = state, match_len

    def _reconcile_growth(self, context: Sequence[int]) -> None:
        """Matches ending inside tokens appended since the last sync: compare backwards."""
        source, n = self.sam.tokens, len(context)
        for end in self._pending_ends:
            limit = min(end + 1, n, _RESYNC_CAP)
            common = 0
            while common < limit and context[n - 1 - common] == source[end - common]:
                common += 1
            if common > self.match_len:
                self.state, self.match_len = self.sam.state_of(end, common), common
        self._pending_ends.clear()

    def candidate(self, limits: SpeculationLimits, max_tokens: int) -> Candidate | None:
        sam = self.sam
        if self.is_context:
            found = sam.continuable_occurrence(sam.last, len(sam.tokens))
        else:
            found = sam.continuable_occurrence(self.state, self.match_len) if self.match_len else None
        if found is None:
            return None
        end, match_len = found
        tokens = sam.tokens[end + 1 : end + 1 + limits.budget(match_len, max_tokens)]
        return Candidate(tokens=tokens, probs=[1.0] * len(tokens), score=float(len(tokens)), match_len=match_len)


# ------------------------------------------------------------------------------ facade


class SuffixIndex:
    """Named token sources for one request, queried with the request's context.

    Sources ("draft:0", "prompt", ...) can be added, grown by appends and removed.
    With `index_context=True` the index also keeps a source named `CONTEXT_SOURCE`
    over the context itself, grown from each call's new tokens (SuffixDecoding's
    per-request prompt + output tree).

    In "longest_match" mode every source is queried and the longest match wins;
    ties go to the most recently added source (a later draft saw more of the chain
    of thought). One source per call, never a splice of two.
    """

    def __init__(self, mode: IndexMode = "tree", max_depth: int = 4, index_context: bool = False) -> None:
        if mode not in ("tree", "longest_match"):
            raise ValueError(f"unknown suffix index mode {mode!r}")
        self.mode: IndexMode = mode
        self.index_context = index_context
        self._tree = CountsTree(max_depth) if mode == "tree" else None
        self._matchers: dict[str, LongestMatchSource] = {}
        self._cursor = ContextCursor()
        if index_context:
            self._add(CONTEXT_SOURCE, (), is_context=True)

    # -- sources

    def add_source(self, name: str, tokens: Iterable[int] = ()) -> None:
        if name == CONTEXT_SOURCE and self.index_context:
            raise KeyError(f"{CONTEXT_SOURCE!r} is reserved for the indexed context")
        self._add(name, tokens, is_context=False)

    def _add(self, name: str, tokens: Iterable[int], is_context: bool) -> None:
        if name in self:
            raise KeyError(f"source {name!r} already exists")
        if self._tree is not None:
            self._tree.add(name, tokens)
        else:
            self._matchers[name] = LongestMatchSource(tokens, is_context=is_context)

    def extend_source(self, name: str, tokens: Iterable[int]) -> None:
        if self._tree is not None:
            self._tree.extend(name, tokens)
        else:
            self._matchers[name].extend(tokens)

    def remove_source(self, name: str) -> None:
        if self._tree is not None:
            self._tree.remove(name)
        else:
            del self._matchers[name]

    def __contains__(self, name: str) -> bool:
        return name in self._tree if self._tree is not None else name in self._matchers

    @property
    def source_names(self) -> list[str]:
        return self._tree.names if self._tree is not None else list(self._matchers)

    def source_length(self, name: str) -> int:
        return self._tree.length(name) if self._tree is not None else len(self._matchers[name])

    @property
    def tree(self) -> CountsTree:
        """The counts tree (tree mode only), for inspection and tests."""
        if self._tree is None:
            raise AttributeError("a longest_match index has no counts tree")
        return self._tree

    # -- queries

    def reset_context(self) -> None:
        """Forget the context seen so far (a new or rolled-back sequence)."""
        self._cursor.reset()
        for source in self._matchers.values():
            source.reset_matcher()
        if self.index_context:
            if self._tree is not None:
                self._tree.remove(CONTEXT_SOURCE)
                self._tree.add(CONTEXT_SOURCE)
            else:  # replaced in place: keeps its age for the newest-wins tie rule
                self._matchers[CONTEXT_SOURCE] = LongestMatchSource(is_context=True)

    def speculate(
        self,
        context: Sequence[int],
        limits: SpeculationLimits,
        max_tokens: int,
        select: MatchSelection = "score",
    ) -> Candidate | None:
        if self.index_context or self._matchers:
            self._sync(context)
        if self._tree is not None:
            return self._tree.speculate(context, limits, max_tokens, select)
        best: Candidate | None = None
        for name, source in self._matchers.items():
            candidate = source.candidate(limits, max_tokens)
            if candidate is not None and (best is None or candidate.match_len >= best.match_len):
                candidate.source = name
                best = candidate
        return best

    def _sync(self, context: Sequence[int]) -> None:
        if not self._cursor.is_continuation(context):
            self.reset_context()
        new_tokens = self._cursor.advance(context)
        if self.index_context and new_tokens:
            self.extend_source(CONTEXT_SOURCE, new_tokens)
        for source in self._matchers.values():
            source.observe(context, new_tokens)
