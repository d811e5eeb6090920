"""Rewritten layer forwards inside the engine's fused forwards: residual adds fused into the norms
after them (`engine.residual_fusion`) and q/k norms inside the rotary call (`engine.qk_norm_rope`).
The same logits, the fused paths really taken, and layers of any other shape left alone."""

from __future__ import annotations

import inspect

import pytest
import torch

from selfspec.engine import qk_norm_rope, residual_fusion
from selfspec.engine.fusion import LAYER_REWRITES_ENV, compile_pointwise_modules, fused, unfused_copy
from selfspec.engine.llm_engine import Engine, EngineConfig
from selfspec.engine.sampling import SamplingParams
from selfspec.testing.reference import greedy_reference, random_prompts, run_to_finish
from selfspec.testing.tiny import tiny_model

VOCAB = 96


def _layers(model: torch.nn.Module) -> torch.nn.ModuleList:
    return model.model.layers


@pytest.mark.parametrize("arch", ["llama", "qwen3", "qwen3_5", "qwen3_next"])
def test_fused_layers_give_the_eager_logits_and_hand_over_every_norm(arch, monkeypatch):
    model = tiny_model(arch, VOCAB, seed=3, num_layers=4)
    ids = torch.randint(0, VOCAB, (2, 11), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        want = model(ids).logits
        wrapped = compile_pointwise_modules(model, backend="aot_eager")
        assert any(name.endswith("DecoderLayer.residual+norm") for name in wrapped)
        taken = []
        take = residual_fusion._take_pending

        def counting(norm, hidden):
            ready = take(norm, hidden)
            taken.append(ready is not None)
            return ready

        monkeypatch.setattr(residual_fusion, "_take_pending", counting)
        rotated = []
        norm_rope_for = qk_norm_rope._norm_rope_for
        monkeypatch.setattr(qk_norm_rope, "_norm_rope_for", lambda m, b: rotated.append(m) or norm_rope_for(m, b))
        with fused():
            got = model(ids).logits
        # Every input norm after the first layer and the final norm took the sum's norm.
        assert sum(taken) == len(_layers(model))
        if arch != "llama":  # q/k norms: every full-attention layer rotates its normed heads in one call
            attentions = [m for m in model.modules() if type(m).__name__.endswith("Attention") and hasattr(m, "q_norm")]
            assert attentions and rotated == attentions
            assert any(name.endswith("Attention.qk_norm+rope") for name in wrapped)
        assert torch.equal(got, want)
        taken.clear()
        assert torch.equal(model(ids).logits, want)  # outside `fused()`: the layers' own code
        assert not any(taken)


def test_gemma3_norms_of_their_own_go_into_the_rotary_call(monkeypatch):
    """Gemma-3 norms q and k in statements of their own, after the transposes; its sandwich-norm
    layers keep their residual adds."""
    model = tiny_model("gemma3", VOCAB, seed=3, num_layers=3)
    ids = torch.randint(0, VOCAB, (2, 11), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        want = model(ids).logits
        wrapped = compile_pointwise_modules(model, backend="aot_eager")
        assert "Gemma3Attention.qk_norm+rope" in wrapped and not any("residual" in n for n in wrapped)
        rotated = []
        norm_rope_for = qk_norm_rope._norm_rope_for
        monkeypatch.setattr(qk_norm_rope, "_norm_rope_for", lambda m, b: rotated.append(m) or norm_rope_for(m, b))
        with fused():
            assert torch.equal(model(ids).logits, want)
        assert len(rotated) == len(_layers(model))


def test_engine_with_fused_residuals_matches_greedy():
    model = tiny_model("qwen3", VOCAB, seed=4, num_layers=3)
    prompts = random_prompts([5, 9], VOCAB, seed=2)
    want = [greedy_reference(model, p, 16) for p in prompts]
    engine = Engine(
        model,
        None,
        EngineConfig(num_slots=4, max_len=64, static_shapes=True, compile_pointwise=True, compile_backend="aot_eager"),
        eos_token_ids=[],
    )
    seqs = [engine.add_request(p, SamplingParams(max_tokens=16, ignore_eos=True)) for p in prompts]
    run_to_finish(engine, seqs)
    assert [s.output_ids for s in seqs] == want


def test_layers_of_another_shape_are_left_alone():
    qwen = inspect.getsource(type(tiny_model("qwen3", VOCAB, seed=1, num_layers=1).model.layers[0]).forward)
    assert residual_fusion.rewrite_layer_forward(qwen) is not None
    extra_add = qwen.replace(
        "return hidden_states", "hidden_states = residual + hidden_states\n        return hidden_states"
    )
    assert residual_fusion.rewrite_layer_forward(extra_add) is None
    no_post_norm = qwen.replace("self.post_attention_layernorm(hidden_states)", "hidden_states")
    assert residual_fusion.rewrite_layer_forward(no_post_norm) is None
    assert (
        residual_fusion.rewrite_layer_forward(qwen.replace("residual = hidden_states", "residual = super().x", 1))
        is None
    )
    attention = inspect.getsource(
        type(tiny_model("qwen3", VOCAB, seed=1, num_layers=1).model.layers[0].self_attn).forward
    )
    assert qk_norm_rope.rewrite_attention_forward(attention) is not None
    reads_normed_q = attention.replace(
        "cos, sin = position_embeddings", "cos, sin = position_embeddings\n        probe = query_states * 2"
    )
    assert qk_norm_rope.rewrite_attention_forward(reads_normed_q) is None
    assert qk_norm_rope.rewrite_attention_forward(attention.replace(".transpose(1, 2)", ".transpose(2, 1)", 1)) is None


def test_switch_off_and_unfused_copies(monkeypatch):
    monkeypatch.setenv(LAYER_REWRITES_ENV, "0")
    model = tiny_model("llama", VOCAB, seed=5, num_layers=2)
    assert not any("residual" in n for n in compile_pointwise_modules(model, backend="aot_eager"))
    monkeypatch.delenv(LAYER_REWRITES_ENV)
    model = tiny_model("llama", VOCAB, seed=5, num_layers=2)
    compile_pointwise_modules(model, backend="aot_eager")
    assert compile_pointwise_modules(model, backend="aot_eager") == []  # idempotent
    copy = unfused_copy(model)
    for module in copy.modules():
        assert "forward" not in module.__dict__ and "_selfspec_pending_aware" not in module.__dict__
    ids = torch.randint(0, VOCAB, (1, 7), generator=torch.Generator().manual_seed(1))
    with torch.no_grad(), fused():
        assert torch.equal(copy(ids).logits, model(ids).logits)


def test_a_sum_written_in_place_after_its_layer_is_normed_again():
    """The norm hands out the layer's normed sum only for the very tensor, unchanged since."""
    model = tiny_model("qwen3", VOCAB, seed=6, num_layers=2)
    compile_pointwise_modules(model, backend="aot_eager")
    first, second = model.model.layers
    ids = torch.randint(0, VOCAB, (1, 5), generator=torch.Generator().manual_seed(2))
    with torch.no_grad(), fused():
        hidden = model.model.embed_tokens(ids)
        position = torch.arange(5).unsqueeze(0)
        embeddings = model.model.rotary_emb(hidden, position)
        out = first(hidden, position_embeddings=embeddings, position_ids=position)
        out.mul_(2.0)
        want = second.input_layernorm.forward.__wrapped__(out)
        assert torch.equal(second.input_layernorm(out), want)
