"""The scripted policy server (controller/demo/policy_server.py) as a model server command: what
an `inference` component runs in a demo or a test where no GPU model is at hand.

    python -m controller.demo.scripted_server [--taskset NAME --bank DIR] [--policy-script FILE]
                                    [--host ADDR] [--port $PADDOCK_SERVER_PORT]

It serves the OpenAI wire format (`GET /v1/models` is its health endpoint) and takes weight
updates at `POST /admin/policies` ({"version", "params"}), the reload path the built-in trainer
POSTs on every replica (slurm/servers.py). Runs until SIGTERM or SIGINT.

Must not import: zmq, sqlite3, nodeagent.*.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import threading

from controller.demo.localrun import scripted_players
from controller.demo.policy_server import PolicyServer
from controller.farm.assemble import load_taskset


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m controller.demo.scripted_server")
    ap.add_argument("--taskset", default="builtin")
    ap.add_argument("--bank", default="")
    ap.add_argument("--policy-script", default="")
    ap.add_argument("--host", default=os.environ.get("PADDOCK_SERVER_HOST", "0.0.0.0"))
    ap.add_argument("--port", type=int, default=int(os.environ.get("PADDOCK_SERVER_PORT", "8000")))
    ap.add_argument("--count-to", default="", metavar="FILE",
                    help="at exit, write {\"completions\": N} (the chat completions this replica answered) here")
    args = ap.parse_args(argv)
    taskset = load_taskset(args.taskset, args.bank)
    done = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: done.set())
    with PolicyServer(taskset, host=args.host, port=args.port,
                      players=scripted_players(taskset, args.policy_script)) as server:
        served = [0]
        complete = server.policy.complete

        def counted(req):                 # the replica's share of the calls (a job's gateways spread them)
            served[0] += 1
            return complete(req)
        server.policy.complete = counted
        print(f"scripted policy server at {server.url}", flush=True)
        done.wait()
    if args.count_to:
        with open(args.count_to, "w") as f:
            json.dump({"completions": served[0]}, f)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
