"""Sandboxes of ordinary users (issue 16): the runtime as a non-root user with a subordinate id
range and no cgroup delegation, two users' runtimes on one node at once, and the state
directory's checks. The bodies run as `paddock-u1` / `paddock-u2` through `runuser` with the
world-readable interpreter `scripts/setup.sh` builds (/opt/paddock/venv); they skip, saying why,
when either is missing. Every process started here is stopped by its PID; every state dir made
is gone at the end."""
from __future__ import annotations

import json
import os
import pwd
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from nodeagent.sandbox import statedir
from nodeagent.sandbox.host import subid_range
from nodeagent.sandbox.spec import SandboxError
from tests.conftest import alive

pytestmark = pytest.mark.sandbox

USERS = ("paddock-u1", "paddock-u2")
VENV_PY = os.environ.get("PADDOCK_SHARED_VENV", "/opt/paddock/venv") + "/bin/python"
REPO = Path(__file__).resolve().parents[2]
WORKER = (Path(__file__).with_name("userworker.py")).read_text()
RUNUSER = shutil.which("runuser") or "/usr/sbin/runuser"


def _why_not() -> str | None:
    if os.geteuid() != 0:
        return "needs root to run test bodies as paddock-u1/paddock-u2 (runuser)"
    for u in USERS:
        try:
            pwd.getpwnam(u)
            subid_range(u)
        except (KeyError, SandboxError) as exc:
            return f"user {u} or its subordinate range is missing ({exc}): run `make setup`"
    if not os.access(RUNUSER, os.X_OK):
        return "runuser (util-linux) is missing"
    if not os.access(VENV_PY, os.X_OK):
        return f"{VENV_PY} is missing: run `make setup` (it builds the world-readable venv)"
    return None


pytestmark = [pytest.mark.sandbox, pytest.mark.skipif(_why_not() is not None, reason=str(_why_not()))]


def _env(user: str) -> dict:
    """This checkout on the user's PYTHONPATH when the user can read it (else the installed copy)."""
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": pwd.getpwnam(user).pw_dir, "LANG": "C.UTF-8"}
    readable = subprocess.run([RUNUSER, "-u", user, "--", "test", "-r", str(REPO / "nodeagent" / "__init__.py")])
    if readable.returncode == 0:
        env["PYTHONPATH"] = str(REPO)
    return env


def run_as(user: str, argv: list[str], timeout_s: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([RUNUSER, "-u", user, "--", *argv], env=_env(user), cwd="/tmp",
                          capture_output=True, text=True, timeout=timeout_s)


class Worker:
    """userworker.py running as `user`: one runtime, one sandbox, JSON requests on stdin."""

    def __init__(self, user: str, image: str):
        self.user = user
        self.proc = subprocess.Popen([RUNUSER, "-u", user, "--", VENV_PY, "-c", WORKER, str(image)],
                                     env=_env(user), cwd="/tmp", stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True)
        self.facts = self.read()
        assert "error" not in self.facts, self.facts

    def read(self) -> dict:
        line = self.proc.stdout.readline()
        if not line:
            raise AssertionError(f"worker of {self.user} died: {self.proc.stderr.read()[-3000:]}")
        return json.loads(line)

    def ask(self, **req) -> dict:
        self.proc.stdin.write(json.dumps(req) + "\n")
        self.proc.stdin.flush()
        return self.read()

    def stop(self) -> None:
        if self.proc.poll() is None:
            try:
                self.ask(op="quit")
                self.proc.wait(timeout=30)
            except (AssertionError, OSError, subprocess.TimeoutExpired, ValueError):
                self.proc.kill()   # by its PID: the holder follows (PDEATHSIG)
                self.proc.wait()
        facts = getattr(self, "facts", {})
        if facts.get("state_dir") and os.path.exists(facts["state_dir"]):
            shutil.rmtree(facts["state_dir"], ignore_errors=True)
        _rmdir_if_empty(facts.get("run_root"))


@pytest.fixture
def worker_factory(busybox_image):
    made: list[Worker] = []

    def make(user: str) -> Worker:
        w = Worker(user, busybox_image)
        made.append(w)
        return w
    yield make
    for w in made:
        w.stop()


def test_sandbox_run_works_as_an_ordinary_user(busybox_image):
    r = run_as(USERS[0], [VENV_PY, "-m", "controller.cli", "sandbox", "run", "--image", str(busybox_image),
                          "--", "sh", "-c", "echo hello from $(id -u)"])
    assert r.returncode == 0, r.stderr
    assert r.stdout == "hello from 0\n"
    uid = pwd.getpwnam(USERS[0]).pw_uid
    root = f"/tmp/paddock-{uid}"
    st = os.lstat(root)
    assert st.st_uid == uid and st.st_mode & 0o777 == 0o711 and os.listdir(root) == []
    _rmdir_if_empty(root)


def _rmdir_if_empty(path: str | None) -> None:
    try:
        if path:
            os.rmdir(path)
    except OSError:
        pass


def test_an_ordinary_users_caps_hold_without_delegation_and_bombs_kill_only_their_sandbox(worker_factory):
    w = worker_factory(USERS[0])
    assert w.facts["degraded"] == []
    assert w.facts["caps"] == {"memory": "monitor+rlimit", "pids": "rlimit-per-id-slice", "cpu": "affinity+sched-batch"}
    nice, policy = w.facts["sched"].split()[:2]   # /proc/self/stat fields 19 and 41
    assert (nice, policy) == ("10", "3")   # nice 10, SCHED_BATCH
    assert "Cpus_allowed_list" in w.facts["sched"]
    res = w.ask(op="bombs")
    assert res["memory"]["exit"] == 137 and res["memory"]["kills"] >= 1 and "survived" not in res["memory"]["stdout"]
    assert res["memory"]["after"] == "ok\n"
    assert res["fork"]["stderr_cant_fork"] and res["fork"]["after"] == "ok\n"
    assert res["other_sandbox"] == "ok\n" and res["new_sandbox"] == "ok\n"
    assert w.proc.poll() is None   # the runtime (the agent's process) is alive


def test_two_users_runtimes_cannot_see_signal_or_read_each_other(worker_factory):
    a, b = worker_factory(USERS[0]), worker_factory(USERS[1])
    assert a.facts["run_root"] != b.facts["run_root"]
    for me, other in ((a, b), (b, a)):
        pids = [other.facts["holder"], other.facts["init"]]
        paths = [other.facts["run_root"], other.facts["state_dir"]]
        res = me.ask(op="probe", pids=pids, paths=paths)
        for pid in map(str, pids):
            assert res["host"][pid]["kill"] == os.strerror(1), res   # EPERM: no signal crosses users
            assert res["host"][pid]["root"] != "ok" and res["host"][pid]["environ"] != "ok", res
        for p in paths:
            assert res["files"][p]["list"] == os.strerror(13) and res["files"][p]["create"] == os.strerror(13), res
        verdicts, nprocs = res["in_sandbox"][:-1], int(res["in_sandbox"][-1])
        assert verdicts == [f"{p}=no" for p in pids]   # from a sandbox, the other's PIDs do not exist
        assert nprocs <= 6   # its own PID namespace: the init, the sleeper, this shell and its pipe
    for w in (a, b):
        assert not os.path.exists(os.path.join(w.facts["run_root"], "intruder"))
    holders = [a.facts["holder"], b.facts["holder"]]
    a.stop()
    b.stop()
    for w in (a, b):
        assert not os.path.exists(w.facts["state_dir"])
    assert not [p for p in holders if alive(p)]



def test_a_symlinked_state_dir_is_refused_naming_the_path():
    base = tempfile.mkdtemp(prefix="paddock-users-", dir="/tmp")
    try:
        os.chmod(base, 0o755)
        link = os.path.join(base, "root-link")
        script = ("import os, sys\nfrom nodeagent.sandbox.runtime import SandboxRuntime, SandboxError\n"
                  f"os.symlink('/tmp', {link!r})\n"
                  f"try:\n    SandboxRuntime(run_root={link!r}).start()\nexcept SandboxError as e:\n"
                  "    print(e)\n    sys.exit(3)\n")
        os.chown(base, pwd.getpwnam(USERS[0]).pw_uid, -1)
        r = run_as(USERS[0], [VENV_PY, "-c", script])
        assert r.returncode == 3, r.stderr
        assert link in r.stdout and "symlink" in r.stdout
        assert os.listdir(base) == ["root-link"]   # nothing was made through it
    finally:
        shutil.rmtree(base, ignore_errors=True)


def test_a_run_root_of_another_user_or_writable_by_others_is_refused(tmp_path):
    theirs = tmp_path / "theirs"
    theirs.mkdir(mode=0o711)
    os.chown(theirs, pwd.getpwnam(USERS[1]).pw_uid, -1)
    with pytest.raises(SandboxError, match=rf"{theirs} is owned by uid \d+, not by this user"):
        statedir.ensure_run_root(str(theirs))
    loose = tmp_path / "loose"
    loose.mkdir()
    os.chmod(loose, 0o777)
    with pytest.raises(SandboxError, match=rf"{loose} is writable by group or others.*chmod go-w"):
        statedir.ensure_run_root(str(loose))


def test_a_missing_subordinate_range_names_the_file_and_the_fix():
    with pytest.raises(SandboxError, match=r"no range in /etc/subuid.*usermod --add-subuids"):
        subid_range("nobody")


def test_the_default_run_root_is_per_user_and_xdg_only_when_the_holder_can_reach_it(tmp_path):
    assert statedir.default_run_root({}, 1234) == "/tmp/paddock-1234"
    private = tmp_path / "run-user"
    private.mkdir(mode=0o700)
    assert statedir.default_run_root({"XDG_RUNTIME_DIR": str(private)}, 0) == "/tmp/paddock-0"
    os.chmod(private, 0o711)
    os.chmod(tmp_path, 0o711)
    if statedir._searchable_by_others(str(private)):
        assert statedir.default_run_root({"XDG_RUNTIME_DIR": str(private)}, 0) == str(private / "paddock")
