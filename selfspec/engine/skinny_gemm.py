"""Skinny GEMMs for decode and verify steps: `x @ W.T` with at most 64 rows, one Triton kernel.

Why: at batch 1-8 a decode step's linear layers are a memory-bandwidth problem: each weight
is read once and each byte does two flops. Measured on the H200 (bf16, inside CUDA graphs),
cuBLAS reaches 82-84% of copy bandwidth on the large projections of a 4B model but 61% on
the output projection and 75% on the down projection, partly through split-K variants that
add a reduction kernel. This kernel streams the weight once, `BLOCK_N` output features per
program, the rows (padded to a tensor-core tile of 16/32/64) multiplied in as the small side
of the product, so all rows share each weight load.

Batch invariance by construction: a row's output is accumulated over K in the same
`BLOCK_K` order whatever the other rows hold, and rows past `M` are zero. So a 1-token decode
and a k-token verify round a row alike, which greedy speculation in bf16 relies on (the
engine's decode and verify steps must agree bit for bit for the baseline and a speculative
mode to commit the same tokens).

Which kernel a weight shape uses is measured, not assumed: `SkinnyGemmTable.select` times
cuBLAS and every config of this kernel on the device at the row counts of `SELECT_ROWS`, checks
the kernel's output against cuBLAS at each, and keeps for that (N, K) the one fastest over all
of them, for every row count <= `MAX_ROWS` (one choice per shape keeps batch invariance). Why
several row counts: a config picked at one row (small `BLOCK_N`, many programs) makes every
program reload all the rows' inputs, which at 32 rows costs more than the weight stream it
saves; on an H100 such one-row choices on every Qwen3-8B projection left the engine's 32-row
step 0.56 ms behind vLLM's while its one-row step was level. `TRITON_INTERPRET=1` runs the
kernel on CPU tensors for tests.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass

import torch

from selfspec.engine.triton_env import HAVE_TRITON, available, pdl_supported, tl, triton  # noqa: F401

MAX_ROWS = 64  # more rows than this: cuBLAS (the step is no longer a weight stream)
SELECT_ROWS_ENV = "SELFSPEC_SKINNY_SELECT_ROWS"
"""Comma-separated row counts to time the choice at instead of `SELECT_ROWS` (`1`: the one-row
choice, for an A/B in one run)."""
SELECT_ROWS = (1, 8, 32)  # the row counts a shape's choice is timed at: one request, a few, a full batch


def select_rows() -> tuple[int, ...]:
    """`SELECT_ROWS`, or the row counts `SELECT_ROWS_ENV` names (each 1..`MAX_ROWS`)."""
    raw = os.environ.get(SELECT_ROWS_ENV, "").strip()
    if not raw:
        return SELECT_ROWS
    rows = tuple(int(part) for part in raw.split(","))
    if not rows or any(not 1 <= r <= MAX_ROWS for r in rows):
        raise ValueError(f"{SELECT_ROWS_ENV}={raw!r}: row counts must lie in 1..{MAX_ROWS}")
    return rows


L2_DEFEAT_BYTES = 120 * 2**20  # selection timings cycle through weight copies at least this large


@dataclass(frozen=True)
class SkinnyConfig:
    """One launch configuration of the kernel.

    `pdl`: programmatic dependent launch (Hopper on): the kernel's launch and first weight
    load overlap the tail of the kernel before it, which otherwise leaves the GPU idle for
    about a microsecond per launch even inside a CUDA graph.
    """

    block_n: int
    block_k: int
    num_warps: int
    num_stages: int
    pdl: bool = False

    @property
    def label(self) -> str:
        return f"n{self.block_n}k{self.block_k}w{self.num_warps}s{self.num_stages}" + ("-pdl" if self.pdl else "")

    def with_pdl(self) -> "SkinnyConfig":
        return SkinnyConfig(self.block_n, self.block_k, self.num_warps, self.num_stages, pdl=True)


# Tried on each weight shape at selection time: small BLOCK_N gives the many programs a narrow
# projection needs to fill 132 SMs; large BLOCK_K and stages keep enough bytes in flight.
CONFIGS = (
    SkinnyConfig(16, 256, 4, 4),
    SkinnyConfig(16, 512, 4, 3),
    SkinnyConfig(32, 256, 4, 4),
    SkinnyConfig(32, 128, 4, 6),
    SkinnyConfig(64, 128, 4, 4),
    SkinnyConfig(64, 256, 8, 3),
    SkinnyConfig(128, 128, 8, 3),
)


if HAVE_TRITON:

    @triton.jit
    def _skinny_kernel(
        x_ptr,
        w_ptr,
        b_ptr,
        out_ptr,
        M,
        N,
        K,
        sx_m,
        sw_n,
        so_m,
        HAS_BIAS: tl.constexpr,
        BLOCK_M: tl.constexpr,
        BLOCK_N: tl.constexpr,
        BLOCK_K: tl.constexpr,
        USE_PDL: tl.constexpr,
    ):
        pid = tl.program_id(0)
        offs_n = pid * BLOCK_N + tl.arange(0, BLOCK_N)
        offs_m = tl.arange(0, BLOCK_M)
        n_ok = offs_n < N
        m_ok = offs_m < M
        acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
        # The first K tile, peeled: its weight load does not depend on the kernel before this
        # one, so with programmatic dependent launch it is issued before waiting for that
        # kernel (whose output is x) to finish.
        offs_k = tl.arange(0, BLOCK_K)
        k_ok = offs_k < K
        w = tl.load(w_ptr + offs_n[:, None] * sw_n + offs_k[None, :], mask=n_ok[:, None] & k_ok[None, :], other=0.0)
        if USE_PDL:
            tl.extra.cuda.gdc_wait()
        xt = tl.load(x_ptr + offs_m[None, :] * sx_m + offs_k[:, None], mask=m_ok[None, :] & k_ok[:, None], other=0.0)
        acc = tl.dot(w, xt, acc, input_precision="ieee")
        for k0 in range(BLOCK_K, K, BLOCK_K):
            offs_k = k0 + tl.arange(0, BLOCK_K)
            k_ok = offs_k < K
            w = tl.load(w_ptr + offs_n[:, None] * sw_n + offs_k[None, :], mask=n_ok[:, None] & k_ok[None, :], other=0.0)
            xt = tl.load(
                x_ptr + offs_m[None, :] * sx_m + offs_k[:, None], mask=m_ok[None, :] & k_ok[:, None], other=0.0
            )
            acc = tl.dot(w, xt, acc, input_precision="ieee")
        if HAS_BIAS:
            bias = tl.load(b_ptr + offs_n, mask=n_ok, other=0.0).to(tl.float32)
            acc += bias[:, None]
        out = out_ptr + offs_m[None, :] * so_m + offs_n[:, None]
        tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=n_ok[:, None] & m_ok[None, :])


def block_rows(m: int) -> int:
    """The tensor-core tile the rows are padded to (16 at least, the smallest `tl.dot` side)."""
    return 16 if m <= 16 else 32 if m <= 32 else 64


def skinny_linear(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, config: SkinnyConfig
) -> torch.Tensor:
    """`F.linear(x, weight, bias)` for at most `MAX_ROWS` rows (over all leading dims)."""
    n, k = weight.shape
    lead = x.shape[:-1]
    x2 = x.reshape(-1, k)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    m = x2.shape[0]
    if m > MAX_ROWS:
        raise ValueError(f"skinny_linear takes at most {MAX_ROWS} rows, got {m}")
    if weight.stride(-1) != 1:
        raise ValueError("skinny_linear needs a weight with contiguous rows")
    out = torch.empty((m, n), dtype=x.dtype, device=x.device)
    grid = (triton.cdiv(n, config.block_n),)
    _skinny_kernel[grid](
        x2,
        weight,
        bias if bias is not None else weight,
        out,
        m,
        n,
        k,
        x2.stride(0),
        weight.stride(0),
        out.stride(0),
        HAS_BIAS=bias is not None,
        BLOCK_M=block_rows(m),
        BLOCK_N=config.block_n,
        BLOCK_K=config.block_k,
        USE_PDL=config.pdl,
        num_warps=config.num_warps,
        num_stages=config.num_stages,
        **({"launch_pdl": True} if config.pdl else {}),
    )
    return out.view(*lead, n)


class SkinnyGemmTable:
    """Per weight shape, the measured choice between cuBLAS (None) and a kernel config."""

    def __init__(self, force: SkinnyConfig | None = None) -> None:
        # `force`: every shape uses this config, unmeasured (interpreter tests on CPU).
        self.force = force
        self.choice: dict[tuple[int, int, torch.dtype], SkinnyConfig | None] = {}
        self.timings: dict[str, dict[str, float]] = {}
        self.errors: dict[str, str] = {}
        self._lock = threading.Lock()

    def linear(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        """`F.linear`, through the kernel where it was measured faster for this shape."""
        rows = x.numel() // x.shape[-1] if x.shape[-1] else 0
        if rows <= MAX_ROWS and (x.is_cuda or self.force is not None):
            config = self.force or self.choice.get((weight.shape[0], weight.shape[1], weight.dtype))
            if config is not None:
                return skinny_linear(x, weight, bias, config)
        return torch.nn.functional.linear(x, weight, bias)

    def select(self, weight: torch.Tensor, bias: torch.Tensor | None = None, reps: int = 20) -> SkinnyConfig | None:
        """Measure cuBLAS and each config at `SELECT_ROWS` rows on this weight; keep the correct
        one fastest over them (`choose_config`)."""
        key = (weight.shape[0], weight.shape[1], weight.dtype)
        with self._lock:
            if key in self.choice:
                return self.choice[key]
            name = f"{key[0]}x{key[1]}"
            choice: SkinnyConfig | None = None
            if weight.is_cuda and available(weight.device) and weight.stride(-1) == 1:
                counts = select_rows()  # a bad SELFSPEC_SKINNY_SELECT_ROWS raises here, not into `errors`
                try:
                    choice = self._measure(name, weight, bias, reps, counts)
                except Exception as exc:  # noqa: BLE001 - a kernel that fails to build leaves cuBLAS in place
                    self.errors[name] = f"{type(exc).__name__}: {str(exc)[:300]}"
            self.choice[key] = choice
            return choice

    def _measure(
        self, name: str, weight: torch.Tensor, bias: torch.Tensor | None, reps: int, counts: tuple[int, ...]
    ) -> SkinnyConfig | None:
        # Cycle through enough copies of the weight that they do not fit in L2 (50 MB on an
        # H200) together: a decode step streams each weight from memory once.
        copies = max(1, min(8, -(-L2_DEFEAT_BYTES // (weight.numel() * weight.element_size()))))
        weights = [weight] + [weight.clone() for _ in range(copies - 1)]
        reps = copies * max(1, reps // copies)

        def run(fn):
            def body():
                for i in range(reps):
                    fn(weights[i % copies])

            return body

        candidates = list(CONFIGS)
        if pdl_supported(weight.device):
            candidates += [c.with_pdl() for c in CONFIGS]
        times: dict[str, dict[int, float]] = {"cublas": {}}
        for rows in counts:
            x = torch.randn((rows, weight.shape[1]), dtype=weight.dtype, device=weight.device)
            ref = torch.nn.functional.linear(x, weight, bias).float()
            tolerance = 2e-2 * ref.abs().max().item() + 1e-3
            times["cublas"][rows] = graph_seconds_per_call(
                run(lambda w, x=x: torch.nn.functional.linear(x, w, bias)), reps
            )
            for config in candidates:
                if config.label not in times and rows != counts[0]:
                    continue  # out at an earlier row count
                try:
                    got = skinny_linear(x, weight, bias, config).float()
                    if (got - ref).abs().max().item() > tolerance:
                        self.errors[f"{name} {config.label}"] = (
                            f"output differs from cuBLAS beyond bf16 rounding at {rows} rows"
                        )
                        times.pop(config.label, None)
                        continue
                    times.setdefault(config.label, {})[rows] = graph_seconds_per_call(
                        run(lambda w, c=config, x=x: skinny_linear(x, w, bias, c)), reps
                    )
                except Exception as exc:  # noqa: BLE001 - e.g. a Triton without launch_pdl: that config is out
                    self.errors[f"{name} {config.label}"] = f"{type(exc).__name__}: {str(exc)[:200]}"
                    times.pop(config.label, None)
                    torch.cuda.synchronize()
        best = choose_config(times)
        self.timings[name] = {
            label: {str(rows): round(1e6 * t, 2) for rows, t in per_rows.items()} for label, per_rows in times.items()
        }
        return None if best == "cublas" else next(c for c in candidates if c.label == best)

    def report(self) -> dict:
        """What was chosen per shape (and the measured microseconds), for records."""
        return {
            "choice": {f"{n}x{k}": (c.label if c else "cublas") for (n, k, _), c in self.choice.items()},
            "timings_us": self.timings,
            "errors": self.errors,
        }


def choose_config(times: dict[str, dict[int, float]]) -> str:
    """The label ("cublas" or a config's) whose times, each over the fastest time at its row
    count, sum lowest: every measured row count weighs alike, whatever its absolute time. A
    label missing a row count (out at it) is not chosen."""
    counts = set().union(*(per_rows.keys() for per_rows in times.values()))
    complete = {label: per_rows for label, per_rows in times.items() if set(per_rows) == counts}
    fastest = {rows: min(per_rows[rows] for per_rows in complete.values()) for rows in counts}
    return min(complete, key=lambda label: sum(complete[label][rows] / fastest[rows] for rows in counts))


def graph_seconds_per_call(body, reps: int) -> float:
    """Seconds per call of `body()` (which makes `reps` calls) captured in one CUDA graph."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        body()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, capture_error_mode="thread_local"):
        body()
    graph.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(3):
        graph.replay()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / 1e3 / (3 * reps)
