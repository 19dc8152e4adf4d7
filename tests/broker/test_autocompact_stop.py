"""The controller's compaction hook at shutdown (controller/broker/daemon.py `AutoCompact.wait`):
a compaction still running past `compact_wait_s` is stopped, never left behind the controller;
stopped after a commit point, it loses and doubles nothing, and the next one finishes it."""
from __future__ import annotations

from controller.broker.daemon import AutoCompact
from controller.store.catalog import compact
from tests.farm.test_stop_farm import _paused_compaction, _run
from tests.store.test_trajstore import _snapshot


def test_a_compaction_past_the_shutdown_wait_is_stopped_and_finished_by_the_next(tmp_path):
    run = _run(tmp_path)
    before = _snapshot(run)
    hook = AutoCompact(str(run), every=1, wait_s=0.2)
    hook.proc = _paused_compaction(run, "_unlink_unread")    # a target in place, sources not unlinked
    try:
        hook.wait()
        running_after = hook.proc.poll() is None
    finally:
        if hook.proc.poll() is None:
            hook.proc.kill()
        hook.proc.wait(timeout=60)
    assert not running_after and hook.proc.returncode == -15
    assert _snapshot(run) == before
    assert compact(run).recovered == 1
    assert _snapshot(run) == before
