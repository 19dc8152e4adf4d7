"""The math answer checker under coverage-guided fuzzing (atheris), bounded for CI.

Runs `fuzz_math_answers.py` in a child process (atheris exits the process when it stops) for
FUZZ_RUNS inputs with a fixed seed; an exception that escapes, or a fixed integer gold that
accepts a different boxed integer, makes the child fail and so this test. Skipped, with the
reason, when atheris is not installed.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

FUZZ_RUNS = 2000
FUZZ_DEADLINE_S = 120
TARGET = Path(__file__).resolve().parent / "fuzz_math_answers.py"
ROOT = TARGET.parents[2]


def test_math_checker_survives_fuzzing_and_never_accepts_a_different_integer(tmp_path):
    pytest.importorskip("atheris", reason="atheris is not installed (pip install atheris)")
    pytest.importorskip("math_verify", reason="math-verify is not installed")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    proc = subprocess.run(
        [sys.executable, str(TARGET), f"-atheris_runs={FUZZ_RUNS}", "-max_len=256", "-len_control=0",
         "-seed=1", f"-artifact_prefix={tmp_path}/"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=FUZZ_DEADLINE_S)
    tail = (proc.stdout + proc.stderr)[-4000:]
    assert proc.returncode == 0, tail
    assert f"Done {FUZZ_RUNS}" in tail, tail
