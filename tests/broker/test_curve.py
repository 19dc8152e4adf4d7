"""The authenticated, encrypted control plane: the run's key file (made 0600 in a 0700 run
directory, refused with the path and the fix when it is missing, another user's, readable by
others or a symlink, before anything starts), and a controller that answers only peers holding
it: a plain peer, one with the wrong server key and one with a key of its own get nothing, and
each attempt is counted and logged. (Other users' shells: tests/broker/test_strangers.py.)"""
from __future__ import annotations

import json
import os
import pwd
import stat
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import zmq

from controller.broker.config import BrokerConfig
from controller.broker.curve import ensure_run_keys, new_run_keys
from controller.broker.daemon import Controller
from controller.client.api import BadKeyFile, Client, ControllerUnavailable
from controller.contracts import protocol as P
from controller.ondisk.keys import KeyFileError, private_dir, read_key_file, write_key_file
from tests.broker.test_broker import DEP, ROOT, TASKS
from tests.conftest import wait_for


@pytest.fixture
def controller(tmp_path):
    ctl = Controller("tcp://127.0.0.1:0", DEP, str(tmp_path / "run"), "run", TASKS,
                     str(tmp_path / "q.db"), heartbeat_interval_s=0.1)
    t = threading.Thread(target=ctl.serve, daemon=True)
    t.start()
    yield ctl
    ctl.core.stopped = True
    t.join(10)


def mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


# ---- the key file --------------------------------------------------------------------------

def test_a_controller_makes_the_run_keys_0600_in_a_0700_run_dir_and_keeps_them(tmp_path):
    run = tmp_path / "run"
    keys = ensure_run_keys(run / "controller.key") if private_dir(run) else None
    assert mode(run) == 0o700 and mode(run / "controller.key") == 0o600
    assert ensure_run_keys(run / "controller.key") == keys, "a restart keeps the run's keys"
    assert "secret" not in repr(keys), "a secret never reaches a log line"
    assert not write_key_file(run / "controller.key", new_run_keys()), "never overwritten"


def test_a_missing_key_file_names_the_path_and_the_fix(tmp_path):
    with pytest.raises(KeyFileError, match=rf"no key file at {tmp_path}/nope.*start the controller"):
        read_key_file(tmp_path / "nope")


def test_a_key_file_readable_by_others_is_refused_with_chmod_600(tmp_path):
    path = tmp_path / "controller.key"
    write_key_file(path, new_run_keys())
    path.chmod(0o644)
    with pytest.raises(KeyFileError, match=rf"{path} has mode 0644.*chmod 600 {path}"):
        read_key_file(path)


def test_a_symlinked_key_file_is_refused(tmp_path):
    write_key_file(tmp_path / "real.key", new_run_keys())
    (tmp_path / "controller.key").symlink_to(tmp_path / "real.key")
    with pytest.raises(KeyFileError, match="is a symlink"):
        read_key_file(tmp_path / "controller.key")


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give a file to another user")
def test_a_key_file_of_another_user_is_refused(tmp_path):
    path = tmp_path / "controller.key"
    write_key_file(path, new_run_keys())
    os.chown(path, 65534, 65534)
    with pytest.raises(KeyFileError, match=rf"{path} is owned by uid 65534, not by you"):
        read_key_file(path)


def test_the_controller_refuses_a_bad_key_file_before_anything_starts(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    write_key_file(run / "controller.key", new_run_keys())
    (run / "controller.key").chmod(0o640)
    (tmp_path / "tasks.json").write_text(json.dumps(TASKS))
    r = subprocess.run([sys.executable, "-m", "controller.broker", "--deployment", DEP,
                        "--run-dir", str(run), "--tasks-json", str(tmp_path / "tasks.json"),
                        "--endpoint-file", str(run / "controller.endpoint")],
                       cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and f"chmod 600 {run}/controller.key" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr
    assert not (run / "controller.endpoint").exists() and not (run / "controller.db").exists()


def test_an_agent_without_the_key_file_exits_naming_it(tmp_path):
    (tmp_path / "controller.endpoint").write_text("tcp://127.0.0.1:9")
    r = subprocess.run([sys.executable, "-m", "controller.cli", "agent", "--run-dir",
                        str(tmp_path), "--deployment", DEP, "--noop-s", "0"],
                       cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and f"no key file at {tmp_path}/controller.key" in r.stderr, r.stderr


def test_a_client_without_a_key_is_told_how_to_get_one(tmp_path, monkeypatch):
    monkeypatch.delenv("PADDOCK_KEY_FILE", raising=False)
    with pytest.raises(BadKeyFile, match="Client.for_run"):
        Client("tcp://127.0.0.1:9", DEP)
    with pytest.raises(BadKeyFile, match=f"no key file at {tmp_path}/controller.key"):
        Client("tcp://127.0.0.1:9", DEP, endpoint_file=tmp_path / "controller.endpoint")


# ---- strangers on the wire ----------------------------------------------------------------

def stranger(endpoint: str, server_key: str | None = None, own: bool = False) -> zmq.Socket:
    """A DEALER without the run's client key: plain, or CURVE with `server_key` and a key
    pair of its own."""
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    if server_key is not None:
        public, secret = zmq.curve_keypair()
        sock.curve_serverkey = server_key.encode() if own else zmq.curve_keypair()[0]
        sock.curve_publickey, sock.curve_secretkey = public, secret
    sock.connect(endpoint)
    return sock


def wait_counter(ctl, key: str, n: int = 1, timeout_s: float = 10.0) -> None:
    wait_for(lambda: ctl.snapshot()["counters"].get(key, 0) >= n, timeout_s, f"counter {key} to reach {n}")


@pytest.mark.parametrize("how", ["plain", "wrong server key", "own client key"])
def test_a_peer_without_the_run_key_gets_no_answer_and_is_counted(controller, how, caplog):
    keys = read_key_file(controller.key_file)
    sock = stranger(controller.endpoint, None if how == "plain" else keys.server_public,
                    own=how == "own client key")
    try:
        with caplog.at_level("WARNING", logger="controller.curve"):
            sock.send(P.encode(P.Status(), DEP))
            assert not sock.poll(1000), "a stranger got an answer"
            wait_counter(controller, "denied_handshakes")
            if how == "own client key":  # it knew the server key: the ZAP handler said no
                wait_counter(controller, "denied_handshakes_auth")
            assert controller.core.counters["frames_in"] == 0, "nothing reached the broker"
        with Client(controller.endpoint, DEP, key_file=controller.key_file, timeout_s=5) as c:
            counters = c.status().counters  # the run's own peer: answered, and it sees the count
        assert counters["denied_handshakes"] >= 1
        assert "refused peers without the run's key" in caplog.text
    finally:
        sock.close(linger=0)


def test_an_insecure_controller_talks_plain_text_only_when_asked(tmp_path):
    ctl = Controller("tcp://127.0.0.1:0", DEP, str(tmp_path / "run"), "run", TASKS,
                     str(tmp_path / "q.db"), heartbeat_interval_s=0.1, insecure=True)
    t = threading.Thread(target=ctl.serve, daemon=True)
    t.start()
    try:
        assert ctl.key_file is None and not (tmp_path / "run" / "controller.key").exists()
        with Client(ctl.endpoint, DEP, insecure=True, timeout_s=5) as c:
            assert c.status().counts["queued"] == 0
        write_key_file(tmp_path / "other.key", new_run_keys())
        with Client(ctl.endpoint, DEP, key_file=tmp_path / "other.key", timeout_s=0.3,
                    give_up_s=0.6) as c, pytest.raises(ControllerUnavailable):
            c.status()  # a CURVE client does not fall back to plain text
    finally:
        ctl.core.stopped = True
        t.join(10)


def test_metrics_bind_loopback_by_default_never_every_interface():
    assert BrokerConfig().metrics_addr == "127.0.0.1"


def test_the_run_directory_is_private_to_its_owner(tmp_path):
    run = tmp_path / "run"
    run.mkdir(mode=0o755)
    run.chmod(0o755)
    Controller("tcp://127.0.0.1:0", DEP, str(run), "run", TASKS, str(run / "q.db")).close()
    assert mode(run) == 0o700 and mode(run / "controller.key") == 0o600
    assert pwd.getpwuid(os.lstat(run).st_uid).pw_uid == os.geteuid()
