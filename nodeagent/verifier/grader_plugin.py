"""Paddock's in-sandbox pytest grader (installed read-only at /verifier/paddock_grader.py).

This file is not imported by Paddock on the host: `nodeagent.verifier.grade` reads its bytes and
writes them into the grading sandbox, where it runs as `python3 -I -B /verifier/paddock_grader.py
UID REPORT_DIR TESTS_DIR PYTEST_ARGS...` (it is still a normal module, importable and lintable).

Parent (sandbox root): makes a 0700 report directory, makes the tests directory 0711 (its
files are 0400, owned by the sandbox root), reads the test sources, forks the child, reads the
child's result events from a pipe and writes report.json. It never imports the code under
test. Child: drops to an unprivileged uid (cannot read the test files, nor write /work,
/verifier or the report directory), then runs pytest with this module as its only plugin;
test modules are compiled from the sources read before the drop.

Every event the plugin emits is signed with an HMAC (a key made by the parent, held only by the
plugin object): a line written to the pipe by anything else is counted as forged. Test asserts
`a == b` are rewritten (on the host) to `strict_eq`, imported from this module as
`paddock_grader`. Before and after each test the plugin checks that the pytest internals it
depends on (`_Plugin.snapshot`) are the very objects it saw at start; any change is a `tamper`
event.

Standard library only at import (it runs inside the task's image, with no Paddock installed);
must not import Paddock, the code under test, or pytest before the child drops privileges.
"""

import builtins
import hashlib
import hmac
import importlib.abc
import importlib.util
import json
import os
import select
import signal
import sys

_write, _getpid, _exit = os.write, os.getpid, os._exit
MAX_EVENTS_BYTES = 1 << 20
REPORT_RESERVE_BYTES = 3 << 20     # allocated before the code under test runs: a full disk cannot stop the report


def _mac(key, seq, body):
    return hmac.new(key, f"{seq}:{body}".encode(), hashlib.sha256).hexdigest()[:32]


def parent(argv):
    """Run the child, collect its signed events, write the report. Returns the exit code."""
    uid, report_dir, tests_dir, args = int(argv[0]), argv[1], argv[2], argv[3:]
    os.mkdir(report_dir, 0o700)
    report_fd = os.open(os.path.join(report_dir, "report.json.tmp"), os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    os.posix_fallocate(report_fd, 0, REPORT_RESERVE_BYTES)
    os.chmod(tests_dir, 0o711)
    sources = _read_sources(tests_dir)
    key = os.urandom(32)        # signs every event: lines written by anything else are forged
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        _become_child(uid, report_fd, w, key, sources, args)
    os.close(w)
    data, status = _collect(r, pid)
    try:
        os.kill(-1, signal.SIGKILL)     # whatever the code under test left running
    except ProcessLookupError:
        pass
    events, bad, forged = _verified_events(data, key)
    report = {"grader": 1, "exit_code": os.waitstatus_to_exitcode(status), "events": events,
              "malformed_lines": bad, "forged_lines": forged, "truncated": len(data) >= MAX_EVENTS_BYTES}
    _write_report(report_fd, report_dir, report)
    return 0


def _read_sources(tests_dir):
    """path -> bytes of every .py file under the tests directory (read while still root)."""
    sources = {}
    for base, _dirs, names in os.walk(tests_dir):
        for name in names:
            if name.endswith(".py"):
                with open(os.path.join(base, name), "rb") as f:
                    sources[os.path.join(base, name)] = f.read()
    return sources


def _become_child(uid, report_fd, w, key, sources, args):
    """In the forked child: drop to `uid`, then run pytest. Never returns."""
    try:
        os.close(report_fd)
        os.setresgid(uid, uid, uid)
        os.setresuid(uid, uid, uid)
        os.environ.clear()
        os.environ.update({"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": "/tmp", "LANG": "C.UTF-8",
                           "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"})
        sys.modules["paddock_grader"] = sys.modules[__name__]
        child(w, key, sources, args)
    except BaseException as exc:
        os.write(2, f"paddock grader: cannot run pytest: {exc!r}\n".encode())
    _exit(127)


def _collect(r, pid):
    """(the child's event bytes, capped at MAX_EVENTS_BYTES; its wait status)."""
    data, status = bytearray(), None
    while True:
        if status is None:
            got, st = os.waitpid(pid, os.WNOHANG)
            status = st if got else None
        ready, _, _ = select.select([r], [], [], 0.05)
        if not ready:
            if status is not None:
                break           # pytest exited; strays that hold the pipe do not keep us waiting
            continue
        chunk = os.read(r, 65536)
        if not chunk:
            break
        if len(data) < MAX_EVENTS_BYTES:
            data += chunk[:MAX_EVENTS_BYTES - len(data)]
    if status is None:
        _, status = os.waitpid(pid, 0)
    return bytes(data), status


def _verified_events(data, key):
    """(events whose signature checks, in sequence; malformed lines; forged lines)."""
    events, bad, forged, seq = [], 0, 0, 0
    for line in data.decode("utf-8", "replace").splitlines():
        try:
            rec = json.loads(line)
            body = json.dumps(rec["ev"], sort_keys=True)
        except (ValueError, KeyError, TypeError):
            bad += 1
            continue
        if not isinstance(rec["ev"], dict) or not hmac.compare_digest(str(rec.get("mac")), _mac(key, seq, body)):
            forged += 1
            continue
        events.append(rec["ev"])
        seq += 1
    return events, bad, forged


def _write_report(report_fd, report_dir, report):
    """Into the space allocated before the child ran, then renamed into place."""
    data = json.dumps(report).encode()
    if len(data) > REPORT_RESERVE_BYTES:
        report.update(events=[], truncated=True)
        data = json.dumps(report).encode()
    os.pwrite(report_fd, data, 0)
    os.ftruncate(report_fd, len(data))
    os.close(report_fd)
    os.rename(os.path.join(report_dir, "report.json.tmp"), os.path.join(report_dir, "report.json"))


def strict_eq(a, b):
    """`==` that an object overriding __eq__ cannot fake: builtin types compared structurally."""
    num = (int, float, complex)
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if type(a) in num and type(b) in num:
        return a == b
    if type(a) is not type(b):
        return False
    if type(a) in (list, tuple):
        return len(a) == len(b) and all(strict_eq(x, y) for x, y in zip(a, b))
    if type(a) is dict:
        return a.keys() == b.keys() and all(strict_eq(a[k], b[k]) for k in a)
    if type(a) in (str, bytes, set, frozenset, type(None), range):
        return a == b
    return bool(a == b) and bool(b == a)


class _Plugin:
    def __init__(self, fd, key):
        self.fd = fd
        self.watch = []
        seq = [0]

        def sign(body):
            mac = _mac(key, seq[0], body)
            seq[0] += 1
            return mac
        self.sign = sign

    def emit(self, **ev):
        ev = json.loads(json.dumps(ev, default=str))
        body = json.dumps(ev, sort_keys=True)
        _write(self.fd, (json.dumps({"ev": ev, "mac": self.sign(body)}) + "\n").encode())

    def snapshot(self):
        """(owner, name, object) of every internal a test could patch to fake a pass."""
        # pytest's internals are imported here, in the child after the privilege drop: the
        # parent never loads the test framework, and the host can import this module without it.
        import _pytest.main
        import _pytest.python
        import _pytest.reports
        import _pytest.runner
        import pluggy._callers
        targets = [(_pytest.runner, "call_and_report"), (_pytest.runner, "runtestprotocol"),
                   (_pytest.runner, "call_runtest_hook"), (_pytest.runner.CallInfo, "from_call"),
                   (_pytest.runner, "pytest_runtest_makereport"), (_pytest.python.Function, "runtest"),
                   (_pytest.python, "pytest_pyfunc_call"), (_pytest.reports.TestReport, "__init__"),
                   (_pytest.reports.TestReport, "from_item_and_call"), (_pytest.main, "pytest_runtestloop"),
                   (pluggy._callers, "_multicall"), (builtins, "AssertionError"), (sys, "exit"),
                   (sys.modules[__name__], "strict_eq"), (_Plugin, "pytest_runtest_logreport"),
                   (_Plugin, "emit"), (_Plugin, "check"), (json, "dumps"), (hmac, "new"), (_MemFinder, "find_spec"),
                   (_MemLoader, "get_data")]
        return [(obj, name, obj.__dict__.get(name, getattr(obj, name, None)) if isinstance(obj, type)
                 else getattr(obj, name, None)) for obj, name in targets]

    def check(self):
        changed = [name for obj, name, orig in self.watch
                   if (obj.__dict__.get(name, getattr(obj, name, None)) if isinstance(obj, type)
                       else getattr(obj, name, None)) is not orig]
        plugins = {id(p) for p in self.config.pluginmanager.get_plugins()}
        foreign = [repr(p)[:80] for p in self.config.pluginmanager.get_plugins()
                   if id(p) not in self.plugins and not str(getattr(p, "__file__", "")).startswith("/verifier/")]
        if changed or foreign:
            self.emit(ev="tamper", changed=changed, plugins=foreign)
        return plugins

    def pytest_configure(self, config):
        self.config = config
        self.watch = self.snapshot()
        self.plugins = set()
        self.emit(ev="start", pid=_getpid())

    def pytest_collection(self, session):
        self.plugins = {id(p) for p in self.config.pluginmanager.get_plugins()}
        sys.meta_path.insert(0, self.finder)

    def pytest_collection_finish(self, session):
        self.check()
        self.emit(ev="collected", ids=[i.nodeid for i in session.items])

    def pytest_collectreport(self, report):
        if report.failed:
            self.emit(ev="collect_error", id=report.nodeid, detail=str(report.longrepr)[-1500:])

    def pytest_runtest_logreport(self, report):
        self.check()
        if report.when == "call" or report.outcome != "passed":
            self.emit(ev="test", id=report.nodeid, when=report.when, outcome=report.outcome,
                      detail="" if report.passed else str(report.longrepr)[-800:])

    def pytest_sessionfinish(self, session, exitstatus):
        self.check()
        self.emit(ev="end", exitstatus=int(exitstatus))


class _MemLoader(importlib.abc.SourceLoader):
    def __init__(self, path, source):
        self.path, self.source = path, source

    def get_filename(self, fullname):
        return self.path

    def get_data(self, path):
        if path != self.path:
            raise OSError(f"no data for {path}")
        return self.source


class _MemFinder(importlib.abc.MetaPathFinder):
    """Test modules from the sources read before the privilege drop (the files are unreadable now)."""

    def __init__(self, sources):
        self.sources = sources

    def find_spec(self, name, path=None, target=None):
        leaf = name.rpartition(".")[2]
        for d in (path or sys.path):
            for cand in (os.path.join(str(d), leaf + ".py"), os.path.join(str(d), leaf, "__init__.py")):
                if cand in self.sources:
                    return importlib.util.spec_from_file_location(
                        name, cand, loader=_MemLoader(cand, self.sources[cand]),
                        submodule_search_locations=[os.path.dirname(cand)] if cand.endswith("__init__.py") else None)
        return None


def child(fd, key, sources, args):
    """Run pytest with the signing plugin and the in-memory test finder; exits with its code."""
    import pytest       # only in the child, after the privilege drop (see _Plugin.snapshot)
    plugin = _Plugin(fd, key)
    del key
    plugin.finder = _MemFinder(sources)
    code = pytest.main(args, plugins=[plugin])
    _exit(int(code))


if __name__ == "__main__":
    sys.exit(parent(sys.argv[1:]))
