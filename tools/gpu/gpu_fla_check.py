"""GPU check: the engine's Gated DeltaNet layers on flash-linear-attention's kernels vs its torch path.

Run on a CUDA machine with fla-core installed (`pip install selfspec[fla]`, or the carried wheel):

    python tools/gpu/gpu_fla_check.py --out /tmp/fla_check.json     # Qwen3.5-4B's shapes, ~2 min

Random weights of the served shape (`benchmarks/step_profile.py` shapes). Checks, each with its
numbers in the JSON summary (stdout and `--out`; exit status 1 on any FAIL):

1. Layer by layer (one Gated DeltaNet layer of the model, fp32 and bf16): the fla path
   (`slot_forward` on fla's kernels, rollback by recompute) against the torch path (token-by-token
   recurrence, per-position snapshots, transformers' torch chunk rule) on the same inputs:
   a chunked prefill of two padded rows (300 and 173 tokens: the chunked kernel), a decode step,
   verify chunks of 8 and 32 tokens each settled at several positions (fresh verify per
   position), and two verifies of one slot before its settle. Max abs difference of the layer
   outputs, the conv states and the recurrent states after each step.
2. End to end, bf16: over `--positions` random tokens teacher-forced one token per step and 16
   per verify forward, the engine's top-1 (CUDA graphs) against the eager transformers model's,
   fla path and torch path (`SELFSPEC_FLA=0` equivalent), each >= 99.5% like `gpu_check.py`.
3. End to end, fp32: the engine's logits on the fla path (chunks of 1 and 8) against the eager
   model's over 96 positions: max abs error.
4. The engine's own slot kernel (`slot_delta_rule`, run with SELFSPEC_SLOT_DELTA_RULE=1) alone at the
   shape's head counts and dims, fp32: against `recurrent_rule` over rows in scattered slots (one
   fresh), 1, 8 and 32 tokens, the kept initial states, and the slots no row names untouched.

The eager references come from a second process of this script (`--reference-out`) in which `fla`
cannot be imported: with fla installed, transformers binds its Gated DeltaNet functions to fla's
Triton kernels at import, so an in-process reference runs fla too (TF32 dots in fp32: 0.025 of a 5.3
logit scale on an H100) and checks the engine against another fast path instead of the model's own
torch code. Both processes build the same weights (seeded on the same device). In bf16 the eager
model is asked two ways: one teacher-forced pass over every position (the chunked form: a
different summation order from any decode) and its own decode loop (one token per forward, with
its cache: the recurrence the engine's decode runs); the criterion is the decode loop's, the
one-pass agreement is reported beside it.
"""

from __future__ import annotations

import sys

if "--reference-out" in sys.argv:  # the reference process: transformers falls back to its torch code
    sys.modules["fla"] = None  # type: ignore[assignment]

import argparse
import contextlib
import copy
import json
import os
import subprocess
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT / "tools" / "gpu"))

from gpu_check import TeacherForcing, TopOneRecorder, run_all  # noqa: E402

from selfspec.engine import fla_kernels, linear_attention, slot_delta_rule  # noqa: E402
from selfspec.engine.config import EngineConfig  # noqa: E402
from selfspec.engine.llm_engine import Engine  # noqa: E402
from selfspec.engine.sampling import SamplingParams  # noqa: E402
from selfspec.engine.state_cache import SlotStateCache  # noqa: E402

RESULTS: list[dict] = []
DEVICE = "cuda"  # `--dry-run`: cpu (both paths are torch there; only the script's logic runs)
SUMMARY: dict = {}
OUT: Path | None = None  # `--out`: rewritten after every check, so a run cut off by a timeout keeps what passed


def report(name: str, ok: bool, **detail) -> None:
    RESULTS.append({"check": name, "ok": bool(ok), **detail})
    print(("PASS " if ok else "FAIL ") + name + " " + json.dumps(detail), flush=True)
    write_summary(finished=False)


def write_summary(finished: bool) -> str:
    """The JSON summary (`finished` False while checks remain), also to `OUT` when set."""
    summary = {**SUMMARY, "results": RESULTS, "ok": all(r["ok"] for r in RESULTS), "finished": finished}
    text = json.dumps(summary, indent=2)
    if OUT is not None:
        OUT.parent.mkdir(parents=True, exist_ok=True)
        OUT.write_text(text)
    return text


@contextlib.contextmanager
def fla_enabled(on: bool):
    """The engine's choice of path, flipped in place (it is read at every call)."""
    saved = fla_kernels.USABLE
    fla_kernels.USABLE = on and saved
    try:
        yield
    finally:
        fla_kernels.USABLE = saved


def _err(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a.float() - b.float()).abs().max().item()


class LayerPair:
    """One Gated DeltaNet layer run on both paths, each with its own slot state cache."""

    def __init__(self, module, dtype: torch.dtype) -> None:
        self.module = copy.deepcopy(module).to(dtype)
        self.dtype = dtype
        layer = int(self.module.layer_idx)
        spec = {layer: linear_attention.layer_spec(self.module)}
        self.layer = layer
        self.caches = {
            "fla": SlotStateCache(spec, num_slots=4, dtype=dtype, device=DEVICE, rollback="recompute"),
            "torch": SlotStateCache(spec, num_slots=4, dtype=dtype, device=DEVICE, rollback="snapshots"),
        }
        self.hidden = int(self.module.hidden_size)
        self.max_err: dict[str, float] = {}

    def step(self, slots, starts, lengths, width: int, snapshots: bool, seed: int) -> dict[str, float]:
        """One forward on both paths over the same random hidden states; the differences."""
        g = torch.Generator(device=DEVICE).manual_seed(seed)
        x = torch.randn(len(slots), width, self.hidden, generator=g, device=DEVICE, dtype=self.dtype)
        outs = {}
        for name, cache in self.caches.items():
            with fla_enabled(name == "fla"), torch.inference_mode():
                cache.prepare_step(slots, starts, lengths, width, snapshots)
                outs[name] = linear_attention.slot_forward(self.module, x, cache)
                cache.end_step()
        real = (
            torch.arange(width, device=DEVICE)[None, :]
            >= torch.tensor([width - n for n in lengths], device=DEVICE)[:, None]
        )
        return {"out": _err(outs["fla"][real], outs["torch"][real]), **self.state_err(slots)}

    def settle(self, slot: int, position: int) -> dict[str, float]:
        for name, cache in self.caches.items():
            with fla_enabled(name == "fla"):
                assert cache.settle(slot, position), (name, slot, position)
        return self.state_err([slot])

    def state_err(self, slots) -> dict[str, float]:
        a, b = self.caches["fla"], self.caches["torch"]
        idx = torch.tensor(slots, device=DEVICE)
        return {
            "conv": _err(a.conv[self.layer][idx], b.conv[self.layer][idx]),
            "state": _err(a.recurrent[self.layer][idx], b.recurrent[self.layer][idx]),
        }

    def checkpoint(self, slot: int) -> None:
        for cache in self.caches.values():
            cache.checkpoint(slot)

    def restore(self, slot: int) -> None:
        for cache in self.caches.values():
            assert cache.restore(slot)
            cache.checkpoint(slot)  # restore drops it: keep it for the next position


def check_layers(model, dtype: torch.dtype, label: str, tol: float) -> None:
    module = next(m for m in model.modules() if linear_attention.is_gated_deltanet(m))
    pair = LayerPair(module, dtype)
    steps: dict[str, dict] = {}
    seed = iter(range(1000))
    steps["prefill_300_173"] = pair.step([0, 1], [0, 0], [300, 173], 300, False, next(seed))
    steps["decode"] = pair.step([0, 1], [300, 173], [1, 1], 1, False, next(seed))
    start = 301
    for k in (8, 32):
        pair.checkpoint(0)
        for kept in sorted({0, 1, k // 2, k - 1, k}):
            pair.restore(0)
            verify = pair.step([0], [start], [k], k, True, 100 + k)
            steps[f"verify{k}_settle{kept}"] = {
                **{f"verify_{n}": v for n, v in verify.items()},
                **pair.settle(0, start + kept),
            }
        after = pair.step([0], [start + kept], [1], 1, False, next(seed))
        steps[f"verify{k}_then_decode"] = after
        start += kept + 1
    # Two verifies of slot 0 (the second from the first's end, padded beside a longer row) before its settle.
    pair.step([0], [start], [8], 8, True, next(seed))
    two = pair.step([0, 1], [start + 8, 174], [5, 32], 32, True, next(seed))
    steps["two_verifies_settle_at_3_of_2nd"] = {**two, **pair.settle(0, start + 8 + 3)}
    steps["two_verifies_settle_slot1_at_20"] = pair.settle(1, 174 + 20)
    worst = max(v for s in steps.values() for v in s.values())
    report(f"layer-{label}", worst <= tol, worst=worst, tolerance=tol, steps=steps)


def check_slot_kernel(model) -> None:
    """`slot_delta_rule.run` against `recurrent_rule` in fp32 at the model's layer dims (no dots in
    the kernel: no TF32 rounding, so fp32 agreement is the kernel's own)."""
    spec = linear_attention.layer_spec(next(m for m in model.modules() if linear_attention.is_gated_deltanet(m)))
    heads, k_dim, v_dim = spec.heads, spec.k_dim, spec.v_dim
    value_dim = heads * v_dim
    k_heads = (spec.conv_dim - value_dim) // 2 // k_dim
    g = torch.Generator(device=DEVICE).manual_seed(7)
    slots = torch.tensor([5, 0, 3], device=DEVICE)
    fresh = torch.tensor([False, True, False], device=DEVICE)
    detail: dict[str, float | bool] = {}
    for tokens in (1, 8, 32):

        def rand(*shape):
            return torch.randn(*shape, generator=g, device=DEVICE)

        q, k, v = rand(3, tokens, k_heads, k_dim), rand(3, tokens, k_heads, k_dim), rand(3, tokens, heads, v_dim)
        decay, beta = -rand(3, tokens, heads).abs() * 0.1, rand(3, tokens, heads).sigmoid()
        states = rand(6, heads, k_dim, v_dim)
        before = states.clone()
        h0 = before[slots].masked_fill(fresh.view(-1, 1, 1, 1), 0)
        out, initial = slot_delta_rule.run(q, k, v, decay, beta, states, slots, fresh, keep_initial=True)
        ref_out, ref_final, _ = linear_attention.recurrent_rule(q, k, v, decay, beta, h0, False)
        _sync()
        detail[f"t{tokens}_out"] = _err(out, ref_out)
        detail[f"t{tokens}_state"] = _err(states[slots], ref_final)
        detail[f"t{tokens}_initial"] = _err(initial, h0)
        detail[f"t{tokens}_others_untouched"] = bool(torch.equal(states[[1, 2, 4]], before[[1, 2, 4]]))
    worst = max(v for key, v in detail.items() if not key.endswith("untouched"))
    untouched = all(v for key, v in detail.items() if key.endswith("untouched"))
    report(
        "slot-kernel-fp32",
        worst <= 1e-4 and untouched,
        worst=worst,
        tolerance=1e-4,
        heads=heads,
        k_heads=k_heads,
        k_dim=k_dim,
        v_dim=v_dim,
        **detail,
    )


def eager_top1(model, tokens: list[int]) -> tuple[list[int], torch.Tensor]:
    with torch.inference_mode():
        logits = model(torch.tensor([tokens], device=DEVICE)).logits[0, :-1].float()
    top2 = logits.topk(2, dim=-1)
    tie = (top2.values[:, 0] - top2.values[:, 1]) <= top2.values[:, 0].abs() * 2.0**-7
    return top2.indices[:, 0].tolist(), tie


def eager_decode_top1(model, tokens: list[int]) -> tuple[list[int], torch.Tensor]:
    """The eager model's own decode loop, teacher-forced: one token per forward with its cache."""
    rows = []
    with torch.inference_mode():
        out = model(torch.tensor([tokens[:1]], device=DEVICE), use_cache=True)
        rows.append(out.logits[0, -1].float())
        for token in tokens[1:-1]:
            out = model(torch.tensor([[token]], device=DEVICE), past_key_values=out.past_key_values, use_cache=True)
            rows.append(out.logits[0, -1].float())
    logits = torch.stack(rows)
    top2 = logits.topk(2, dim=-1)
    tie = (top2.values[:, 0] - top2.values[:, 1]) <= top2.values[:, 0].abs() * 2.0**-7
    return top2.indices[:, 0].tolist(), tie


def _tokens(model, positions: int, seed: int) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(10, model.config.vocab_size - 10, (positions + 1,), generator=g).tolist()


FP32_POSITIONS = 96


def compute_references(shape: str, positions: int) -> dict:
    """Everything the end-to-end checks compare with, from the eager model of this process."""
    out: dict = {}
    model = _model(shape, torch.float32)
    tokens = _tokens(model, FP32_POSITIONS, seed=1)
    with torch.inference_mode():
        out["fp32_logits"] = model(torch.tensor([tokens], device=DEVICE)).logits[0, :-1].float().cpu()
    del model
    model = _model(shape, torch.bfloat16)
    tokens = _tokens(model, positions, seed=0)
    top, tie = eager_top1(model, tokens)
    out["bf16_onepass"] = (top, tie.cpu())
    top, tie = eager_decode_top1(model, tokens)
    out["bf16_decode"] = (top, tie.cpu())
    out["fla_in_reference"] = fla_kernels.USABLE
    return out


def references(shape: str, positions: int) -> dict:
    """The eager references, from a process without fla where fla is installed here."""
    if not fla_kernels.USABLE:
        return compute_references(shape, positions)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "reference.pt"
        command = [sys.executable, __file__, "--shape", shape, "--positions", str(positions)]
        subprocess.run([*command, "--reference-out", str(path)], check=True, env=os.environ.copy())
        return torch.load(path)


def _model(shape: str, dtype: torch.dtype):
    torch.manual_seed(0)  # the reference process builds the very same weights
    if shape == "tiny":
        from selfspec.testing.tiny import tiny_model

        return tiny_model("qwen3_5", 128, seed=1, num_layers=4, dtype=dtype).to(DEVICE)
    from step_profile import shaped_model

    return shaped_model(shape, dtype, DEVICE)


def _sync() -> None:
    if DEVICE == "cuda":
        torch.cuda.synchronize()


def _agreement(top: list[int], reference: tuple[list[int], torch.Tensor]) -> tuple[float, float]:
    ref, tie = reference
    same = [a == b for a, b in zip(top, ref)]
    clear = [ok for ok, t in zip(same, tie.tolist()) if not t]
    return sum(same) / max(1, len(same)), sum(clear) / max(1, len(clear))


def check_end_to_end_bf16(shape: str, positions: int, refs: dict) -> None:
    model = _model(shape, torch.bfloat16)
    tokens = _tokens(model, positions, seed=0)
    check_layers(model, torch.bfloat16, f"{shape}-bf16", tol=0.25)
    for path in ("fla", "torch"):
        with fla_enabled(path == "fla"):
            engine = Engine(model, None, EngineConfig(num_slots=2, max_len=positions + 64), eos_token_ids=[])
            if DEVICE == "cuda":
                assert engine.runner.state.rollback == ("recompute" if path == "fla" else "snapshots")
            for chunk in (1, 16):
                recorder = TopOneRecorder(tokens[1:] + [0], chunk)
                seq = engine.add_request(
                    tokens[:1], SamplingParams(max_tokens=positions, ignore_eos=True), policy=recorder
                )
                _sync()
                t0 = time.perf_counter()
                run_all(engine, [seq])
                _sync()
                seconds = time.perf_counter() - t0
                top = recorder.top[:positions]
                agree, clear = _agreement(top, refs["bf16_decode"])
                onepass, onepass_clear = _agreement(top, refs["bf16_onepass"])
                report(
                    f"e2e-{shape}-bf16-{path}-chunk{chunk}",
                    agree >= 0.995,
                    positions=len(top),
                    agreement=round(agree, 5),
                    agreement_without_near_ties=round(clear, 5),
                    agreement_one_pass=round(onepass, 5),
                    agreement_one_pass_without_near_ties=round(onepass_clear, 5),
                    reference_used_fla=refs["fla_in_reference"],
                    seconds=round(seconds, 2),
                    static=engine.runner.static.stats() if engine.runner.static else None,
                )
            del engine


class LogitRecorder(TeacherForcing):
    """Teacher forcing that keeps every position's logits row."""

    def __init__(self, tokens: list[int], chunk: int) -> None:
        super().__init__(tokens, chunk)
        self.rows: list[torch.Tensor] = []

    def verify(self, engine, seq, logits, proposal):
        self.rows.append(logits.float().clone())
        return super().verify(engine, seq, logits, proposal)


def check_end_to_end_fp32(shape: str, refs: dict, positions: int = FP32_POSITIONS) -> None:
    """fp32 engine vs eager logits. An fp32 engine keeps the torch path even with fla installed
    (`fla_kernels.applies`: Triton rounds fp32 dots to TF32, 0.026 of a 5.2 logit scale on an
    H100), so this checks that path on the GPU; the layer checks above run fla in fp32 directly."""
    model = _model(shape, torch.float32)
    tokens = _tokens(model, positions, seed=1)
    reference = refs["fp32_logits"][:positions].to(DEVICE)
    check_layers(model, torch.float32, f"{shape}-fp32", tol=2e-3)
    if DEVICE == "cuda":  # a Triton kernel: not on the dry run's CPU tensors
        check_slot_kernel(model)
    engine = Engine(model, None, EngineConfig(num_slots=2, max_len=positions + 64), eos_token_ids=[])
    for chunk in (1, 8):
        recorder = LogitRecorder(tokens[1:] + [0], chunk)
        seq = engine.add_request(tokens[:1], SamplingParams(max_tokens=positions, ignore_eos=True), policy=recorder)
        run_all(engine, [seq])
        got = torch.cat(recorder.rows)[:positions]
        err = _err(got, reference[: len(got)])
        scale = reference.abs().max().item()
        report(
            f"e2e-{shape}-fp32-chunk{chunk}",
            err <= 1e-3 * max(1.0, scale),
            positions=len(got),
            max_abs_error=err,
            logit_scale=scale,
            top1_agreement=round((got.argmax(-1) == reference[: len(got)].argmax(-1)).float().mean().item(), 5),
            reference_used_fla=refs["fla_in_reference"],
        )
    del engine, model


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shape", default="qwen3.5-4b")
    parser.add_argument("--positions", type=int, default=2048)
    parser.add_argument("--out", default=None, help="also write the JSON summary here")
    parser.add_argument("--dry-run", action="store_true", help="CPU, tiny model: the script's logic only")
    parser.add_argument("--reference-out", default=None, help=argparse.SUPPRESS)  # the reference process
    args = parser.parse_args()
    global DEVICE, OUT
    if args.reference_out:
        if args.shape == "tiny":
            DEVICE = "cpu"
        torch.save(compute_references(args.shape, args.positions), args.reference_out)
        return 0
    OUT = Path(args.out) if args.out else None
    summary = SUMMARY
    summary.update(fla_usable=fla_kernels.USABLE, fla_reason=fla_kernels.REASON)
    if args.dry_run:
        DEVICE, args.shape, args.positions = "cpu", "tiny", min(args.positions, 64)
        refs = references(args.shape, args.positions)
        check_end_to_end_fp32(args.shape, refs, 16)
        check_end_to_end_bf16(args.shape, args.positions, refs)
    elif not fla_kernels.USABLE:
        report("fla-usable", False, reason=fla_kernels.REASON)
    else:
        import fla

        summary["fla_version"] = getattr(fla, "__version__", "?")
        summary["device"] = torch.cuda.get_device_name()
        start = time.perf_counter()
        refs = references(args.shape, args.positions)
        check_end_to_end_fp32(args.shape, refs)
        check_end_to_end_bf16(args.shape, args.positions, refs)
        summary["seconds"] = round(time.perf_counter() - start, 1)
    print(write_summary(finished=True))
    return 0 if all(r["ok"] for r in RESULTS) else 1


if __name__ == "__main__":
    sys.exit(main())
