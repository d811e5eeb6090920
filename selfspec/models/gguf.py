"""GGUF -> safetensors: the one-time conversion that makes later loads of a GGUF fast.

transformers can read a GGUF directly, but dequantizing it takes tens of seconds on each load.
The conversion writes the dequantized weights (and a tokenizer that passes `tokenizer_check`)
as a Hugging Face directory in the cache, atomically and under a file lock, keyed by the file's
fingerprint and `CONVERSION_VERSION`, so every later load is a plain safetensors read.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import shutil
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import torch
from filelock import FileLock
from transformers import AutoModelForCausalLM, AutoTokenizer

from selfspec.models.registry import cache_key
from selfspec.models.tokenizer_check import defect_message, gguf_adds_bos, tokenizer_problems

logger = logging.getLogger("selfspec.models.loader")

CONVERSION_VERSION = 1
"""Bump when the conversion output changes, so old caches are not reused."""
SOURCE_RECORD = "selfspec_source.json"

TRANSFORMERS_LOCK = threading.RLock()
"""`from_pretrained` flips process-global switches (weight init, tying) and restores
them on exit: two threads loading at once can leave a later load with untied, randomly
initialized weights (SmolLM2's tied lm_head reported MISSING). Loads in one process are
therefore serialized; across processes the conversion uses a file lock."""


def _safe_name(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip("._") or "model"


def converted_dir(cache_dir: Path, name: str, fingerprint: str) -> Path:
    """Where the safetensors conversion of a GGUF identified by `fingerprint` lives."""
    return cache_dir / "models" / f"{_safe_name(name)}-{cache_key(fingerprint, CONVERSION_VERSION)}"


def file_lock(path: Path) -> FileLock:
    """An exclusive lock file, so concurrent loaders (threads or processes) convert once."""
    path.parent.mkdir(parents=True, exist_ok=True)
    return FileLock(str(path))


def _strip_quantization(model: Any) -> None:
    """Forget the GGUF 'quantizer': the weights are already dequantized floats, and
    `save_pretrained` refuses non-serializable quantizers."""
    for holder, attribute in (
        (model, "hf_quantizer"),
        (model, "quantization_method"),
        (model.config, "quantization_config"),
    ):
        if hasattr(holder, attribute):
            with contextlib.suppress(AttributeError):
                delattr(holder, attribute)
            if hasattr(holder, attribute):
                with contextlib.suppress(AttributeError):
                    setattr(holder, attribute, None)
    if hasattr(model, "is_quantized"):
        with contextlib.suppress(AttributeError):
            model.is_quantized = False


def _make_readable(directory: Path) -> None:
    """Give every file the umask's default mode (some writers create files 0600)."""
    umask = os.umask(0)
    os.umask(umask)
    for file in directory.iterdir():
        file.chmod(0o666 & ~umask)


def load_gguf_tokenizer(gguf_path: Path) -> Any:
    """The tokenizer transformers builds from a GGUF file's vocabulary (check it: see
    `tokenizer_check`)."""
    return AutoTokenizer.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name)


def load_gguf(gguf_path: Path) -> tuple[Any, Any]:
    """Model (float32, dequantized) and tokenizer straight from a GGUF file (slow)."""
    tokenizer = load_gguf_tokenizer(gguf_path)
    model = AutoModelForCausalLM.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name, dtype=torch.float32)
    model.eval()
    return model, tokenizer


def convert_gguf(gguf_path: Path, target: Path, *, fingerprint: str) -> Path:
    """Write a GGUF's model + tokenizer as a safetensors HF dir at `target`, atomically.

    Returns `target`; if another process finished it first, its result is kept. A tokenizer
    that fails `tokenizer_check` is not saved (the record says why): loading then rebuilds it
    with whatever transformers is installed by then, or takes one given with `tokenizer=`.
    """
    with file_lock(target.parent.parent / "locks" / f"{target.name}.lock"):
        if (target / "config.json").is_file():
            return target
        logger.info("converting %s to safetensors in %s (once)", gguf_path, target)
        started = time.perf_counter()
        with TRANSFORMERS_LOCK:
            model, tokenizer = load_gguf(gguf_path)
        _strip_quantization(model)
        adds_bos = gguf_adds_bos(gguf_path)
        problems = tokenizer_problems(tokenizer, expects_bos=adds_bos)
        partial = target.with_name(f".{target.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.partial")
        try:
            model.save_pretrained(partial, safe_serialization=True)
            if problems:
                # A warning, not an error: a load given a working tokenizer (`--tokenizer`) goes on
                # with that one; a load without one stops at `_converted_tokenizer`'s check.
                logger.warning(
                    "the conversion saves no tokenizer (a load given --tokenizer uses that one): %s",
                    defect_message(str(gguf_path), problems),
                )
            else:
                tokenizer.save_pretrained(partial)
            record = {
                "gguf_file": str(gguf_path),
                "fingerprint": fingerprint,
                "conversion_version": CONVERSION_VERSION,
                "seconds": round(time.perf_counter() - started, 2),
                "gguf_add_bos_token": adds_bos,
                "tokenizer_problems": problems,
            }
            (partial / SOURCE_RECORD).write_text(json.dumps(record, indent=2))
            _make_readable(partial)
            try:
                os.rename(partial, target)
            except OSError:
                if not (target / "config.json").is_file():
                    raise
        finally:
            if partial.exists():
                shutil.rmtree(partial, ignore_errors=True)
    return target


def ensure_converted(gguf_path: Path, name: str, fingerprint: str, cache_dir: Path) -> Path:
    """The converted directory of a GGUF, converting it first if no process did yet."""
    target = converted_dir(cache_dir, name, fingerprint)
    if (target / "config.json").is_file():
        return target
    return convert_gguf(gguf_path, target, fingerprint=fingerprint)
