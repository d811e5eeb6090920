"""The demo's shipped prompt is a held-out item of the packaged thinker's own task generator."""

from __future__ import annotations

from selfspec.cli.demo import DEMO_MODEL, default_demo_prompt
from selfspec.models.registry import adapter_data_version
from selfspec_research.thinker.data_versions import DATA_VERSION_LONG_V1, DATA_VERSIONS, HARD_DATA_VERSIONS
from selfspec_research.thinker.tasks import generate


def test_demo_prompt_is_a_held_out_item_of_every_data_version():
    assert DEMO_MODEL == "smollm2-thinker-v4b"
    assert adapter_data_version(DEMO_MODEL) == "thinker-data-v3"
    for name, knobs in DATA_VERSIONS.items():
        if name in (*HARD_DATA_VERSIONS, DATA_VERSION_LONG_V1):  # larger knobs: other items by design
            continue
        assert default_demo_prompt() == generate("class_synthesis", 1000, 3, **knobs["class_synthesis"]).prompt
