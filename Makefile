PY ?= python3

.PHONY: install run test lint bench
install:
	$(PY) -m pip install -q -e ".[dev,server,k8s]"

# The main job: the triage service on embedded SQLite, seeded with sample incidents.
run:
	$(PY) -m triage.cli serve --demo

# Every check: ruff, mypy, the whole test suite with warnings as errors.
test:
	bash .ci/check

bench:
	$(PY) bench/replay_large.py
	$(PY) bench/diagnosis.py
