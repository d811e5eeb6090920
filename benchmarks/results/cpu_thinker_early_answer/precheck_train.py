"""Pre-check of early-answer training on the CPU: v2 + a LoRA trained on early-answer examples only."""
import selfspec_research.thinker.train as T
from selfspec_research.thinker.train import DataSpec, TrainConfig, LoraSpec, train_thinker, save_adapter

real = T.encode_examples
def early_only(tokenizer, fmt, items, max_len):
    examples, dropped = real(tokenizer, fmt, items, max_len)
    return T.early_answer_examples(examples, len(fmt.close_ids), 1.0, seed=0), dropped
T.encode_examples = early_only

data = DataSpec.for_version("thinker-data-v2", families=["class_synthesis"], seed=0, items_per_family=60)
config = TrainConfig(base="smollm2-thinker-v2", data=data, heldout_items_per_family=2, max_len=2048,
                     tokens_per_batch=8192, epochs=1.0, lr=5e-4, lora=LoraSpec(r=8, alpha=16, dropout=0.0),
                     device="cpu", dtype="float32", log_every=2)
model, result = train_thinker(config, progress=False)
print(result.steps, result.seconds, result.heldout_loss_before, result.heldout_loss_after)
save_adapter(model, "/tmp/early/v2-early", config, result, command="pre-check", description="v2 + early-answer LoRA (CPU pre-check)")
