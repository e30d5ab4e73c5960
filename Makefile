# Two commands on a fresh clone: `make serve` (the course) and `make test` (everything).
# Each creates or refreshes .venv with what it needs when the dependency files change (stamps keyed on
# their hash): serving installs the site and the exam service; testing adds the test tools; `make lab`
# adds JupyterLab. tools/setup_venv.py installs with uv where it can (pip is the fallback) and says
# what it is doing at each step.
PY      ?= python3
PORT    ?= 8000
VENV    := .venv
BIN     := $(VENV)/bin
# Pinned in every install: an unpinned torch resolves to a multi-GB CUDA build.
TORCH   := torch==2.13.0
SETUP   := $(PY) tools/setup_venv.py --venv $(VENV) --torch "$(TORCH)"
DEPHASH := $(shell cat pyproject.toml Makefile tools/setup_venv.py | sha1sum | cut -c1-12)
SERVESTAMP := $(VENV)/.serve-$(DEPHASH)
TESTSTAMP  := $(VENV)/.test-$(DEPHASH)
LABSTAMP   := $(VENV)/.lab-$(DEPHASH)
export NO_MKDOCS_2_WARNING := 1

.PHONY: install install-test serve test test-fast test-load mutants lab site bench clean

install: $(SERVESTAMP)

install-test: $(TESTSTAMP)

$(SERVESTAMP):
	@$(SETUP) --extras site,serve --stamp $@

# DeepSpeed (an sdist, ~40 s to build) for the side-by-side parity tests; torch optimizers avoid its JIT kernels.
$(TESTSTAMP): $(SERVESTAMP)
	@$(SETUP) --extras test,site,serve,deepspeed --stamp $@

# JupyterLab is kept out of the test install: it pulls rfc3987-syntax, which slows every nbformat import.
$(LABSTAMP): $(SERVESTAMP)
	@$(SETUP) --extras lab,site,serve --stamp $@

site: install
	$(BIN)/mkdocs build --strict

serve: install
	@echo "==> starting the course site and the exam on http://127.0.0.1:$(PORT)/ (a first start builds the site, ~10 s)"
	$(BIN)/minimega serve --host 127.0.0.1 --port $(PORT) --dev

# Two workers (pytest-xdist): a file's tests stay together on one (conftest.py groups them), and the
# multi-rank jobs of one overlap the single-process tests of the other. WORKERS=0 runs in this process.
WORKERS ?= 2
XDIST   := $(if $(filter 0,$(WORKERS)),,-n $(WORKERS) --dist loadgroup)

# The project's own modules are compiled before each run, as the installed packages are at install
# (tools/setup_venv.py): with PYTHONDONTWRITEBYTECODE set, every rank and subprocess would compile them again.
PYC := $(BIN)/python -m compileall -q -j 0 src tests && $(BIN)/python -m compileall -q -l labs

# The Debian packages the tests drive (chromium, PostgreSQL, caddy, Slurm, munge, libaio, Node.js): installed as root,
# else one line names the command (tools/system_packages.py). The end of the run lists every skip and its reason.
test: install-test
	@$(PY) tools/system_packages.py
	@$(PYC)
	$(BIN)/python -m pytest -q $(XDIST)

test-fast: install-test
	@$(PYC)
	$(BIN)/python -m pytest -q $(XDIST) -m "not slow and not browser"

# The files whose tests time things (watchdogs, hostile-file refusals, overlap against a slowed wire, torchrun
# rendezvous, a Slurm requeue), run three times in a row beside four busy loops: a load of about 6 on two cores
# (tools/busy.py kills the loops when the runs end and prints the load average after each).
LOAD_FILES := tests/test_launch.py tests/test_cli.py tests/test_checkpoint_safety.py tests/test_comm_overlap.py \
              tests/test_torchrun.py tests/test_slurm.py
test-load: install-test
	@$(PYC)
	$(BIN)/python tools/busy.py 4 --times 3 -- $(BIN)/python -m pytest -q -p no:cacheprovider $(XDIST) $(LOAD_FILES)

# Not part of `make test`: each mutant of tools/mutants.toml breaks a copy of src/ and must fail its tests
# (~15 min on 2 cores; the measured table is tests/MUTANTS.md).
mutants: install-test
	nice -n 10 $(BIN)/python tools/mutants.py

lab: $(LABSTAMP)
	$(BIN)/python -m ipykernel install --sys-prefix --name minimega --display-name "minimega"
	$(BIN)/jupyter lab --notebook-dir=labs --ip=127.0.0.1 $$([ "$$(id -u)" = 0 ] && echo --allow-root)

bench: install
	$(BIN)/python bench/ddp.py

clean:
	rm -rf $(VENV) site build .pytest_cache
