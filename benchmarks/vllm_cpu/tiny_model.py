"""Write the benchmark's model: a tiny random Llama (hidden 128, head_dim 32 as vLLM's CPU
attention needs) with `tiny_tokenizer()`, attention output zeroed, so its answer after the
end-of-thinking marker does not depend on the CoT: drafts match, as a thinker's do. The same
model as the vLLM tests' "bigram" one (`selfspec.testing.tiny.save_tiny_model_dir`).

Run: python benchmarks/vllm_cpu/tiny_model.py DIR
"""

import sys

from selfspec.testing.tiny import save_tiny_model_dir

if __name__ == "__main__":
    print(save_tiny_model_dir(sys.argv[1], "llama", seed=5, hidden=128, zero_attention=True))
