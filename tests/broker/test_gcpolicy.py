"""The controller daemon's collector policy (controller/broker/gcpolicy.py), in a process of
its own: the start-up state is frozen out of the collector's walks, later cycles are still
collected."""
from __future__ import annotations

import subprocess
import sys

CHILD = r'''
import gc, json, weakref
from controller.broker import gcpolicy
startup = [{"task": [i]} for i in range(50_000)]     # containers of containers: tracked by the collector
gcpolicy.settle()
frozen = gc.get_freeze_count()
class Node:
    pass
a, b = Node(), Node()
a.peer, b.peer = b, a                                 # a cycle made after the start
gone = weakref.ref(a)
del a, b
gc.collect()
print(json.dumps({"frozen": frozen, "threshold": gc.get_threshold(), "cycle_collected": gone() is None}))
'''


def test_settle_freezes_the_start_up_state_and_later_cycles_are_still_collected():
    out = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, check=True)
    import json
    r = json.loads(out.stdout)
    assert r["frozen"] >= 50_000, "the start-up objects are out of the collector's walks"
    assert r["threshold"][0] == 10_000
    assert r["cycle_collected"], "a cycle made after settle() is still collected"


def test_the_daemon_settles_before_it_serves():
    import inspect

    from controller.broker import daemon
    src = inspect.getsource(daemon.run)
    assert src.index("gcpolicy.settle()") < src.index("ctl.serve()")
