"""The tiny offline models and tokenizer that the engine tests build on."""

import pytest
import torch

from selfspec.testing.tiny import (
    FAMILIES,
    IM_END,
    SPECIAL_TOKENS,
    save_tiny_model_dir,
    tiny_model,
    tiny_tokenizer,
)


@pytest.fixture(scope="module")
def tokenizer():
    return tiny_tokenizer()


def test_tokenizer_specials_are_single_tokens(tokenizer):
    for token in SPECIAL_TOKENS:
        ids = tokenizer.encode(token, add_special_tokens=False)
        assert len(ids) == 1, token
        assert tokenizer.convert_ids_to_tokens(ids[0]) == token
    assert tokenizer.eos_token == IM_END
    assert tokenizer.pad_token_id != tokenizer.eos_token_id
    assert 300 <= len(tokenizer) <= 500


def test_tokenizer_round_trips_any_text(tokenizer):
    text = "déjà vu: 42 → ∑ <think>x</think>\n\tend"
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert tokenizer.decode(ids) == text


def test_tokenizer_is_reproducible():
    a, b = tiny_tokenizer(), tiny_tokenizer()
    assert a.get_vocab() == b.get_vocab()
    assert a is not b


def test_chat_template_thinking_switch(tokenizer):
    messages = [{"role": "user", "content": "Hi"}]
    on = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False, enable_thinking=True)
    off = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False, enable_thinking=False)
    default = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert on == default == "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    assert off == on + "<think>\n\n</think>\n\n"


def test_chat_template_renders_past_reasoning(tokenizer):
    messages = [
        {"role": "user", "content": "Q"},
        {"role": "assistant", "content": "A", "reasoning_content": "\nwhy\n"},
    ]
    text = tokenizer.apply_chat_template(messages, tokenize=False)
    assert text.endswith("<|im_start|>assistant\n<think>\nwhy\n</think>\n\nA<|im_end|>\n")


@pytest.mark.parametrize("family", FAMILIES)
def test_tiny_model_is_deterministic_per_seed(family, tokenizer):
    ids = torch.tensor([tokenizer.encode("def add(a, b):\n    return a + b\n" * 2, add_special_tokens=False)])
    with torch.no_grad():
        first = tiny_model(family, len(tokenizer), seed=3)(ids).logits
        again = tiny_model(family, len(tokenizer), seed=3)(ids).logits
        other = tiny_model(family, len(tokenizer), seed=4)(ids).logits
    assert torch.equal(first, again)
    assert not torch.allclose(first, other)
    assert first.shape == (1, ids.shape[1], len(tokenizer))
    # A wide init keeps argmax decisions robust: logits spread by several units.
    assert first.std() > 1.0


def test_tiny_model_leaves_global_rng_alone(tokenizer):
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    tiny_model("llama", len(tokenizer), seed=9)
    assert torch.equal(torch.rand(3), expected)


def test_tiny_model_settings(tokenizer):
    model = tiny_model("gemma3", len(tokenizer), num_layers=3, hidden=32, dtype=torch.bfloat16)
    assert model.config.sliding_window == 8
    assert model.config.layer_types == ["full_attention", "sliding_attention", "full_attention"]
    assert model.config._attn_implementation == "sdpa"
    assert next(model.parameters()).dtype == torch.bfloat16
    assert not model.training
    assert not any(p.requires_grad for p in model.parameters())

    qwen = tiny_model("qwen3", len(tokenizer), sliding_window=4)
    assert "sliding_attention" in qwen.config.layer_types
    assert tiny_model("qwen3", len(tokenizer)).config.layer_types == ["full_attention"] * 2
    with pytest.raises(ValueError, match="sliding"):
        tiny_model("llama", len(tokenizer), sliding_window=4)
    with pytest.raises(ValueError, match="family"):
        tiny_model("gpt2", len(tokenizer))


def test_gemma3_sliding_window_changes_long_context_logits(tokenizer):
    """Past the window the sliding layer must see less: the same model with a huge
    window gives different logits at late positions and equal ones inside the window."""
    ids = torch.tensor([tokenizer.encode("The quick brown fox jumps over the lazy dog.", add_special_tokens=False)])
    assert ids.shape[1] > 8
    with torch.no_grad():
        windowed = tiny_model("gemma3", len(tokenizer), sliding_window=8)(ids).logits
        wide = tiny_model("gemma3", len(tokenizer), sliding_window=4096)(ids).logits
    assert torch.allclose(windowed[:, :8], wide[:, :8], atol=1e-5)
    assert not torch.allclose(windowed[:, -1], wide[:, -1], atol=1e-3)


def test_save_tiny_model_dir_writes_a_loadable_checkpoint(tmp_path, tokenizer):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = save_tiny_model_dir(tmp_path / "tiny", "qwen3", seed=1)
    model = AutoModelForCausalLM.from_pretrained(path, local_files_only=True)
    loaded_tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
    assert model.generation_config.eos_token_id == tokenizer.eos_token_id
    assert loaded_tokenizer.chat_template == tokenizer.chat_template
    ids = torch.tensor([tokenizer.encode("hello world", add_special_tokens=False)])
    with torch.no_grad():
        expected = tiny_model("qwen3", len(tokenizer), seed=1)(ids).logits
        assert torch.allclose(model(ids).logits, expected, atol=1e-6)
