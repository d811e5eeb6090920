"""Skinny-GEMM and KV-write kernel checks, run by tests/engine/test_decode_kernels.py in a process
with TRITON_INTERPRET=1 (Triton decides at import time whether kernels are interpreted)."""

from __future__ import annotations

import os
import sys

assert os.environ.get("TRITON_INTERPRET") == "1", "run with TRITON_INTERPRET=1"

import torch  # noqa: E402

from selfspec.engine.kv_write import write_kv  # noqa: E402
from selfspec.engine.skinny_gemm import CONFIGS, SkinnyConfig, skinny_linear  # noqa: E402

SMALL = (SkinnyConfig(16, 32, 4, 2), SkinnyConfig(32, 64, 4, 2), CONFIGS[0])


def check_skinny() -> None:
    g = torch.Generator().manual_seed(0)
    for n, k in [(48, 40), (100, 64), (33, 130)]:
        w = torch.randn(n, k, generator=g)
        bias = torch.randn(n, generator=g)
        for m in (1, 3, 16, 17, 40, 64):
            x = torch.randn(m, k, generator=g)
            ref = (x.double() @ w.double().T) + bias.double()
            for config in SMALL:
                out = skinny_linear(x, w, bias, config)
                err = float((out.double() - ref).abs().max() / ref.abs().max())
                assert out.shape == (m, n) and err < 1e-5, (n, k, m, config, err)
            nobias = skinny_linear(x.view(m, 1, k), w, None, SMALL[0])
            assert nobias.shape == (m, 1, n)
            assert float((nobias.view(m, n).double() - (ref - bias.double())).abs().max()) < 1e-4
    # A strided input (a column slice) is read correctly.
    base = torch.randn(4, 80, generator=g)
    w = torch.randn(24, 40, generator=g)
    out = skinny_linear(base[:, 20:60], w, None, SMALL[1])
    assert torch.allclose(out, base[:, 20:60] @ w.T, atol=1e-4)
    check_batch_invariance()
    print("skinny ok")


def check_batch_invariance() -> None:
    """Row 0 comes out the same bits whatever the other rows hold and however many there are
    (within one tile size), which the engine's decode/verify agreement relies on."""
    g = torch.Generator().manual_seed(1)
    w = torch.randn(64, 96, generator=g)
    row = torch.randn(1, 96, generator=g)
    alone = skinny_linear(row, w, None, SMALL[0])
    for m in (2, 5, 16):
        x = torch.cat([row, torch.randn(m - 1, 96, generator=g)])
        assert torch.equal(skinny_linear(x, w, None, SMALL[0])[:1], alone), m


def check_kv_write() -> None:
    g = torch.Generator().manual_seed(2)
    for b, h, t, d in [(2, 3, 4, 16), (1, 2, 1, 24), (3, 1, 2, 32)]:
        k_buf = torch.zeros(5, h, 40, d)
        v_buf = torch.zeros(5, h, 40, d)
        keys = torch.randn(b, t, h, d, generator=g).transpose(1, 2)  # strided, as transformers passes it
        values = torch.randn(b, t, h, d, generator=g).transpose(1, 2)
        slots = torch.randint(0, 4, (b, 1), generator=g).expand(b, t).clone()
        slots[0, 0] = 4  # a padding token goes to the scratch slot
        positions = torch.stack([torch.randperm(40, generator=g)[:t] for _ in range(b)])
        ref_k, ref_v = k_buf.clone(), v_buf.clone()
        ref_k[slots, :, positions] = keys.transpose(1, 2)
        ref_v[slots, :, positions] = values.transpose(1, 2)
        write_kv(k_buf, v_buf, keys, values, slots, positions)
        assert torch.equal(k_buf, ref_k) and torch.equal(v_buf, ref_v), (b, h, t, d)
    print("kv_write ok")


def check_engine() -> None:
    """The engine with every projection and the head on the skinny kernel, static shapes and
    slot attention (so the KV-write kernel too), gives transformers' greedy tokens (fp32)."""
    from selfspec.engine.fusion import use_skinny_gemms
    from selfspec.engine.llm_engine import Engine, EngineConfig
    from selfspec.engine.sampling import SamplingParams
    from selfspec.engine.skinny_gemm import SkinnyGemmTable
    from selfspec.engine.static_forward import GraphBuckets
    from selfspec.testing.tiny import tiny_model

    # The CPU linear path swaps the linears' forwards for its own; this check routes them itself.
    os.environ["SELFSPEC_CPU_LINEAR"] = "0"
    g = torch.Generator().manual_seed(3)
    for family in ("llama", "gemma3"):
        kwargs = {"sliding_window": 8} if family == "gemma3" else {}
        model = tiny_model(family, 128, seed=1, num_layers=2, **kwargs)
        prompts = [torch.randint(1, 128, (n,), generator=g).tolist() for n in (3, 7)]
        refs = []
        for p in prompts:
            ids = torch.tensor([p])
            with torch.inference_mode():
                out = model.generate(
                    ids,
                    attention_mask=torch.ones_like(ids),
                    max_new_tokens=12,
                    min_new_tokens=12,
                    do_sample=False,
                    eos_token_id=None,
                    pad_token_id=0,
                )
            refs.append(out[0, len(p) :].tolist())
        cfg = EngineConfig(
            num_slots=4,
            max_len=64,
            static_shapes=True,
            slot_attention=True,
            compile_pointwise=True,
            compile_backend="aot_eager",
            graph_buckets=GraphBuckets(batch=(1, 2, 4), tokens=(1, 2, 4, 8), min_keys=16),
        )
        engine = Engine(model, None, cfg, eos_token_ids=[])
        table = SkinnyGemmTable(force=SMALL[0])
        routed = use_skinny_gemms(model, table, backend="aot_eager")
        assert {"lm_head"} < set(routed) and any(r.endswith("gate_up+down") for r in routed), routed
        calls = {"n": 0}
        linear = table.linear

        def counted(*args, **kwargs):
            calls["n"] += 1
            return linear(*args, **kwargs)

        table.linear = counted
        seqs = [engine.add_request(p, SamplingParams(max_tokens=12, ignore_eos=True)) for p in prompts]
        while not all(s.is_finished for s in seqs):
            engine.step()
        for s, ref in zip(seqs, refs):
            assert s.output_ids == ref, (family, s.output_ids, ref)
        assert calls["n"] > 0, "the skinny kernels were not called"
    print("engine ok")


if __name__ == "__main__":
    {"skinny": check_skinny, "kv_write": check_kv_write, "engine": check_engine}[sys.argv[1]]()
