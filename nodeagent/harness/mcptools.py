"""MCP for rollouts: a task's own MCP servers, run inside its sandbox, offered to the policy.

A task declares its servers in a visible file, `.paddock/mcp.json` (`MCP_CONFIG_PATH`):

    {"servers": {"calc": {"transport": "stdio", "command": ["python3", "/work/calc.py"]},
                 "docs": {"transport": "http", "command": ["python3", "/work/docs.py"],
                          "port": 8765, "path": "/mcp"}},
     "call_timeout_s": 30}

(`cwd` default /work, `env` an object of strings, `start_timeout_s` default 30.) `mcp_servers`
checks it and raises `McpConfigError` naming the key: the task's fault (`infra_error: task: ...`).

Each server runs INSIDE the sandbox (`nodeagent.harness.sandboxlink`): `stdio`, an exec'd
process whose stdin/stdout are joined through the sandbox relay to a private host socket, which
the official MCP Python SDK's stdio client reaches through a small host pipe process; `http`
(streamable HTTP), a server bound to 127.0.0.1:`port` in the sandbox's own network namespace,
which the SDK's streamable-HTTP client reaches through a host Unix socket whose every
connection becomes one connection to that port. The client side is the SDK (`ClientSession`,
`stdio_client`, `streamable_http_client`), on an event loop of its own thread.

`McpToolbox(sandbox, link, servers, base)` offers the base toolbox's tools (the sandbox's
shell tools, `nodeagent.harness.tools.Toolbox`) plus every server's tools, named
`mcp__<server>__<tool>` (OpenAI function names: `[A-Za-z0-9_-]`, at most 64 characters; a
tool that cannot be named so, or two that collide, or an `inputSchema` that is not a valid JSON
Schema, is a task error). The schemas go to the model as the servers gave them; each call is
checked like the built-in tools' (name, size, JSON, then the server's schema) before it is sent,
runs at most `call_timeout_s` and at most the rollout's remaining wall time, and its result
(text blocks; other blocks named; structured content as JSON) is capped at the task's
`observation_bytes`. A server's error result, a timeout or a server that went away is an
`error:` observation (the agent may have killed it); a server that does not start is a
`SandboxError` (infrastructure; a task whose server never starts ends dead-lettered).

`McpRollout.of(task)` is the attempt pipeline's hook (see docs/harness.md "MCP servers of a task").
Must not import: zmq, controller.* outside contracts, nodeagent.agent, nodeagent.verifier.
"""
from __future__ import annotations

import asyncio
import json
import logging
import re
import threading
from dataclasses import dataclass, field
from typing import Any, Mapping

import jsonschema

from controller.contracts.tools import ToolSetError
from nodeagent.harness.sandboxlink import LinkError, SandboxLink, pipe_argv
from nodeagent.harness.tools import Toolbox, ToolResult, _cap, _refuse
from nodeagent.sandbox.runtime import SandboxError

log = logging.getLogger(__name__)

MCP_CONFIG_PATH = ".paddock/mcp.json"
NAME_RE = re.compile(r"^[A-Za-z0-9_-]{1,24}$")
TOOL_NAME_RE = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
PREFIX = "mcp__"
MAX_SERVERS = 8
MAX_TOOLS = 128
DEFAULT_CALL_TIMEOUT_S = 30.0
DEFAULT_START_TIMEOUT_S = 30.0
_SERVER_KEYS = {"transport", "command", "cwd", "env", "port", "path", "start_timeout_s"}


class McpConfigError(ToolSetError):
    """The task's MCP declaration (or a server's tool list) is malformed: the task's fault (a
    ToolSetError: the attempt pipeline records it as `infra_error: task: ...`)."""


class McpStartError(SandboxError):
    """A declared server did not start or did not answer the MCP handshake."""


@dataclass(frozen=True)
class McpServerSpec:
    name: str
    transport: str                 # stdio | http
    command: tuple[str, ...]
    cwd: str = "/work"
    env: Mapping[str, str] = field(default_factory=dict)
    port: int = 0
    path: str = "/mcp"
    start_timeout_s: float = DEFAULT_START_TIMEOUT_S


def _number(where: str, value: Any, lo: float, hi: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not lo <= value <= hi:
        raise McpConfigError(f"{MCP_CONFIG_PATH}: {where} must be a number from {lo:g} to {hi:g}, got {value!r}")
    return float(value)


def _server(name: Any, d: Any) -> McpServerSpec:
    where = f"servers.{name}"
    if not isinstance(name, str) or not NAME_RE.match(name):
        raise McpConfigError(f"{MCP_CONFIG_PATH}: server name {name!r} must be 1-24 of [A-Za-z0-9_-]")
    if not isinstance(d, dict):
        raise McpConfigError(f"{MCP_CONFIG_PATH}: {where} must be an object")
    unknown = sorted(set(d) - _SERVER_KEYS)
    if unknown:
        raise McpConfigError(f"{MCP_CONFIG_PATH}: {where} has unknown key(s) {unknown}; valid: {sorted(_SERVER_KEYS)}")
    transport = d.get("transport")
    if transport not in ("stdio", "http"):
        raise McpConfigError(f"{MCP_CONFIG_PATH}: {where}.transport must be 'stdio' or 'http', got {transport!r}")
    cmd = d.get("command")
    if not isinstance(cmd, list) or not cmd or not all(isinstance(c, str) and c for c in cmd):
        raise McpConfigError(f"{MCP_CONFIG_PATH}: {where}.command must be a non-empty list of strings (argv)")
    env = d.get("env", {})
    if not isinstance(env, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
        raise McpConfigError(f"{MCP_CONFIG_PATH}: {where}.env must be an object of strings")
    cwd = d.get("cwd", "/work")
    if not isinstance(cwd, str) or not cwd.startswith("/"):
        raise McpConfigError(f"{MCP_CONFIG_PATH}: {where}.cwd must be an absolute path")
    port, path = 0, d.get("path", "/mcp")
    if transport == "http":
        port = int(_number(f"{where}.port", d.get("port"), 1, 65535))
        if port == 3128 or port != d.get("port"):
            raise McpConfigError(f"{MCP_CONFIG_PATH}: {where}.port must be an integer port other than 3128 "
                                 "(the sandbox relay's)")
        if not isinstance(path, str) or not path.startswith("/"):
            raise McpConfigError(f"{MCP_CONFIG_PATH}: {where}.path must start with '/'")
    elif "port" in d or "path" in d:
        raise McpConfigError(f"{MCP_CONFIG_PATH}: {where}: port and path are for transport 'http'")
    start = _number(f"{where}.start_timeout_s", d.get("start_timeout_s", DEFAULT_START_TIMEOUT_S), 1, 600)
    return McpServerSpec(name, transport, tuple(cmd), cwd, dict(env), port, path, start)


def mcp_servers(files: Mapping[str, Any]) -> tuple[tuple[McpServerSpec, ...], float]:
    """The servers a task declares in its files, and the per-call timeout; ((), ...) for none.
    Raises McpConfigError naming the key."""
    raw = files.get(MCP_CONFIG_PATH)
    if raw is None:
        return (), DEFAULT_CALL_TIMEOUT_S
    try:
        doc = json.loads(raw.decode() if isinstance(raw, bytes) else raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise McpConfigError(f"{MCP_CONFIG_PATH} is not JSON: {exc}") from None
    if not isinstance(doc, dict) or set(doc) - {"servers", "call_timeout_s"}:
        raise McpConfigError(f"{MCP_CONFIG_PATH} must be an object with 'servers' (and 'call_timeout_s')")
    servers = doc.get("servers")
    if not isinstance(servers, dict) or not servers:
        raise McpConfigError(f"{MCP_CONFIG_PATH}: 'servers' must be a non-empty object of name -> server")
    if len(servers) > MAX_SERVERS:
        raise McpConfigError(f"{MCP_CONFIG_PATH}: at most {MAX_SERVERS} servers, got {len(servers)}")
    timeout = _number("call_timeout_s", doc.get("call_timeout_s", DEFAULT_CALL_TIMEOUT_S), 0.1, 3600)
    return tuple(_server(n, d) for n, d in servers.items()), timeout


def _schema_of(server: str, tool: Any) -> dict:
    schema = tool.input_schema if tool.input_schema is not None else {"type": "object"}
    try:
        jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator).check_schema(schema)
    except jsonschema.SchemaError as exc:
        raise McpConfigError(f"MCP server {server!r} tool {tool.name!r}: inputSchema is not a valid JSON Schema: "
                             f"{exc.message}") from None
    if schema.get("type", "object") != "object":
        raise McpConfigError(f"MCP server {server!r} tool {tool.name!r}: inputSchema must describe an object")
    return schema


def _render(result: Any) -> str:
    """An MCP tool result as one observation text."""
    parts = []
    for block in result.content or ():
        kind = getattr(block, "type", "?")
        if kind == "text":
            parts.append(block.text)
        elif kind in ("image", "audio"):
            parts.append(f"[{kind}: {block.mime_type}, {len(block.data) * 3 // 4} bytes]")
        elif kind == "resource":
            res = block.resource
            parts.append(getattr(res, "text", None) or f"[resource {res.uri}]")
        else:
            parts.append(f"[{kind} content]")
    if not parts and result.structured_content is not None:
        parts.append(json.dumps(result.structured_content, sort_keys=True))
    return "\n".join(parts)


@dataclass
class _Tool:
    server: str
    name: str                 # the server's own name
    definition: dict
    validator: Any


class McpToolbox:
    """The sandbox's tools plus the task's MCP servers' tools (see the module doc)."""

    def __init__(self, sandbox, link: SandboxLink, servers: tuple[McpServerSpec, ...], base: Toolbox,
                 call_timeout_s: float = DEFAULT_CALL_TIMEOUT_S, network: bool = False) -> None:
        self.sandbox, self.link, self.base = sandbox, link, base
        self.call_timeout_s = call_timeout_s
        self.obs_cap = base.obs_cap
        self.tools: dict[str, _Tool] = {}
        self._sessions: dict[str, Any] = {}
        self._stop: asyncio.Event | None = None
        self._runners: list[Any] = []
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="mcp-client", daemon=True)
        self._thread.start()
        try:
            self._stop = self._run(self._make_event(), 5)
            for spec in servers:
                self._start(spec, network)
        except BaseException:
            self.close()
            raise

    # -- the event loop ----------------------------------------------------------------------
    async def _make_event(self) -> asyncio.Event:
        return asyncio.Event()

    def _run(self, coro, timeout_s: float):
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout_s)

    def _start(self, spec: McpServerSpec, network: bool) -> None:
        mode = "stdio" if spec.transport == "stdio" else "tcp"
        tag = f"mcp-{spec.name}"
        try:
            sock = self.link.open(self.sandbox, mode, tag, list(spec.command), cwd=spec.cwd,
                                  env=None, network=network, port=spec.port,
                                  log=f"/tmp/paddock-mcp-{spec.name}.log", timeout_s=spec.start_timeout_s)
        except LinkError as exc:
            raise McpStartError(f"MCP server {spec.name!r}: {exc}") from None
        portal = self.link.portal(mode, tag, sock)
        ready: Any = self._loop.create_future()
        self._runners.append(asyncio.run_coroutine_threadsafe(self._serve(spec, portal.path, ready), self._loop))
        try:
            session, tools = asyncio.run_coroutine_threadsafe(_wait(ready), self._loop).result(spec.start_timeout_s)
        except Exception as exc:   # noqa: BLE001 - any failure of the handshake: the server did not start
            raise McpStartError(f"MCP server {spec.name!r} ({spec.transport}) did not answer the MCP handshake: "
                                f"{type(exc).__name__}: {exc}"[:2000]) from None
        self._sessions[spec.name] = session
        for tool in tools:
            self._add(spec.name, tool)

    async def _serve(self, spec: McpServerSpec, portal: str, ready: asyncio.Future) -> None:
        from mcp import ClientSession, StdioServerParameters
        from mcp.client.stdio import stdio_client
        from mcp.client.streamable_http import streamable_http_client
        try:
            if spec.transport == "stdio":
                argv = pipe_argv(portal)
                transport = stdio_client(StdioServerParameters(command=argv[0], args=argv[1:]))
                client = None
            else:
                import httpx2
                client = httpx2.AsyncClient(transport=httpx2.AsyncHTTPTransport(uds=portal),
                                            timeout=httpx2.Timeout(self.call_timeout_s + 5))
                transport = streamable_http_client(f"http://127.0.0.1:{spec.port}{spec.path}", http_client=client)
            async with transport as (read, write), ClientSession(read, write) as session:
                await session.initialize()
                listed = await session.list_tools()
                ready.set_result((session, listed.tools))
                assert self._stop is not None
                await self._stop.wait()
            if client is not None:
                await client.aclose()
        except BaseException as exc:          # noqa: BLE001 - handed to the waiting start
            if not ready.done():
                ready.set_exception(exc if isinstance(exc, Exception) else RuntimeError(repr(exc)))
            else:
                log.info("MCP server %s ended: %s: %s", spec.name, type(exc).__name__, exc)

    def _add(self, server: str, tool: Any) -> None:
        name = f"{PREFIX}{server}__{tool.name}"
        if not TOOL_NAME_RE.match(name):
            raise McpConfigError(f"MCP server {server!r} tool {tool.name!r}: its name {name!r} is not a valid "
                                 "function name ([A-Za-z0-9_-], at most 64 characters)")
        if name in self.tools or name in self.base.names:
            raise McpConfigError(f"MCP server {server!r} lists tool {tool.name!r} twice")
        if len(self.tools) >= MAX_TOOLS:
            raise McpConfigError(f"the task's MCP servers offer more than {MAX_TOOLS} tools")
        schema = _schema_of(server, tool)
        validator_cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
        definition = {"type": "function", "function": {
            "name": name, "description": (tool.description or f"{tool.name} (MCP server {server})")[:1024],
            "parameters": schema}}
        self.tools[name] = _Tool(server, tool.name, definition, validator_cls(schema))

    # -- the toolbox interface ---------------------------------------------------------------
    def definitions(self) -> list[dict]:
        return self.base.definitions() + [t.definition for t in self.tools.values()]

    def call(self, name: Any, raw_args: Any, budget_s: float | None = None) -> ToolResult:
        tool = self.tools.get(name) if isinstance(name, str) else None
        if tool is None:
            if isinstance(name, str) and name in self.base.names:
                return self.base.call(name, raw_args, budget_s)
            return _refuse("unknown_tool", f"unknown tool {name!r}; available: "
                                           f"{list(self.base.names) + list(self.tools)}")
        args, refused = self._parse(name, tool, raw_args)
        if refused is not None:
            return refused
        timeout_s = min(self.call_timeout_s, budget_s) if budget_s is not None else self.call_timeout_s
        session = self._sessions[tool.server]
        try:
            result = self._run(asyncio.wait_for(session.call_tool(tool.name, args), timeout_s), timeout_s + 5)
        except (asyncio.TimeoutError, TimeoutError):
            return ToolResult(f"error: {name} did not answer within {timeout_s:g} s", None, "timeout")
        except Exception as exc:  # noqa: BLE001 - the server's failure is what the model reads
            return ToolResult(f"error: {name} failed: {type(exc).__name__}: {exc}"[:2000], None, "server_failed")
        text, truncated = _cap(_render(result).encode(), self.obs_cap)
        if result.is_error:
            return ToolResult(f"error: {text}", None, "tool_error", truncated)
        return ToolResult(text, 0, None, truncated)

    def _parse(self, name: str, tool: _Tool, raw_args: Any) -> tuple[dict | None, ToolResult | None]:
        if raw_args is None or raw_args == "":
            raw_args = "{}"
        if isinstance(raw_args, dict):
            raw_args = json.dumps(raw_args)
        if not isinstance(raw_args, str):
            return None, _refuse("bad_arguments", f"arguments of {name} must be a JSON string")
        if len(raw_args.encode(errors="replace")) > self.base.max_argument_bytes:
            return None, _refuse("oversized_arguments", f"arguments of {name} are over "
                                                        f"{self.base.max_argument_bytes} bytes")
        try:
            args = json.loads(raw_args)
        except ValueError as exc:
            return None, _refuse("malformed_json", f"arguments of {name} are not valid JSON: {exc}")
        if not isinstance(args, dict):
            return None, _refuse("invalid_arguments", f"arguments of {name} must be a JSON object")
        error = next(iter(sorted(tool.validator.iter_errors(args), key=lambda e: list(e.path))), None)
        if error is not None:
            where = "/".join(str(p) for p in error.path) or "(root)"
            return None, _refuse("invalid_arguments", f"invalid arguments for {name} at {where}: {error.message}")
        return args, None

    def close(self) -> None:
        """Stop the clients (each server's link closes with the sandbox link); idempotent."""
        if self._loop.is_closed():
            return
        if self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        for runner in self._runners:
            try:
                runner.result(10)
            except Exception:  # noqa: BLE001 - shutting down: nothing is left to report to
                pass
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        if not self._thread.is_alive():
            self._loop.close()


async def _wait(fut: asyncio.Future):
    return await fut


class McpRollout:
    """The MCP servers of one rollout: the sandbox relay to ask for, then the toolbox. The
    attempt pipeline's hook (in `nodeagent.agent.agentphase.run_agent_phase`; `of` never raises, a
    malformed declaration raises McpConfigError from `toolbox`, a ToolSetError):

        mcp = McpRollout.of(task)                                 # None: no .paddock/mcp.json
        relay = mcp.relay(relay) if mcp else relay                # before runtime.acquire(...)
        ... run_agent(..., toolbox=mcp.toolbox(sb, task) if mcp else None)
        ... finally: if mcp: mcp.close()                          # with sb.destroy()
    """

    def __init__(self, files: Mapping[str, Any]) -> None:
        self.files = files
        self.link: SandboxLink | None = None
        self.network = False
        self.box: McpToolbox | None = None

    @classmethod
    def of(cls, task: Any) -> "McpRollout | None":
        """None when the task's files hold no `.paddock/mcp.json`."""
        return cls(task.files) if MCP_CONFIG_PATH in task.files else None

    def relay(self, egress_socket: str | None) -> str:
        """The sandbox's relay socket: a link that passes the task's own egress through."""
        self.network = egress_socket is not None
        self.link = SandboxLink(fallback=egress_socket)
        return self.link.path

    def toolbox(self, sandbox, task: Any, tool_timeout_s: float = 20.0) -> McpToolbox:
        """Start the servers in `sandbox` and return the combined toolbox. Raises McpConfigError
        (the declaration, or a tool list the harness cannot offer) or McpStartError."""
        assert self.link is not None, "relay() first: the sandbox must be made with this link"
        servers, call_timeout_s = mcp_servers(self.files)
        base = Toolbox(sandbox, task.tools, observation_bytes=task.budgets.observation_bytes, timeout_s=tool_timeout_s)
        self.box = McpToolbox(sandbox, self.link, servers, base, call_timeout_s, self.network)
        return self.box

    def close(self) -> None:
        if self.box is not None:
            self.box.close()
        if self.link is not None:
            self.link.close()


__all__ = ["MCP_CONFIG_PATH", "McpConfigError", "McpRollout", "McpServerSpec", "McpStartError", "McpToolbox",
           "mcp_servers"]
