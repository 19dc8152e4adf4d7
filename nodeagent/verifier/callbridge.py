"""The call boundary of function-level grading (installed read-only at /verifier/paddock_callbridge.py).

For a task graded with call isolation (docs/verifier.md, "Call isolation"), the trusted pytest
process never imports the agent's code. The grader starts, under a uid of its own (`CALLEE_UID`,
neither the grader's nor pytest's), `python3 -I -B /verifier/paddock_callbridge.py serve FD
TIMEOUT_S MODULE...`: the *callee*, which imports the agent's modules from /work and answers
requests on the socket FD. In the trusted pytest process, `install(fd, modules, timeout_s)`
puts a finder first on `sys.meta_path` that turns `import solution` / `from solution import f`
into a proxy module: each attribute is looked up in the callee, each call crosses as data.

Wire format: one frame = 4-byte big-endian length + a JSON document, at most MAX_FRAME_BYTES.
Values are encoded by `encode` into JSON with tags for everything JSON has not (tuples, dicts
with any keys, sets, bytes, complex, non-finite floats); only exact builtin types cross, so an
object with a lying `__eq__` cannot: the trusted side `decode`s into plain builtins. Anything
else crosses as an `Opaque` (type name, truth value, repr), equal only to itself. Requests:
{"op": "lookup", "module", "name"} and {"op": "call", "module", "name", "args", "kwargs"};
replies: {"value"} | {"callable": true} | {"missing": msg} | {"exc": [type, message]} |
{"timeout": true}. A call runs under a SIGALRM deadline in the callee; the trusted side waits
`timeout_s + GRACE_S` at most, and a callee that misses it is dead: that call and every later
one raise `CallBoundaryError` (a BaseException, so a test's `except Exception` cannot swallow a
hang into a pass).

Standard library only (it runs in the task's image; on the trusted side nothing from /work).
Must not import: pytest, anything of Paddock.
"""

import base64
import builtins
import collections
import importlib
import importlib.util
import json
import math
import os
import select
import signal
import socket
import struct
import sys
import time
import types

MAX_FRAME_BYTES = 64 << 20
MAX_DEPTH = 200
MAX_ITEMS = 1 << 20
GRACE_S = 2.0
CALLEE_UID_OFFSET = 1


# the standard library's dict subclasses cross as plain dicts (MBPP 88 returns a Counter for a
# dict): their items only, so nothing of the object but its contents reaches the trusted side
_PLAIN_DICTS = (collections.Counter, collections.OrderedDict, collections.defaultdict)


class CallBoundaryError(BaseException):
    """The call could not be answered: the solution's process timed out, died or sent garbage."""


class RemoteError(Exception):
    """The solution raised an exception whose type is not a builtin exception."""


class _Unencodable(Exception):
    pass


# -- codec --------------------------------------------------------------------------------------

def encode(obj, depth=0):
    """A JSON-able form of `obj`; only exact builtin types (and iterators, materialised) cross."""
    if depth > MAX_DEPTH:
        raise _Unencodable("value nested too deeply")
    t = type(obj)
    if obj is None or t in (bool, int, str):
        return obj
    if t is float:
        return obj if math.isfinite(obj) else {"t": "float", "v": repr(obj)}
    if t is list:
        return [encode(x, depth + 1) for x in obj]
    if t in (tuple, set, frozenset):
        items = sorted(obj, key=repr) if t is not tuple else obj
        return {"t": t.__name__, "v": [encode(x, depth + 1) for x in items]}
    if t is dict or t in _PLAIN_DICTS:
        return {"t": "dict", "v": [[encode(k, depth + 1), encode(v, depth + 1)] for k, v in obj.items()]}
    if t in (bytes, bytearray):
        return {"t": t.__name__, "v": base64.b64encode(bytes(obj)).decode()}
    if t is complex:
        return {"t": "complex", "v": [encode(obj.real), encode(obj.imag)]}
    if t is range:
        return {"t": "range", "v": [obj.start, obj.stop, obj.step]}
    if isinstance(obj, (types.GeneratorType, map, filter, zip, enumerate, reversed)) or t.__name__.endswith("iterator"):
        items = []
        for x in obj:
            items.append(encode(x, depth + 1))
            if len(items) > MAX_ITEMS:
                raise _Unencodable("iterator longer than the call boundary's limit")
        return {"t": "iter", "v": items}
    return {"t": "opaque", "v": [t.__name__[:100], _truth(obj), _safe_repr(obj)]}


def _truth(obj):
    try:
        return bool(obj)
    except BaseException:
        return True


def _safe_repr(obj):
    try:
        return repr(obj)[:1000]
    except BaseException:
        return "<unrepresentable>"


class Opaque:
    """A value of a type that cannot cross (a regex match, an instance of the solution's class):
    on the trusted side it keeps only its type name, truth value and repr, and equals only itself."""

    __slots__ = ("type_name", "truth", "text")

    def __init__(self, type_name, truth, text):
        self.type_name, self.truth, self.text = str(type_name), bool(truth), str(text)

    def __bool__(self):
        return self.truth

    def __repr__(self):
        return self.text


_SCALARS = (type(None), bool, int, str, float)


def decode(doc, depth=0):
    """Plain builtins from an encoded document; anything unexpected is a ValueError."""
    if depth > MAX_DEPTH:
        raise ValueError("value nested too deeply")
    if type(doc) in _SCALARS:
        return doc
    if type(doc) is list:
        return [decode(x, depth + 1) for x in doc]
    if type(doc) is not dict or set(doc) != {"t", "v"}:
        raise ValueError(f"not an encoded value: {str(doc)[:80]}")
    tag, v = doc["t"], doc["v"]
    if tag == "float" and v in ("nan", "inf", "-inf"):
        return float(v)
    if tag == "complex" and type(v) is list and len(v) == 2:
        return complex(decode(v[0], depth + 1), decode(v[1], depth + 1))
    if tag == "range" and type(v) is list and len(v) == 3 and all(type(x) is int for x in v):
        return range(*v)
    if tag in ("bytes", "bytearray") and type(v) is str:
        return (bytes if tag == "bytes" else bytearray)(base64.b64decode(v))
    if type(v) is not list:
        raise ValueError(f"bad encoded {tag}")
    if tag == "dict":
        return {_hashable(decode(k, depth + 1)): decode(x, depth + 1) for k, x in v}
    items = [decode(x, depth + 1) for x in v]
    if tag == "tuple":
        return tuple(items)
    if tag == "set":
        return {_hashable(x) for x in items}
    if tag == "frozenset":
        return frozenset(_hashable(x) for x in items)
    if tag == "iter":
        return iter(items)
    if tag == "opaque" and len(v) == 3 and type(v[1]) is bool:
        return Opaque(*v)
    raise ValueError(f"unknown tag {tag!r}")


def _hashable(x):
    hash(x)
    return x


def send(sock, doc):
    data = json.dumps(doc).encode()
    if len(data) > MAX_FRAME_BYTES:
        raise _Unencodable(f"message of {len(data)} bytes is over the call boundary's limit")
    sock.sendall(struct.pack(">I", len(data)) + data)


def _recv_exact(sock, n, deadline):
    buf = bytearray()
    while len(buf) < n:
        if deadline is not None:
            left = deadline - _now()
            if left <= 0 or not select.select([sock], [], [], left)[0]:
                raise TimeoutError("no reply before the deadline")
        chunk = sock.recv(min(n - len(buf), 1 << 20))
        if not chunk:
            raise EOFError("the other side closed the connection")
        buf += chunk
    return bytes(buf)


def recv(sock, deadline=None):
    (n,) = struct.unpack(">I", _recv_exact(sock, 4, deadline))
    if n > MAX_FRAME_BYTES:
        raise ValueError(f"frame of {n} bytes is over the limit")
    return json.loads(_recv_exact(sock, n, deadline))


def _now():
    return time.monotonic()


# -- the callee (untrusted side: runs the agent's code) ------------------------------------------

class _Deadline(BaseException):
    pass


def _on_alarm(signum, frame):
    raise _Deadline()


_FRAMEWORK = ("pytest", "_pytest", "pluggy", "paddock_grader")


class _FrameworkWatch:
    """Notes the solution importing the test framework (only useful for patching it, which
    cannot reach the trusted process). Its word can only cost the solution reward, never earn it."""

    def __init__(self):
        self.seen = []

    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in _FRAMEWORK and name not in self.seen:
            self.seen.append(name)
        return None


def serve(fd, timeout_s, modules):
    """Answer requests on `fd` until EOF. Runs as the callee uid, with /work first on sys.path.
    The agent's modules are imported at the first request: after pytest has started."""
    sock = socket.socket(fileno=fd)
    sys.path.insert(0, "/work")
    os.chdir("/work")
    watch = _FrameworkWatch()
    sys.meta_path.insert(0, watch)
    loaded, failed = None, {}
    signal.signal(signal.SIGALRM, _on_alarm)
    while True:
        try:
            req = recv(sock)
        except (EOFError, OSError, ValueError):
            return
        if loaded is None:
            loaded = _import_all(modules, failed, timeout_s)
        reply = _answer(req, loaded, failed, timeout_s)
        if watch.seen:
            reply["framework"] = list(watch.seen)
        send(sock, reply)


def _import_all(modules, failed, timeout_s):
    loaded = {}
    for name in modules:
        try:
            signal.setitimer(signal.ITIMER_REAL, timeout_s)
            try:
                loaded[name] = importlib.import_module(name)
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)
        except BaseException as exc:        # the solution's fault: every lookup says so
            failed[name] = f"importing {name} failed: {type(exc).__name__}: {exc}"
    return loaded


def _answer(req, loaded, failed, timeout_s):
    mod = req.get("module")
    if mod in failed:
        return {"missing": failed[mod]}
    if mod not in loaded:
        return {"missing": f"module {mod!r} is not served"}
    try:
        signal.setitimer(signal.ITIMER_REAL, timeout_s)
        try:
            obj = getattr(loaded[mod], req["name"])
            if req["op"] == "lookup":
                return {"callable": True} if callable(obj) else {"value": encode(obj)}
            result = obj(*decode(req["args"]), **decode(req["kwargs"]))
            return {"value": encode(result)}
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
    except _Deadline:
        return {"timeout": True}
    except AttributeError as exc:
        if req["op"] == "lookup":
            return {"missing": str(exc)}
        return {"exc": ["AttributeError", str(exc)[:2000]]}
    except _Unencodable as exc:
        return {"exc": ["TypeError", str(exc)]}
    except BaseException as exc:
        try:
            return {"exc": [type(exc).__name__, str(exc)[:2000]]}
        except BaseException:
            return {"exc": ["Exception", "unprintable exception"]}


# -- the trusted side (in pytest's process) -----------------------------------------------------

class Bridge:
    """The trusted end of the socket: every lookup and call, with the per-call deadline."""

    def __init__(self, fd, timeout_s, on_tamper=None):
        self.sock = socket.socket(fileno=fd)
        self.timeout_s = float(timeout_s)
        self.dead = None
        self.on_tamper, self.reported = on_tamper, False

    def request(self, doc):
        if self.dead:
            raise CallBoundaryError(self.dead)
        try:
            send(self.sock, doc)
            reply = recv(self.sock, _now() + self.timeout_s + GRACE_S)
        except _Unencodable as exc:
            raise TypeError(str(exc)) from None
        except TimeoutError:
            self.dead = f"the solution did not answer within {self.timeout_s:g} s; its process is abandoned"
            raise CallBoundaryError(self.dead) from None
        except (EOFError, OSError, ValueError, RecursionError) as exc:      # RecursionError: nested too deep
            self.dead = f"the solution's process is gone ({type(exc).__name__}: {exc})"
            raise CallBoundaryError(self.dead) from None
        if type(reply) is not dict:
            self.dead = "the solution's process sent a malformed reply"
            raise CallBoundaryError(self.dead)
        if reply.get("framework") and self.on_tamper and not self.reported:
            self.reported = True
            self.on_tamper(ev="tamper", detail="the solution imported the test framework",
                           modules=[str(m)[:80] for m in reply["framework"]][:10])
        return reply

    def value(self, reply):
        if "timeout" in reply:
            raise CallBoundaryError(f"call timed out after {self.timeout_s:g} s")
        if "exc" in reply:
            raise _exception(reply["exc"])
        try:
            return decode(reply["value"])
        except (KeyError, ValueError, TypeError) as exc:
            raise CallBoundaryError(f"undecodable reply: {exc}") from None


def _exception(spec):
    name, message = (str(spec[0]), str(spec[1])) if isinstance(spec, list) and len(spec) == 2 else ("?", str(spec))
    cls = getattr(builtins, name, None)
    if isinstance(cls, type) and issubclass(cls, Exception) and cls.__module__ == "builtins":
        try:
            return cls(message)
        except Exception:
            pass
    return RemoteError(f"{name}: {message}")


def _remote_function(bridge, module, name):
    def call(*args, **kwargs):
        return bridge.value(bridge.request({"op": "call", "module": module, "name": name,
                                            "args": encode(list(args)), "kwargs": encode(kwargs)}))
    call.__name__ = call.__qualname__ = name
    call.__module__ = module
    return call


class _ProxyModule(types.ModuleType):
    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        bridge, module = _PROXIES[id(self)]
        reply = bridge.request({"op": "lookup", "module": module, "name": name})
        if "missing" in reply:
            raise AttributeError(f"module {module!r} has no attribute {name!r} ({reply['missing']})")
        value = _remote_function(bridge, module, name) if reply.get("callable") else bridge.value(reply)
        self.__dict__[name] = value
        return value


_PROXIES: dict[int, tuple[Bridge, str]] = {}


class _ProxyLoader:
    def __init__(self, bridge):
        self.bridge = bridge

    def create_module(self, spec):
        mod = _ProxyModule(spec.name)
        _PROXIES[id(mod)] = (self.bridge, spec.name)
        return mod

    def exec_module(self, module):
        module.__all__ = []         # `from solution import *` imports nothing from the other side


class RemoteFinder:
    """First on sys.meta_path: the agent's modules resolve to proxies, never to files."""

    def __init__(self, bridge, modules):
        self.modules = set(modules)
        self.loader = _ProxyLoader(bridge)

    def find_spec(self, name, path=None, target=None):
        if name in self.modules:
            return importlib.util.spec_from_loader(name, self.loader)
        if name.partition(".")[0] in self.modules:
            raise ImportError(f"{name}: submodules of the solution cannot cross the call boundary")
        return None


def install(fd, modules, timeout_s, on_tamper=None):
    """In the trusted pytest process: route imports of `modules` to the callee on `fd`;
    `on_tamper(**event)` hears a solution that imported the test framework."""
    finder = RemoteFinder(Bridge(fd, timeout_s, on_tamper), modules)
    sys.meta_path.insert(0, finder)
    return finder


def main(argv):
    if len(argv) < 3 or argv[0] != "serve":
        sys.stderr.write("usage: paddock_callbridge.py serve FD TIMEOUT_S MODULE...\n")
        return 2
    serve(int(argv[1]), float(argv[2]), argv[3:])
    return 0


if __name__ == "__main__":
    os._exit(main(sys.argv[1:]))
