"""The agent's tools: shell, read_file, write_file, edit, list, search — run inside a sandbox.

The tool names, their JSON Schemas (`TOOL_SPECS`) and the task's tool set (`tool_set`) are a
contract: `controller.contracts.tools`. `Toolbox.call(name, raw_arguments)` checks the
name against the task's tool set, the size of the raw arguments, parses them as JSON and
validates them against the schema *before* anything runs. Every failure a model can cause
(unknown tool, malformed JSON, schema violation, oversized arguments, a string the sandbox
cannot carry -- NaN, a lone surrogate, a NUL or an oversized command-line argument, see
`controller.contracts.tools.value_error` --, a missing file, an edit whose search text matches
zero or several times) is a `ToolResult` with `error` set: an observation the model reads,
never an exception (a ValueError from running the tool is one too). Only infrastructure failures raise
(`SandboxError` from the sandbox).

Paths are passed to commands as argv elements, never through a shell; relative paths are
taken under /work. `McpServer` serves the same tools over MCP (JSON-RPC lines on stdio).
Must not import zmq, controller.* outside contracts, nodeagent.agent or nodeagent.verifier.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Iterable

from controller.contracts.tools import MAX_TIMEOUT_S, TOOL_SPECS, argument_error, definitions, tool_set
from nodeagent.sandbox import sbxinit
from nodeagent.sandbox.runtime import Sandbox

WORKDIR = "/work"
DEFAULT_TIMEOUT_S = 20.0
DEFAULT_OBSERVATION_BYTES = 16384
MAX_ARGUMENT_BYTES = 4 * 1024 * 1024   # raw JSON arguments of one call (write_file's content)
MAX_EDIT_FILE_BYTES = 8 * 1024 * 1024   # edit reads the whole file
# No command's output may fill the sandbox init's reply (stdout and stderr, each up to the cap):
# a reply past INIT_REPLY_MAX_BYTES reads as a dead init, an infrastructure error.
MAX_OUTPUT_CAP = sbxinit.INIT_REPLY_MAX_BYTES // 2 - 65536
WRITE_CHUNK_BYTES = 32 * 1024          # one exec's stdin (the sandbox passes at most 64 KiB)
MAX_LIST_ENTRIES = 500


@dataclass(frozen=True)
class ToolResult:
    observation: str
    exit_code: int | None = None     # of the command that ran, None if nothing ran
    error: str | None = None         # why the call was refused or failed (the model's fault)
    truncated: bool = False


def _abs(path: str) -> str:
    return path if path.startswith("/") else f"{WORKDIR}/{path}"


def _cap(data: bytes, cap: int) -> tuple[str, bool]:
    if len(data) <= cap:
        return data.decode(errors="replace"), False
    return data[:cap].decode(errors="ignore") + f"\n[output truncated at {cap} bytes]", True


def _refuse(kind: str, message: str) -> ToolResult:
    return ToolResult(f"error: {message}", None, kind)


class Toolbox:
    """The tools of one rollout, bound to its sandbox and the task's tool set."""

    def __init__(self, sandbox: Sandbox, names: Iterable[str] | None = None,
                 observation_bytes: int = DEFAULT_OBSERVATION_BYTES,
                 timeout_s: float = DEFAULT_TIMEOUT_S, max_argument_bytes: int = MAX_ARGUMENT_BYTES,
                 env: dict[str, str] | None = None) -> None:
        self.sandbox = sandbox
        self.names = tool_set(names)
        self.obs_cap = observation_bytes
        self.timeout_s = timeout_s
        self.max_argument_bytes = max_argument_bytes
        self.env = dict(env or {})
        self._budget_s: float | None = None

    def definitions(self) -> list[dict[str, Any]]:
        return definitions(self.names)

    def parse(self, name: Any, raw_args: Any) -> tuple[dict | None, ToolResult | None]:
        """(arguments, None) for a valid call, or (None, the error observation)."""
        if not isinstance(name, str) or name not in self.names:
            return None, _refuse("unknown_tool", f"unknown tool {name!r}; available: {list(self.names)}")
        if raw_args is None or raw_args == "":
            raw_args = "{}"
        if isinstance(raw_args, dict):   # some servers send an object instead of a JSON string
            raw_args = json.dumps(raw_args)
        if not isinstance(raw_args, str):
            return None, _refuse("bad_arguments", f"arguments of {name} must be a JSON string, "
                                                  f"got {type(raw_args).__name__}")
        size = len(raw_args.encode(errors="replace"))
        if size > self.max_argument_bytes:
            return None, _refuse("oversized_arguments", f"arguments of {name} are {size} bytes; "
                                                        f"the limit is {self.max_argument_bytes} bytes")
        try:
            args = json.loads(raw_args)
            error = argument_error(name, args)
        except ValueError as exc:
            return None, _refuse("malformed_json", f"arguments of {name} are not valid JSON: {exc}")
        except RecursionError:
            return None, _refuse("malformed_json", f"arguments of {name} are nested too deeply")
        if error is not None:
            return None, _refuse("invalid_arguments", f"invalid arguments for {name} {error}")
        return args, None

    def call(self, name: Any, raw_args: Any, budget_s: float | None = None) -> ToolResult:
        """Validate and run one tool call; no command runs longer than `budget_s` (the rollout's
        remaining wall time). Raises only SandboxError (infrastructure)."""
        args, refused = self.parse(name, raw_args)
        if refused is not None:
            return refused
        self._budget_s = budget_s
        try:
            return getattr(self, f"_{name}")(args)
        except ValueError as exc:   # input the sandbox refused (parse lets none through): still the model's
            return _refuse("invalid_arguments", f"{name} could not run with these arguments: {exc}"[:2000])

    # -- the tools ------------------------------------------------------------------------
    def _timeout(self, wanted_s: float | None = None) -> float:
        t = wanted_s or self.timeout_s
        return min(t, self._budget_s) if self._budget_s is not None else t

    def _run(self, argv: list[str], stdin: bytes = b"", timeout_s: float | None = None, cap: int = 0):
        return self.sandbox.exec(argv, stdin=stdin, timeout_s=self._timeout(timeout_s), cwd=WORKDIR,
                                 env=self.env, output_cap=min(cap or self.obs_cap + 1, MAX_OUTPUT_CAP))

    def _shell(self, args: dict) -> ToolResult:
        timeout_s = self._timeout(min(float(args.get("timeout_s", self.timeout_s)), MAX_TIMEOUT_S))
        r = self._run(["sh", "-c", args["command"]], timeout_s=timeout_s)
        text, truncated = _cap(r.stdout + r.stderr, self.obs_cap)
        if r.timed_out:
            text += f"\n[timed out after {timeout_s:g}s]"
        return ToolResult(text, r.exit_code, "timeout" if r.timed_out else None, truncated or r.truncated)

    def _read_file(self, args: dict) -> ToolResult:
        path = _abs(args["path"])
        if "start_line" in args or "max_lines" in args:
            start = args.get("start_line", 1)
            end = f"{start + args['max_lines'] - 1}" if "max_lines" in args else "$"
            r = self._run(["sed", "-n", f"{start},{end}p", path])
        else:
            r = self._run(["cat", path])
        if r.exit_code != 0:
            return ToolResult(f"error: cannot read {path}: {r.stderr.decode(errors='replace').strip()}",
                              r.exit_code, "command_failed")
        text, truncated = _cap(r.stdout, self.obs_cap)
        return ToolResult(text, 0, None, truncated)

    def _write(self, path: str, data: bytes) -> ToolResult | None:
        """Write `data` to `path` in stdin chunks of WRITE_CHUNK_BYTES (the first truncates, the
        rest append; an existing file keeps its mode), then check the size on disk: a short
        write (disk cap reached) is an error observation, never a silent truncation."""
        chunks = [data[i:i + WRITE_CHUNK_BYTES] for i in range(0, len(data), WRITE_CHUNK_BYTES)] or [b""]
        for i, chunk in enumerate(chunks):
            script = ('mkdir -p -- "$(dirname -- "$1")" && cat > "$1"' if i == 0 else 'cat >> "$1"')
            if i == len(chunks) - 1:
                script += ' && wc -c < "$1"'
            r = self._run(["sh", "-c", script, "write_file", path], stdin=chunk)
            if r.exit_code != 0:
                return ToolResult(f"error: cannot write {path} (after {i * WRITE_CHUNK_BYTES} of {len(data)} "
                                  f"bytes): {r.stderr.decode(errors='replace').strip()}",
                                  r.exit_code, "command_failed")
        written = r.stdout.decode(errors="replace").strip()
        if written != str(len(data)):
            return ToolResult(f"error: writing {path} stored {written or '?'} of {len(data)} bytes "
                              "(is the disk full?)", r.exit_code, "command_failed")
        return None

    def _write_file(self, args: dict) -> ToolResult:
        path, data = _abs(args["path"]), args["content"].encode()
        return self._write(path, data) or ToolResult(f"wrote {len(data)} bytes to {path}", 0)

    def _edit(self, args: dict) -> ToolResult:
        path = _abs(args["path"])
        r = self._run(["cat", path], cap=MAX_EDIT_FILE_BYTES + 1)
        if r.exit_code != 0:
            return ToolResult(f"error: cannot read {path}: {r.stderr.decode(errors='replace').strip()}",
                              r.exit_code, "command_failed")
        if len(r.stdout) > MAX_EDIT_FILE_BYTES or r.truncated:
            return _refuse("file_too_large", f"{path} is larger than {MAX_EDIT_FILE_BYTES} bytes; "
                                             "use shell or write_file")
        try:
            text = r.stdout.decode()
        except UnicodeDecodeError:
            return _refuse("not_text", f"{path} is not UTF-8 text")
        n = text.count(args["old"])
        if n == 0:
            return _refuse("no_match", f"the text to replace was not found in {path}; "
                                       "read the file and copy the text exactly (whitespace counts)")
        if n > 1 and not args.get("replace_all"):
            return _refuse("ambiguous_match", f"the text to replace occurs {n} times in {path}; "
                                              "include more surrounding lines to make it unique, "
                                              "or set replace_all")
        new_text = text.replace(args["old"], args["new"]) if args.get("replace_all") \
            else text.replace(args["old"], args["new"], 1)
        failed = self._write(path, new_text.encode())
        return failed or ToolResult(f"replaced {n if args.get('replace_all') else 1} occurrence(s) in {path}", 0)

    def _list(self, args: dict) -> ToolResult:
        path = _abs(args.get("path", WORKDIR))
        depth = args.get("depth", 2)
        r = self._run(["sh", "-c", 'find "$1" -mindepth 1 -maxdepth "$2" | sort | head -n "$3"',
                       "list", path, str(depth), str(MAX_LIST_ENTRIES)])
        if r.exit_code != 0 or (not r.stdout and r.stderr):
            return ToolResult(f"error: cannot list {path}: {r.stderr.decode(errors='replace').strip()}",
                              r.exit_code or 1, "command_failed")
        text, truncated = _cap(r.stdout, self.obs_cap)
        return ToolResult(text or f"{path} is empty", 0, None, truncated)

    def _search(self, args: dict) -> ToolResult:
        path = _abs(args.get("path", WORKDIR))
        flags = "-rnI" + ("i" if args.get("ignore_case") else "") + ("F" if args.get("fixed_strings") else "E")
        r = self._run(["grep", flags, "-e", args["pattern"], "--", path])
        if r.exit_code == 1:
            return ToolResult(f"no matches for {args['pattern']!r} under {path}", 1)
        if r.exit_code != 0 and not r.stdout:
            return ToolResult(f"error: search failed: {r.stderr.decode(errors='replace').strip()}",
                              r.exit_code, "command_failed")
        text, truncated = _cap(r.stdout, self.obs_cap)
        return ToolResult(text, 0, None, truncated)


# ---------------------------------------------------------------------------------------------
# The same tools over the Model Context Protocol (JSON-RPC 2.0, one message per line on stdio).

MCP_PROTOCOL_VERSIONS = ("2025-06-18", "2025-03-26", "2024-11-05")


class McpServer:
    """Serves a Toolbox over MCP: initialize, ping, tools/list, tools/call. `handle` is pure
    request-in, response-out (None for notifications); `serve` runs it over line streams."""

    def __init__(self, toolbox: Toolbox, name: str = "paddock-tools", version: str = "1") -> None:
        self.toolbox, self.name, self.version = toolbox, name, version

    @staticmethod
    def _error(id_: Any, code: int, message: str) -> dict:
        return {"jsonrpc": "2.0", "id": id_, "error": {"code": code, "message": message}}

    def handle(self, msg: Any) -> dict | None:
        if not isinstance(msg, dict) or msg.get("jsonrpc") != "2.0" or not isinstance(msg.get("method"), str):
            return self._error(msg.get("id") if isinstance(msg, dict) else None, -32600,
                               "invalid request: need jsonrpc '2.0' and a string method")
        id_, method, params = msg.get("id"), msg["method"], msg.get("params") or {}
        if "id" not in msg:          # a notification (e.g. notifications/initialized): no reply
            return None
        if not isinstance(params, dict):
            return self._error(id_, -32602, "params must be an object")
        if method == "initialize":
            asked = params.get("protocolVersion")
            return {"jsonrpc": "2.0", "id": id_, "result": {
                "protocolVersion": asked if asked in MCP_PROTOCOL_VERSIONS else MCP_PROTOCOL_VERSIONS[0],
                "capabilities": {"tools": {"listChanged": False}},
                "serverInfo": {"name": self.name, "version": self.version}}}
        if method == "ping":
            return {"jsonrpc": "2.0", "id": id_, "result": {}}
        if method == "tools/list":
            return {"jsonrpc": "2.0", "id": id_, "result": {"tools": [
                {"name": n, "description": TOOL_SPECS[n]["description"], "inputSchema": TOOL_SPECS[n]["parameters"]}
                for n in self.toolbox.names]}}
        if method == "tools/call":
            name, args = params.get("name"), params.get("arguments", {})
            raw = args if isinstance(args, str) else json.dumps(args)
            out = self.toolbox.call(name, raw)
            return {"jsonrpc": "2.0", "id": id_, "result": {
                "content": [{"type": "text", "text": out.observation}], "isError": out.error is not None}}
        return self._error(id_, -32601, f"method not found: {method}")

    def serve(self, inp, out) -> None:
        """Read one JSON message per line from `inp` until EOF; write replies to `out`."""
        for line in inp:
            if not line.strip():
                continue
            try:
                msg = json.loads(line)
            except ValueError as exc:
                reply: dict | None = self._error(None, -32700, f"parse error: {exc}")
            except RecursionError:
                reply = self._error(None, -32700, "parse error: the message is nested too deeply")
            else:
                try:
                    reply = self.handle(msg)
                except RecursionError:
                    id_ = msg.get("id") if isinstance(msg, dict) else None
                    reply = self._error(id_ if isinstance(id_, (str, int)) else None, -32602,
                                        "invalid params: nested too deeply")
            if reply is not None:
                out.write(json.dumps(reply) + "\n")
                out.flush()


__all__ = ["McpServer", "ToolResult", "Toolbox"]
