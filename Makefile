# The two commands of the README:
#   make train   set up .venv (if missing) and train the default recipe
#   make test    set up .venv (if missing) and run the whole test suite
VENV ?= .venv
RECIPE ?=
ARGS ?=
PYTEST_ARGS ?=

.PHONY: train test test-heavy setup setup-train bench lint clean

setup-train:
	@bash scripts/setup.sh $(VENV) train

setup:
	@bash scripts/setup.sh $(VENV) full

train: setup-train
	$(VENV)/bin/embodied train $(RECIPE) $(ARGS)

test: setup
	$(VENV)/bin/python -m pytest -m "not heavy" $(PYTEST_ARGS)

# the kill -9 fault tests, trainer ranks, the two-node cluster, VLA PPO learning (~14 min on 2 cores)
test-heavy: setup
	$(VENV)/bin/python -m pytest -m heavy $(PYTEST_ARGS)

lint: setup
	$(VENV)/bin/lint-imports

bench: setup
	$(VENV)/bin/python -m benchmarks.pipeline_overhead

clean:
	rm -rf runs .pytest_cache
