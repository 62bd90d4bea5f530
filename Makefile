# A fresh clone needs only `make run` or `make test`: both create .venv on first use.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: setup run test test-slow lint bench clean

setup: $(STAMP)

# Re-installs when pyproject.toml changes; otherwise a no-op.
$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e ".[dev]"
	touch $(STAMP)

run: setup
	$(BIN)/python launch/run.py --agent=impala --platform=local_mp --env=CartPole-v1

test: setup
	$(BIN)/python -m pytest -q

test-slow: setup
	$(BIN)/python -m pytest -q -m slow

lint: setup
	$(BIN)/ruff check .

bench: setup
	$(BIN)/python benchmarks/throughput.py

clean:
	rm -rf $(VENV) runs .pytest_cache .ruff_cache *.egg-info
