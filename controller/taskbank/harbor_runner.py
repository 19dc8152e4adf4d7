"""Runs a Harbor task's `tests/test.sh` in the verification sandbox and decides from its reward.

Shipped as a hidden support file of every imported Harbor task (`importers_tools.harbor_task`)
and run by its `command` checker as `python3 -I -B /verifier/tests/paddock_harbor_runner.py`
with the image's own Python (standard library only, Python >= 3.8). Exit 0 means the reward is
1; any other exit is a fail, and the last line on stderr says why. The contract
(docs/verifier.md, "Harbor tasks: the reward file"):

1. The reward directory (`/tmp/logs/verifier`, Harbor's `/logs/verifier`) is created here, fresh,
   before test.sh starts (a directory already there is refused) and held open; the reward is
   read through that handle, and `/tmp/logs` or the directory moved or replaced is a fail.
2. This process is the children's subreaper: a process the tests started that outlives its
   parent is reparented here. When test.sh exits, every other process of the sandbox (its PID
   namespace; the init is PID 1) is killed and reaped BEFORE the reward is read. Any process
   still alive when test.sh ended, and any background process that ended at or after the
   reward's last change (the file's and the directory's ctime: a process can push neither back),
   makes the reward untrustworthy: fail, naming it. test.sh killed by a signal is a fail.
3. The reward is read only from a regular file with one link, opened with O_NOFOLLOW and
   O_NONBLOCK (a symbolic link, FIFO, socket, directory or hard link is refused), of at most
   MAX_REWARD_BYTES (`reward.txt`) or MAX_REWARD_JSON_BYTES (`reward.json`, which Harbor reads
   first: an object whose "reward" decides; without one, `reward.txt`; read only with
   JSON_FLAG, for a task whose tests name `reward.json`); it must be a finite number in [0, 1]
   ("1", "1.0"; not a JSON bool); only 1 passes.
4. test.sh runs with cwd /work (Harbor's WORKDIR /app), stdout to stderr, PYTHONSAFEPATH=1 (the
   working directory, e.g. of `python3 -m pytest` from /app, does not shadow installed or
   standard modules) and PYTHONPATH starting with SITE_DIR, whose `sitecustomize` puts the
   directory a Python 3.11+ program would have had first (its script's, or the working
   directory for -m/-c) at the END of sys.path instead: the agent's programs still import their
   sibling modules, which no longer shadow anything installed.
5. test.sh and everything it starts share one Landlock domain (Linux >= 5.13) in which no file
   under /proc or /sys opens for writing, and (Landlock ABI >= 6) no signal reaches a process
   outside it: the program under test, run by the tests as the same user, cannot write the
   memory of the tests' own processes through /proc/<pid>/mem (process_vm_writev and ptrace
   are already denied by the sandbox's seccomp filter). Writing anywhere else is unchanged, but
   only beneath the entries of / that exist when test.sh starts. On a kernel without Landlock
   the runner says so on stderr and runs test.sh unconfined.
6. Every pytest session test.sh starts loads PYTEST_GUARD (`PYTEST_PLUGINS`), which reports on a
   pipe only this runner reads, under a nonce it takes out of the environment at import, how the
   session ended. A reward of 1 stands only if every session that started also reported its end,
   with no test failed or errored, no interruption (`pytest.exit`), at least one test passed, and
   no test skipped or xfailed from inside its own run without a skip/xfail marker (the code under
   test, imported into pytest's process, can end it with status 0 or skip every test). A line
   on the pipe without the nonce (written by another process holding it) is a fail.

Must not import: controller, nodeagent, layers, slurm (it runs inside the sandbox's image).
"""
from __future__ import annotations

import ctypes
import json
import math
import os
import re
import signal
import stat
import sys
import time
from typing import NoReturn

LOGS = "/tmp/logs"
REWARD_DIR = LOGS + "/verifier"
REWARD_NAME = "reward.txt"
REWARD_JSON = "reward.json"
MAX_REWARD_JSON_BYTES = 65536
JSON_FLAG = "--reward-json"   # the task's tests write reward.json (importers_tools.harbor_task)
TEST_SH = "/verifier/tests/tests/test.sh"
SITE_DIR = "/verifier/tests/paddock_site"
MAX_REWARD_BYTES = 64
PR_SET_CHILD_SUBREAPER = 36
PR_SET_DUMPABLE = 4
PR_CAPBSET_DROP = 24
CAP_SYS_PTRACE = 19
PR_SET_NO_NEW_PRIVS = 38
# Landlock (include/uapi/linux/landlock.h); the syscall numbers are the same on every architecture
SYS_LANDLOCK_CREATE_RULESET, SYS_LANDLOCK_ADD_RULE, SYS_LANDLOCK_RESTRICT_SELF = 444, 445, 446
LANDLOCK_CREATE_RULESET_VERSION = 1
LANDLOCK_RULE_PATH_BENEATH = 1
FS_WRITE_FILE, FS_TRUNCATE = 1 << 1, 1 << 14          # TRUNCATE from ABI 3
SCOPE_ABSTRACT_UNIX_SOCKET, SCOPE_SIGNAL = 1 << 0, 1 << 1   # from ABI 6
UNWRITABLE = ("proc", "sys")
GUARD_ENV = "PADDOCK_HARBOR_GUARD"
GUARD_MODULE = "paddock_pytest_guard"
MAX_GUARD_BYTES = 1 << 20
BROKER_ENV = "PADDOCK_CALLEE_BROKER"   # the command check's callee broker (nodeagent/verifier/cmdrunner.py)
CALLEE_SETTLE_S = 1.0
try:
    BROKER = int(os.environ.pop(BROKER_ENV, "") or 0)
except ValueError:
    BROKER = 0
PYTEST_GUARD = '''"""Paddock (Harbor tasks): each pytest session tells the verifier's runner how it ended."""
import os

_raw = os.environ.pop("PADDOCK_HARBOR_GUARD", "")
_fd, _sep, _nonce = _raw.partition(":")
_ID = os.urandom(6).hex()
_COUNTS = dict.fromkeys(("passed", "failed", "error", "skipped", "own_skip", "xpassed"), 0)
_MARKED = set()
_STATE = {"interrupted": 0}


def _say(line):
    try:
        os.write(int(_fd), ("%s %s %d %s\\n" % (_nonce, _ID, os.getpid(), line)).encode())
    except (ValueError, OSError):
        pass


def pytest_sessionstart(session):
    _say("start")


def pytest_itemcollected(item):
    if any(item.get_closest_marker(name) is not None for name in ("skip", "skipif", "xfail")):
        _MARKED.add(item.nodeid)


def pytest_runtest_logreport(report):
    if report.when == "call":
        if report.passed:
            _COUNTS["xpassed" if hasattr(report, "wasxfail") else "passed"] += 1
        elif report.failed:
            _COUNTS["failed"] += 1
        elif report.nodeid in _MARKED:      # skipped or xfailed as its marker says
            _COUNTS["skipped"] += 1
        else:                               # pytest.skip() or pytest.xfail() from inside its own run
            _COUNTS["own_skip"] += 1
    elif report.failed:
        _COUNTS["error"] += 1
    elif report.skipped:
        _COUNTS["skipped"] += 1


def pytest_keyboard_interrupt(excinfo):
    _STATE["interrupted"] = 1


def pytest_sessionfinish(session, exitstatus):
    _say("end %d %d %s" % (int(exitstatus), _STATE["interrupted"],
                           " ".join("%s=%d" % kv for kv in sorted(_COUNTS.items()))))
'''

LIBC: ctypes.CDLL

SITECUSTOMIZE = '''"""Paddock (Harbor tasks): the directory Python would have put first on sys.path, last; and
a line to the runner that a Python process (a pytest run or another) started under test.sh."""
import os
import sys

_g = os.environ.get("PADDOCK_HARBOR_GUARD", "")
if _g:
    _fd0, _s0, _n0 = _g.partition(":")
    _av = list(getattr(sys, "orig_argv", sys.argv))
    _i0 = _av.index("-m") if "-m" in _av else -1
    _py = (os.path.basename(sys.argv[0]) if sys.argv else "") in ("pytest", "py.test") or (
        0 <= _i0 < len(_av) - 1 and _av[_i0 + 1] in ("pytest", "py.test"))
    _asks = any(a in ("--version", "-V", "--help", "-h", "--fixtures", "--markers") for a in _av)
    try:
        os.write(int(_fd0), ("%s L%s %d launch %s\\n" % (
            _n0, os.urandom(6).hex(), os.getpid(), "pytest" if _py and not _asks else "python")).encode())
    except (ValueError, OSError):
        pass

if getattr(sys.flags, "safe_path", False):
    _argv = list(getattr(sys, "orig_argv", sys.argv))
    _a0 = sys.argv[0] if sys.argv else ""
    _d = None
    if _a0 == "-m":
        _i = _argv.index("-m") if "-m" in _argv else -1
        _name = _argv[_i + 1].split(".")[0] if 0 <= _i < len(_argv) - 1 else ""
        try:
            import importlib.machinery
            if _name and importlib.machinery.PathFinder.find_spec(_name) is None \\
                    and _name not in sys.builtin_module_names:
                _d = os.getcwd()   # `python -m pkg` of a package only the working directory has
        except Exception:
            pass
    elif _a0 in ("", "-c", "-"):
        _d = os.getcwd()
    else:
        _d = os.path.dirname(os.path.abspath(_a0))
    if _d and _d not in sys.path:
        sys.path.append(_d)
    _here = os.path.dirname(os.path.abspath(__file__))
    try:   # the image's own sitecustomize, which this one shadows
        import importlib.machinery
        import importlib.util
        _spec = importlib.machinery.PathFinder.find_spec(
            "sitecustomize", [p for p in sys.path if p and os.path.abspath(p) != _here])
        if _spec is not None and _spec.loader is not None:
            _mod = importlib.util.module_from_spec(_spec)
            _spec.loader.exec_module(_mod)
    except Exception:
        pass
'''


def say(msg: str) -> None:
    sys.stderr.write(f"paddock-harbor: {msg}\n")
    sys.stderr.flush()


def verdict(ok: bool, msg: str) -> NoReturn:
    sys.stderr.write("\n")
    say(("PASS: " if ok else "FAIL: ") + msg)
    sys.exit(0 if ok else 1)


def comm(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip()
    except OSError:
        return "?"


def _stat_fields(pid: int) -> list:
    """/proc/<pid>/stat's fields after the command name (state first, then ppid), or []."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return []


def others() -> list:
    """(pid, name) of every live process of the sandbox but its init, this one and the command
    check's callee broker (`BROKER_ENV`: it runs the agent's programs as the callee uid for the
    tests, and dies with the rest below); a zombie has ended."""
    me, out = os.getpid(), []
    for name in os.listdir("/proc"):
        if name.isdigit() and int(name) not in (1, me, BROKER):
            fields = _stat_fields(int(name))
            if fields and fields[0] != "Z":
                out.append((int(name), comm(int(name))))
    return out


def settle_callees(alive: list) -> list:
    """`alive`, after up to CALLEE_SETTLE_S for the broker's workers whose program has ended
    (they report its status, then exit) to be gone: a callee still running stays in it."""
    deadline = time.monotonic() + CALLEE_SETTLE_S
    while alive and BROKER and time.monotonic() < deadline and all(
            (_stat_fields(p)[1:2] or [""])[0] == str(BROKER) for p, _n in alive):
        time.sleep(0.01)
        alive = others()
    return alive


def names_pytest(path: str) -> bool:
    """Does test.sh run pytest (the word outside a comment)?"""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            text = f.read()
    except OSError:
        return False
    return any(re.search(r"\bpytest\b", line.split("#", 1)[0]) for line in text.splitlines())


def identity(path: str) -> tuple:
    st = os.lstat(path)
    return (st.st_dev, st.st_ino, stat.S_IFMT(st.st_mode))


def fresh_reward_dir() -> tuple:
    """(an open handle on the new reward directory, the identities of LOGS and REWARD_DIR)."""
    try:
        os.mkdir(LOGS, 0o755)
    except FileExistsError:
        if not stat.S_ISDIR(os.lstat(LOGS).st_mode):
            verdict(False, f"{LOGS} exists and is not a directory")
    try:
        os.mkdir(REWARD_DIR, 0o755)
    except FileExistsError:
        verdict(False, f"{REWARD_DIR} existed before test.sh ran (the verifier creates it fresh)")
    return (os.open(REWARD_DIR, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW),
            [(path, identity(path)) for path in (LOGS, REWARD_DIR)])


class _RulesetAttr(ctypes.Structure):
    _fields_ = [("handled_access_fs", ctypes.c_uint64), ("handled_access_net", ctypes.c_uint64),
                ("scoped", ctypes.c_uint64)]


class _PathBeneath(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


def confine_writes() -> None:
    """This process (test.sh to be) enters a Landlock domain where nothing under /proc or /sys
    opens for writing (contract 5). Raises OSError when a step fails on a kernel that has
    Landlock; returns with a warning on one without."""
    abi = LIBC.syscall(SYS_LANDLOCK_CREATE_RULESET, None, 0, LANDLOCK_CREATE_RULESET_VERSION)
    if abi < 1:
        print(f"paddock-harbor: warning: no Landlock on this kernel ({os.strerror(ctypes.get_errno())}): "
              "test.sh runs without its /proc write guard", file=sys.stderr, flush=True)
        return
    access = FS_WRITE_FILE | (FS_TRUNCATE if abi >= 3 else 0)
    attr = _RulesetAttr(access, 0, (SCOPE_SIGNAL | SCOPE_ABSTRACT_UNIX_SOCKET) if abi >= 6 else 0)
    size = ctypes.sizeof(attr) if abi >= 6 else 8
    ruleset = LIBC.syscall(SYS_LANDLOCK_CREATE_RULESET, ctypes.byref(attr), ctypes.c_size_t(size), 0)
    if ruleset < 0:
        raise OSError(ctypes.get_errno(), "landlock_create_ruleset")
    try:
        for name in sorted(os.listdir("/")):
            if name in UNWRITABLE:
                continue
            try:
                fd = os.open("/" + name, os.O_PATH | os.O_CLOEXEC)
            except OSError:
                continue   # gone meanwhile, or a dangling link
            try:
                rule = _PathBeneath(access, fd)
                if LIBC.syscall(SYS_LANDLOCK_ADD_RULE, ruleset, LANDLOCK_RULE_PATH_BENEATH,
                                ctypes.byref(rule), 0) != 0:
                    raise OSError(ctypes.get_errno(), f"landlock_add_rule /{name}")
            finally:
                os.close(fd)
        if LIBC.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS)")
        if LIBC.syscall(SYS_LANDLOCK_RESTRICT_SELF, ruleset, 0) != 0:
            raise OSError(ctypes.get_errno(), "landlock_restrict_self")
    finally:
        os.close(ruleset)


def start_test_sh() -> tuple:
    """(test.sh's pid, the read end of the pytest guard's pipe, the guard's nonce)."""
    env = dict(os.environ)
    env["PYTHONSAFEPATH"] = "1"
    env["PYTHONNOUSERSITE"] = "1"        # no user site (HOME is never the agent's; this holds if it were)
    for name in ("BASH_ENV", "ENV", "PYTHONSTARTUP", "PYTHONUSERBASE"):
        env.pop(name, None)
    env["PYTHONPATH"] = SITE_DIR + (":" + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    guard_r, guard_w = os.pipe()
    nonce = os.urandom(16).hex()
    env[GUARD_ENV] = f"{guard_w}:{nonce}"
    env["PYTEST_PLUGINS"] = ",".join(p for p in (env.get("PYTEST_PLUGINS", ""), GUARD_MODULE) if p)
    pid = os.fork()
    if pid == 0:
        try:
            os.close(guard_r)
            os.set_inheritable(guard_w, True)
            # test.sh and all it starts lose CAP_SYS_PTRACE (seccomp already denies ptrace): this
            # process, not dumpable, is then out of their reach (/proc/<pid>/mem, fd, environ)
            if LIBC.prctl(PR_CAPBSET_DROP, CAP_SYS_PTRACE, 0, 0, 0) != 0:
                raise OSError(ctypes.get_errno(), "prctl(PR_CAPBSET_DROP, CAP_SYS_PTRACE)")
            confine_writes()
            os.dup2(2, 1)
            os.execvpe("bash", ["bash", TEST_SH], env)
        except OSError as exc:
            print(f"paddock-harbor: cannot start test.sh: {exc}", file=sys.stderr, flush=True)
        finally:
            os._exit(127)
    os.close(guard_w)
    return pid, guard_r, nonce


def read_guard(fd: int, nonce: str) -> list:
    """The guard's lines (every writer is gone: test.sh ended, the rest were killed)."""
    data = b""
    while len(data) <= MAX_GUARD_BYTES:
        chunk = os.read(fd, 65536)
        if not chunk:
            break
        data += chunk
    os.close(fd)
    lines = data.decode("utf-8", "replace").splitlines()
    foreign = [ln for ln in lines if ln.split(" ", 1)[0] != nonce]
    if foreign or len(data) > MAX_GUARD_BYTES:
        verdict(False, "something other than pytest wrote into the verifier's pytest report pipe, so the "
                       f"reward cannot be trusted: {(foreign or ['(over the size cap)'])[0][:120]!r}")
    return [ln.split(" ")[1:] for ln in lines]


def launch_verdict(lines: list) -> None:
    """A pytest run that started (our sitecustomize saw it) must have reported its session's
    start: one that ended before (a conftest or start-up hook of the agent's exiting) cannot
    stand. Where no Python process under test.sh saw our sitecustomize at all and test.sh names
    pytest, pytest ran without it and without the guard (`env -i`): that cannot stand either.
    What ran decides, not the word alone (a test.sh that runs unittest and mentions pytest)."""
    launched = [w for w in lines if len(w) >= 4 and w[2] == "launch"]
    started = {w[1] for w in lines if len(w) >= 3 and w[2] == "start"}
    for w in launched:
        if w[3] == "pytest" and w[1] not in started:
            verdict(False, f"the pytest run of pid {w[1]} ended before its session started (a conftest or "
                           "start-up hook exited it, or it ran without the guard), so a reward of 1 cannot stand")
    if not launched and not started and names_pytest(TEST_SH):
        verdict(False, "test.sh runs pytest but no pytest session reported (ended before it started, or "
                       "run without the guard), so a reward of 1 cannot stand")


def guard_verdict(lines: list) -> None:
    """Contract 6: a reward of 1 stands only if every pytest session ended as a clean run."""
    ended = {}
    for words in lines:
        if len(words) >= 3 and words[2] == "end":
            ended[words[0]] = words
    for words in lines:
        if len(words) < 3 or words[2] != "start":
            continue
        session, pid = words[0], words[1]
        end = ended.get(session)
        if end is None:
            verdict(False, f"the pytest session of pid {pid} never reported its end (it was exited from "
                           "inside: os._exit, a signal, an atexit hook), so the reward cannot be trusted")
        counts = dict(kv.split("=", 1) for kv in end[5:] if "=" in kv)
        bad = [f"{k}={counts.get(k)}" for k in ("failed", "error", "own_skip") if counts.get(k, "0") != "0"]
        if end[4] != "0":
            bad.append("interrupted (pytest.exit)")
        if counts.get("passed", "0") == "0":
            bad.append("no test passed")
        if bad:
            verdict(False, f"the pytest session of pid {pid} did not pass cleanly ({', '.join(bad)}; a skip or "
                           "xfail from inside a test without its marker counts), so a reward of 1 cannot stand")


def wait_test_sh(test_pid: int, orphans: list) -> int:
    """Reap until test.sh exits; every other child reaped (a process reparented here) is
    recorded with the time it was reaped (after it ended)."""
    while True:
        info = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOWAIT)
        if info is None:
            continue
        pid = info.si_pid
        name = comm(pid)
        _, status = os.waitpid(pid, 0)
        if pid == test_pid:
            return status
        orphans.append((time.time_ns(), pid, name))


def reap_already_dead(orphans: list) -> None:
    while True:
        try:
            info = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            return
        if info is None:
            return
        name = comm(info.si_pid)
        os.waitpid(info.si_pid, 0)
        orphans.append((time.time_ns(), info.si_pid, name))


def kill_the_rest() -> bool:
    """SIGKILL to every other process of the PID namespace (one kill(-1): no fork escapes it),
    then reap until none is left. True when there was one to kill."""
    killed = bool(others())        # (the callee broker, if any, is not the tests')
    try:
        os.kill(-1, signal.SIGKILL)
    except ProcessLookupError:
        pass
    while True:
        try:
            os.waitpid(-1, 0)
        except ChildProcessError:
            break
    deadline = time.monotonic() + 10
    while others() and time.monotonic() < deadline:   # not our descendants: none expected
        time.sleep(0.01)
    if others():
        verdict(False, f"processes survived the kill: {others()[:5]}")
    return killed


def read_file(dirfd: int, name: str, cap: int):
    """(bytes, last change in ns) of a regular one-link file of at most `cap` bytes in the
    reward directory, None if there is none, or a verdict(False)."""
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY, dir_fd=dirfd)
    except FileNotFoundError:
        return None
    except OSError as exc:
        verdict(False, f"{name} cannot be opened as a file ({exc.strerror}: a symbolic link or socket is refused)")
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            verdict(False, f"{name} is not a regular file (mode {stat.filemode(st.st_mode)})")
        if st.st_nlink != 1:
            verdict(False, f"{name} has {st.st_nlink} links (a hard link is refused)")
        if st.st_size > cap:
            verdict(False, f"{name} is {st.st_size} bytes (at most {cap})")
        data = os.read(fd, cap + 1)
    finally:
        os.close(fd)
    if len(data) > cap:
        verdict(False, f"{name} is over {cap} bytes")
    return data, max(st.st_ctime_ns, st.st_mtime_ns)


def reward_value(name: str, raw) -> float:
    """A finite number in [0, 1] (not a bool), or a verdict(False)."""
    if isinstance(raw, bytes):
        try:
            raw = float(raw.decode("ascii").strip())
        except (UnicodeDecodeError, ValueError):
            verdict(False, f"{name} is not a number: {raw[:MAX_REWARD_BYTES]!r}")
    if isinstance(raw, bool) or not isinstance(raw, (int, float)):
        verdict(False, f"{name}: the reward {raw!r} is not a number")
    try:
        value = float(raw)
    except OverflowError:
        value = math.inf
    if not math.isfinite(value) or not 0.0 <= value <= 1.0:
        verdict(False, f"{name} says {str(raw)[:40]!r}: a reward is a finite number in [0, 1]")
    return value


def read_reward(dirfd: int, json_first: bool):
    """(file, value, last change in ns) or a verdict(False). As Harbor: `reward.json` (an object;
    its "reward") when test.sh wrote one with a "reward", else `reward.txt` — the JSON only for a
    task whose tests name it (`json_first`, decided at import): for the others a reward.json is
    one the code under test wrote, not test.sh."""
    dst = os.fstat(dirfd)
    changed = max(dst.st_ctime_ns, dst.st_mtime_ns)
    got = read_file(dirfd, REWARD_JSON, MAX_REWARD_JSON_BYTES) if json_first else None
    if got is not None:
        changed = max(changed, got[1])
        try:
            doc = json.loads(got[0].decode("utf-8"), parse_constant=lambda c: verdict(False, f"{REWARD_JSON}: {c}"))
        except (UnicodeDecodeError, ValueError, RecursionError) as exc:
            verdict(False, f"{REWARD_JSON} is not JSON: {exc}")
        if not isinstance(doc, dict):
            verdict(False, f"{REWARD_JSON} is not a JSON object")
        if "reward" in doc:
            return REWARD_JSON, reward_value(REWARD_JSON, doc["reward"]), changed
    got = read_file(dirfd, REWARD_NAME, MAX_REWARD_BYTES)
    if got is None:
        verdict(False, f"test.sh wrote no {REWARD_DIR}/{REWARD_NAME} (nor a {REWARD_JSON} with a reward)")
    return REWARD_NAME, reward_value(REWARD_NAME, got[0]), max(changed, got[1])


def main() -> None:
    global LIBC
    try:
        LIBC = ctypes.CDLL(None, use_errno=True)
        for option, value in ((PR_SET_CHILD_SUBREAPER, 1), (PR_SET_DUMPABLE, 0)):
            if LIBC.prctl(option, value, 0, 0, 0) != 0:
                raise OSError(ctypes.get_errno(), f"prctl({option}, {value})")
    except (OSError, AttributeError) as exc:
        verdict(False, f"cannot become the tests' subreaper: {exc}")
    dirfd, made = fresh_reward_dir()
    orphans: list = []
    test_pid, guard_fd, nonce = start_test_sh()
    status = wait_test_sh(test_pid, orphans)
    reap_already_dead(orphans)
    alive = settle_callees(others())
    killed = kill_the_rest()
    sessions = read_guard(guard_fd, nonce)
    if os.WIFSIGNALED(status):
        verdict(False, f"test.sh was killed by signal {os.WTERMSIG(status)}")
    if alive or killed:
        verdict(False, "processes the tests started were still running when test.sh exited, so the reward "
                       f"cannot be trusted: {', '.join(f'{p} ({n})' for p, n in alive[:5]) or 'killed'}")
    for path, ident in made:
        try:
            same = identity(path) == ident
        except OSError:
            same = False
        if not same:
            verdict(False, f"{path} was moved or replaced while the tests ran (the reward directory is the one "
                           "the verifier created)")
    name, value, changed = read_reward(dirfd, JSON_FLAG in sys.argv[1:])
    late = [(pid, name) for at, pid, name in orphans if at >= changed]
    if late:
        verdict(False, "background processes the tests started ended after the reward's last change, so it "
                       f"cannot be trusted: {', '.join(f'{p} ({n})' for p, n in late[:5])}")
    say(f"test.sh exited {os.WEXITSTATUS(status)}; {len(orphans)} background process(es) ended before the reward; "
        f"{sum(1 for w in sessions if len(w) >= 3 and w[2] == 'start')} pytest session(s)")
    if value == 1.0:
        launch_verdict(sessions)
        guard_verdict(sessions)
    verdict(value == 1.0, f"{name} says {value:g}")


if __name__ == "__main__":
    main()
