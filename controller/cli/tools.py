"""`paddock tools mcp`: serve the agent's tools for one fresh sandbox over MCP on stdio.

An MCP client (an agent framework, an IDE) gets the same six tools, schemas and error
observations as the harness, running in a one-shot sandbox of an image; the sandbox is
destroyed when stdin closes. `paddock tools list` prints the tool schemas. Thin: parses and
calls into nodeagent.harness.tools.
"""
from __future__ import annotations

import argparse
import json
import sys

from controller.contracts.tools import ToolSetError, definitions, tool_set
from layers.builtin import default_store_root, ensure_builtin_image
from layers.store import ImageStore, ImageStoreError
from nodeagent.harness.tools import McpServer, Toolbox
from nodeagent.sandbox.runtime import SandboxError, SandboxRuntime, SandboxSpec


def cmd_list(args: argparse.Namespace) -> int:
    try:
        print(json.dumps(definitions(args.tools.split(",") if args.tools else None), indent=2))
    except ToolSetError as exc:
        print(f"paddock tools: error: {exc}", file=sys.stderr)
        return 2
    return 0


def cmd_mcp(args: argparse.Namespace) -> int:
    try:
        names = tool_set(args.tools.split(",") if args.tools else None)
        store = ImageStore(default_store_root())
        image = store.resolve(args.image) if args.image else ensure_builtin_image(store)[1]
    except (ToolSetError, ImageStoreError, OSError) as exc:
        print(f"paddock tools mcp: error: {exc}", file=sys.stderr)
        return 2
    try:
        with SandboxRuntime() as rt:
            sb = rt.create(SandboxSpec(image=image))
            try:
                McpServer(Toolbox(sb, names, observation_bytes=args.observation_bytes)).serve(sys.stdin, sys.stdout)
            finally:
                sb.destroy()
    except SandboxError as exc:
        print(f"paddock tools mcp: sandbox failed: {exc}", file=sys.stderr)
        return 125
    return 0


def register(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = subparsers.add_parser("tools", help="the agent's tools: schemas, MCP server")
    sub = p.add_subparsers(dest="tools_cmd", required=True)
    ls = sub.add_parser("list", help="print the tools' OpenAI function definitions (JSON)")
    ls.add_argument("--tools", help="comma-separated tool set (default: all)")
    ls.set_defaults(func=cmd_list)
    mcp = sub.add_parser("mcp", help="serve the tools of one fresh sandbox over MCP (stdio)")
    mcp.add_argument("--image", help="image path or sha256:<digest> (default: the built-in python image)")
    mcp.add_argument("--tools", help="comma-separated tool set (default: all)")
    mcp.add_argument("--observation-bytes", type=int, default=16384, help="cap per observation")
    mcp.set_defaults(func=cmd_mcp)
    return p
