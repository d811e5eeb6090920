"""Tiny, offline, deterministic models and a tokenizer for tests.

No model hub is reachable, and engine tests must run in seconds on two CPU cores, so
every engine test builds its model here: a random-weight `transformers` model of a real
family (Llama, Qwen3, Gemma-3 with sliding + full layers; the hybrid linear-attention
Qwen3.5 and Qwen3-Next; Gemma-4 text with per-layer head dims, shared K/V and per-layer
input embeddings as in its E-series) and a small byte-level BPE
tokenizer with a Qwen3-like ChatML template that has `<think>`/`</think>` as single
tokens. Weights are drawn with a wide init so logits are far from ties: the engine's
exactness tests compare argmax tokens between decoding modes, and near-ties would make
them flaky under different (but equally correct) reduction orders.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Literal

import torch
from transformers import AutoModelForCausalLM, PreTrainedModel, PreTrainedTokenizerFast

Family = Literal["llama", "qwen3", "gemma3", "qwen3_5", "qwen3_next", "gemma4"]
FAMILIES: tuple[str, ...] = ("llama", "qwen3", "gemma3", "qwen3_5", "qwen3_next", "gemma4")
HYBRID_FAMILIES: tuple[str, ...] = ("qwen3_5", "qwen3_next")
"""Families with linear-attention (Gated DeltaNet) layers beside full attention."""

IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
THINK_START = "<think>"
THINK_END = "</think>"
PAD = "<pad>"
SPECIAL_TOKENS: tuple[str, ...] = (PAD, IM_START, IM_END, THINK_START, THINK_END)

TINY_VOCAB_TARGET = 420
"""Requested BPE vocabulary size: 256 bytes + specials + ~160 merges."""

DEFAULT_GEMMA3_SLIDING_WINDOW = 8
"""Small enough that ordinary test sequences cross the window."""

DEFAULT_INITIALIZER_RANGE = 0.3

# Qwen3's template, reduced to what tests need: ChatML turns, reasoning in past assistant
# turns, `enable_thinking=False` emitting an empty think block in the generation prompt, and
# Qwen3's tool format (a system turn listing the tools, `<tool_call>` JSON in assistant turns,
# tool results as `<tool_response>` in user turns).
TINY_CHAT_TEMPLATE = (
    "{%- if tools -%}"
    "{{- '<|im_start|>system\\n# Tools\\n\\nYou may call functions. Signatures within <tools></tools>:\\n<tools>' -}}"
    "{%- for tool in tools -%}{{- '\\n' + (tool | tojson) -}}{%- endfor -%}"
    '{{- \'\\n</tools>\\n\\nReturn each call as <tool_call>\\n{"name": <function-name>, '
    '"arguments": <args-json-object>}\\n</tool_call><|im_end|>\\n\' -}}'
    "{%- endif -%}"
    "{%- for message in messages -%}"
    "{%- if message['role'] == 'tool' -%}"
    "{{- '<|im_start|>user\\n<tool_response>\\n' + message['content'] + '\\n</tool_response><|im_end|>\\n' -}}"
    "{%- else -%}"
    "{{- '<|im_start|>' + message['role'] + '\\n' -}}"
    "{%- if message['role'] == 'assistant' and message['reasoning_content'] is defined"
    " and message['reasoning_content'] -%}"
    "{{- '<think>\\n' + message['reasoning_content'].strip('\\n') + '\\n</think>\\n\\n' -}}"
    "{%- endif -%}"
    "{{- message['content'] -}}"
    "{%- if message['tool_calls'] is defined and message['tool_calls'] -%}"
    "{%- for call in message['tool_calls'] -%}"
    "{%- set call = call['function'] if call['function'] is defined else call -%}"
    "{{- '\\n<tool_call>\\n{\"name\": \"' + call['name'] + '\", \"arguments\": ' -}}"
    "{{- call['arguments'] if call['arguments'] is string else (call['arguments'] | tojson) -}}"
    "{{- '}\\n</tool_call>' -}}"
    "{%- endfor -%}"
    "{%- endif -%}"
    "{{- '<|im_end|>\\n' -}}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}"
    "{{- '<|im_start|>assistant\\n' -}}"
    "{%- if enable_thinking is defined and enable_thinking is false -%}"
    "{{- '<think>\\n\\n</think>\\n\\n' -}}"
    "{%- endif -%}"
    "{%- endif -%}"
)

_CORPUS = """
The quick brown fox jumps over the lazy dog. A tiny model thinks before it answers.
Let me think step by step. First, add the numbers: 12 + 30 = 42. Then check the result.
So the answer is 42. The answer is correct because 42 - 30 = 12.
def add(a, b):
    return a + b

class Counter:
    def __init__(self):
        self.count = 0

    def step(self, n=1):
        self.count += n
        return self.count

for i in range(10):
    print(i, i * i)
user: What is the capital of France? assistant: The capital of France is Paris.
system: You are a helpful assistant. Answer briefly and think carefully.
We need to find the shortest route from A to B, then from B to C, and return the cost.
Records: name=Alice, age=30; name=Bob, age=25; name=Carol, age=41.
If x > 3 and y < 7 then z = x * y else z = 0. Verify: 4 * 5 = 20, 2 * 9 = 18.
Hello, world! How are you today? I am fine, thank you. Good morning and good night.
0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 100 1000
"""


@functools.lru_cache(maxsize=1)
def _tiny_tokenizer_json() -> str:
    """Train the BPE once per process; callers get fresh tokenizer objects from it."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=TINY_VOCAB_TARGET,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    corpus_lines = [line for line in _CORPUS.splitlines(keepends=True) if line.strip()]
    tokenizer.train_from_iterator(corpus_lines * 4, trainer=trainer)
    return tokenizer.to_str()


def tiny_tokenizer() -> PreTrainedTokenizerFast:
    """A fresh byte-level BPE tokenizer (~420 tokens) with a Qwen3-like chat template.

    Special tokens: `<pad>` (pad), `<|im_start|>`, `<|im_end|>` (eos), `<think>`,
    `</think>`, each a single id. No BOS token is added, as with Qwen3. Any text,
    including unseen characters, round-trips through the byte-level alphabet.
    """
    from tokenizers import Tokenizer

    backend = Tokenizer.from_str(_tiny_tokenizer_json())
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        eos_token=IM_END,
        pad_token=PAD,
        additional_special_tokens=[IM_START, THINK_START, THINK_END],
        clean_up_tokenization_spaces=False,
        model_max_length=4096,
    )
    tokenizer.chat_template = TINY_CHAT_TEMPLATE
    return tokenizer


def _layer_types(num_layers: int, sliding: bool) -> list[str]:
    """Alternate sliding and full layers, ending on a full layer so both kinds exist."""
    if not sliding:
        return ["full_attention"] * num_layers
    return ["full_attention" if (num_layers - 1 - i) % 2 == 0 else "sliding_attention" for i in range(num_layers)]


def tiny_config(
    family: Family,
    vocab_size: int,
    *,
    num_layers: int = 2,
    hidden: int = 64,
    sliding_window: int | None = None,
    eos_token_id: int | None = None,
    pad_token_id: int | None = None,
    initializer_range: float = DEFAULT_INITIALIZER_RANGE,
):
    """The `PretrainedConfig` behind `tiny_model` (exposed for tests that need variants)."""
    if family not in FAMILIES:
        raise ValueError(f"unknown tiny model family {family!r}; expected one of {FAMILIES}")
    if hidden % 4 != 0:
        raise ValueError(f"hidden must be a multiple of 4 (4 attention heads), got {hidden}")
    heads, kv_heads = 4, 2
    common = dict(
        vocab_size=vocab_size,
        hidden_size=hidden,
        intermediate_size=hidden * 2,
        num_hidden_layers=num_layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=hidden // heads,
        max_position_embeddings=4096,
        initializer_range=initializer_range,
        tie_word_embeddings=False,
        eos_token_id=eos_token_id,
        pad_token_id=pad_token_id,
        bos_token_id=None,
    )
    if family == "llama":
        from transformers import LlamaConfig

        if sliding_window is not None:
            raise ValueError("Llama has no sliding-window attention; use qwen3 or gemma3")
        return LlamaConfig(**common)
    if family == "qwen3":
        from transformers import Qwen3Config

        sliding = sliding_window is not None
        return Qwen3Config(
            **common,
            use_sliding_window=sliding,
            sliding_window=sliding_window,
            max_window_layers=num_layers,
            layer_types=_layer_types(num_layers, sliding),
        )
    if family in HYBRID_FAMILIES:
        return _hybrid_config(family, common, num_layers)
    if family == "gemma4":
        return _gemma4_config(common, num_layers, sliding_window)
    from transformers import Gemma3TextConfig

    window = DEFAULT_GEMMA3_SLIDING_WINDOW if sliding_window is None else sliding_window
    return Gemma3TextConfig(
        **common,
        query_pre_attn_scalar=hidden // heads,
        sliding_window=window,
        layer_types=_layer_types(num_layers, sliding=True),
    )


def _hybrid_layer_types(num_layers: int) -> list[str]:
    """Linear-attention layers with a full-attention layer every second layer, ending on one
    (the published models have one in four; two layers in four keep tiny models cheap)."""
    if num_layers < 2:
        raise ValueError("a hybrid model needs at least 2 layers (linear + full attention)")
    return ["full_attention" if i % 2 == 1 else "linear_attention" for i in range(num_layers)]


def _hybrid_config(family: str, common: dict, num_layers: int):
    """Qwen3.5 text or Qwen3-Next (a small MoE): Gated DeltaNet with GQA on its q/k heads."""
    linear = dict(
        layer_types=_hybrid_layer_types(num_layers),
        linear_conv_kernel_dim=4,
        linear_key_head_dim=8,
        linear_value_head_dim=8,
        linear_num_key_heads=2,
        linear_num_value_heads=4,
    )
    if family == "qwen3_5":
        from transformers import Qwen3_5TextConfig

        return Qwen3_5TextConfig(**common, **linear)
    from transformers import Qwen3NextConfig

    return Qwen3NextConfig(
        **common,
        **linear,
        num_experts=4,
        num_experts_per_tok=2,
        moe_intermediate_size=common["hidden_size"] // 2,
        shared_expert_intermediate_size=common["hidden_size"] // 2,
        decoder_sparse_step=1,
    )


def _gemma4_config(common: dict, num_layers: int, sliding_window: int | None):
    """Gemma-4 text, E-series shape: sliding and full layers alternate (full layers with twice the
    head dim), per-layer input embeddings, and from 4 layers on the last third of the layers (an
    even number, at least 2) reuse earlier K/V."""
    from transformers import Gemma4TextConfig

    if num_layers < 2:
        raise ValueError("a tiny Gemma-4 needs at least 2 layers (one sliding, one full)")
    shared = max(2, num_layers // 3) // 2 * 2 if num_layers >= 4 else 0
    return Gemma4TextConfig(
        **common,
        layer_types=["full_attention" if i % 2 == 1 else "sliding_attention" for i in range(num_layers)],
        sliding_window=DEFAULT_GEMMA3_SLIDING_WINDOW if sliding_window is None else sliding_window,
        global_head_dim=2 * common["head_dim"],
        num_kv_shared_layers=shared,
        hidden_size_per_layer_input=8,
        vocab_size_per_layer_input=common["vocab_size"],
        final_logit_softcapping=30.0,
    )


def tiny_model(
    family: Family,
    vocab_size: int,
    *,
    seed: int = 0,
    num_layers: int = 2,
    hidden: int = 64,
    sliding_window: int | None = None,
    dtype: torch.dtype = torch.float32,
    eos_token_id: int | None = None,
    pad_token_id: int | None = None,
    initializer_range: float = DEFAULT_INITIALIZER_RANGE,
) -> PreTrainedModel:
    """A random-weight causal LM of a real family, deterministic per `seed`, in eval mode.

    `gemma3` defaults to `sliding_window=8` with alternating sliding/full layers (last
    layer full); `qwen3` uses sliding layers only when `sliding_window` is given; `llama`
    rejects it. `qwen3_5` / `qwen3_next` alternate linear-attention and full layers (at least
    2); `gemma4` shares K/V from 4 layers on. Attention is SDPA. The global torch RNG is left
    untouched.
    """
    config = tiny_config(
        family,
        vocab_size,
        num_layers=num_layers,
        hidden=hidden,
        sliding_window=sliding_window,
        eos_token_id=eos_token_id,
        pad_token_id=pad_token_id,
        initializer_range=initializer_range,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa", dtype=torch.float32)
    model = model.to(dtype)
    if eos_token_id is not None:
        model.generation_config.eos_token_id = eos_token_id
        model.generation_config.pad_token_id = pad_token_id
    model.eval()
    model.requires_grad_(False)
    return model


def bigram_model(vocab_size: int, *, seed: int = 5, num_layers: int = 2, **kwargs) -> PreTrainedModel:
    """A tiny llama whose attention output is zeroed: its next token depends on the current
    token only, so the answer after the end of thinking is the same whatever the CoT and SSR's
    drafts match (the acceptance paths get exercised). `kwargs` go to `tiny_model`."""
    model = tiny_model("llama", vocab_size, seed=seed, num_layers=num_layers, **kwargs)
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.zero_()
    return model


def save_tiny_model_dir(
    path: str | Path,
    family: Family,
    *,
    seed: int = 0,
    num_layers: int = 2,
    hidden: int = 64,
    sliding_window: int | None = None,
    dtype: torch.dtype = torch.float32,
    zero_attention: bool = False,
) -> Path:
    """Write a tiny model + `tiny_tokenizer()` as a local HF directory (safetensors).

    The config and generation config carry the tokenizer's eos/pad ids, like a real
    checkpoint, so loaders and stop conditions can be tested against it. `zero_attention`
    zeroes every attention output projection: each position's logits then depend on its own
    token only (a bigram model), so an answer after the end-of-thinking marker does not depend
    on the CoT and SSR's drafts match, as a real thinker's do (the vLLM tests and benchmark).
    """
    target = Path(path)
    tokenizer = tiny_tokenizer()
    model = tiny_model(
        family,
        len(tokenizer),
        seed=seed,
        num_layers=num_layers,
        hidden=hidden,
        sliding_window=sliding_window,
        dtype=dtype,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    if zero_attention:
        with torch.no_grad():
            for layer in model.model.layers:
                layer.self_attn.o_proj.weight.zero_()
    target.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(target, safe_serialization=True)
    tokenizer.save_pretrained(target)
    return target
