"""The head step's trainer is a command (slurm/jobsteps.py): yours, or the built-in scripted one
(`python -m controller.demo.builtin_trainer`). The head asks the built-in one first whether it
can train the task set, so a job it cannot train is refused before its farm starts; the built-in
one runs without a shell between and with the job's end-of-time signals ignored (its policy
server must answer the rollouts still running during the drain; the head stops it with SIGINT)."""
from __future__ import annotations

import signal
import subprocess
import sys

import pytest

from controller.farm.assemble import load_taskset
from slurm.jobsteps import END_OF_TIME, HeadStep, JobStepError, _check_builtin_trainer, _start_trainer, _stop_trainer


def head(tmp_path, **kw) -> HeadStep:
    return HeadStep(run_dir=str(tmp_path), deployment="d1", image_store=str(tmp_path / "images"), agents=1, **kw)


def test_the_head_refuses_a_policy_script_the_built_in_trainer_cannot_read(tmp_path):
    missing = tmp_path / "no-such-script.json"
    with pytest.raises(JobStepError, match="cannot read policy script .*no-such-script.json"):
        _check_builtin_trainer(head(tmp_path, policy_script=str(missing)), load_taskset("builtin"))


def test_the_built_in_trainer_can_train_the_built_in_task_set(tmp_path):
    _check_builtin_trainer(head(tmp_path), load_taskset("builtin"))     # no error


def test_a_trainer_argv_runs_without_a_shell_with_the_farm_in_its_environment_and_the_signals_ignored(tmp_path):
    (tmp_path / "logs").mkdir()
    probe = ("import os, signal; print(os.environ['PADDOCK_ENDPOINT'], os.environ['PADDOCK_DEPLOYMENT'], "
             "[signal.getsignal(s) == signal.SIG_IGN for s in (signal.SIGTERM, signal.SIGWINCH, signal.SIGUSR2)])")
    proc = _start_trainer([sys.executable, "-c", probe], tmp_path, "tcp://10.0.0.1:5555", head(tmp_path),
                          load_taskset("builtin"), "10.0.0.1", out=subprocess.PIPE, ignore=END_OF_TIME)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0
    assert out.decode().split(None, 2) == ["tcp://10.0.0.1:5555", "d1", "[True, True, True]\n"]


def test_a_shell_line_trainer_starts_with_the_signals_at_their_defaults(tmp_path):
    (tmp_path / "logs").mkdir()
    line = f"{sys.executable} -c 'import signal; print(signal.getsignal(signal.SIGTERM) == signal.SIG_DFL)'"
    proc = _start_trainer(line, tmp_path, "tcp://x:1", head(tmp_path), load_taskset("builtin"), "x",
                          out=subprocess.PIPE)
    out, _ = proc.communicate(timeout=60)
    assert out.decode().strip() == "True"


def test_sigint_stops_a_trainer_that_ignores_the_job_signals_and_counts_as_a_clean_stop(tmp_path):
    (tmp_path / "logs").mkdir()
    # 'up' is printed inside the try: a SIGINT that comes before pause() is still a clean stop
    script = ("import signal, sys\n"
              "try:\n    print('up', flush=True)\n    signal.pause()\nexcept KeyboardInterrupt:\n    sys.exit(0)\n")
    proc = _start_trainer([sys.executable, "-c", script], tmp_path, "tcp://x:1", head(tmp_path),
                          load_taskset("builtin"), "x", out=subprocess.PIPE, ignore=END_OF_TIME)
    assert proc.stdout.readline() == b"up\n"
    proc.send_signal(signal.SIGTERM)            # the job's signal: ignored
    with pytest.raises(subprocess.TimeoutExpired):
        proc.wait(timeout=0.5)
    status = [ln for ln in open(f"/proc/{proc.pid}/status") if ln.startswith(("SigBlk", "SigIgn", "SigCgt", "State"))]
    assert _stop_trainer(proc, 30.0, signal.SIGINT) == 0, status


def test_the_stop_waits_for_a_shell_line_trainer_whose_shell_dies_of_the_signal_first(tmp_path):
    """dash forks for `VAR=x python ...`: the job's SIGTERM kills the shell at once while the
    trainer under it is still writing its checkpoint; the stop returns only once it is written."""
    (tmp_path / "logs").mkdir()
    done = tmp_path / "checkpoint"
    script = ("import signal, sys, time\n"
              "def stop(*_):\n    time.sleep(1.0)\n"
              f"    open({str(done)!r}, 'w').write('saved')\n    sys.exit(0)\n"
              "signal.signal(signal.SIGTERM, stop)\nprint('up', flush=True)\nwhile True:\n    signal.pause()\n")
    (tmp_path / "trainer.py").write_text(script)
    proc = _start_trainer(f"X=1 {sys.executable} {tmp_path / 'trainer.py'}", tmp_path, "tcp://x:1", head(tmp_path),
                          load_taskset("builtin"), "x", out=subprocess.PIPE)
    assert proc.stdout.readline() == b"up\n"
    assert _stop_trainer(proc, 30.0) == 0
    assert done.read_text() == "saved"


def test_a_trainer_that_outlives_the_stop_s_timeout_is_killed_with_its_whole_group(tmp_path):
    (tmp_path / "logs").mkdir()
    script = "import signal\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\nprint('up', flush=True)\nsignal.pause()\n"
    (tmp_path / "trainer.py").write_text(script)
    proc = _start_trainer(f"X=1 {sys.executable} {tmp_path / 'trainer.py'}", tmp_path, "tcp://x:1", head(tmp_path),
                          load_taskset("builtin"), "x", out=subprocess.PIPE)
    assert proc.stdout.readline() == b"up\n"
    _stop_trainer(proc, 1.0)
    from slurm.jobsteps import _group_alive
    assert not _group_alive(proc.pid)
