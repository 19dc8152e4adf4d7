"""The service host: a rollout's mock services, their state, and their operations as tools.

`ServiceHost(services, sandbox)` holds each service's state for one rollout (starting at its
`initial_state`), offers every operation as a tool (`definitions`, the OpenAI `tools` array)
and runs a call (`call(name, raw_arguments)`) as the built-in tools do: the arguments are
parsed and checked against the operation's JSON Schema first; an invalid call, a refused
operation (arguments nested deeper than `MAX_ARGUMENT_DEPTH` included), a transition that
would break the service's `state_schema` or a result that JSON
text cannot carry (an integer past Python's 4300 digits of text, from `mul`: the engine in the
sandbox could not write it) is an `error:` observation (`ToolResult.error` set, the state
unchanged), never an exception.

Where it runs: the engine (`controller/contracts/serviceengine.py`, standard library only)
and each service's spec are written into the rollout's sandbox at start, owned outside the
sandbox's id slice (0444: the agent's root can read, not change them), and each operation runs
there as in-sandbox uid `SERVICE_UID` (the slice's last id where slices are smaller; `python3
-I -S`), with no network (the sandbox has none). The authoritative state stays here, on the
node: it never exists as a file the agent could edit, and every reply from the sandbox is
checked against the same engine run here. A reply that differs or does not parse (an
interpreter the agent managed to replace) is refused and recorded in `tampered`; the state
checker fails such a rollout. An engine that fails to run (a non-zero exit, a timeout: a
loaded node, a sandbox out of pids) is run once more; when it fails again it raises
SandboxError (infrastructure, never a score), unless the agent can run code in the sandbox
(`agent_has_shell`: its root can signal uid `SERVICE_UID`, starve it of CPU, fill its memory):
then a twice-failed engine (killed by a signal, timed out, or failing with its trusted input)
is the agent's doing, recorded in `tampered` (the rollout fails), never infrastructure a policy
could use to escape its score.
Without a sandbox (`sandbox=None`: tests, benchmarks) the engine runs here only.

`final_state()` is what the verifier compares with the goal; `log` lists every operation
(service, operation, arguments, ok, error).

Must not import: zmq, controller.* outside contracts, nodeagent.agent, nodeagent.verifier.
"""
from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any, Mapping

from controller.contracts import serviceengine as engine
from controller.contracts.services import MAX_STATE_BYTES, operation_names, service_tools
from nodeagent.harness.tools import ToolResult
from nodeagent.sandbox.runtime import SandboxError

SERVICE_DIR = "/srv/paddock-service"
ENGINE_PATH = f"{SERVICE_DIR}/engine.py"
SERVICE_UID = 1002          # neither the agent's root nor the grader's uids
ENGINE_SOURCE = Path(engine.__file__).read_bytes()
MAX_ARGUMENT_BYTES = 64 * 1024
MAX_ARGUMENT_DEPTH = 32     # nesting of an operation's arguments (as the built-in tools': contracts/tools.py)
STDIN_MAX_BYTES = 60 * 1024     # the sandbox passes at most 64 KiB of stdin: larger states go as a file
OP_TIMEOUT_S = 10.0
MAX_INTEGER_DIGITS = 4300       # Python's default limit on an integer's text (int_max_str_digits)
_TOO_LONG = 10 ** MAX_INTEGER_DIGITS


class ServiceRuleError(Exception):
    """A service's rule cannot be evaluated: the task's fault (infra_error `task: ...`)."""


def _refuse(kind: str, message: str) -> ToolResult:
    return ToolResult(f"error: {message}", None, kind)


def _long_integer(value: Any) -> str | None:
    """The path of the first integer in `value` longer than MAX_INTEGER_DIGITS, or None. Python
    writes no longer integer as text by default (`sys.get_int_max_str_digits`), the sandbox's
    interpreter included, whatever limit this process runs with."""
    stack: list[tuple[str, Any]] = [("", value)]
    while stack:
        path, v = stack.pop()
        if isinstance(v, int) and v.bit_length() > 14_000 and abs(v) >= _TOO_LONG:   # 10**4214 < 2**14000
            return path or "/"
        if isinstance(v, dict):
            stack.extend((f"{path}/{k}", x) for k, x in v.items())
        elif isinstance(v, list):
            stack.extend((f"{path}/{i}", x) for i, x in enumerate(v))
    return None


def _depth(value: Any) -> int:
    """How deeply `value` nests objects and arrays (iteratively: no recursion limit to hit)."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        v, d = stack.pop()
        if isinstance(v, (dict, list)):
            deepest = max(deepest, d)
            if d <= MAX_ARGUMENT_DEPTH:
                stack.extend((x, d + 1) for x in (v.values() if isinstance(v, dict) else v))
    return deepest


def _canon(v: Any) -> str:
    return json.dumps(v, sort_keys=True, separators=(",", ":"))


class ServiceHost:
    """The mock services of one rollout (see the module docstring)."""

    def __init__(self, services: Mapping[str, Any], sandbox=None, *, observation_bytes: int = 16384,
                 timeout_s: float = OP_TIMEOUT_S) -> None:
        import jsonschema
        self.services = {k: dict(v) for k, v in services.items()}
        self.sandbox = sandbox
        self.obs_cap, self.timeout_s = observation_bytes, timeout_s
        self.owner = operation_names(self.services)
        self.states = {k: copy.deepcopy(v["initial_state"]) for k, v in self.services.items()}
        self._args = {op: jsonschema.Draft202012Validator(self.services[svc]["operations"][op]["parameters"])
                      for op, svc in self.owner.items()}
        self._state = {k: jsonschema.Draft202012Validator(v["state_schema"]) for k, v in self.services.items()}
        self.log: list[dict] = []
        self.tampered: list[str] = []
        self.sandbox_ops = 0
        self.agent_has_shell = False        # set by the conversation when the agent's tools run code
        self._installed = False

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(self.owner)

    def definitions(self) -> list[dict[str, Any]]:
        return service_tools(self.services)

    def final_state(self) -> dict:
        return copy.deepcopy(self.states)

    def install(self) -> None:
        """Write the engine and each service's spec into the sandbox (owned outside its slice)."""
        if self.sandbox is None or self._installed:
            return
        files = {ENGINE_PATH: ENGINE_SOURCE}
        files.update({f"{SERVICE_DIR}/{name}.json": _canon(spec).encode() for name, spec in self.services.items()})
        self.sandbox.write_files(files, owner="system", mode=0o444)
        self._installed = True

    # -- one call -------------------------------------------------------------------------------
    def parse(self, name: Any, raw_args: Any) -> tuple[dict | None, ToolResult | None]:
        if name not in self.owner:
            return None, _refuse("unknown_tool", f"unknown tool {name!r}")
        if raw_args is None or raw_args == "":
            raw_args = "{}"
        if isinstance(raw_args, dict):
            raw_args = json.dumps(raw_args)
        if not isinstance(raw_args, str):
            return None, _refuse("bad_arguments", f"arguments of {name} must be a JSON string")
        if len(raw_args.encode(errors="replace")) > MAX_ARGUMENT_BYTES:
            return None, _refuse("oversized_arguments", f"arguments of {name} exceed {MAX_ARGUMENT_BYTES} bytes")
        try:
            args = json.loads(raw_args)
        except ValueError as exc:
            return None, _refuse("malformed_json", f"arguments of {name} are not valid JSON: {exc}")
        except RecursionError:      # the agent's nesting: its call's error, never the node's crash
            return None, _refuse("malformed_json", f"arguments of {name} are nested too deeply")
        if _depth(args) > MAX_ARGUMENT_DEPTH:
            return None, _refuse("invalid_arguments", f"arguments of {name} are nested deeper than "
                                                      f"{MAX_ARGUMENT_DEPTH} levels")
        error = next(iter(sorted(self._args[name].iter_errors(args), key=lambda e: list(e.path))), None)
        if error is not None:
            where = "/".join(str(p) for p in error.absolute_path) or "arguments"
            return None, _refuse("invalid_arguments", f"invalid arguments for {name} at {where}: {error.message}")
        return args, None

    def call(self, name: Any, raw_args: Any, budget_s: float | None = None) -> ToolResult:
        """Validate and run one operation. Raises ServiceRuleError (the task's rules are broken)
        or SandboxError (infrastructure: the sandbox, or the engine failing to run in it)."""
        args, refused = self.parse(name, raw_args)
        if refused is not None:
            return refused
        svc = self.owner[name]
        try:
            want = engine.apply(self.services[svc], self.states[svc], name, args)
        except (engine.RuleError, RecursionError) as exc:
            raise ServiceRuleError(f"service {svc!r} operation {name!r}: {exc}") from None
        entry = {"service": svc, "operation": name, "args": args, "ok": bool(want["ok"])}
        where = _long_integer(want)
        if where is not None:
            self.log.append({**entry, "ok": False, "error": f"an integer past {MAX_INTEGER_DIGITS} digits at {where}"})
            return _refuse("refused", f"{name} would leave {svc} with an integer past {MAX_INTEGER_DIGITS} digits "
                                      f"(at {where}), which JSON text here cannot carry; nothing changed")
        if self.sandbox is not None:
            bad = self._check_in_sandbox(svc, name, args, want, budget_s)
            if bad is not None:
                self.tampered.append(f"{name}: {bad}")
                self.log.append({**entry, "ok": False, "error": f"reply did not verify: {bad}"})
                return _refuse("service_unavailable", f"service {svc} did not answer correctly; nothing changed")
        if not want["ok"]:
            self.log.append({**entry, "error": want["error"]})
            return _refuse("refused", want["error"])
        new = want["state"]
        problem = self._invalid(svc, new)
        if problem is not None:
            self.log.append({**entry, "ok": False, "error": problem})
            return _refuse("refused", f"{name} would leave {svc} in an invalid state ({problem}); nothing changed")
        self.states[svc] = new
        self.log.append(entry)
        text = _canon(want["result"])
        if len(text.encode()) > self.obs_cap:
            return ToolResult(text.encode()[: self.obs_cap].decode(errors="ignore")
                              + f"\n[output truncated at {self.obs_cap} bytes]", 0, None, True)
        return ToolResult(text, 0, None)

    def _invalid(self, svc: str, state: Any) -> str | None:
        if len(_canon(state)) > MAX_STATE_BYTES:
            return f"state larger than {MAX_STATE_BYTES} bytes"
        error = next(iter(self._state[svc].iter_errors(state)), None)
        if error is not None:
            where = "/".join(str(p) for p in error.absolute_path) or "state"
            return f"{where}: {error.message}"
        return None

    def _uid(self) -> int:
        """SERVICE_UID, or the last id of a smaller id slice (dense nodes: benchmarks/density.py)."""
        size = getattr(getattr(self.sandbox, "runtime", None), "slice_size", None)
        return SERVICE_UID if not size or size > SERVICE_UID else size - 1

    def _check_in_sandbox(self, svc: str, name: str, args: dict, want: dict, budget_s: float | None) -> str | None:
        """Run the operation in the sandbox; None when its reply equals `want`, else why not."""
        self.install()
        req = {"service_path": f"{SERVICE_DIR}/{svc}.json", "state": self.states[svc], "operation": name, "args": args}
        blob = _canon(req).encode()
        if len(blob) > STDIN_MAX_BYTES:
            state_path = f"{SERVICE_DIR}/{svc}.state.json"
            self.sandbox.write_files({state_path: _canon(self.states[svc]).encode()}, owner="system", mode=0o444)
            req.pop("state")
            req["state_path"] = state_path
            blob = _canon(req).encode()
        timeout = min(self.timeout_s, budget_s) if budget_s else self.timeout_s
        for _ in range(2):                    # once more: a loaded node passes, the agent's killer does not
            r = self.sandbox.exec(["python3", "-I", "-S", ENGINE_PATH], stdin=blob, timeout_s=max(timeout, 0.5),
                                  cwd="/", output_cap=MAX_STATE_BYTES + 65536, uid=self._uid())
            self.sandbox_ops += 1
            if not (r.timed_out or r.exit_code != 0):
                break
        why = (f"its engine failed in the sandbox (exit {r.exit_code}{', timed out' if r.timed_out else ''}), "
               f"twice: {r.stderr.decode(errors='replace')[-300:]}")
        if (r.timed_out or r.exit_code != 0) and self.agent_has_shell:
            kind = "killed by a signal" if _by_signal(r.exit_code) else "timed out" if r.timed_out else "failed"
            return f"{why} ({kind} in a sandbox where the agent's shell can signal, starve or fill it)"
        if r.timed_out or r.exit_code != 0:     # no agent code could do it: load or a full sandbox, never scored
            raise SandboxError(f"service {svc}: {why}")
        if r.truncated:
            return "reply larger than any state"
        try:
            got = json.loads(r.stdout)
        except ValueError:
            return "reply is not JSON"
        if _canon(got) != _canon(want):
            return "reply differs from the rules' result"
        return None


def _by_signal(exit_code: int | None) -> bool:
    """An exit status of a process a signal ended (negative, or 128 + the signal as shells say)."""
    return exit_code is not None and (exit_code < 0 or exit_code > 128)


class ToolRouter:
    """The built-in tools and a rollout's service operations behind one `call`, as the agent
    loop uses a `Toolbox`: an operation name goes to the services, any other to the tools."""

    def __init__(self, toolbox, services: ServiceHost) -> None:
        self.toolbox, self.services = toolbox, services

    def definitions(self) -> list[dict[str, Any]]:
        return self.toolbox.definitions() + self.services.definitions()

    def call(self, name: Any, raw_args: Any, budget_s: float | None = None) -> ToolResult:
        if isinstance(name, str) and name in self.services.owner:
            return self.services.call(name, raw_args, budget_s)
        if isinstance(name, str) and name not in self.toolbox.names:
            return _refuse("unknown_tool", f"unknown tool {name!r}; available: "
                                           f"{list(self.toolbox.names) + list(self.services.names)}")
        return self.toolbox.call(name, raw_args, budget_s=budget_s)


__all__ = ["ENGINE_PATH", "SERVICE_UID", "ServiceHost", "ServiceRuleError", "ToolRouter"]
