# The two commands of the README:
#   make train   set up .venv (if missing) and train the default recipe
#   make test    set up .venv (if missing) and run the test suite (all but the long learning demos)
VENV ?= .venv
RECIPE ?=
ARGS ?=
PYTEST_ARGS ?=
# pytest workers: one per core. Each test waits on Ray, simulators and subprocesses for part of its
# time, so one worker per core keeps the cores busy (JOBS=1: one process, in collection order)
JOBS ?= 2
# `make test` leaves out what `make test-learning` runs: learning demonstrations of several minutes
# (the tiny VLA's PPO, the tiny reasoning model's GRPO), and what `make test-exhaustive` runs: every
# task of ManiSkill's registry built and stepped, minutes of work that would take the suite past
# its 30-minute limit on a slow host (MARKS= : all)
MARKS ?= not long_learning and not exhaustive

.PHONY: train test test-heavy test-learning test-exhaustive setup setup-train bench lint clean

setup-train:
	@bash scripts/setup.sh $(VENV) train

setup:
	@bash scripts/setup.sh $(VENV) full

# the line `make train` ends with, however the run ended (its exit code is kept)
ACTIVATE_HINT = echo "[make] to use \`embodied\` directly (embodied train, eval, config ...): . $(VENV)/bin/activate"

train: setup-train
	@echo "$(VENV)/bin/embodied train $(RECIPE) $(ARGS)"; $(VENV)/bin/embodied train $(RECIPE) $(ARGS); \
	code=$$?; $(ACTIVATE_HINT); exit $$code

test: setup
	$(VENV)/bin/python -m pytest -n $(JOBS) --dist loadgroup -m "$(MARKS)" $(PYTEST_ARGS)

# only the heavy tests of `make test` (kill -9 faults, trainer ranks, the two-node cluster)
test-heavy: setup
	$(VENV)/bin/python -m pytest -n $(JOBS) --dist loadgroup -m "heavy and $(MARKS)" $(PYTEST_ARGS)

# only the long learning demonstrations (a behaviour-cloned tiny OpenVLA raised by PPO; the tiny
# reasoning model raised by GRPO): minutes each
test-learning: setup
	$(VENV)/bin/python -m pytest -n $(JOBS) --dist loadgroup -m long_learning $(PYTEST_ARGS)

# only the registry-wide checks (every ManiSkill task builds and steps, or says what it lacks)
test-exhaustive: setup
	$(VENV)/bin/python -m pytest -n $(JOBS) --dist loadgroup -m exhaustive $(PYTEST_ARGS)

lint: setup
	$(VENV)/bin/lint-imports

bench: setup
	$(VENV)/bin/python -m benchmarks.pipeline_overhead

clean:
	rm -rf runs .pytest_cache
