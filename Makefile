# The two commands of the README:
#   make train   set up .venv (if missing) and train the default recipe
#   make test    set up .venv (if missing) and run the whole test suite
VENV ?= .venv
RECIPE ?=
ARGS ?=
PYTEST_ARGS ?=
# pytest workers: the suite waits on Ray, simulators and subprocesses for half its time, so two
# workers on two cores finish it in about half the time (JOBS=1: one process, in collection order)
JOBS ?= 2

.PHONY: train test test-heavy setup setup-train bench lint clean

setup-train:
	@bash scripts/setup.sh $(VENV) train

setup:
	@bash scripts/setup.sh $(VENV) full

train: setup-train
	$(VENV)/bin/embodied train $(RECIPE) $(ARGS)

test: setup
	$(VENV)/bin/python -m pytest -n $(JOBS) --dist loadgroup $(PYTEST_ARGS)

# only the heavy tests (kill -9 faults, trainer ranks, the two-node cluster, VLA learning)
test-heavy: setup
	$(VENV)/bin/python -m pytest -n $(JOBS) --dist loadgroup -m heavy $(PYTEST_ARGS)

lint: setup
	$(VENV)/bin/lint-imports

bench: setup
	$(VENV)/bin/python -m benchmarks.pipeline_overhead

clean:
	rm -rf runs .pytest_cache
