"""Responses kept for `previous_response_id` and `GET /v1/responses/{id}`: in memory, bounded.

A stored response keeps the whole conversation that produced it (every earlier turn's input and
output items, then its own input), so continuing it needs only this one entry: evicting an older
response of the same chain breaks nothing. The store is an LRU (a lookup refreshes an entry) of
at most `capacity` responses; the oldest go first. Nothing survives a restart, as a local server
has no database to keep them in. Used from the event loop's thread only, so it takes no lock.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

DEFAULT_CAPACITY = 1000


@dataclass
class StoredResponse:
    response: dict[str, Any]  # the response object as the client received it
    context: list[Any] = field(default_factory=list)  # input items up to and including this request's


class ResponseStore:
    def __init__(self, capacity: int = DEFAULT_CAPACITY) -> None:
        if capacity < 1:
            raise ValueError("the response store needs room for at least one response")
        self.capacity = capacity
        self._entries: OrderedDict[str, StoredResponse] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def put(self, entry: StoredResponse) -> None:
        key = entry.response["id"]
        self._entries[key] = entry
        self._entries.move_to_end(key)
        while len(self._entries) > self.capacity:
            self._entries.popitem(last=False)

    def get(self, response_id: str) -> StoredResponse | None:
        entry = self._entries.get(response_id)
        if entry is not None:
            self._entries.move_to_end(response_id)
        return entry

    def delete(self, response_id: str) -> bool:
        return self._entries.pop(response_id, None) is not None
