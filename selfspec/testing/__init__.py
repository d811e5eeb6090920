"""Test helpers shared across the project (tiny offline models and tokenizer)."""

from selfspec.testing.tiny import save_tiny_model_dir, tiny_config, tiny_model, tiny_tokenizer

__all__ = ["save_tiny_model_dir", "tiny_config", "tiny_model", "tiny_tokenizer"]
