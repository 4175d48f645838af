PY ?= python3
PIP ?= $(PY) -m pip

.PHONY: install install-server run test check bench
# Quick start, on a fresh machine:
#   make run    the triage service on embedded SQLite, seeded with sample incidents (http://127.0.0.1:8000)
#   make test   every check: system packages, Python packages, ruff, mypy, the whole test suite

install:
	$(PIP) install -q -e ".[dev,server,k8s]"

install-server:
	$(PIP) install -q -e ".[server]"

run: install-server
	$(PY) -m triage.cli serve --demo

test:
	bash .ci/setup
	$(MAKE) install
	bash .ci/check

check:
	bash .ci/check

bench:
	$(PY) bench/replay_large.py
	$(PY) bench/diagnosis.py
