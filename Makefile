# A fresh clone needs only `make run` or `make test`: both create .venv on first use.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
# Two stamps: `make run` installs only pyproject's core `dependencies` (its CartPole run needs
# nothing else); `make setup`/`make test` install EXTRAS too, so a `make test` after a `make run`
# adds the rest to the same .venv.
CORE_STAMP := $(VENV)/.core
STAMP := $(VENV)/.installed
# The extras `make setup` installs: dev, plus the optional packages whose tests run in the
# default suite. The dm-reverb environment below installs dev only (its JAX is too old for some).
EXTRAS := dev,gymnax,brax,tune,envpool,popgym,es,search,marl,mujoco,playground,minatar,video,wandb,mlflow

.PHONY: setup run test test-slow test-reverb test-onnx links lint docs bench clean

setup: $(STAMP)

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

# Each re-installs when pyproject.toml changes; otherwise a no-op. The full install holds the core.
$(CORE_STAMP): pyproject.toml setup.py Makefile | $(BIN)/python
	$(BIN)/python -m pip install -q -e .
	touch $@

$(STAMP): pyproject.toml setup.py Makefile | $(BIN)/python
	$(BIN)/python -m pip install -q -e ".[$(EXTRAS)]"
	touch $@ $(CORE_STAMP)

run: $(CORE_STAMP)
	$(BIN)/python launch/run.py --agent=impala --platform=local_mp --env=CartPole-v1

# Two pytest processes, each taking whole files (module fixtures compile once): most tests
# wait on a process start or a compile, so two share 2 cores at 1.45x one's pace (697 s
# against 1,000-1,070 s, docs/benchmarks.md). TEST_WORKERS=0 runs it in this process.
TEST_WORKERS ?= 2

test: setup
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadfile

test-slow: setup
	$(BIN)/python -m pytest -q -m slow

# dm-reverb pins TensorFlow 2.15, numpy<2 and jax 0.4.34, so it gets its own environment
# (Python 3.11). The replay tests run there on both backends, and IMPALA trains through a
# dm-reverb Queue table on jax 0.4.34.
REVERB_VENV := .venv-reverb
$(REVERB_VENV)/.installed: pyproject.toml
	test -x $(REVERB_VENV)/bin/python || python3.11 -m venv $(REVERB_VENV)
	$(REVERB_VENV)/bin/python -m pip install -q --upgrade pip
	$(REVERB_VENV)/bin/python -m pip install -q "tensorflow-cpu~=2.15.0" "dm-reverb==0.14.0" \
		"numpy<2" "tensorflow-probability~=0.23.0" -e ".[dev]"
	touch $@

test-reverb: $(REVERB_VENV)/.installed
	$(REVERB_VENV)/bin/python -m pytest -q tests/test_reverb_tables.py \
		tests/test_reverb_tables_native.py tests/test_replay_node.py tests/test_unroll_queue.py

# The ONNX export's tests, with the onnx extra (jax2onnx pins an older orbax-checkpoint: pyproject).
ONNX_VENV := .venv-onnx
$(ONNX_VENV)/.installed: pyproject.toml setup.py
	test -x $(ONNX_VENV)/bin/python || $(PY) -m venv $(ONNX_VENV)
	$(ONNX_VENV)/bin/python -m pip install -q --upgrade pip
	$(ONNX_VENV)/bin/python -m pip install -q -e ".[dev,onnx]"
	touch $@

test-onnx: $(ONNX_VENV)/.installed
	$(ONNX_VENV)/bin/python -m pytest -q tests/test_onnx_export.py

# mypy cannot follow the editable install's import hook (setuptools' PEP 660 finder), so it reads
# `trellis` from links, trellis/<folder> -> <folder> as setup.py maps them and trellis/<file> ->
# the root package's files (trellis/), under the mypy_path of pyproject's [tool.mypy]
# (tests/link_tree.py makes the same links for tests/test_types.py and tests/test_layers.py).
MYPY_LINKS := $(VENV)/mypy_path/trellis
FOLDERS := agents builders envs launch reverb_tables
ROOT_FILES := __init__.py __main__.py py.typed

# The tree of links that mypy, import-linter and mkdocstrings (`make docs`) read `trellis` from.
links:
	mkdir -p $(MYPY_LINKS)
	for f in $(FOLDERS); do ln -sfn ../../../$$f $(MYPY_LINKS)/$$f; done
	for f in $(ROOT_FILES); do ln -sfn ../../../trellis/$$f $(MYPY_LINKS)/$$f; done

# ruff, the import layers (pyproject's [tool.importlinter] contracts, read from the links: the
# folders of `trellis` in one tree), then mypy: strict on the
# whole library, its five folders ([tool.mypy]). mypy, not pyright: a wheel from PyPI that runs
# offline, where pyright's PyPI package downloads Node.js at its first run.
lint: setup links
	$(BIN)/ruff check .
	cd $(VENV)/mypy_path && ../bin/lint-imports ../../pyproject.toml
	$(BIN)/mypy

# The docs site (mkdocs.yml: docs/ and the API reference from docstrings) into build/site, with
# warnings as errors: a broken link or a docstring that does not parse fails it.
DOCS_STAMP := $(VENV)/.docs
$(DOCS_STAMP): pyproject.toml setup.py Makefile | $(BIN)/python
	$(BIN)/python -m pip install -q -e ".[docs]"
	touch $@

# NO_MKDOCS_2_WARNING: Material's banner about MkDocs 2, printed at every build.
docs: $(DOCS_STAMP) links
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

bench: setup
	$(BIN)/python benchmarks/throughput.py

clean:
	rm -rf $(VENV) $(REVERB_VENV) runs .pytest_cache .ruff_cache .mypy_cache *.egg-info
