# Paddock: the two commands a newcomer needs.
#   make run   set up this machine, then run the local farm (controller, 2 node agents, trainer)
#   make test  set up this machine, then lint, type-check and run the whole test suite
VENV ?= .venv
PYTEST_ARGS ?=

.PHONY: setup run test lint clean

setup:
	./scripts/setup.sh

run: setup
	$(VENV)/bin/paddock run

test: setup lint
	$(VENV)/bin/python -m pytest -q -p no:cacheprovider $(PYTEST_ARGS)

lint:
	VENV=$(VENV) ./scripts/lint.sh

clean:
	rm -rf runs .pytest_cache
