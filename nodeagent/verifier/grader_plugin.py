"""Paddock's in-sandbox pytest grader (installed read-only at /verifier/paddock_grader.py).

This file is not imported by Paddock on the host: `nodeagent.verifier.grade` reads its bytes and
writes them into the grading sandbox, where it runs as `python3 -I -B /verifier/paddock_grader.py
CONFIG_JSON PYTEST_ARGS...` (it is still a normal module, importable and lintable). CONFIG_JSON:
{"uid", "report_dir", "tests_dir", "call": null | {"uid", "modules", "timeout_s"}}.

Parent (sandbox root): makes a 0700 report directory, makes the tests directory 0711 (its
files are 0400, owned by the sandbox root), reads the test sources, forks the child, reads the
child's result events from a pipe and writes report.json. It never imports the code under
test. Child: drops to an unprivileged uid (cannot read the test files, nor write /work,
/verifier or the report directory), then runs pytest with this module as its only plugin;
test modules are compiled from the sources read before the drop.

Events travel over a SOCK_SEQPACKET socket with SO_PASSCRED: only messages the kernel stamps
with the pytest child's pid count; each is also signed with an HMAC (defence in depth: in
repository mode the key lives in the process of the code under test). With call isolation the
parent also starts the callee (`paddock_callbridge.py serve`, under the callee uid) and the
pytest child imports the agent's modules only as proxies over a socket. In every mode the child,
before any agent code can run, puts a finder first on sys.meta_path that loads the standard
library and the test framework only from the trusted sys.path, and installs an audit hook (which
cannot be removed) that refuses ctypes, gc.get_objects/get_referrers/get_referents, code-object
construction, `__code__` swaps and frame access (sys._getframe, tb_frame, gi_frame, f_code,
settrace/setprofile) to code outside the trusted directories, directly or through a
frame-returning library function; a refusal is a `tamper` event. In repository mode the host
has planted hidden canary tests (`nodeagent.verifier.canaries`): the loader binds the
canaries' perturber into their compiled code, and pins the test modules' state
(`paddock_asserts.state_*`); the test sources wait in a generator's frame, out of reach. Test
asserts `a == b` are rewritten (on the host) to `strict_eq`, imported from this module as
`paddock_grader`. At every test the plugin checks that the pytest internals it depends on
(`_Plugin.snapshot`), the test modules' functions and state and the builtins are what it saw at
start, and that no trace or profile hook is set; any change is a `tamper` event.

Standard library only at import (it runs inside the task's image, with no Paddock installed);
nothing of the code under test, and pytest only after the child drops privileges. Must not
import: anything of Paddock.
"""

import _imp
import _thread
import ast
import builtins
import hashlib
import hmac
import importlib.abc
import importlib.machinery
import importlib.util
import json
import os
import select
import signal
import socket
import struct
import sys
import sysconfig

_write, _getpid, _exit = os.write, os.getpid, os._exit
MAX_EVENTS_BYTES, CALLBRIDGE_PATH, ASSERTS_PATH = 1 << 20, "/verifier/paddock_callbridge.py", "/verifier/paddock_asserts.py"
_asserts = None     # `paddock_asserts` (grader_asserts.py): loaded by path in `child`, before any code under test
if __name__.startswith("nodeagent."):       # imported on the host (tests): the package's own copy
    from nodeagent.verifier import grader_asserts as _asserts  # type: ignore[assignment]  # None until loaded
REPORT_RESERVE_BYTES = 3 << 20     # allocated before the code under test runs: a full disk cannot stop the report


def _mac(key, seq, body):
    return hmac.new(key, f"{seq}:{body}".encode(), hashlib.sha256).hexdigest()[:32]


def parent(argv):
    """Run the child (and the callee), collect the child's events, write the report. Returns 0."""
    cfg, args = json.loads(argv[0]), argv[1:]
    uid, report_dir, tests_dir, call = int(cfg["uid"]), cfg["report_dir"], cfg["tests_dir"], cfg.get("call")
    os.mkdir(report_dir, 0o700)
    report_fd = os.open(os.path.join(report_dir, "report.json.tmp"), os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    os.posix_fallocate(report_fd, 0, REPORT_RESERVE_BYTES)
    os.chmod(tests_dir, 0o711)
    sources = _read_sources(tests_dir)
    for path in cfg.get("locked") or ():    # repository test modules, 0400: from memory only
        with open(path, "rb") as f:
            sources[path] = f.read()
    key = os.urandom(32)        # signs every event (defence in depth: the sender pid is what counts)
    r, w = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    r.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
    bridge_fd = _start_callee(call, [r.fileno(), w.fileno(), report_fd]) if call else None
    pid = os.fork()
    if pid == 0:
        r.close()
        _become_child(uid, report_fd, w.detach(), key, sources, args, cfg, bridge_fd)
    w.close()
    if bridge_fd is not None:
        os.close(bridge_fd)
    data, status = _collect(r, pid)
    try:
        os.kill(-1, signal.SIGKILL)     # whatever the code under test left running
    except ProcessLookupError:
        pass
    events, bad, forged = _verified_events(data, key)
    report = {"grader": 2, "exit_code": os.waitstatus_to_exitcode(status), "events": events,
              "malformed_lines": bad, "forged_lines": forged,
              "truncated": sum(len(m) for _p, m in data) >= MAX_EVENTS_BYTES}
    _write_report(report_fd, report_dir, report)
    return 0


def _start_callee(call, close_fds):
    """Fork and exec the callee (the agent's code, under call["uid"]); return pytest's end."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    pid = os.fork()
    if pid == 0:
        try:
            for fd in close_fds + [ours.fileno()]:
                os.close(fd)
            os.dup2(theirs.fileno(), 3)
            null = os.open(os.devnull, os.O_RDWR)
            for fd in (0, 1, 2):
                os.dup2(null, fd)
            os.closerange(4, 65536)
            cuid = int(call["uid"])
            os.setresgid(cuid, cuid, cuid)
            os.setresuid(cuid, cuid, cuid)
            env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": "/tmp", "LANG": "C.UTF-8"}
            os.execve(sys.executable, [sys.executable, "-I", "-B", CALLBRIDGE_PATH, "serve", "3",
                                       str(float(call["timeout_s"])), *call["modules"]], env)
        finally:
            _exit(127)
    theirs.close()
    return ours.detach()


def _read_sources(tests_dir):
    """path -> bytes of every .py file under the tests directory (read while still root)."""
    sources = {}
    for base, _dirs, names in os.walk(tests_dir):
        for name in names:
            if name.endswith(".py"):
                with open(os.path.join(base, name), "rb") as f:
                    sources[os.path.join(base, name)] = f.read()
    return sources


def _become_child(uid, report_fd, w, key, sources, args, cfg, bridge_fd):
    """In the forked child: drop to `uid`, then run pytest. Never returns."""
    try:
        os.close(report_fd)
        os.setresgid(uid, uid, uid)
        os.setresuid(uid, uid, uid)
        os.environ.clear()
        os.environ.update({"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": "/tmp", "LANG": "C.UTF-8",
                           "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"})
        sys.modules["paddock_grader"] = sys.modules[__name__]
        child(w, key, sources, args, cfg, bridge_fd)
    except BaseException as exc:
        os.write(2, f"paddock grader: cannot run pytest: {exc!r}\n".encode())
    _exit(127)


def _collect(sock, pid):
    """([(sender pid, message bytes)], capped at MAX_EVENTS_BYTES in all; the child's wait status)."""
    msgs, total, status = [], 0, None
    cred_size = socket.CMSG_SPACE(struct.calcsize("3i"))
    while True:
        if status is None:
            got, st = os.waitpid(pid, os.WNOHANG)
            status = st if got else None
        ready, _, _ = select.select([sock], [], [], 0.05)
        if not ready:
            if status is not None:
                break           # pytest exited; strays that hold the socket do not keep us waiting
            continue
        data, anc, _flags, _addr = sock.recvmsg(1 << 20, cred_size)
        if not data and not anc:
            break
        sender = -1
        for level, kind, payload in anc:
            if level == socket.SOL_SOCKET and kind == socket.SCM_CREDENTIALS:
                sender = struct.unpack("3i", payload[:struct.calcsize("3i")])[0]
        if total < MAX_EVENTS_BYTES:
            msgs.append((sender if sender == pid else -1, data[:MAX_EVENTS_BYTES - total]))
            total += len(data)
    if status is None:
        _, status = os.waitpid(pid, 0)
    return msgs, status


def _verified_events(msgs, key):
    """(events sent by the pytest child whose signature checks, in sequence; malformed lines;
    forged lines: another sender, a bad signature, or a second report of the same test phase)."""
    events, bad, forged, seq, seen = [], 0, 0, 0, set()
    for sender, data in msgs:
        for line in data.decode("utf-8", "replace").splitlines():
            try:
                rec = json.loads(line)
                body = json.dumps(rec["ev"], sort_keys=True)
            except (ValueError, KeyError, TypeError, RecursionError):     # RecursionError: nested too deep
                bad += 1
                continue
            if sender < 0 or not isinstance(rec["ev"], dict) or not hmac.compare_digest(
                    str(rec.get("mac")), _mac(key, seq, body)):
                forged += 1
                continue
            seq += 1
            ev = rec["ev"]
            phase = (ev.get("ev"), str(ev.get("id")), str(ev.get("when"))) if ev.get("ev") in ("test", "end") else None
            if phase is not None and phase in seen:
                forged += 1
                continue
            seen.add(phase)
            events.append(ev)
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
    def __init__(self, fd, key, tests_dir, locked=()):
        self.fd, self.tests_dir, self.locked = fd, tests_dir, frozenset(locked)
        self.watch, self.globals_watch, self.class_watch = [], [], []
        self.config = None
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
                   (sys.modules[__name__], "strict_eq"), (_asserts, "honest_eq"), (_asserts, "perturb"),
                   (_asserts, "_trusted_function"), (_asserts, "_suspect"), (_asserts, "trusted_function"),
                   (_asserts, "state_compile"), (_asserts, "state_pin"), (_asserts, "state_items"),
                   (_asserts, "state_check"),
                   (_MemLoader, "source_to_code"), (_Plugin, "pytest_runtest_logreport"),
                   (_Plugin, "emit"), (_Plugin, "check"), (json, "dumps"), (hmac, "new"), (_MemFinder, "find_spec"),
                   (_MemLoader, "get_data")]
        return [(obj, name, obj.__dict__.get(name, getattr(obj, name, None)) if isinstance(obj, type)
                 else getattr(obj, name, None)) for obj, name in targets + _asserts.framework_targets()]

    def check(self, nodeid=None, when=None):
        changed = _asserts.state_check(nodeid, when) + [name for obj, name, orig in self.watch
                   if (obj.__dict__.get(name, getattr(obj, name, None)) if isinstance(obj, type)
                       else getattr(obj, name, None)) is not orig]
        changed += [f"{where}.{name}" for where, space, name, orig in self.globals_watch
                    if space.get(name) is not orig]
        changed += [f"{cls.__name__}.{name}" for cls, snap in self.class_watch
                    for name in {n for n in vars(cls) if n not in snap and hasattr(vars(cls)[n], "__get__")}
                    | {n for n in snap if vars(cls).get(n) is not snap[n]}]
        if sys.gettrace() is not None or sys.getprofile() is not None or \
                getattr(sys.modules.get("threading"), "_trace_hook", None) is not None or \
                getattr(sys.modules.get("threading"), "_profile_hook", None) is not None:
            changed.append("a trace or profile hook is set")
        plugins = {id(p) for p in self.config.pluginmanager.get_plugins()}
        foreign = [repr(p)[:80] for p in self.config.pluginmanager.get_plugins()
                   if id(p) not in self.plugins and not str(getattr(p, "__file__", "")).startswith("/verifier/")]
        if changed or foreign:
            self.emit(ev="tamper", changed=changed, plugins=foreign)
        return plugins

    def take_snapshot(self):
        """In `child` before pytest.main, before any /work code (the task's conftest) runs."""
        self.watch = self.snapshot()
        self.class_watch = [(cls, dict(vars(cls))) for cls in (_Plugin, *_asserts.framework_targets(classes=True))]
        self.globals_watch = [("builtins", vars(builtins), n, v) for n, v in list(vars(builtins).items())
                              if callable(v) or isinstance(v, type)]

    def pytest_configure(self, config):
        self.config = config
        if not self.watch:
            self.take_snapshot()
        self.plugins = set()
        self.emit(ev="start", pid=_getpid())

    def pytest_collection(self, session):
        self.plugins = {id(p) for p in self.config.pluginmanager.get_plugins()}
        if type(sys.meta_path) is not list:     # a subclass would see (and could read) the finder
            self.emit(ev="tamper", detail=f"sys.meta_path replaced by a {type(sys.meta_path).__qualname__}")
            return
        list.insert(sys.meta_path, 0, self.finder)

    def pytest_collection_finish(self, session):
        self.globals_watch += _callables_of(self.tests_dir, self.locked)
        _asserts.state_items(session.items)
        self.finder.store.send(False)       # the test sources handed out so far are gone
        self.check()
        ids = [i.nodeid for i in session.items]
        for at in range(0, max(len(ids), 1), 500):      # one socket message each, well under its limit
            self.emit(ev="collected", ids=ids[at:at + 500])

    def pytest_collectreport(self, report):
        if report.failed:
            self.emit(ev="collect_error", id=report.nodeid, detail=str(report.longrepr)[-1500:])

    def pytest_runtest_logreport(self, report):
        self.check(report.nodeid, report.when)
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
        if path != self.path or self.source is None:
            raise OSError(f"no data for {path}")
        source, self.source = self.source, None      # one shot: code under test cannot read it later
        return source

    def source_to_code(self, data, path, *, _optimize=-1):
        tree = _asserts._liars.compile_tree(ast.parse(data, path), path, _asserts.HonestAsserts, _asserts.state_compile)
        code = compile(ast.fix_missing_locations(tree), path, "exec", dont_inherit=True, optimize=_optimize)
        return _asserts.bind_perturber(code, data)

    def exec_module(self, module):
        path, module.__dict__["_paddock_honest_eq"] = self.path, _asserts.honest_eq
        super().exec_module(module)
        _asserts.state_pin(module, path)        # its state, checked from now on (`_Plugin.check`)


def _source_store(sources, _audit=sys.audit, _list=list, _set=set):
    """The test sources in a generator's own frame (`gi_frame` is refused to the code under test):
    send a path, get its bytes or None; `False` ends collection: what was handed out is dropped,
    the rest is handed out once (`--import-mode=importlib` with `--doctest-modules` imports a
    module twice while collecting). Asked with code under test on the stack or from another
    thread (`paddock.stack`), it answers None and keeps the source."""
    path, handed, collecting = (yield None), _set(), True
    while True:
        culprit = _list()
        _audit("paddock.stack", culprit)
        if path is False and not any(culprit):
            collecting = [sources.pop(p, None) for p in handed] and False       # (always false)
        ok = type(path) is str and not any(culprit) and not handed.add(path)
        path = yield ((sources.get(path) if collecting else sources.pop(path, None)) if ok else None)


class _MemFinder(importlib.abc.MetaPathFinder):
    """Test modules from the sources read before the privilege drop (the files are unreadable now)."""

    def __init__(self, sources):
        self.paths = frozenset(sources)
        self.store = _source_store(sources)
        next(self.store)

    def find_spec(self, name, path=None, target=None):
        leaf = name.rpartition(".")[2]
        for d in (path or sys.path):
            for cand in (os.path.join(str(d), leaf + ".py"), os.path.join(str(d), leaf, "__init__.py")):
                if cand in self.paths:
                    source = self.store.send(cand)
                    if source is None:
                        continue
                    return importlib.util.spec_from_file_location(
                        name, cand, loader=_MemLoader(cand, source),
                        submodule_search_locations=[os.path.dirname(cand)] if cand.endswith("__init__.py") else None)
        return None


# -- defences that hold before any code under test runs ------------------------------------------

TRUSTED_TOPS = frozenset(sys.stdlib_module_names) | {"pytest", "_pytest", "pluggy", "paddock_grader", "paddock_callbridge"}
PYTEST_DEPENDENCIES = frozenset({"iniconfig", "packaging", "py", "exceptiongroup", "tomli", "attr", "more_itertools"})


class _TrustedImports(importlib.abc.MetaPathFinder):
    """First on sys.meta_path: the standard library and the test framework only from the trusted sys.path."""

    def __init__(self, trusted_path):
        self.path = list(trusted_path)
        self.loaded = frozenset()

    def seal(self, plugins=frozenset()):
        """The framework's dependencies imported by now, and the image's plugins' (`plugins`), stay trusted."""
        self.loaded = frozenset(n.partition(".")[0] for n in sys.modules) & PYTEST_DEPENDENCIES | plugins

    def find_spec(self, name, path=None, target=None):
        top = name.partition(".")[0]
        if top in self.loaded:
            pass        # pytest imported it from the trusted path before any /work code ran, or a plugin's
        elif top not in TRUSTED_TOPS or name in sys.builtin_module_names or _imp.is_frozen(name):
            return None
        where = self.path if path is None else [p for p in path if not str(p).startswith("/work")]
        spec = importlib.machinery.PathFinder.find_spec(name, where)
        if spec is None:
            raise ModuleNotFoundError(f"No module named {name!r} (outside /work)", name=name)
        return spec


def trusted_prefixes(tests_dir):
    """Directories whose code is trusted: the interpreter's library, its site directories, the
    grader's own and the tests'. Everything else (/work, /tmp, `<string>`) is code under test."""
    dirs = {v for k, v in sysconfig.get_paths().items() if k in ("stdlib", "platstdlib", "purelib", "platlib")}
    dirs |= {p for p in sys.path if p and p.startswith(("/usr/lib/python3", "/usr/local/lib/python3"))}
    dirs |= {"/verifier/", tests_dir}
    return tuple(sorted(d.rstrip("/") + "/" for d in dirs if not d.startswith(("/work", "/tmp"))))


_STACK_EVENTS = ("ctypes.", "gc.get_objects", "gc.get_referrers", "gc.get_referents", "code.__new__",
                 "function.__new__", "sys.setprofile", "sys.settrace", "sys._current_frames", "sys.addaudithook")
_FRAME_EVENTS = ("sys._getframe",)
_FRAME_ATTRS = frozenset({"tb_frame", "gi_frame", "cr_frame", "ag_frame", "f_code"})
_SWAP_ATTRS = frozenset({"__code__", "__defaults__", "__kwdefaults__"})
_OWN = "/verifier/paddock_"     # the grader's files (ASSERTS_PATH ...)
_FRAME_GIVERS = frozenset({"currentframe", "stack", "trace", "getouterframes", "getinnerframes", "walk_stack",
                           "walk_tb", "<lambda>", "_getframe", "extract_stack", "format_stack", "print_stack"})
_OTHER_EVENTS = frozenset({"object.__getattr__", "object.__setattr__", "marshal.loads", "marshal.load", "import", "open"})
_MEMORY_FILES = ("mem", "pagemap")
_REAL_LOADERS = (importlib.machinery.SourceFileLoader, importlib.machinery.SourcelessFileLoader)


def install_audit_hook(emit, prefixes, tests_prefix="/verifier/tests/", test_files=()):
    """An audit hook (it cannot be removed) that refuses introspection and patching primitives to
    code under test and reports each refusal as a `tamper` event.

    Trust rests on a code object's file name, so no name is taken on the code's word: code
    compiled for the code under test is tainted by name; code compiled under a trusted name from
    a trusted stack must be the file's own bytes (the tests': through the grader's own loader);
    `<frozen ...>` names are never compiled at run time; and bytecode is unmarshalled only by
    importlib's own loaders (exact types), pytest's cache reader or zipimport, from a trusted
    file, or for a module whose source is outside the trusted directories from a cache file the
    child cannot write (the grader never applies the agent's .pyc files: importlib renames only
    the code objects named like the module, so a forged cache could hold functions that claim
    the standard library). Any other unmarshal is refused, as are native
    extension modules in a file or directory the child can write (/tmp; not /work, nor the
    image) and opening a process's memory through /proc. A repository check's test modules
    (`test_files`, /work paths) are trusted like the tests directory: the task's code, compiled
    by the grader's own loader (the same name compiled any other way taints it). Any other name
    compiled from a source not its file's own is recorded as forged (`paddock.trusted` of a name)."""
    getframe, ident, busy, tainted, forged = sys._getframe, _thread.get_ident, set(), set(), set()
    home = ident()         # the thread that runs pytest
    realpath, claims, test_files = os.path.realpath, (*prefixes, "<frozen "), frozenset(test_files)

    def trusted(code):       # `<frozen ...>`: the interpreter's own frozen stdlib (importlib)
        name = code.co_filename
        return (name.startswith(claims) or name in test_files) and name not in tainted

    def trusted_file(path):
        return isinstance(path, str) and not path.startswith("<") and realpath(path).startswith(prefixes)

    def writable(path):      # by this process: something the code under test could have put there
        real = realpath(path)
        return os.access(real, os.W_OK) or os.access(os.path.dirname(real), os.W_OK)

    def on_stack(frame, test):
        while frame is not None:
            if test(frame):
                return True
            frame = frame.f_back
        return False

    def in_file(frame, name, suffix):
        return frame.f_code.co_name == name and frame.f_code.co_filename.endswith(suffix) and trusted(frame.f_code)

    def genuine_source(source, name, frame):
        """Code compiled under trusted name `name` from a trusted stack: is it that file's own?"""
        if name.startswith("<"):
            return False
        if name.startswith(tests_prefix) or name in test_files:     # through the grader's own loader
            return on_stack(frame, lambda f: type(f.f_locals.get("self")) is _MemLoader and trusted(f.f_code))
        if not isinstance(source, (str, bytes, bytearray)):   # an AST: only pytest's assert rewrite
            return on_stack(frame, lambda f: in_file(f, "_rewrite_test", "/_pytest/assertion/rewrite.py"))
        try:
            with open(name, "rb") as fh:
                disk = fh.read()
        except OSError:
            return False
        if isinstance(source, str):
            return source in (disk.decode("utf-8", "replace"), importlib.util.decode_source(disk))
        return bytes(source) == disk

    def genuine_unmarshal(frame):
        """May this unmarshal proceed: one of the three trusted readers, reading a trusted file
        (or a module's own cache whose code will carry its untrusted source's name)?"""
        if in_file(frame, "_compile_bytecode", "importlib._bootstrap_external>"):
            loader = frame.f_back.f_locals.get("self") if frame.f_back is not None else None
            if type(loader) not in _REAL_LOADERS:
                return False
            source, pyc = frame.f_locals.get("source_path"), frame.f_locals.get("bytecode_path")
            if isinstance(source, str) and not trusted_file(source) and not source.startswith(claims):
                return isinstance(pyc, str) and not writable(pyc)   # not one the code under test wrote
            return trusted_file(pyc)
        if in_file(frame, "_read_pyc", "/_pytest/assertion/rewrite.py"):
            return trusted_file(str(frame.f_locals.get("pyc")))
        if in_file(frame, "_unmarshal_code", "<frozen zipimport>"):
            return trusted_file(getattr(frame.f_locals.get("self"), "archive", None))
        return False

    def started_by_code_under_test():
        """Is this a thread other than the one the hook was installed in (pytest's)? Neither
        pytest nor the grader starts Python threads, so any other thread was started, directly
        or not, by the code under test; its stack begins in trusted threading code, which would
        otherwise launder a call: `Thread(target=out.extend, args=(map(gc.get_objects, [None]),))`
        (CPython before 3.13 raises no audit event when a thread starts)."""
        return ident() != home

    def untrusted_on_stack(frame, thread=True):
        if thread and started_by_code_under_test():
            return "a thread the code under test started"
        while frame is not None:
            if not trusted(frame.f_code):
                return frame.f_code.co_filename
            frame = frame.f_back
        return None

    def verdict(event, args, frame):
        """The file of the code under test behind this event, or None if the event may proceed."""
        if event == "compile":
            name = args[1] if len(args) > 1 else None
            if isinstance(name, str) and (name.startswith(claims) or name in test_files) and name not in tainted and (
                    untrusted_on_stack(frame, thread=False) or not genuine_source(args[0], name, frame)):
                tainted.add(name)           # code compiled for the code under test is not trusted
            elif isinstance(name, str) and name not in forged and not genuine_source(args[0], name, frame):
                forged.add(name)            # (`exec(compile(src, "/work/pkg/x.py", ...))`: no file's own code)
            return None
        if event in ("marshal.loads", "marshal.load"):
            return None if genuine_unmarshal(frame) else (untrusted_on_stack(frame) or "marshal")
        if event == "import":        # (name, file, ...): `file` is set for an extension module
            so = args[1] if len(args) > 1 else None
            if isinstance(so, str) and writable(so):   # native code the code under test wrote: never
                return untrusted_on_stack(frame) or so
            return None
        if event == "open":          # a process's own memory, written through /proc, is no test
            path = args[0] if args else None
            if isinstance(path, bytes):
                path = path.decode("utf-8", "replace")
            # /proc/<pid>/mem is reached by that name (also relative to a dir_fd) or through a
            # link as the last component: only those pay for a realpath (this runs on every open)
            if isinstance(path, str) and (os.path.basename(path) in _MEMORY_FILES or os.path.islink(path)):
                real = realpath(path)
                if os.path.basename(real) in _MEMORY_FILES and (real.startswith("/proc/") or not os.path.exists(real)):
                    return untrusted_on_stack(frame) or path
            return None
        if event.startswith(_STACK_EVENTS):
            return untrusted_on_stack(frame)
        if event == "object.__setattr__" and len(args) > 1 and args[1] in _SWAP_ATTRS:
            if args[1] == "__defaults__" and in_file(frame, "namedtuple", "/collections/__init__.py"):
                return None     # `namedtuple(..., defaults=)` on the `__new__` it just made (Markdown, webcolors)
            return untrusted_on_stack(frame)
        if event == "object.__getattr__" and len(args) > 1 and args[1] in ("__defaults__", "__kwdefaults__"):
            code = getattr(args[0], "__code__", None)     # the guards' state is in their defaults: the grader's only
            return untrusted_on_stack(frame) if code is not None and code.co_filename.startswith(_OWN) and \
                not frame.f_code.co_filename.startswith(_OWN) else None
        if event == "object.__getattr__" and len(args) > 1 and args[1] == "__code__":
            code = getattr(args[0], "__code__", None)
            if code is not None and (str(code.co_filename).startswith(tests_prefix) or (
                    code.co_filename in test_files and code.co_name.startswith("test") and "<locals>" not in code.co_qualname)):
                return untrusted_on_stack(frame)        # the tests' constants are their expected values
            # (a repository test module's helpers and the functions a test defines and hands over
            # stay inspectable: `curry(f)`, `memoize(f)`, `inspect.signature(f)` in the project)
            return None
        if event in _FRAME_EVENTS or (event == "object.__getattr__" and len(args) > 1 and args[1] in _FRAME_ATTRS):
            if not trusted(frame.f_code):
                return frame.f_code.co_filename
            if frame.f_code.co_name in _FRAME_GIVERS and frame.f_back is not None and not trusted(frame.f_back.f_code):
                return frame.f_back.f_code.co_filename
            if frame.f_code.co_name == "walk_stack":    # a generator: its consumer may be library code
                return untrusted_on_stack(frame)        # (`StackSummary.extract(..., capture_locals)`)
            named = "_getframe" if event in _FRAME_EVENTS else args[1]   # trusted code handed the function or name:
            if named not in (*frame.f_code.co_names, *frame.f_code.co_varnames, *frame.f_code.co_freevars):
                return untrusted_on_stack(frame)        # `inspect.getmembers(tb)`, `weakref.finalize(o, sys._getframe, 0)()`
        return None

    def hook(event, args):
        if not (event.startswith(_STACK_EVENTS) or event in _FRAME_EVENTS or event == "compile"
                or event in _OTHER_EVENTS or event in ("paddock.trusted", "paddock.stack")):
            return
        if event == "paddock.stack":        # (out,): the code under test on the caller's stack?
            if len(args) == 1 and type(args[0]) is list:
                culprit = untrusted_on_stack(getframe(1))
                if culprit:
                    emit(ev="tamper", refused="a test module's source", by=str(culprit)[:200])
                args[0].append(culprit)
            return
        if event == "paddock.trusted":      # (fn, out): is fn's code trusted? (`paddock_asserts.trusted_function`)
            if len(args) == 2 and type(args[1]) is list and type(args[0]) is str:   # (name, out): forged?
                args[1].append(args[0] in forged or args[0].startswith("<"))
            elif len(args) == 2 and type(args[1]) is list:
                me = ident()
                busy.add(me)
                try:
                    code = getattr(_asserts._liars.unwrap(args[0]), "__code__", None)    # (a class guard: its original)
                finally:
                    busy.discard(me)
                args[1].append(code is not None and trusted(code))
            return
        me = ident()
        if me in busy:
            return
        busy.add(me)
        try:
            culprit = verdict(event, args, getframe(1))
        finally:
            busy.discard(me)
        if culprit:
            emit(ev="tamper", refused=event, by=str(culprit)[:200])
            raise RuntimeError(f"paddock grader: {event} is refused to the code under test")
    sys.addaudithook(hook)


def _callables_of(tests_dir, locked=()):
    """(module, its globals, name, object) of every function, class and module the test
    modules (and a repository check's locked test modules) hold after collection: the code
    under test must not swap any of them (`_paddock_honest_eq` included)."""
    out = []
    for name, mod in list(sys.modules.items()):
        where = str(getattr(mod, "__file__", ""))
        if where.startswith(tests_dir + "/") or where in locked:
            out += [(name, vars(mod), n, v) for n, v in list(vars(mod).items())
                    if callable(v) or isinstance(v, type(sys))]
    return out


def child(fd, key, sources, args, cfg, bridge_fd):
    """Guard the imports, install the audit hook, route the agent's modules to the callee (call
    isolation) or put /work on the path (repository mode); run pytest; exit with its code."""
    trusted_path = [p for p in sys.path if p and not p.startswith("/work")]
    guard = _TrustedImports(trusted_path)
    sys.meta_path.insert(0, guard)
    import pytest       # noqa: I001 - only in the child, after the privilege drop (see _Plugin.snapshot)
    import _pytest.debugging  # noqa: F401  (pytest's own lazily imported plugins: before any agent code)
    import ctypes  # noqa: F401  (its own dlopen at import, before the hook: `import ctypes` by the code under test is free; every use is audited)
    global _asserts
    spec = importlib.util.spec_from_file_location("paddock_asserts", ASSERTS_PATH)
    _asserts = sys.modules["paddock_asserts"] = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(_asserts)
    plugin_args, plugin_tops = _asserts.image_plugins(trusted_path, TRUSTED_TOPS) if cfg.get("locked") else ([], frozenset())
    guard.seal(plugin_tops)
    plugin = _Plugin(fd, key, cfg["tests_dir"], cfg.get("locked") or ())
    del key
    plugin.finder = _MemFinder(sources)
    del sources
    install_audit_hook(plugin.emit, trusted_prefixes(cfg["tests_dir"]),
                                           test_files=cfg.get("locked") or ())
    armed = [_asserts._liars.install(plugin.emit, _asserts._sites._probes)] if cfg.get("locked") else []  # (before the snapshot)
    plugin.take_snapshot()
    _asserts.install_frame_views()
    if bridge_fd is not None:
        spec = importlib.util.spec_from_file_location("paddock_callbridge", CALLBRIDGE_PATH)
        bridge = sys.modules["paddock_callbridge"] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(bridge)
        bridge.install(bridge_fd, cfg["call"]["modules"], float(cfg["call"]["timeout_s"]), plugin.emit)
    code = pytest.main([*plugin_args, *args], plugins=[plugin, *armed])
    _exit(int(code))


if __name__ == "__main__":
    sys.exit(parent(sys.argv[1:]))
