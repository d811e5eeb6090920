"""Write the benchmark's model: a tiny random Llama (hidden 128, head_dim 32 as vLLM's CPU
attention needs) with `tiny_tokenizer()`, attention output zeroed, so its answer after the
end-of-thinking marker does not depend on the CoT: drafts match, as a thinker's do.

Run: python benchmarks/vllm_cpu/tiny_model.py DIR
"""

import sys
from pathlib import Path

import torch

from selfspec.testing.tiny import tiny_model, tiny_tokenizer

if __name__ == "__main__":
    path = Path(sys.argv[1])
    tok = tiny_tokenizer()
    model = tiny_model(
        "llama", len(tok), seed=5, hidden=128, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id
    )
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.zero_()
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path, safe_serialization=True)
    tok.save_pretrained(path)
    print(path)
