"""Slot-attention kernel checks, run by tests/test_slot_attention.py in a process with
TRITON_INTERPRET=1 (Triton decides at import time whether kernels are interpreted)."""

from __future__ import annotations

import math
import os
import sys

assert os.environ.get("TRITON_INTERPRET") == "1", "run with TRITON_INTERPRET=1"
sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import torch  # noqa: E402

from selfspec.engine.slot_attention import slot_attention  # noqa: E402


def reference(q, kc, vc, slots, pos, scale, window):
    b_, hq, t_, d = q.shape
    groups = hq // kc.shape[1]
    out = torch.zeros(b_, t_, hq, d, dtype=torch.float64)
    for b in range(b_):
        for t in range(t_):
            p = int(pos[b, t])
            lo = max(0, p - window + 1) if window else 0
            k = kc[slots[b], :, lo : p + 1].repeat_interleave(groups, 0).double()
            v = vc[slots[b], :, lo : p + 1].repeat_interleave(groups, 0).double()
            s = torch.einsum("hd,hnd->hn", q[b, :, t].double(), k) * scale
            out[b, t] = torch.einsum("hn,hnd->hd", s.softmax(-1), v)
    return out


def check_kernel() -> None:
    g = torch.Generator().manual_seed(0)
    # (B, Hq, Hkv, T, D, cache length, key length, window): GQA, multi-query, splits, windows.
    for b, hq, hkv, t, d, cache_len, keys, window in [
        (2, 6, 2, 3, 16, 300, 200, 0),
        (1, 4, 1, 1, 32, 1500, 1300, 0),  # 3 splits of 512 keys
        (3, 4, 2, 2, 16, 700, 600, 40),  # sliding window 40
        (2, 2, 2, 1, 16, 64, 64, 0),  # no grouping
    ]:
        q = torch.randn(b, t, hq, d, generator=g).transpose(1, 2)  # strided, as transformers passes it
        kc = torch.randn(5, hkv, cache_len, d, generator=g)
        vc = torch.randn(5, hkv, cache_len, d, generator=g)
        packed = torch.zeros(5, b, max(t, 2), dtype=torch.long)  # slots as a strided view, like the engine's
        packed[4, :, 0] = torch.tensor([4, 1, 2][:b])
        slots = packed[4, :, 0]
        pos = torch.randint(0, keys, (b, t), generator=g)
        out = slot_attention(
            q, kc, vc, slots, pos, scale=1 / math.sqrt(d), key_length=keys, sliding_window=window or None
        )
        ref = reference(q, kc, vc, slots, pos, 1 / math.sqrt(d), window)
        err = float((out.double() - ref).norm() / ref.norm())
        assert out.shape == (b, t, hq, d) and out.is_contiguous()
        assert err < 1e-5, (b, hq, hkv, t, d, keys, window, err)
    check_key_bucket_invariance()
    check_token_blocks()
    print("kernel ok")


def check_token_blocks() -> None:
    """Consecutive query tokens sharing a program (`SELFSPEC_SLOT_ATTENTION_TOKEN_BLOCKS=1`) give
    what one token per program gives, and the float64 reference still holds: blocks that end
    inside a split, a token whose later splits are empty, a last partial block, grouped heads of 3
    (5 tokens a tile), 4 (4) and 8 (2), one and several splits. Equal to rounding, not bit for
    bit: the interpreter's dot is the CPU BLAS's, whose result for a row depends on where the row
    sits in the matrix (rows past the sixth of a tile differ in the last bit); bitwise equality
    of decode and verify on the compiled kernel is `tools/gpu/gpu_batch_invariance.py`'s check."""
    from selfspec.engine import slot_attention as sa

    g = torch.Generator().manual_seed(7)
    for b, hq, hkv, t, d, keys, dtype in [
        (2, 6, 2, 7, 16, 300, torch.float32),  # 3 groups: tiles of 5 tokens, then 2
        (1, 8, 2, 9, 32, 1500, torch.float32),  # 4 groups, 3 splits
        (
            2,
            16,
            2,
            5,
            16,
            1100,
            torch.float32,
        ),  # 8 groups: 2 tokens a tile (fp32: the interpreter's bf16 dot is not bf16's)
    ]:
        q = torch.randn(b, t, hq, d, generator=g).to(dtype).transpose(1, 2)
        kc = torch.randn(3, hkv, 1600, d, generator=g).to(dtype)
        vc = torch.randn(3, hkv, 1600, d, generator=g).to(dtype)
        slots = torch.tensor([2, 0][:b])
        base = torch.randint(t, keys - 1, (b, 1), generator=g)
        pos = base - t + 1 + torch.arange(t)  # a verify chunk: consecutive positions
        pos[0, 0] = 3  # and one token far before the rest: its later splits are empty
        args = dict(scale=1 / math.sqrt(d), key_length=keys)
        os.environ.pop(sa.TOKEN_BLOCKS_ENV, None)
        one = slot_attention(q, kc, vc, slots, pos, **args)
        os.environ[sa.TOKEN_BLOCKS_ENV] = "1"
        try:
            assert sa.tokens_per_program(t, hq // hkv, 16, 0) > 1
            blocked = slot_attention(q, kc, vc, slots, pos, **args)
        finally:
            os.environ.pop(sa.TOKEN_BLOCKS_ENV, None)
        assert (blocked - one).abs().max() <= 1e-6, (b, hq, hkv, t)
        ref = reference(q, kc, vc, slots, pos, 1 / math.sqrt(d), 0)
        err = float((blocked.double() - ref).norm() / ref.norm())
        assert err < 1e-5, (b, hq, hkv, t, err)
    assert sa.tokens_per_program(8, 3, 16, 40) == 1  # sliding windows: one token a program


def check_key_bucket_invariance() -> None:
    """A position's output is the same bits under every key bucket that covers it.

    Decode computes a position under the smallest bucket; a verify chunk reaching past the
    bucket's edge computes the same position under the next one (more, empty, splits). On the
    H200 a split merge whose layout depended on the split count rounded differently per bucket. The interpreter cannot
    show fp-fusion effects (the Hopper compile test covers the kernel's code), but it checks
    that the result is independent of the bucket by construction.
    """
    g = torch.Generator().manual_seed(3)
    hq, hkv, d, cache_len = 6, 2, 32, 4096
    # float32: the interpreter's bf16 dot does not compute bf16 products (its outputs are far from
    # any reference), so bf16 equality here would compare noise with noise.
    kc = torch.randn(2, hkv, cache_len, d, generator=g)
    vc = torch.randn(2, hkv, cache_len, d, generator=g)
    slots = torch.tensor([1])
    for window in (0, 300):
        pos = torch.tensor([[1022, 1023, 700]])
        q = torch.randn(1, 3, hq, d, generator=g).transpose(1, 2)
        outs = [
            slot_attention(
                q, kc, vc, slots, pos, scale=1 / math.sqrt(d), key_length=keys, sliding_window=window or None
            )
            for keys in (1024, 2048, 4096)
        ]
        for keys, out in zip((2048, 4096), outs[1:]):
            assert torch.equal(out, outs[0]), (window, keys, (out.float() - outs[0].float()).abs().max())


def check_engine() -> None:
    from selfspec.engine.llm_engine import Engine, EngineConfig
    from selfspec.engine.sampling import SamplingParams
    from selfspec.engine.static_forward import GraphBuckets
    from selfspec.testing.tiny import tiny_model

    g = torch.Generator().manual_seed(2)
    for family in ("llama", "gemma3"):
        kwargs = {"sliding_window": 8} if family == "gemma3" else {}
        model = tiny_model(family, 128, seed=1, num_layers=2, **kwargs)
        prompts = [torch.randint(1, 128, (n,), generator=g).tolist() for n in (3, 6, 11)]
        refs = []
        for p in prompts:
            ids = torch.tensor([p])
            with torch.inference_mode():
                out = model.generate(
                    ids,
                    attention_mask=torch.ones_like(ids),
                    max_new_tokens=24,
                    min_new_tokens=24,
                    do_sample=False,
                    eos_token_id=None,
                    pad_token_id=0,
                )
            refs.append(out[0, len(p) :].tolist())
        cfg = EngineConfig(
            num_slots=4,
            max_len=128,
            static_shapes=True,
            slot_attention=True,
            prefill_chunk=16,
            graph_buckets=GraphBuckets(batch=(1, 2, 4), tokens=(1, 2, 4, 8), min_keys=16),
        )
        engine = Engine(model, None, cfg, eos_token_ids=[])
        assert engine.runner.slot_attention, "slot attention was not enabled"
        seqs = [engine.add_request(p, SamplingParams(max_tokens=24, ignore_eos=True)) for p in prompts]
        while not all(s.is_finished for s in seqs):
            engine.step()
        for s, ref in zip(seqs, refs):
            assert s.output_ids == ref, (family, s.output_ids, ref)
        # transformers' own path is untouched on the same model object
        assert (
            refs[0]
            == model.generate(
                torch.tensor([prompts[0]]),
                attention_mask=torch.ones(1, 3, dtype=torch.long),
                max_new_tokens=24,
                min_new_tokens=24,
                do_sample=False,
                eos_token_id=None,
                pad_token_id=0,
            )[0, 3:].tolist()
        )
    check_ssr()
    print("engine ok")


def check_ssr() -> None:
    """SSR (fork, verify, rollback) through slot attention gives the baseline's tokens."""
    from selfspec.engine.config import EngineConfig
    from selfspec.engine.sampling import SamplingParams
    from selfspec.engine.static_forward import GraphBuckets
    from selfspec.llm import LLM
    from selfspec.spec.ssr import SSRConfig
    from selfspec.testing.tiny import tiny_model, tiny_tokenizer
    from selfspec.thinking.policy import ThinkingLimits

    tok = tiny_tokenizer()
    model = tiny_model("qwen3", len(tok), seed=5, num_layers=2, eos_token_id=tok.eos_token_id)
    with torch.no_grad():
        for layer in model.model.layers:  # bigram model: drafts match, acceptance paths run
            layer.self_attn.o_proj.weight.zero_()
    cfg = EngineConfig(
        num_slots=8,
        max_len=256,
        static_shapes=True,
        slot_attention=True,
        graph_buckets=GraphBuckets(batch=(1, 2, 4), tokens=(1, 2, 4, 8, 16, 32, 64), min_keys=16),
    )
    llm = LLM.from_model(model, tok, engine_config=cfg)
    assert llm.engine.runner.slot_attention
    limits = ThinkingLimits(cot_cap=30, answer_cap=20, fixed_length=True)
    params = SamplingParams(max_tokens=1000)
    texts = ["What is 12 + 30?", "hello"]
    base = llm.generate(texts, params, limits=limits, thinking=True, spec="off")
    out = llm.generate(texts, params, limits=limits, spec=SSRConfig(draft_budgets=[8], max_draft_len=30))
    assert [o.token_ids for o in out] == [b.token_ids for b in base]
    assert sum(o.metrics["accepted_prefix"] for o in out) > 0


if __name__ == "__main__":
    {"kernel": check_kernel, "engine": check_engine}[sys.argv[1]]()
