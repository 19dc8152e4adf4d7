"""The bounded YAML, JSON and JSONL parsers under coverage-guided fuzzing (atheris), one test per
parser, bounded for CI: `fuzz_safeload.py <parser>` runs in a child process for FUZZ_RUNS inputs
with a fixed seed; an exception other than ParseLimitError, or a value that differs from the
unbounded parser's, fails the child and so the test. Skipped when atheris is not installed.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

FUZZ_RUNS = 10000
FUZZ_DEADLINE_S = 120
TARGET = Path(__file__).resolve().parent / "fuzz_safeload.py"
ROOT = TARGET.parents[2]


@pytest.mark.parametrize("parser", ["yaml", "json", "jsonl"])
def test_bounded_parser_survives_fuzzing_with_only_named_refusals(parser, tmp_path):
    pytest.importorskip("atheris", reason="atheris is not installed (pip install atheris)")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    proc = subprocess.run(
        [sys.executable, str(TARGET), parser, f"-atheris_runs={FUZZ_RUNS}", "-max_len=512", "-len_control=0",
         "-seed=1", f"-artifact_prefix={tmp_path}/"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=FUZZ_DEADLINE_S)
    tail = (proc.stdout + proc.stderr)[-4000:]
    assert proc.returncode == 0, tail
    assert f"Done {FUZZ_RUNS}" in tail, tail
