"""Paddock's in-sandbox runner of a `command` check (installed read-only at /verifier/paddock_cmdrun.py).

Not imported by Paddock on the host for grading: `nodeagent.verifier.commandcheck` ships its bytes
into the grading sandbox and runs `python3 -I -B /verifier/paddock_cmdrun.py CONFIG_JSON ARGV...`
as the sandbox's root (the checker's identity). CONFIG_JSON: {"callee_uid", "tests_dir"}; the nonce
comes in $PADDOCK_CMDRUN_NONCE (an environment only root can read, unlike a process's cmdline) and
marks the runner's own failure to prepare: exit 125, `paddock-cmdrun[NONCE]: ...`.

Before the checker's command starts, as root:
1. The hidden support files under `tests_dir` stay 0400 and owned by root; every directory there
   becomes 0711: the agent's code cannot list them nor read a file it learns the name of (from
   `/proc/self/fd/0`, another process's command line).
2. A fresh empty HOME (`HOME_DIR`, root's, 0755; the agent's programs get their own,
   `CALLEE_HOME`) and a clean environment: no Python user site
   (`PYTHONNOUSERSITE`), none of `BASH_ENV`, `ENV`, `PYTHONSTARTUP`, ... (`DROPPED_ENV`).
3. `/work` and what is in it become the callee uid's (`callee_uid`): the agent's programs may write
   their outputs there as they did in the agent's sandbox.
4. A broker (a root process outside the checker's process tree) listens on `SOCKET`, and shims
   (`BIN_DIR`, first on the checker's PATH) stand for the image's interpreters (`INTERPRETERS`).
   An interpreter started on the agent's code -- a script under /work or owned by the callee
   uid, inline code (`-c`, `-e`) or stdin from inside the checker, a `-m` module found in a /work
   working directory -- is run by the broker as `callee_uid`, with the caller's stdin, stdout,
   stderr, working directory and environment; its exit status (or signal) comes back to the shim.
   `paddock-callee CMD ARGS...` runs any command so (a compiled program under /work, for one).
   Everything else runs as the checker (root), Python with `sys.executable` set to the shim, so
   a checker's `subprocess.run([sys.executable, "-c", ...])` crosses to the callee too.
Then the checker's argv runs (exec'd in place, as root; or through the broker when it is itself
the agent's program). Its exit status is the check's.

Standard library only (it runs in the task's image, Python >= 3.8). Must not import: anything of Paddock.
"""
import json
import os
import re
import signal
import socket
import struct
import sys

HOME_DIR = "/tmp/.paddock-home"
CALLEE_HOME = "/tmp/.paddock-callee-home"   # the agent's programs' own HOME (theirs: caches, rc files)
BIN_DIR = "/tmp/.paddock-bin"
SOCKET = BIN_DIR + "/.callee.sock"
STARTED = BIN_DIR + "/.started"
RUNNER = "/verifier/paddock_cmdrun.py"
NONCE_ENV = "PADDOCK_CMDRUN_NONCE"          # marks the runner's own words (commandcheck sets it)
BROKER_ENV = "PADDOCK_CALLEE_BROKER"       # the broker's pid (the Harbor runner spares it until test.sh ends)
DROPPED_ENV = ("BASH_ENV", "ENV", "PYTHONSTARTUP", "PYTHONUSERBASE", "PYTHONHOME", "PYTHONINSPECT",
               "PERL5OPT", "PERL5LIB", "RUBYOPT", "NODE_OPTIONS", "LD_PRELOAD", "LD_LIBRARY_PATH",
               "GIT_CONFIG_GLOBAL", "XDG_CONFIG_HOME", "NPM_CONFIG_USERCONFIG", "PYTEST_ADDOPTS")
PY = re.compile(r"python[0-9.]*$|pypy[0-9.]*$")
SHELLS = ("sh", "bash", "dash", "zsh", "ksh", "mksh", "ash")
OTHERS = ("node", "nodejs", "ruby", "perl", "php", "lua", "luajit", "Rscript", "tclsh", "julia", "deno", "bun")
SHELL_OPTS_WITH_ARG = ("-o", "+o", "-O", "+O", "--rcfile", "--init-file")
INLINE = ("-e", "--eval", "-p", "--print", "-E", "-r", "-c")
CALLEE_CMD = "paddock-callee"
MAX_REQUEST = 1 << 20


def interpreter_kind(name):
    if PY.match(name):
        return "python"
    if name in SHELLS:
        return "shell"
    if name in OTHERS or name.startswith("lua"):
        return "other"
    return None


def agent_path(path, cwd, callee_uid):
    """Is `path` (relative to `cwd`) the agent's: owned by the callee uid (the runner gave it
    /work's files), or by the sandbox's root under /work? A protected original the task put back
    in /work is owned outside the sandbox: the task's, the checker's to run."""
    given = os.path.normpath(os.path.join(cwd, path))
    full = os.path.realpath(given)
    try:
        if given.startswith("/work/") and os.lstat(given).st_uid in (0, callee_uid):
            return True     # (a link the agent made in /work: its program, wherever it points)
        owner = os.stat(full).st_uid
    except OSError:
        return False        # (nothing there: it will not run either way)
    return owner == callee_uid or (owner == 0 and full.startswith("/work/"))


def _python_target(args):
    """('script', path) | ('inline', None) | ('module', name) | ('stdin', None)."""
    i = 0
    while i < len(args):
        a = args[i]
        if a == "--":
            return ("script", args[i + 1]) if i + 1 < len(args) and args[i + 1] != "-" else ("stdin", None)
        if a == "-" or not a.startswith("-"):
            return ("stdin", None) if a == "-" else ("script", a)
        if a.startswith("--"):
            i += 2 if a == "--check-hash-based-pycs" else 1
            continue
        flags = a[1:]
        for j, f in enumerate(flags):
            if f == "c":
                return ("inline", None)
            if f == "m":
                rest = flags[j + 1:]
                return ("module", rest or (args[i + 1] if i + 1 < len(args) else ""))
            if f in "WX":
                if j == len(flags) - 1:
                    i += 1          # its argument is the next word
                break
        i += 1
    return ("stdin", None)


def is_agent_program(name, args, cwd, callee_uid, nested, env):
    """Does `name args` (an interpreter by its base name) run the agent's code? `nested`: started
    from inside the checker (inline code and stdin are then the checker's way to call the agent's
    code); False for the task's own argv."""
    kind = interpreter_kind(name)
    # inline code (or stdin) from inside the checker is the agent's when it can reach the agent's
    # modules: it names /work, or runs in a /work working directory (`-c "from solution import f"`)
    inline = nested and (any("/work" in a for a in args) or cwd == "/work" or cwd.startswith("/work/"))
    if kind == "python":
        what, target = _python_target(args)
        if what == "script":
            return agent_path(target, cwd, callee_uid)
        if what == "module":
            return shadowed_module(target, cwd, env) == "agent"
        return inline
    if kind in ("shell", "other"):
        skip = False
        for i, a in enumerate(args):
            if skip:
                skip = False
                continue
            if a == "--":
                return i + 1 < len(args) and agent_path(args[i + 1], cwd, callee_uid)
            if kind == "shell" and a in SHELL_OPTS_WITH_ARG:
                skip = True
                continue
            if (a.startswith("-") or (kind == "shell" and a.startswith("+"))) and len(a) > 1:
                if kind == "shell" and "c" in a[1:] and not a.startswith("--"):
                    return False            # `sh -c`: the checker's own glue
                if kind == "other" and a in INLINE:
                    return inline
                continue
            return agent_path(a, cwd, callee_uid)
        return inline if kind == "other" else False
    return False


def shadowed_module(target, cwd, env):
    """For `python -m target` in `cwd`: "agent" (the module is only the agent's, in a /work
    working directory: its program), "shadowed" (an installed module the agent's file in the
    working directory would shadow: run with SAFE_SITE) or ""."""
    top = (target or "").split(".")[0]
    in_work = cwd == "/work" or cwd.startswith("/work/")
    if not top or not in_work or env.get("PYTHONSAFEPATH") or not (
            os.path.exists(os.path.join(cwd, top + ".py")) or os.path.isdir(os.path.join(cwd, top))):
        return ""
    import importlib.machinery
    installed = top in sys.builtin_module_names or importlib.machinery.PathFinder.find_spec(
        top, [p for p in sys.path if p and os.path.abspath(p) != os.path.abspath(cwd)]) is not None
    return "shadowed" if installed else "agent"


SAFE_SITE = BIN_DIR + "/site"
SAFE_SITECUSTOMIZE = """import os, sys
if getattr(sys.flags, "safe_path", False):
    sys.path.append(os.getcwd())   # the working directory last: it shadows nothing installed
"""


def safe_env(name, args, cwd, env):
    """The environment for a checker's Python: `python -m mod` of an installed module that an
    agent's file in the /work working directory would shadow runs with the working directory
    at the end of sys.path (PYTHONSAFEPATH and SAFE_SITE's sitecustomize; Python >= 3.11)."""
    if interpreter_kind(name) == "python":
        what, target = _python_target(args)
        if what == "module" and shadowed_module(target, cwd, env) == "shadowed":
            env = dict(env)
            env["PYTHONSAFEPATH"] = "1"
            env["PYTHONPATH"] = SAFE_SITE + (":" + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


# --------------------------------------------------------------------------- the broker

def _send_fds(sock, data, fds):
    sock.sendmsg([data], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, struct.pack("%di" % len(fds), *fds))])


def _recv_request(conn):
    fds, data = [], b""
    msg, anc, _flags, _addr = conn.recvmsg(65536, socket.CMSG_SPACE(3 * 4))
    for level, kind, payload in anc:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds += list(struct.unpack("%di" % (len(payload) // 4), payload[:len(payload) // 4 * 4]))
    data = msg
    while len(data) < 4 or len(data) < 4 + struct.unpack(">I", data[:4])[0]:
        chunk = conn.recv(65536)
        if not chunk or len(data) > MAX_REQUEST:
            raise ValueError("short request")
        data += chunk
    n = struct.unpack(">I", data[:4])[0]
    return json.loads(data[4:4 + n].decode()), fds


def _serve_one(conn, callee_uid):
    """In a forked worker: run one request as the callee, report its wait status, then exit."""
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    try:
        req, fds = _recv_request(conn)
    except (OSError, ValueError):
        os._exit(1)
    pid = os.fork()
    if pid == 0:
        try:
            conn.close()
            for target, fd in zip((0, 1, 2), fds):
                os.dup2(fd, target)
            os.closerange(3, 65536)
            os.setresgid(callee_uid, callee_uid, callee_uid)
            os.setresuid(callee_uid, callee_uid, callee_uid)
            os.chdir(req["cwd"])
            env = dict(req["env"])
            env["HOME"] = CALLEE_HOME
            os.execvpe(req["argv"][0], req["argv"], env)
        except BaseException as exc:   # the shim reports 127, as a shell would
            os.write(2, ("paddock-callee: cannot run %r: %s\n" % (req.get("argv", ["?"])[0], exc)).encode())
        os._exit(127)
    for fd in fds:
        os.close(fd)
    import select
    while True:
        got, status = os.waitpid(pid, os.WNOHANG)
        if got:
            break
        ready, _, _ = select.select([conn], [], [], 0.05)
        if ready:
            try:
                gone = not conn.recv(1, socket.MSG_PEEK)
            except OSError:
                gone = True
            if gone:                      # the shim was killed (a timeout): so is its callee
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                os._exit(0)
    try:
        conn.sendall(struct.pack(">i", status))
    except OSError:
        pass
    os._exit(0)


def _broker(listener, callee_uid, runner_pid):
    """Serve shims until the runner (the checker, exec'd in place) is gone."""
    import select
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)        # workers are reaped by the kernel
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    watch = [listener]
    try:
        pidfd = os.pidfd_open(runner_pid)
        watch.append(pidfd)
    except (AttributeError, OSError):
        pidfd = None
    while True:
        ready, _, _ = select.select(watch, [], [], 0.2)
        if pidfd is not None and pidfd in ready:
            os._exit(0)
        if pidfd is None:
            try:
                os.kill(runner_pid, 0)
            except ProcessLookupError:
                os._exit(0)
        if listener in ready:
            try:
                conn, _ = listener.accept()
            except OSError:
                continue
            if os.fork() == 0:
                listener.close()
                _serve_one(conn, callee_uid)
            conn.close()


def call_callee(argv, sock_path):
    """From a shim: run `argv` as the callee through the broker; exit as it did."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PADDOCK_")}
    data = json.dumps({"argv": argv, "cwd": os.getcwd(), "env": env}).encode()
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(sock_path)
    _send_fds(s, struct.pack(">I", len(data)) + data, [0, 1, 2])
    got = b""
    while len(got) < 4:
        chunk = s.recv(4 - len(got))
        if not chunk:
            sys.stderr.write("paddock-callee: the broker is gone\n")
            os._exit(125)
        got += chunk
    status = struct.unpack(">i", got)[0]
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        signal.signal(sig, signal.SIG_DFL)
        os.kill(os.getpid(), sig)
        os._exit(128 + sig)
    os._exit(os.WEXITSTATUS(status) if os.WIFEXITED(status) else 1)


def as_shim(name, real):
    """argv[0] for exec'ing `real`: the shim's path for a Python (its `sys.executable` then
    crosses to the callee too), unless `real` is a virtual environment's (pyvenv.cfg beside it
    or above: a Python finds its environment from argv[0])."""
    if interpreter_kind(name) != "python":
        return real
    d = os.path.dirname(real)
    if any(os.path.exists(os.path.join(x, "pyvenv.cfg")) for x in (d, os.path.dirname(d))):
        return real
    return os.path.join(BIN_DIR, name)


def shim(name, real, callee_uid, argv):
    """A shim in BIN_DIR: the agent's program goes to the callee, anything else runs as is."""
    try:
        cwd = os.getcwd()
    except OSError:
        cwd = "/"
    if os.getuid() != callee_uid:
        if name == CALLEE_CMD:
            if len(argv) < 2:
                sys.stderr.write("usage: paddock-callee COMMAND [ARGS...]\n")
                os._exit(2)
            call_callee(argv[1:], SOCKET)
        if is_agent_program(name, argv[1:], cwd, callee_uid, True, os.environ):
            call_callee([real] + argv[1:], SOCKET)
    elif name == CALLEE_CMD:
        os.execvp(argv[1], argv[1:])
    os.execve(real, [as_shim(name, real)] + argv[1:], safe_env(name, argv[1:], cwd, dict(os.environ)))


SHIM = """#!{python} -IB
import sys
_g = {{"__name__": "paddock_cmdrun"}}
with open({runner!r}, "rb") as _f:
    exec(compile(_f.read(), {runner!r}, "exec"), _g)
_g["shim"]({name!r}, {real!r}, {uid!r}, sys.argv)
"""


def _which(name, path):
    for d in path.split(":"):
        full = os.path.join(d, name)
        if d and os.path.isfile(full) and os.access(full, os.X_OK):
            return full
    return None


def make_shims(path, callee_uid):
    os.mkdir(BIN_DIR, 0o755)
    os.mkdir(SAFE_SITE, 0o755)
    with open(os.path.join(SAFE_SITE, "sitecustomize.py"), "w") as f:
        f.write(SAFE_SITECUSTOMIZE)
    names = {CALLEE_CMD: sys.executable}
    for d in path.split(":"):
        try:
            entries = os.listdir(d)
        except OSError:
            continue
        for n in entries:
            if n not in names and interpreter_kind(n) and _which(n, path):
                names[n] = _which(n, path)
    for n, real in names.items():
        p = os.path.join(BIN_DIR, n)
        with open(p, "w") as f:
            f.write(SHIM.format(python=sys.executable, runner=RUNNER, name=n, real=real, uid=callee_uid))
        os.chmod(p, 0o755)


def prepare(cfg):
    for base, dirs, _files in os.walk(cfg["tests_dir"]):
        if os.lstat(base).st_uid == 0:      # (Paddock's own public files sit in directories owned outside)
            os.chmod(base, 0o711)
    for p in (HOME_DIR, BIN_DIR):
        if os.path.lexists(p):
            raise RuntimeError("%s exists before the check (the runner makes it)" % p)
    uid = int(cfg["callee_uid"])
    os.mkdir(HOME_DIR, 0o755)          # the checker's (caches); the agent's programs cannot write it
    os.mkdir(CALLEE_HOME, 0o700)
    os.chown(CALLEE_HOME, uid, uid)
    for base, dirs, files in os.walk("/work"):
        for n in [base] + [os.path.join(base, x) for x in dirs + files]:
            try:
                if os.lstat(n).st_uid == 0:
                    os.lchown(n, uid, uid)
            except OSError:
                pass          # a protected original (owned outside the sandbox)


def main():
    cfg, argv = json.loads(sys.argv[1]), sys.argv[2:]
    cfg["nonce"] = os.environ.pop(NONCE_ENV, "")    # never in argv: a broker's cmdline is public
    uid = int(cfg["callee_uid"])
    path = os.environ.get("PATH", "/usr/local/bin:/usr/bin:/bin")
    try:
        prepare(cfg)
        make_shims(path, uid)
        with open(STARTED, "w"):       # (commandcheck: the runner ran, so no fallback without it)
            pass
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(SOCKET)
        os.chmod(SOCKET, 0o666)
        listener.listen(64)
    except (OSError, RuntimeError) as exc:     # the nonce: only this runner knew it (no code of the agent's ran yet)
        sys.stderr.write("paddock-cmdrun[%s]: cannot prepare the check: %s\n" % (cfg.get("nonce", ""), exc))
        os._exit(125)
    runner_pid = os.getpid()
    r, w = os.pipe()
    first = os.fork()
    if first == 0:         # double fork: the broker is no child of the checker (a `wait` in it)
        os.close(r)
        broker = os.fork()
        if broker == 0:
            os.close(w)
            _broker(listener, uid, runner_pid)
        os.write(w, str(broker).encode())
        os._exit(0)
    os.close(w)
    os.waitpid(first, 0)
    broker_pid = os.read(r, 32).decode()
    os.close(r)
    env = {k: v for k, v in os.environ.items() if k not in DROPPED_ENV}
    env.update({"HOME": HOME_DIR, "PYTHONNOUSERSITE": "1", "PATH": BIN_DIR + ":" + path})
    listener.close()
    env[BROKER_ENV] = broker_pid
    os.environ.clear()
    os.environ.update(env)
    cwd = os.getcwd()
    name = os.path.basename(argv[0])
    if argv[0] == CALLEE_CMD and len(argv) > 1:
        call_callee([_which(argv[1], path) or argv[1]] + argv[2:], SOCKET)
    real = argv[0] if "/" in argv[0] else _which(argv[0], path)
    if real is None:
        cannot_run(cfg, argv[0], os.strerror(2), 127)
    if is_agent_program(name, argv[1:], cwd, uid, False, env) or ("/" in argv[0] and agent_path(argv[0], cwd, uid)):
        call_callee([real] + argv[1:], SOCKET)
    shimmed = interpreter_kind(name) == "python" and os.path.realpath(_which(name, path) or "") == os.path.realpath(real)
    try:
        os.execve(real, [as_shim(name, real) if shimmed else argv[0]] + argv[1:], safe_env(name, argv[1:], cwd, env))
    except OSError as exc:
        cannot_run(cfg, argv[0], exc.strerror, 127 if exc.errno == 2 else 126)


def cannot_run(cfg, what, why, code):
    """The task's argv cannot be run (the task's fault): said with the nonce, before any code of
    the agent's ran (commandcheck makes it an infrastructure error)."""
    sys.stderr.write("paddock-cmdrun[%s]: cannot run %s: %s\n" % (cfg.get("nonce", ""), what, why))
    os._exit(code)


if __name__ == "__main__":
    main()
