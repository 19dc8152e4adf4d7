# Paddock: the two commands a newcomer needs.
#   make run   set up this machine, then run the local farm (controller, 2 node agents, trainer)
#   make test  set up this machine, then run the whole test suite
VENV ?= .venv
PYTEST_ARGS ?=

.PHONY: setup run test clean

setup:
	./scripts/setup.sh

run: setup
	$(VENV)/bin/paddock run

test: setup
	$(VENV)/bin/python -m pytest -q -p no:cacheprovider $(PYTEST_ARGS)

clean:
	rm -rf runs .pytest_cache
