"""Generated task items are pinned: the same (family, version, seed, index, knobs) gives the
same item, byte for byte, whatever the code that builds it looks like.

Why: an adapter's manifest names the data version it was trained on, and the held-out
splits are named by seed; both mean something only while the generators reproduce the
items they made when the data was named. `data/golden_task_items.json` holds what the
generators produced: a SHA-256 per group of items (every built-in data version, every
family, three seeds, and class items with all ten methods, which reach every probe of
every concept) and five whole items, so a failure shows where an item changed. The file is
never regenerated to make a test pass: a change that alters items is a new family version
(`TaskFamily.version`), and the items of the old one stay as pinned here.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from selfspec_research.thinker.tasks import generate

GOLDEN = json.loads((Path(__file__).with_name("data") / "golden_task_items.json").read_text())


@pytest.mark.parametrize("group", GOLDEN["groups"], ids=lambda g: f"{g['label']}-{g['family']}-s{g['seed']}")
def test_item_groups_are_unchanged(group):
    digest = hashlib.sha256()
    for index in range(group["count"]):
        item = generate(group["family"], group["seed"], index, **group["knobs"])
        digest.update(json.dumps(item.to_dict(), sort_keys=True).encode())
    assert digest.hexdigest() == group["sha256"]


@pytest.mark.parametrize("pinned", GOLDEN["items"], ids=lambda p: f"{p['item']['family']}-{len(p['knobs'])}knobs")
def test_whole_items_are_unchanged(pinned):
    expected = pinned["item"]
    item = generate(expected["family"], expected["seed"], expected["index"], **pinned["knobs"])
    assert json.loads(json.dumps(item.to_dict())) == expected
