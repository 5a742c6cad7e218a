# mlsys_nb: `make lab` sets everything up and opens JupyterLab; `make test` runs every test.
# Re-running skips what is already installed (stamp files in $(VENV)).
PYTHON     ?= python3
VENV       ?= .venv
# torch is installed first, pinned: a looser range would pull a multi-GB CUDA build.
# For a GPU machine, e.g.: make lab TORCH_SPEC="torch==2.13.0 --index-url https://download.pytorch.org/whl/cu128"
TORCH_SPEC ?= torch==2.13.0
EXTRAS     ?= lab,test,bench,inference,rl,kernels,finetune
HOST       ?= 127.0.0.1
PORT       ?= 8888
DASHBOARD_PORT ?= 8866
SERVE_PORT ?= 8000
MODEL      ?= tiny
PYTEST_ARGS ?=
PY         := $(VENV)/bin/python
# JupyterLab refuses to start as root (containers, CI machines) unless told it is meant.
ALLOW_ROOT := $(if $(filter 0,$(shell id -u)),--allow-root,)

.PHONY: setup lab test test-fast test-gpu lint format dashboard serve bench worksheets site clean-venv help

help:
	@echo "make lab        set up .venv (first time) and open JupyterLab on notebooks/ at $(HOST)"
	@echo "make test       set up .venv (first time) and run every test (unit, notebooks, papermill)"
	@echo "make test-fast  unit tests only (no notebooks, no browser)"
	@echo "make test-gpu   the GPU pack (tests/gpu) with the python3 found, no venv: smoke first, then the rest"
	@echo "make lint       ruff check over the code and the notebooks (also run by make test)"
	@echo "make format     ruff format, then ruff check --fix (rewrites files)"
	@echo "make dashboard  serve notebooks/00_dashboard.ipynb as a web page (Voila) at $(HOST)"
	@echo "make serve      OpenAI-compatible server (MODEL=tiny) at http://$(HOST):$(SERVE_PORT)/v1"
	@echo "make bench      run the benchmark scripts in benchmarks/"
	@echo "make worksheets SEED=n  printable interview worksheets + answer keys in worksheets/"
	@echo "make site       execute every notebook (papermill) into a static site: site/index.html (SITE_NOTEBOOKS=\"14 20\" a subset)"
	@echo "make clean-venv remove .venv (e.g. after changing TORCH_SPEC)"

$(VENV)/.stamp-torch:
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install $(TORCH_SPEC)
	@touch $@

$(VENV)/.stamp-install: $(VENV)/.stamp-torch pyproject.toml constraints.txt
	$(PY) -m pip install --quiet -c constraints.txt -e ".[$(EXTRAS)]"
	$(PY) -m ipykernel install --sys-prefix --name mlsys_nb --display-name "mlsys_nb (Python 3)"
	@touch $@

setup: $(VENV)/.stamp-install

lab: setup
	$(VENV)/bin/jupyter lab --ip $(HOST) --port $(PORT) --notebook-dir notebooks $(ALLOW_ROOT)

# Byte-compile the package first: where PYTHONDONTWRITEBYTECODE is set (containers, CI images) every process
# would otherwise compile it from source on import (~0.25 s of CPU each, in ~150 kernels, ranks and servers).
test: setup
	$(PY) -m compileall -q mlsys_nb benchmarks
	$(PY) -m pytest $(PYTEST_ARGS)

test-fast: setup
	$(PY) -m compileall -q mlsys_nb benchmarks
	$(PY) -m pytest tests -m "not notebook and not browser" $(PYTEST_ARGS)

# The GPU pack: no set-up (a GPU machine may have no network), the interpreter on PATH and its torch;
# the smoke subset first, then the rest; figures land in data/measured/gpu-<device>.md/.json as measured.
GPU_PYTHON ?= python3
test-gpu:
	PYTHONPATH=. $(GPU_PYTHON) -m pytest -o addopts="" -p no:cacheprovider -v -rs -m "gpu and smoke" tests/gpu $(PYTEST_ARGS)
	PYTHONPATH=. $(GPU_PYTHON) -m pytest -o addopts="" -p no:cacheprovider -v -rs -m "gpu and not smoke" tests/gpu $(PYTEST_ARGS)

lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

format: setup
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .

# Voila starts one kernel (~180 MiB) per page load; a kernel idle for DASHBOARD_CULL_IDLE_S seconds with no
# page connected is shut down, checked every DASHBOARD_CULL_INTERVAL_S seconds (an open page keeps its kernel:
# cull_connected=False). tests/test_dashboard_culling.py runs these flags with short times.
DASHBOARD_CULL_IDLE_S ?= 120
DASHBOARD_CULL_INTERVAL_S ?= 30
dashboard: setup
	@echo "Dashboard: http://$(HOST):$(DASHBOARD_PORT)/  (Ctrl-C to stop)"
	$(VENV)/bin/voila notebooks/00_dashboard.ipynb --no-browser --Voila.ip=$(HOST) --port=$(DASHBOARD_PORT) \
		--MappingKernelManager.cull_idle_timeout=$(DASHBOARD_CULL_IDLE_S) \
		--MappingKernelManager.cull_interval=$(DASHBOARD_CULL_INTERVAL_S) --MappingKernelManager.cull_connected=False

serve: setup
	$(PY) -m mlsys_nb.inference.serve --model $(MODEL) --host $(HOST) --port $(SERVE_PORT)

bench: setup
	@for f in benchmarks/*.py; do echo "== $$f"; $(PY) $$f || exit 1; done

SEED ?= 0
N ?= 8
worksheets: setup
	$(PY) -m mlsys_nb.quiz --html worksheets --seed $(SEED) -n $(N)

# The notebooks executed at their defaults (as the tests run them) and written as HTML pages, the dashboard's tabs
# as screenshots, an index in curriculum order; then every page is checked in Chromium (tools/build_site.py).
SITE_NOTEBOOKS ?=
site: setup
	$(PY) -m compileall -q mlsys_nb
	$(PY) -m tools.build_site $(if $(strip $(SITE_NOTEBOOKS)),--only $(SITE_NOTEBOOKS),)

clean-venv:
	rm -rf $(VENV)
