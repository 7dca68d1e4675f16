# fedhetero: `make run` and `make test` each do their own set-up (venv, install, data).
SHELL := /bin/bash
.SHELLFLAGS := -o pipefail -c
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.fedhetero-installed
FMNIST_SYSTEM := /usr/share/datasets/fashion-mnist
# pip on some machines prints one harmless line per configured-but-missing local index
PIP_QUIET := { grep -v "is ignored: it is neither a file nor a directory" || true; }
NUM_SUPERNODES ?= 10
# `make test` runs test modules in this many pytest workers (pytest-xdist, a module per
# worker): a flwr run or a deployment mostly waits on its SuperLink, so 3 workers keep 2 cores busy
TEST_WORKERS ?= 3

.PHONY: run test test-fast install data bench clean docs

run: install data  ## train FedAvg on Fashion-MNIST (10 clients, Dirichlet 0.5) with flwr run
	$(PY) -m simulation run --num-supernodes $(NUM_SUPERNODES)

test: install data  ## the whole test suite (offline): unit, app and deploy tests
	$(PY) -m pytest -n $(TEST_WORKERS) --dist loadfile

test-fast: install data  ## the unit tests only (one process, about 1 min on 2 cores)
	$(PY) -m pytest -m unit -q

bench: install data  ## efficiency, aggregation time and memory (python -m simulation bench)
	$(PY) -m simulation bench

install: $(STAMP)

# `make docs` has a venv of its own with the `docs` extra's packages only (pyproject.toml):
# no torch, no flwr, not even fedhetero itself, since mkdocstrings reads strategies/ with
# Griffe, statically, without importing it. Inside $(VENV)/, so git ignores it and `make
# clean` removes it.
DOCS_VENV ?= $(VENV)/docs
DOCS_STAMP := $(DOCS_VENV)/.fedhetero-docs-installed
DOCS_REQUIREMENTS := import tomllib; project = tomllib.load(open("pyproject.toml", "rb"))["project"]; \
	print("\n".join(project["optional-dependencies"]["docs"]))

docs: $(DOCS_STAMP)  ## the docs site into site/ (offline, no torch; a warning fails it): open site/index.html
	NO_MKDOCS_2_WARNING=1 $(DOCS_VENV)/bin/python -m mkdocs build --strict --site-dir site

$(DOCS_STAMP): pyproject.toml
	@test -x $(DOCS_VENV)/bin/python || $(PYTHON) -m venv $(DOCS_VENV)
	$(DOCS_VENV)/bin/python -c '$(DOCS_REQUIREMENTS)' > $(DOCS_VENV)/requirements.txt
	$(DOCS_VENV)/bin/python -m pip install --quiet -r $(DOCS_VENV)/requirements.txt 2>&1 | $(PIP_QUIET)
	@touch $(DOCS_STAMP)

$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet -e ".[app,dev]" 2>&1 | $(PIP_QUIET)
	@touch $(STAMP)

data: install  ## make sure Fashion-MNIST is present (apt package, else torchvision download)
	@if ls $(FMNIST_SYSTEM)/train-images-idx3-ubyte* >/dev/null 2>&1; then \
	  echo "Fashion-MNIST: $(FMNIST_SYSTEM)"; \
	elif command -v apt-get >/dev/null 2>&1 && { [ "$$(id -u)" = 0 ] || sudo -n true 2>/dev/null; }; then \
	  SUDO=$$([ "$$(id -u)" = 0 ] || echo sudo); \
	  echo "Installing Debian package dataset-fashion-mnist"; \
	  { $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq dataset-fashion-mnist >/dev/null; } \
	    || $(PY) -m task.data ensure fashion-mnist; \
	else \
	  $(PY) -m task.data ensure fashion-mnist; \
	fi

clean:
	rm -rf $(VENV) .flwr .pytest_cache *.egg-info

# Deployment runtime (deploy/README.md): SuperLink + $(NUM_DEPLOY_SUPERNODES) SuperNodes on this machine.
NUM_DEPLOY_SUPERNODES ?= 2
DEPLOY_ARGS ?=
.PHONY: deploy-run deploy-run-secure deploy-test

deploy-run: install data  ## insecure SuperLink + SuperNodes on 127.0.0.1, one flwr run, stop all
	$(PY) -m deploy run --num-supernodes $(NUM_DEPLOY_SUPERNODES) $(DEPLOY_ARGS)

deploy-run-secure: install data  ## the same with TLS and SuperNode authentication
	$(PY) -m deploy run --num-supernodes $(NUM_DEPLOY_SUPERNODES) --tls --auth $(DEPLOY_ARGS)

deploy-test: install data  ## the deployment e2e tests only
	$(PY) -m pytest tests/test_deploy_e2e.py -q
