"""`paddock sandbox debug TASK`: a shell in the sandbox a rollout of the task gets — its files,
limits and network policy — and nothing of it left behind; `--replay` runs a committed
rollout's recorded tool calls in it first."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from controller.store.catalog import Catalog
from controller.taskbank.builtin import builtin_taskset
from nodeagent.agent.attempt import run_attempt
from nodeagent.agent.core import Attempt
from nodeagent.agent.debugbox import debug_sandbox, recorded_calls, replay_calls
from nodeagent.agent.replay import ReplayModel
from nodeagent.sandbox.runtime import SandboxError

pytestmark = [pytest.mark.sandbox]
ROOT = Path(__file__).resolve().parents[2]


def _task(python_image, **over) -> dict:
    """A lease task (inline content): the built-in gcd task with its own files and limits."""
    t = builtin_taskset().tasks[[x.name for x in builtin_taskset().tasks].index("python/gcd")]
    d = dict(t.canonical(), task_id=t.task_id, image_digest="sha256:" + Path(python_image).stem)
    d.update(over)
    return d


def _run_dir(tmp_path: Path, tasks: dict) -> Path:
    run = tmp_path / "run"
    run.mkdir()
    (run / "tasks.json").write_text(json.dumps({t["name"]: t for t in tasks.values()} | tasks))
    return run


def _debug(args: list[str], commands: str, timeout_s: float = 120) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, "-m", "controller.cli.main", "sandbox", "debug", *args, "--facts"],
                          input=commands.encode(), capture_output=True, timeout=timeout_s, env=env, cwd=ROOT)


def _facts(stderr: bytes) -> dict:
    return json.loads(next(ln for ln in stderr.decode().splitlines() if ln.startswith("{")))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class _Recording:
    """A runtime that records the spec the attempt pipeline asks for, then refuses it."""

    def __init__(self, real) -> None:
        self.real, self.specs = real, []

    def __getattr__(self, name):
        return getattr(self.real, name)

    def acquire(self, spec, timeout_s: float = 30.0):
        self.specs.append(spec)
        raise SandboxError("recorded")


def test_the_debug_sandbox_is_made_from_the_spec_a_rollout_acquires(runtime, python_image, tmp_path):
    task = _task(python_image, files={"notes/a.txt": "alpha", "b.bin": {"base64": "AAEC"}},
                 limits={"memory_mb": 160, "pids": 24, "disk_mb": 48, "cpu": 0.5, "nofile": 128})
    rec = _Recording(runtime)
    a = Attempt("r", str(tmp_path), "ro-1", 1, 1, "b", 0, task, 0, "http://127.0.0.1:9", "m")
    assert run_attempt(rec, python_image, "n", a).infra_reason.startswith("sandbox_start")
    with debug_sandbox(runtime, python_image, task) as box:
        assert box.spec == rec.specs[0]
        assert box.sandbox.spec.egress_socket == box.link.path      # the shell's way back
        assert box.sandbox.spec.files == rec.specs[0].files and box.sandbox.spec.limits == rec.specs[0].limits


def test_the_shell_sees_the_tasks_files_limits_and_network_and_leaves_nothing(python_image, tmp_path):
    task = _task(python_image, files={"hello.txt": "hi from the task\n"},
                 limits={"memory_mb": 128, "pids": 12, "disk_mb": 32, "cpu": 1.0, "nofile": 256})
    run = _run_dir(tmp_path, {task["task_id"]: task})
    commands = "\n".join([
        "pwd; cat hello.txt",
        "echo proxy=[$HTTP_PROXY]",
        "python3 - <<'EOF'",
        "import subprocess",
        "procs = []",
        "for _ in range(30):",
        "    try:",
        "        procs.append(subprocess.Popen(['sleep', '30']))",
        "    except OSError as exc:",
        "        print('refused', exc.strerror)",
        "        break",
        "print(f'started={len(procs)}')",
        "for p in procs:",
        "    p.kill()",
        "for p in procs:",
        "    p.wait()",                            # reaped before the next command forks
        "EOF",
        "python3 -c 'import socket; socket.create_connection((\"1.1.1.1\", 80), timeout=3)' 2>&1 | tail -n 1",
    ]) + "\n"
    r = _debug([task["name"], "--run", str(run)], commands)
    out = r.stdout.decode()
    assert r.returncode == 0, r.stderr.decode()
    assert "/work\nhi from the task\n" in out
    assert "proxy=[]" in out                      # a task without network: no proxy variables
    started = int(out.split("started=")[1].split()[0])
    assert "refused" in out and started < 12      # the pids cap of the task (12), not the default 64
    assert "Network is unreachable" in out        # network "none": no route
    facts = _facts(r.stderr)
    assert facts["limits"]["pids"] == 12 and facts["network"] == "none" and facts["files"] == ["hello.txt"]
    assert not _alive(facts["init_pid"])
    for path in facts["cgroup"].values():
        assert not os.path.exists(path), path
    assert not os.path.exists(facts["link_dir"]) and not os.path.exists(facts["state_dir"])
    mounts = Path("/proc/self/mountinfo").read_text()
    assert facts["state_dir"] not in mounts


def test_a_task_with_an_allowlist_reaches_its_egress_proxy_and_only_that(python_image, tmp_path):
    task = _task(python_image, network=["allowed.example:443"])
    run = _run_dir(tmp_path, {task["task_id"]: task})
    probe = ("import socket\n"
             "for host in ('allowed.example', 'denied.example'):\n"
             "    s = socket.create_connection(('127.0.0.1', 3128), timeout=10)\n"
             "    s.sendall(f'CONNECT {host}:443 HTTP/1.1\\r\\nHost: {host}:443\\r\\n\\r\\n'.encode())\n"
             "    print(host, repr(s.recv(400)))\n")
    r = _debug([task["task_id"][7:19], "--run", str(run)],
               f"echo proxy=$HTTPS_PROXY\npython3 - <<'EOF'\n{probe}EOF\n")
    out = r.stdout.decode()
    assert r.returncode == 0, r.stderr.decode()
    assert "proxy=http://127.0.0.1:3128" in out
    lines = {ln.split()[0]: ln for ln in out.splitlines() if ln.endswith("'")}
    # The node's egress proxy judges each CONNECT by the task's allowlist, as in a rollout: the
    # allowed host passes the policy (and fails only to resolve here), the other does not.
    assert "X-Paddock-Egress: host_not_allowed" in lines["denied.example"], out
    assert "X-Paddock-Egress: resolve_failed" in lines["allowed.example"], out
    assert _facts(r.stderr)["network"] == ["allowed.example:443"]


def test_replay_runs_the_rollouts_recorded_tool_calls_first(runtime, python_image, tmp_path):
    task = _task(python_image)
    run = _run_dir(tmp_path, {task["task_id"]: task})
    steps = [{"step": 0, "role": "assistant", "content": "", "tool_name": "write_file,shell",
              "tool_args": json.dumps([
                  {"id": "c1", "name": "write_file",
                   "arguments": json.dumps({"path": "made.txt", "content": "written by the rollout\n"})},
                  {"id": "c2", "name": "shell", "arguments": json.dumps({"command": "echo ran >> made.txt"})}]),
              "prompt_tokens": 1, "completion_tokens": 1, "logprobs": None},
             {"step": 1, "role": "assistant", "content": "done", "tool_name": None, "tool_args": None,
              "prompt_tokens": 1, "completion_tokens": 1, "logprobs": None}]
    a = Attempt("run", str(run), "ro-7", 1, 3, "b", 5, task, 0, ReplayModel(steps), "m")  # type: ignore[arg-type]
    result = run_attempt(runtime, python_image, "node-a", a)
    assert result.infra_reason is None, result.infra_reason
    catalog = Catalog(run)
    catalog.commit("ro-7", 1, 3, result.shards, time.time())
    catalog.flush()
    assert [c["name"] for _, c in recorded_calls(steps)] == ["write_file", "shell"]
    r = _debug(["--run", str(run), "--replay", "ro-7"], "cat made.txt\n")
    out = r.stdout.decode()
    assert r.returncode == 0, r.stderr.decode()
    assert "[replay step 0] write_file" in out and "[replay step 0] shell" in out
    assert out.endswith("written by the rollout\nran\n")
    other = _debug(["python/fizzbuzz", "--run", str(run), "--replay", "ro-7"], "")
    assert other.returncode == 2 and b"no task 'python/fizzbuzz'" in other.stderr


def test_an_unknown_task_or_a_replay_without_a_run_is_a_clear_error(tmp_path):
    r = _debug(["no/such-task"], "")
    assert r.returncode == 2 and b"no task 'no/such-task'" in r.stderr
    r = _debug(["python/gcd", "--bank", str(tmp_path / "bank")], "")
    assert r.returncode == 2 and b"does not exist" in r.stderr and not (tmp_path / "bank").exists()
    r = _debug(["python/gcd", "--run", str(tmp_path / "run")], "")
    assert r.returncode == 2 and b"cannot read the run's tasks" in r.stderr and not (tmp_path / "run").exists()
    r = _debug(["python/gcd", "--replay", "x"], "")
    assert r.returncode == 2 and b"--replay needs --run" in r.stderr


def _read_until(fd: int, marker: bytes, deadline: float, seen: bytearray) -> bool:
    import select
    while marker not in seen:
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        ready, _, _ = select.select([fd], [], [], left)
        if ready:
            try:
                chunk = os.read(fd, 4096)
            except OSError:              # EIO: the other side of the terminal closed
                return marker in seen
            if not chunk:
                return marker in seen
            seen += chunk
    return True


def test_on_a_terminal_the_shell_is_interactive_and_exit_ends_it(python_image):
    import pty
    pid, fd = pty.fork()
    if pid == 0:                                   # the child: paddock on a terminal
        os.chdir(ROOT)
        os.execve(sys.executable, [sys.executable, "-m", "controller.cli.main", "sandbox", "debug", "python/gcd"],
                  dict(os.environ, PYTHONPATH=str(ROOT)))
    seen = bytearray()
    deadline = time.monotonic() + 120
    try:
        assert _read_until(fd, b"# ", deadline, seen), bytes(seen)          # sh -i's prompt (root in the sandbox)
        os.write(fd, b"cd /tmp && echo at $(pwd) $((6*7))\n")
        assert _read_until(fd, b"at /tmp 42", deadline, seen), bytes(seen)   # one shell: cd holds
        os.write(fd, b"exit\n")
        assert _read_until(fd, b"shell ended (pipes); destroying the sandbox", deadline, seen), bytes(seen)
    finally:
        _, status = os.waitpid(pid, 0)
        os.close(fd)
    assert os.waitstatus_to_exitcode(status) == 0


def test_a_terminated_session_still_leaves_nothing(python_image):
    import signal
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.Popen([sys.executable, "-m", "controller.cli.main", "sandbox", "debug", "python/gcd", "--facts"],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, cwd=ROOT)
    try:
        proc.stdin.write(b"echo ready\n")
        proc.stdin.flush()
        assert proc.stdout.readline() == b"ready\n"      # the shell is up; stdin stays open
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 128 + signal.SIGTERM, err.decode()
    assert b"ended by SIGTERM; the sandbox is destroyed" in err
    facts = _facts(err)
    assert not _alive(facts["init_pid"])
    assert not any(os.path.exists(p) for p in facts["cgroup"].values())
    assert not os.path.exists(facts["link_dir"]) and not os.path.exists(facts["state_dir"])


def test_the_shell_runs_over_the_tasks_setup_layer(python_image, tmp_path):
    task = _task(python_image, setup=["mkdir -p /work/.dbg && echo set up once > /work/.dbg/marker"])
    run = _run_dir(tmp_path, {task["task_id"]: task})
    r = _debug([task["name"], "--run", str(run)], "cat /work/.dbg/marker\n")
    assert r.returncode == 0, r.stderr.decode()
    assert r.stdout.decode() == "set up once\n"
    facts = _facts(r.stderr)
    assert facts["setup"] == task["setup"] and len(facts["layers"]) == 1     # the set-up layer, as a rollout's


def test_a_task_with_mcp_servers_gets_them_and_a_replay_calls_them(runtime, python_image):
    from tests.harness.test_mcp_tools import CALC
    config = {"servers": {"calc": {"transport": "stdio", "command": ["python3", "/work/mcp/calc.py"]}}}
    task = _task(python_image, files={".paddock/mcp.json": json.dumps(config), "mcp/calc.py": CALC})
    steps = [{"step": 0, "tool_name": "mcp__calc__add,shell", "tool_args": json.dumps([
        {"id": "a", "name": "mcp__calc__add", "arguments": '{"a": 40, "b": 2}'},
        {"id": "b", "name": "shell", "arguments": json.dumps({"command": "grep -l '/work/mcp/[c]alc' "
                                                                         "/proc/[0-9]*/cmdline | wc -l"})}])}]
    with debug_sandbox(runtime, python_image, task) as box:
        assert box.relayed                         # as in the rollout: the servers' links use the relay
        assert [r.observation for _, _, r in replay_calls(box, steps)] == ["42", "1\n"]
