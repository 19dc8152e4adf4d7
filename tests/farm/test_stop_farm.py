"""`stop_farm` (controller/farm/assemble.py) returns only once no compaction of the run runs:
the controller gets its compaction wait on top of the stop wait, and a compaction left behind
(its controller killed) is waited for, then killed past the wait and finished by the next one.
Real processes running the real `compact`, paused at a chosen point through a pipe."""
from __future__ import annotations

import subprocess
import sys
import textwrap

import controller.farm.assemble as assemble
from controller.farm.assemble import stop_farm
from controller.store.catalog import Catalog, compact, compaction_holder
from tests.store.test_trajstore import _snapshot, attempt

# A real compaction that stops at `point` (a function of controller/store/catalog.py), says
# "paused" and goes on once it reads a line.
PAUSED_COMPACT = textwrap.dedent("""
    import sys
    import controller.store.catalog as c
    point = sys.argv[2]
    real = getattr(c, point)
    def paused(*a, **kw):
        setattr(c, point, real)
        print("paused", flush=True)
        sys.stdin.readline()
        return real(*a, **kw)
    setattr(c, point, paused)
    r = c.compact(sys.argv[1])
    print(f"done {r.targets}", flush=True)
""")


def _run(tmp_path):
    cat = Catalog(tmp_path)
    for i in range(4):
        attempt(tmp_path, f"r{i}", cat=cat)
    cat.flush()
    return tmp_path


def _paused_compaction(run, point):
    proc = subprocess.Popen([sys.executable, "-c", PAUSED_COMPACT, str(run), point], text=True,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert proc.stdout.readline() == "paused\n"     # it holds the compaction lock now
    return proc


def _gone_controller():
    ctl = subprocess.Popen([sys.executable, "-c", "pass"])
    ctl.wait()
    return ctl


def test_stop_farm_returns_only_once_the_runs_compaction_has_finished(tmp_path, monkeypatch):
    run = _run(tmp_path)
    before = _snapshot(run)
    compaction = _paused_compaction(run, "_compact_group")
    asked = []
    real_holder = compaction_holder

    def holder(run_dir):
        """stop_farm asks whether a compaction runs: let the paused one go on (once)."""
        if not asked:
            compaction.stdin.write("\n")
            compaction.stdin.flush()
        asked.append(run_dir)
        return real_holder(run_dir)

    monkeypatch.setattr(assemble, "compaction_holder", holder, raising=False)
    try:
        stop_farm([_gone_controller()], None, "d", run / "controller.key", "test", wait_s=1.0,
                  compact_wait_s=60.0)
        at_return = real_holder(run), sorted(p.name for p in (run / "steps").glob("*.parquet"))
    finally:
        if not asked:           # the old stop_farm never asked: let the compaction end
            compaction.stdin.write("\n")
            compaction.stdin.flush()
        compaction.wait(timeout=60)
    assert asked
    assert at_return == (None, ["compact-000001.parquet"])   # done: its files no longer change
    assert compaction.returncode == 0 and compaction.stdout.read() == "done 5\n"   # finished, not killed
    assert _snapshot(run) == before


def test_a_compaction_still_running_past_the_wait_is_killed_and_the_next_one_finishes_it(tmp_path):
    """Paused after its first commit point (a target in place, its sources not unlinked): killed
    there, no row is lost or doubled, and the next compaction completes it."""
    run = _run(tmp_path)
    before = _snapshot(run)
    compaction = _paused_compaction(run, "_unlink_unread")
    try:
        stop_farm([_gone_controller()], None, "d", run / "controller.key", "test", wait_s=0.1,
                  compact_wait_s=0.2)
        running_at_return = compaction.poll() is None
    finally:
        if compaction.poll() is None:
            compaction.kill()
        compaction.wait(timeout=60)
    assert not running_at_return and compaction.returncode == -9
    assert _snapshot(run) == before
    result = compact(run)
    assert result.recovered == 1 and result.targets == 4
    assert _snapshot(run) == before


def test_the_controller_gets_its_compaction_wait_on_top_of_the_stop_wait(tmp_path):
    """A controller whose shutdown outlasts the stop wait (it lets a compaction finish) is not
    terminated before `compact_wait_s` more has passed."""
    _run(tmp_path)
    slow = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(1.0)"])  # its shutdown's work
    stop_farm([slow], None, "d", tmp_path / "controller.key", "test", wait_s=0.05, compact_wait_s=60.0)
    assert slow.returncode == 0           # exited by itself; the old budget (wait_s) SIGTERMed it
