"""The tokenizer check: a tokenizer built wrongly (transformers 5.17 and Gemma-3's GGUF) is
caught before it feeds the model prompts cut into pieces it never saw, and the loader
recovers: a given `--tokenizer` directory, or a rebuild once transformers gets it right.

The tokenizers here are real `tokenizers` objects with a 16K+ vocabulary, one that keeps
words whole and one that cuts every character apart (the failure seen on the GPU machine:
2.5 characters a token instead of 5.6).
"""

from __future__ import annotations

import json
import types

import pytest
from transformers import PreTrainedTokenizerFast

from selfspec.models import TokenizerDefectError, load_model
from selfspec.models import gguf as gguf_module
from selfspec.models import loader as loader_module
from selfspec.models.tokenizer_check import MIN_JUDGED_VOCAB, PROBE_TEXT, tokenizer_problems
from selfspec.testing.tiny import tiny_model

BOS = "<bos>"


def _tokenizer(*, whole_words: bool, bos: bool, vocab_size: int = MIN_JUDGED_VOCAB + 100) -> PreTrainedTokenizerFast:
    """A WordLevel tokenizer over `vocab_size` pieces: words whole, or one piece a character."""
    from tokenizers import Regex, Tokenizer, models, pre_tokenizers, processors

    if whole_words:
        pieces = sorted({w for w in PROBE_TEXT.replace(".", " . ").replace(",", " , ").split()} | {".", ","})
        pre = pre_tokenizers.Sequence([pre_tokenizers.WhitespaceSplit(), pre_tokenizers.Punctuation()])
    else:
        pieces = sorted(set(PROBE_TEXT) - {" "})
        pre = pre_tokenizers.Split(Regex(r"\S"), behavior="isolated")
    names = ["<unk>", BOS, "<eos>", *pieces]
    names += [f"filler{i}" for i in range(vocab_size - len(names))]
    backend = Tokenizer(models.WordLevel({name: i for i, name in enumerate(names)}, unk_token="<unk>"))
    backend.pre_tokenizer = pre
    if bos:
        backend.post_processor = processors.TemplateProcessing(single=f"{BOS} $A", special_tokens=[(BOS, 1)])
    return PreTrainedTokenizerFast(tokenizer_object=backend, bos_token=BOS, eos_token="<eos>", unk_token="<unk>")


def test_a_tokenizer_that_keeps_words_whole_passes():
    good = _tokenizer(whole_words=True, bos=True)
    assert good(PROBE_TEXT)["input_ids"][0] == good.bos_token_id
    assert tokenizer_problems(good, expects_bos=True) == []
    assert tokenizer_problems(_tokenizer(whole_words=True, bos=False), expects_bos=False) == []


def test_a_tokenizer_that_cuts_characters_apart_is_caught():
    broken = _tokenizer(whole_words=False, bos=False)
    problems = tokenizer_problems(broken)
    assert len(problems) == 1 and "characters a token" in problems[0]


def test_a_missing_or_unwanted_bos_is_caught_when_the_model_says_which():
    no_bos = _tokenizer(whole_words=True, bos=False)
    assert tokenizer_problems(no_bos) == []  # unknown expectation: not judged
    assert "adds no <bos>" in tokenizer_problems(no_bos, expects_bos=True)[0]
    assert "adds a <bos>" in tokenizer_problems(_tokenizer(whole_words=True, bos=True), expects_bos=False)[0]


def test_small_vocabularies_are_not_judged_by_compression():
    assert tokenizer_problems(_tokenizer(whole_words=False, bos=False, vocab_size=500)) == []


@pytest.fixture
def gguf_with_broken_tokenizer(tmp_path, monkeypatch):
    """A fake .gguf whose conversion gives a working model and, from this 'transformers', the
    character-cutting tokenizer (no <bos>, though the GGUF asks for one); `fixed()` makes the
    installed transformers build it right, as an upgrade would."""
    path = tmp_path / "src" / "model.gguf"
    path.parent.mkdir()
    path.write_bytes(b"GGUF fake")
    state = {"fixed": False, "model_reads": 0, "tokenizer_builds": 0}

    def build_tokenizer(gguf_path):
        state["tokenizer_builds"] += 1
        return _tokenizer(whole_words=state["fixed"], bos=state["fixed"])

    def fake_load_gguf(gguf_path):
        state["model_reads"] += 1
        tokenizer = build_tokenizer(gguf_path)
        model = tiny_model("llama", len(tokenizer), seed=3, eos_token_id=tokenizer.eos_token_id)
        model.hf_quantizer = types.SimpleNamespace(is_serializable=lambda: False)
        return model, tokenizer

    # The conversion (models.gguf) and the loader's rebuild of a cached conversion both read the GGUF.
    monkeypatch.setattr(gguf_module, "load_gguf", fake_load_gguf)
    monkeypatch.setattr(gguf_module, "load_gguf_tokenizer", build_tokenizer)
    monkeypatch.setattr(gguf_module, "gguf_adds_bos", lambda gguf_path: True)
    monkeypatch.setattr(loader_module, "load_gguf_tokenizer", build_tokenizer)
    monkeypatch.setattr(loader_module, "gguf_adds_bos", lambda gguf_path: True)
    return path, state


def test_a_broken_gguf_tokenizer_is_refused_with_the_ways_out(gguf_with_broken_tokenizer, tmp_path):
    path, state = gguf_with_broken_tokenizer
    cache = tmp_path / "cache"
    with pytest.raises(TokenizerDefectError, match="--tokenizer") as error:
        load_model(str(path), cache_dir=cache)
    assert "characters a token" in str(error.value) and "adds no <bos>" in str(error.value)
    # The weights were converted and kept; the wrong tokenizer was not saved, and the record says why.
    (converted,) = (cache / "models").iterdir()
    assert (converted / "model.safetensors").is_file() and not (converted / "tokenizer.json").exists()
    record = json.loads((converted / "selfspec_source.json").read_text())
    assert record["gguf_add_bos_token"] is True and len(record["tokenizer_problems"]) == 2
    assert state["model_reads"] == 1


def test_a_given_tokenizer_directory_replaces_the_broken_one(gguf_with_broken_tokenizer, tmp_path):
    path, state = gguf_with_broken_tokenizer
    given = tmp_path / "tok"
    _tokenizer(whole_words=True, bos=True).save_pretrained(given)
    loaded = load_model(str(path), cache_dir=tmp_path / "cache", tokenizer=given)
    assert loaded.tokenizer(PROBE_TEXT)["input_ids"] == _tokenizer(whole_words=True, bos=True)(PROBE_TEXT)["input_ids"]
    assert f"tokenizer from {given}" in loaded.source
    with pytest.raises(ValueError, match="not a tokenizer directory"):
        load_model(str(path), cache_dir=tmp_path / "cache", tokenizer=tmp_path / "nowhere")
    broken = tmp_path / "broken-tok"
    _tokenizer(whole_words=False, bos=False).save_pretrained(broken)
    with pytest.raises(TokenizerDefectError):
        load_model(str(path), cache_dir=tmp_path / "cache", tokenizer=broken)


def test_once_transformers_builds_it_right_the_cache_heals(gguf_with_broken_tokenizer, tmp_path):
    path, state = gguf_with_broken_tokenizer
    cache = tmp_path / "cache"
    with pytest.raises(TokenizerDefectError):
        load_model(str(path), cache_dir=cache)
    state["fixed"] = True  # an upgraded transformers
    healed = load_model(str(path), cache_dir=cache)
    assert healed.tokenizer(PROBE_TEXT)["input_ids"][0] == healed.tokenizer.bos_token_id
    (converted,) = (cache / "models").iterdir()
    assert (converted / "tokenizer.json").is_file()
    assert json.loads((converted / "selfspec_source.json").read_text())["tokenizer_problems"] == []
    builds = state["tokenizer_builds"]
    again = load_model(str(path), cache_dir=cache)
    assert state["tokenizer_builds"] == builds and state["model_reads"] == 1  # read from the cache now
    assert again.tokenizer(PROBE_TEXT)["input_ids"] == healed.tokenizer(PROBE_TEXT)["input_ids"]
