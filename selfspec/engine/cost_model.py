"""A fitted step-cost model: what one forward of a model costs on a device, from a few numbers.

Why: a speculation policy needs the cost of shapes it has not run yet (a 32-token verify, a
second row, a batch of 16) to decide whether to propose at all, and what-if questions ("what
would this run cost at 8B on an H100?") need step times without a GPU. Timing every shape
takes a GPU session; a model with a handful of coefficients per (shape, device) fitted to a
measured grid (`selfspec bench step-grid`) answers both, and is small enough to commit as data.

The form follows where a forward's time goes:

    t = fixed                                   weights read once + launches (bandwidth-bound floor)
      + per_row   * (rows - 1)                  per-row work that does not shrink with the batch
      + per_token * tokens                      GEMM tiles growing below the compute knee
      + compute   * max(0, tokens - knee)       compute-bound GEMMs past the knee
      + kv_decode * rows * keys  (decode steps) attention reading each row's keys, one query per row
      + kv_verify * rows * keys  (verify steps) the same with several queries per row
      + attn      * tokens * keys               attention's query x key work
      + log_keys  * log2(keys)                  per-step work that grows with the key bucket, slowly

with `tokens` = rows x tokens per row (all fed tokens) and `keys` the key length a row attends
over. Why the key read is split by step kind: a decode step's attention is bandwidth-bound on the
cache (Qwen3-4B, 32 rows x 4,096 keys: 19 GB of K/V, 5.8 ms at an H100's bandwidth, against 6.4 ms
measured over the same step at 256 keys), while a verify step's is dominated by its query x key
work; one coefficient for both, fitted mostly to the many verify shapes, priced long decode steps
12-13% low at 4B and 8B. The log term takes what grows with the key bucket less than linearly (each
bucket its own graph; split-key programs and their reduce): at 135M a decode step costs 0.14 ms more
at 1,024 keys than at 256 and only 0.20 ms more again at 4,096. On the committed H100 grids (3- and
5-fold cross-validation over diagonals of the grid) the two changes raised the share of held-out
shapes within 10% from 92.1 / 96.0 / 98.4% to 96.4 / 97.6 / 99.2% (135M / 4B / 8B). Static forwards (CUDA graphs) pad a step to its bucket shape, so the model rounds rows,
tokens per row and keys up to the buckets the engine captured, as the engine does, before the
formula; a shape beyond the buckets runs eagerly at its real size.

The fit is linear least squares on relative error (each point weighted by 1/t, so a 1 ms step
and a 40 ms step count alike) for each candidate knee, keeping every coefficient >= 0 (a
negative coefficient is dropped and the rest refitted); the knee with the smallest error wins.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np

TERMS = ("fixed", "per_row", "per_token", "compute", "kv_decode", "kv_verify", "attn", "log_keys")
"""The model's coefficients, in the order of `features`."""
LEGACY_TERMS = ("fixed", "per_row", "per_token", "compute", "kv_read", "attn")
"""An older form's coefficients (one key-read term for every step): read as kv_decode = kv_verify =
kv_read and log_keys = 0, the same predictions."""
KNEES = (0, 16, 32, 64, 96, 128, 192, 256, 384, 512, 768, 1024)
"""Candidate fed-token counts where GEMMs turn compute-bound (H100/H200 bf16: a few hundred)."""


@dataclass(frozen=True)
class StepPoint:
    """One measured step shape: `rows` rows of `tokens` tokens each over `keys` keys per row."""

    rows: int
    tokens: int
    keys: int
    seconds: float


@dataclass(frozen=True)
class Buckets:
    """The static forwards' shape rounding (`static_forward.GraphBuckets`), or none (eager)."""

    batch: tuple[int, ...] = ()
    tokens: tuple[int, ...] = ()
    min_keys: int = 0
    max_len: int = 0

    def round(self, rows: int, tokens: int, keys: int) -> tuple[int, int, int]:
        """The shape a forward of this size runs at (padded up to its bucket, if it has one)."""
        row_b = next((b for b in self.batch if b >= rows), None)
        tok_b = next((b for b in self.tokens if b >= tokens), None)
        if row_b is None or tok_b is None or not self.min_keys:
            return rows, tokens, keys  # eager: the real size
        size = self.min_keys
        while size < keys:
            size *= 2
        return row_b, tok_b, min(size, self.max_len) if self.max_len else size


def features(rows: int, tokens: int, keys: int, knee: int) -> np.ndarray:
    """The terms of the module docstring's formula for one (bucketed) shape."""
    fed = rows * tokens
    row_keys = float(rows * keys)
    decode = tokens == 1
    return np.array(
        [
            1.0,
            rows - 1.0,
            float(fed),
            float(max(0, fed - knee)),
            row_keys if decode else 0.0,
            0.0 if decode else row_keys,
            float(fed * keys),
            math.log2(keys),
        ],
        dtype=np.float64,
    )


@dataclass
class StepCostModel:
    """Seconds per forward of one model shape on one device (module docstring)."""

    coefficients: dict[str, float]
    knee: int
    buckets: Buckets = field(default_factory=Buckets)
    shape: str = ""
    device: str = ""
    dtype: str = ""
    fit_error: dict[str, float] = field(default_factory=dict)
    signature: dict[str, int] = field(default_factory=dict)  # the model config it was measured on

    def seconds(self, rows: int, tokens: int = 1, keys: int = 1) -> float:
        """Predicted seconds of a forward of `rows` rows of `tokens` tokens over `keys` keys."""
        if rows < 1 or tokens < 1 or keys < 1:
            raise ValueError(f"a forward needs rows, tokens and keys >= 1, got {rows}, {tokens}, {keys}")
        x = features(*self.buckets.round(rows, tokens, keys), self.knee)
        return float(x @ np.array([self.coefficients[t] for t in TERMS]))

    def relative_errors(self, points: Iterable[StepPoint]) -> list[float]:
        """(predicted - measured) / measured per point."""
        return [(self.seconds(p.rows, p.tokens, p.keys) - p.seconds) / p.seconds for p in points]

    def to_dict(self) -> dict:
        out = asdict(self)
        out["buckets"] = {k: list(v) if isinstance(v, tuple) else v for k, v in out["buckets"].items()}
        out["form"] = "t = " + " + ".join(TERMS) + " (selfspec.engine.cost_model)"
        return out

    @classmethod
    def from_dict(cls, data: dict) -> StepCostModel:
        given = data.get("coefficients", {})
        if all(t in given for t in LEGACY_TERMS) and not any(t in given for t in ("kv_decode", "kv_verify")):
            given = {**given, "kv_decode": given["kv_read"], "kv_verify": given["kv_read"], "log_keys": 0.0}
        missing = [t for t in TERMS if t not in given]
        if missing or "knee" not in data:
            raise ValueError(f"not a step-cost model: missing {missing or ['knee']}")
        b = data.get("buckets") or {}
        return cls(
            coefficients={t: float(given[t]) for t in TERMS},
            knee=int(data["knee"]),
            buckets=Buckets(
                batch=tuple(b.get("batch", ())),
                tokens=tuple(b.get("tokens", ())),
                min_keys=int(b.get("min_keys", 0)),
                max_len=int(b.get("max_len", 0)),
            ),
            shape=data.get("shape", ""),
            device=data.get("device", ""),
            dtype=data.get("dtype", ""),
            fit_error=dict(data.get("fit_error", {})),
            signature={k: int(v) for k, v in (data.get("signature") or {}).items()},
        )

    def save(self, path: Path) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), indent=1) + "\n")

    @classmethod
    def load(cls, path: Path) -> StepCostModel:
        return cls.from_dict(json.loads(Path(path).read_text()))


def _nonnegative_lstsq(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Least squares with every coefficient >= 0: drop the most negative term, refit, repeat."""
    active = list(range(x.shape[1]))
    while True:
        coef = np.zeros(x.shape[1])
        if not active:
            return coef
        sol, *_ = np.linalg.lstsq(x[:, active], y, rcond=None)
        coef[active] = sol
        if (sol >= 0).all():
            return coef
        active.pop(int(np.argmin(sol)))


def fit(
    points: Sequence[StepPoint], buckets: Buckets = Buckets(), knees: Iterable[int] = KNEES, **about
) -> StepCostModel:
    """The model of the module docstring fitted to `points` (relative least squares, every
    coefficient >= 0, the best of the candidate knees)."""
    if len(points) < len(TERMS):
        raise ValueError(f"a fit needs at least {len(TERMS)} measured shapes, got {len(points)}")
    if any(p.seconds <= 0 for p in points):
        raise ValueError("measured seconds must be > 0")
    shapes = [buckets.round(p.rows, p.tokens, p.keys) for p in points]
    y = np.array([p.seconds for p in points])
    best: tuple[float, int, np.ndarray] | None = None
    for knee in knees:
        x = np.stack([features(*s, knee) for s in shapes]) / y[:, None]  # relative: divide by t
        coef = _nonnegative_lstsq(x, np.ones(len(points)))
        err = float(np.sqrt(np.mean((x @ coef - 1.0) ** 2)))
        if best is None or err < best[0]:
            best = (err, knee, coef)
    assert best is not None
    model = StepCostModel(dict(zip(TERMS, map(float, best[2]))), best[1], buckets, **about)
    errs = np.abs(model.relative_errors(points))
    model.fit_error = {"points": len(points), "rms": best[0], "max_abs": float(errs.max())}
    return model


SIGNATURE_FIELDS = (
    "hidden_size",
    "num_hidden_layers",
    "intermediate_size",
    "vocab_size",
    "num_attention_heads",
    "num_key_value_heads",
)
"""What decides a forward's time in a model config (the weights' values do not)."""
PRIORS_DIR = Path(__file__).parent / "cost_priors"
"""Packaged models (`selfspec bench step-grid` fits), one file per model shape and device."""


def signature(config) -> dict[str, int]:
    """The config's shape fields (`SIGNATURE_FIELDS`; a multimodal config's text part)."""
    config = getattr(config, "text_config", None) or config
    return {f: int(getattr(config, f)) for f in SIGNATURE_FIELDS if getattr(config, f, None) is not None}


def packaged_prior(config, device_name: str, directory: Path = PRIORS_DIR) -> StepCostModel | None:
    """The packaged step-cost model measured on this model shape and this device, if there is one:
    what the speculation policy prices unmeasured step shapes with from the first step on."""
    if config is None or not directory.is_dir():
        return None
    wanted = signature(config)
    for path in sorted(directory.glob("*.json")):
        try:
            model = StepCostModel.load(path)
        except (OSError, ValueError):
            continue
        if model.device == device_name and model.signature and model.signature == wanted:
            return model
    return None
