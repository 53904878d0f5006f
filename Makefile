# The two commands of the README:
#   make train   set up .venv (if missing) and train the default recipe
#   make test    set up .venv (if missing) and run the whole test suite
VENV ?= .venv
RECIPE ?=
ARGS ?=
PYTEST_ARGS ?=
# pytest workers: one per core. Each test waits on Ray, simulators and subprocesses for part of its
# time, so two workers keep both cores 93-97% busy (measured from /proc/stat through a run) and
# finish in about half the time of one (JOBS=1: one process, in collection order)
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
