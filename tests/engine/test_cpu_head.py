"""The CPU LM head as `W @ h.T`: the same logits as `nn.Linear`, only inside the runner's forwards."""

from __future__ import annotations

import torch

from selfspec.engine.cpu_head import applies_to, weight_major_head
from selfspec.testing.tiny import tiny_model


def test_weight_major_head_matches_linear_and_is_scoped():
    model = tiny_model("qwen3", 96)
    head = model.get_output_embeddings()
    assert applies_to(model)
    hidden = torch.randn(3, 2, head.in_features)
    want = torch.nn.functional.linear(hidden, head.weight, head.bias)
    with weight_major_head(model):
        got = head(hidden)
        assert "forward" in vars(head)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert "forward" not in vars(head)  # outside the block transformers' own forward runs again
    torch.testing.assert_close(head(hidden), want, rtol=0, atol=0)


def test_a_biased_head_keeps_its_bias():
    head = torch.nn.Linear(16, 40, bias=True)

    class Model(torch.nn.Module):
        def get_output_embeddings(self):
            return head

    hidden = torch.randn(2, 16)
    with weight_major_head(Model()):
        got = head(hidden)
    torch.testing.assert_close(got, head(hidden), rtol=1e-5, atol=1e-5)
