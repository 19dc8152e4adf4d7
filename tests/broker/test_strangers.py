"""Another user's shell on the same machine against a live controller (of root, or of
`paddock-u1`): it tries register, lease (as an agent), result, submit, publish, drain and
shutdown over the wire -- in plain text, and with CURVE using a key pair of its own and the
controller's public key (public keys are not secret) -- and reading the run directory (the
key file, the tasks with their hidden tests, the queue). 0 succeed: nothing is answered,
nothing changes, every file is refused, and the controller counts the attempts.

The stranger is `paddock-u2` running `/opt/paddock/venv/bin/python` (users and venv made by
scripts/setup.sh); without them these tests skip and say why. Its script is
self-contained (pyzmq only): the frames it sends are made here with the project's codec.
"""
from __future__ import annotations

import base64
import json
import os
import pwd
import shutil
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import psutil
import pytest

from controller.broker.daemon import Controller
from controller.client.api import Client
from controller.contracts import protocol as P
from controller.ondisk.keys import RunKeys, write_key_file
from tests.broker.test_broker import DEP, ROOT, TASKS

VENV_PY = "/opt/paddock/venv/bin/python"
OWNER, STRANGER = "paddock-u1", "paddock-u2"
WIRE_TRIES = ("register", "lease", "result", "submit", "publish", "drain", "shutdown")
FILE_TRIES = ("list run dir", "read key file", "read tasks.json", "read controller.db")
ANSWER_WAIT_MS = 1000  # per try; an answer to a peer of the run comes in milliseconds

STRANGER_SCRIPT = r'''
import base64, json, os, sys
import zmq

args = json.load(open(sys.argv[1]))
ctx = zmq.Context()
out = {}

def dealer(curve):
    s = ctx.socket(zmq.DEALER)
    s.setsockopt(zmq.LINGER, 0)
    if curve:  # its own key pair, and the controller's public key (not secret)
        pub, sec = zmq.curve_keypair()
        s.curve_serverkey, s.curve_publickey, s.curve_secretkey = args["server_public"].encode(), pub, sec
    s.connect(args["endpoint"])
    return s

for name, frames in args["frames"].items():
    for curve in (False, True):
        s = dealer(curve)
        for f in frames:
            s.send(base64.b64decode(f))
        answered = bool(s.poll(args["wait_ms"]))
        out[f"{name} ({'curve' if curve else 'plain'})"] = "ANSWERED" if answered else "no answer"
        s.close(linger=0)

run = args["run_dir"]
for name, fn in (("list run dir", lambda: os.listdir(run)),
                 ("read key file", lambda: open(os.path.join(run, "controller.key")).read()),
                 ("read tasks.json", lambda: open(os.path.join(run, "tasks.json")).read()),
                 ("read controller.db", lambda: open(os.path.join(run, "controller.db"), "rb").read(1))):
    try:
        fn()
        out[name] = "READ"
    except OSError as exc:
        out[name] = f"refused: {type(exc).__name__}"
print(json.dumps(out))
'''


def _users_ready() -> str | None:
    """Why the test cannot run here (None: it can)."""
    if os.geteuid() != 0:
        return "needs root to run a shell as another user (runuser)"
    if not Path(VENV_PY).exists():
        return f"{VENV_PY} is missing: run scripts/setup.sh"
    for user in (OWNER, STRANGER):
        try:
            pwd.getpwnam(user)
        except KeyError:
            return f"user {user} is missing: run scripts/setup.sh"
    if shutil.which("runuser") is None:
        return "runuser is missing"
    return None


pytestmark = pytest.mark.skipif(_users_ready() is not None, reason=_users_ready() or "")


def frames_to_try(batch_id: str) -> dict[str, list[str]]:
    """What a stranger sends for each try (base64 frames of the project's codec)."""
    reg = P.Register(node="intruder", slots=4, images=[], mem_free_mb=1000,
                     agent_version="0.3.0", held=[])
    tries = {
        "register": [reg],
        "lease": [reg, P.Ready(node="intruder", credit=4, draining=False)],
        "result": [P.Result(rollout_id=f"{batch_id}-00000", attempt=1, token=1, outcome="pass",
                            reward=1.0, shards={}, infra_reason=None, idem="x")],
        "submit": [P.Submit(idem="evil", tasks=["t1"], n_per_task=50, policy_version=1,
                            sampler=None)],
        "publish": [P.PublishPolicy(idem="evil", version=99, endpoint="http://evil:1/v1",
                                    model="evil")],
        "drain": [P.DrainNode(node="n1", deadline_s=0.0)],
        "shutdown": [P.Shutdown(reason="evil")],
    }
    assert set(tries) == set(WIRE_TRIES)
    return {k: [base64.b64encode(P.encode(m, DEP)).decode() for m in msgs]
            for k, msgs in tries.items()}


@pytest.fixture
def shared_tmp():
    """A directory any user may pass through (pytest's own tmp is root's 0700): so only the
    run directory's own mode keeps a stranger out."""
    d = Path(tempfile.mkdtemp(prefix="paddock-strangers-", dir="/tmp"))
    d.chmod(0o755)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def run_stranger(tmp: Path, endpoint: str, server_public: str, run_dir: Path,
                 batch_id: str) -> dict[str, str]:
    script, args = tmp / "stranger.py", tmp / "stranger.json"
    script.write_text(STRANGER_SCRIPT)
    args.write_text(json.dumps({"endpoint": endpoint, "server_public": server_public,
                                "run_dir": str(run_dir), "frames": frames_to_try(batch_id),
                                "wait_ms": ANSWER_WAIT_MS}))
    for p in (script, args):
        p.chmod(0o644)
    r = subprocess.run(["runuser", "-u", STRANGER, "--", VENV_PY, str(script), str(args)],
                       capture_output=True, text=True, timeout=120, cwd="/")
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def check_nothing_succeeded(outcome: dict[str, str]) -> None:
    wire = {k: v for k, v in outcome.items() if k.split(" (")[0] in WIRE_TRIES}
    files = {k: v for k, v in outcome.items() if k in FILE_TRIES}
    assert len(wire) == 2 * len(WIRE_TRIES) and len(files) == len(FILE_TRIES), outcome
    succeeded = [k for k, v in outcome.items() if v in ("ANSWERED", "READ")]
    assert succeeded == [], f"a stranger succeeded at: {succeeded}"
    assert all(v == "refused: PermissionError" for v in files.values()), files


def check_unchanged(status: P.StatusReply, batch_rollouts: int) -> None:
    counts = status.counts
    assert counts.get("committed", 0) == 0, "a stranger's result was committed"
    assert sum(counts.values()) == batch_rollouts, "a stranger's submit made rollouts"
    assert [n["node"] for n in status.nodes] == [], "a stranger registered as a node"
    assert status.counters.get("frames_in", 0) <= 3, "stranger frames reached the broker"


def test_another_users_shell_gets_nothing_from_a_roots_controller(shared_tmp):
    run = shared_tmp / "run"
    ctl = Controller("tcp://127.0.0.1:0", DEP, str(run), "run", TASKS, str(run / "controller.db"),
                     heartbeat_interval_s=0.1)
    (run / "tasks.json").write_text(json.dumps(TASKS))  # what leases carry: hidden tests too
    t = threading.Thread(target=ctl.serve, daemon=True)
    t.start()
    try:
        with Client(ctl.endpoint, DEP, key_file=ctl.key_file, timeout_s=5) as c:
            c.publish_policy(1, "http://127.0.0.1:9/v1")
            batch = c.submit(["t1"], 3, 1)
            outcome = run_stranger(shared_tmp, ctl.endpoint,
                                   json.loads(Path(ctl.key_file).read_text())["server_public"],
                                   run, batch)
            check_nothing_succeeded(outcome)
            status = c.status()
            check_unchanged(status, 3)
            assert status.counters["denied_handshakes"] >= 2 * len(WIRE_TRIES), status.counters
            assert status.counters.get("denied_handshakes_auth", 0) >= len(WIRE_TRIES)
        assert not ctl.stopped, "a stranger's shutdown stopped the controller"
    finally:
        ctl.core.stopped = True
        t.join(10)


def owners_key_copy(path: Path, tmp: Path) -> Path:
    """The owner's key file copied for root (0600, root's): the test plays the owner's trainer;
    the peer-side check rightly refuses the owner's file itself to any other uid."""
    copy = tmp / "owner.key"
    write_key_file(copy, read_owner_keys(path))
    return copy


def read_owner_keys(path: Path) -> RunKeys:
    d = json.loads(path.read_text())  # root may read it; as anyone else this raises EACCES
    return RunKeys(d["server_public"], d["server_secret"], d["client_public"], d["client_secret"])


def stop_owned(proc: subprocess.Popen) -> None:
    """Stop the owner's controller (runuser's child) and runuser: both started here."""
    for child in psutil.Process(proc.pid).children(recursive=True):
        child.kill()
    proc.kill()
    proc.wait()


def test_another_users_shell_gets_nothing_from_another_users_controller(shared_tmp):
    owner = pwd.getpwnam(OWNER)
    os.chown(shared_tmp, owner.pw_uid, owner.pw_gid)
    run = shared_tmp / "run"
    tasks = shared_tmp / "tasks.json"
    tasks.write_text(json.dumps(TASKS))
    tasks.chmod(0o644)
    ep = run / "controller.endpoint"
    proc = subprocess.Popen(
        ["runuser", "-u", OWNER, "--", "env", f"PYTHONPATH={ROOT}", VENV_PY, "-m",
         "controller.broker", "--deployment", DEP, "--run-dir", str(run), "--tasks-json",
         str(tasks), "--endpoint-file", str(ep), "--heartbeat-interval-s", "0.1",
         "--log-level", "WARNING"],
        cwd=str(ROOT), stdout=subprocess.DEVNULL, stderr=open(shared_tmp / "ctl.log", "wb"))
    try:
        deadline = time.monotonic() + 60
        while not ep.exists():
            assert proc.poll() is None, (shared_tmp / "ctl.log").read_text()
            assert time.monotonic() < deadline, "the controller did not start"
            time.sleep(0.05)
        assert run.stat().st_uid == owner.pw_uid and (run.stat().st_mode & 0o777) == 0o700
        keys = read_owner_keys(run / "controller.key")
        with Client(ep.read_text().strip(), DEP, timeout_s=5,
                    key_file=owners_key_copy(run / "controller.key", shared_tmp)) as c:
            c.publish_policy(1, "http://127.0.0.1:9/v1")
            batch = c.submit(["t1"], 3, 1)
            outcome = run_stranger(shared_tmp, c.endpoint, keys.server_public, run, batch)
            check_nothing_succeeded(outcome)
            status = c.status()
            check_unchanged(status, 3)
            assert status.counters["denied_handshakes"] >= 2 * len(WIRE_TRIES), status.counters
        assert proc.poll() is None, "a stranger's shutdown stopped the controller"
    finally:
        stop_owned(proc)
