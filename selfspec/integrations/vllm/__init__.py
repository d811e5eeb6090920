"""SSR on an unmodified vLLM (the `vllm` extra): a driver that forks draft requests and a
`custom_class` proposer that feeds the drafts to vLLM's own verifier.

- `engine.VLLMEngine`: the driver over `vllm.v1.engine.llm_engine.LLMEngine`.
- `proposer.SSRProposer` / `proposer.SSRWorkerExtension`: the worker side.
- `handoff`: the plan a request carries in `SamplingParams.extra_args`.
- `compat`: the pinned versions, the hooks and the runner attributes used.

Importing this package does not import vLLM; `VLLMEngine` checks the version when built.
"""

from selfspec.integrations.vllm.compat import SUPPORTED_VERSIONS, VLLMUnsupportedError, check_vllm

__all__ = ["SUPPORTED_VERSIONS", "VLLMEngine", "VLLMUnsupportedError", "check_vllm"]


def __getattr__(name: str):
    # The driver imports the inference stack; loaded on first use, not with the package.
    if name == "VLLMEngine":
        from selfspec.integrations.vllm.engine import VLLMEngine

        return VLLMEngine
    raise AttributeError(name)
