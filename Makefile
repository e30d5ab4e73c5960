# Two commands on a fresh clone: `make serve` (the course) and `make test` (everything).
# Each creates or refreshes .venv when the dependency files change (a stamp keyed on their hash).
PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
TORCH   := torch==2.13.0
DEPHASH := $(shell cat pyproject.toml Makefile | sha1sum | cut -c1-12)
STAMP   := $(VENV)/.stamp-$(DEPHASH)
LABSTAMP := $(VENV)/.lab-$(DEPHASH)
export NO_MKDOCS_2_WARNING := 1

.PHONY: install serve test test-fast lab site bench clean

install: $(STAMP)

$(STAMP):
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# Pin the CPU wheel first: an unpinned torch resolves to a multi-GB CUDA build.
	$(BIN)/pip install -q "$(TORCH)"
	# DeepSpeed (an sdist, ~40 s to build) for the side-by-side parity tests; torch optimizers avoid its JIT kernels.
	$(BIN)/pip install -q -e ".[test,site,serve,deepspeed]" "$(TORCH)"
	rm -f $(VENV)/.stamp-*
	touch $@

site: install
	$(BIN)/mkdocs build --strict

serve: install
	$(BIN)/minimega serve --host 127.0.0.1 --port 8000 --dev

test: install
	$(BIN)/python -m pytest -q

test-fast: install
	$(BIN)/python -m pytest -q -m "not slow and not browser"

# JupyterLab is kept out of the test install: it pulls rfc3987-syntax, which slows every nbformat import.
$(LABSTAMP): $(STAMP)
	$(BIN)/pip install -q -e ".[lab]" "$(TORCH)"
	rm -f $(VENV)/.lab-*
	touch $@

lab: $(LABSTAMP)
	$(BIN)/python -m ipykernel install --sys-prefix --name minimega --display-name "minimega"
	$(BIN)/jupyter lab --notebook-dir=labs --ip=127.0.0.1 $$([ "$$(id -u)" = 0 ] && echo --allow-root)

bench: install
	$(BIN)/python bench/ddp.py

clean:
	rm -rf $(VENV) site build .pytest_cache
