#!/usr/bin/env bash
# Lint and type check, run by `make test` before the suite (and on its own: `make lint`).
#   ruff: undefined names, unused imports/variables, redefinitions, syntax errors, import order
#         (pyproject.toml [tool.ruff]) over every Python file of the project;
#   mypy: the shared base (controller/contracts, controller/ondisk) and the verifier (nodeagent/verifier).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
"$VENV/bin/ruff" check controller nodeagent layers slurm tests benchmarks scripts
"$VENV/bin/mypy" controller/contracts controller/ondisk nodeagent/verifier
echo "lint: ok"
