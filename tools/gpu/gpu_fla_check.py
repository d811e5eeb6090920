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
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT / "tools" / "gpu"))

from gpu_check import TeacherForcing, TopOneRecorder, run_all  # noqa: E402

from selfspec.engine import fla_kernels, linear_attention  # noqa: E402
from selfspec.engine.config import EngineConfig  # noqa: E402
from selfspec.engine.llm_engine import Engine  # noqa: E402
from selfspec.engine.sampling import SamplingParams  # noqa: E402
from selfspec.engine.state_cache import SlotStateCache  # noqa: E402

RESULTS: list[dict] = []
DEVICE = "cuda"  # `--dry-run`: cpu (both paths are torch there; only the script's logic runs)


def report(name: str, ok: bool, **detail) -> None:
    RESULTS.append({"check": name, "ok": bool(ok), **detail})
    print(("PASS " if ok else "FAIL ") + name + " " + json.dumps(detail), flush=True)


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


def eager_top1(model, tokens: list[int]) -> tuple[list[int], torch.Tensor]:
    with torch.inference_mode():
        logits = model(torch.tensor([tokens], device=DEVICE)).logits[0, :-1].float()
    top2 = logits.topk(2, dim=-1)
    tie = (top2.values[:, 0] - top2.values[:, 1]) <= top2.values[:, 0].abs() * 2.0**-7
    return top2.indices[:, 0].tolist(), tie


def _model(shape: str, dtype: torch.dtype):
    if shape == "tiny":
        from selfspec.testing.tiny import tiny_model

        return tiny_model("qwen3_5", 128, seed=1, num_layers=4, dtype=dtype).to(DEVICE)
    from step_profile import shaped_model

    return shaped_model(shape, dtype, DEVICE)


def _sync() -> None:
    if DEVICE == "cuda":
        torch.cuda.synchronize()


def check_end_to_end_bf16(shape: str, positions: int) -> None:
    model = _model(shape, torch.bfloat16)
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(10, model.config.vocab_size - 10, (positions + 1,), generator=g).tolist()
    reference, tie = eager_top1(model, tokens)
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
                same = [a == b for a, b in zip(recorder.top[:positions], reference)]
                clear = [ok for ok, t in zip(same, tie.tolist()) if not t]
                agree = sum(same) / max(1, len(same))
                report(
                    f"e2e-{shape}-bf16-{path}-chunk{chunk}",
                    agree >= 0.995,
                    positions=len(same),
                    agreement=round(agree, 5),
                    agreement_without_near_ties=round(sum(clear) / max(1, len(clear)), 5),
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


def check_end_to_end_fp32(shape: str, positions: int = 96) -> None:
    """fp32 engine vs eager logits. An fp32 engine keeps the torch path even with fla installed
    (`fla_kernels.applies`: Triton rounds fp32 dots to TF32, 0.026 of a 5.2 logit scale on an
    H100), so this checks that path on the GPU; the layer checks above run fla in fp32 directly."""
    model = _model(shape, torch.float32)
    g = torch.Generator().manual_seed(1)
    tokens = torch.randint(10, model.config.vocab_size - 10, (positions + 1,), generator=g).tolist()
    with torch.inference_mode():
        reference = model(torch.tensor([tokens], device=DEVICE)).logits[0, :-1].float()
    check_layers(model, torch.float32, f"{shape}-fp32", tol=2e-3)
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
        )
    del engine, model


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shape", default="qwen3.5-4b")
    parser.add_argument("--positions", type=int, default=2048)
    parser.add_argument("--out", default=None, help="also write the JSON summary here")
    parser.add_argument("--dry-run", action="store_true", help="CPU, tiny model: the script's logic only")
    args = parser.parse_args()
    global DEVICE
    summary: dict = {"fla_usable": fla_kernels.USABLE, "fla_reason": fla_kernels.REASON}
    if args.dry_run:
        DEVICE, args.shape, args.positions = "cpu", "tiny", min(args.positions, 64)
        check_end_to_end_fp32(args.shape, 16)
        check_end_to_end_bf16(args.shape, args.positions)
    elif not fla_kernels.USABLE:
        report("fla-usable", False, reason=fla_kernels.REASON)
    else:
        import fla

        summary["fla_version"] = getattr(fla, "__version__", "?")
        summary["device"] = torch.cuda.get_device_name()
        start = time.perf_counter()
        check_end_to_end_fp32(args.shape)
        check_end_to_end_bf16(args.shape, args.positions)
        summary["seconds"] = round(time.perf_counter() - start, 1)
    summary["results"] = RESULTS
    summary["ok"] = all(r["ok"] for r in RESULTS)
    text = json.dumps(summary, indent=2)
    print(text)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(text)
    return 0 if summary["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
