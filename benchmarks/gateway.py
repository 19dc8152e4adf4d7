"""Model gateway overhead per call, side by side with calling the model server directly.

Three processes, as on a node: the scripted policy server (token-level replies), the gateway's
HTTP front (a `Session` forwarding over its kept upstream connection: what a harness inside
the sandbox calls), and this client. The same conversation turn is sent, after --warmup calls
each way that are not counted, --calls times each way, the ways interleaved call by call (the
order alternating, so a burst of machine load hits both), by two kinds of client:
- a kept connection (`KeepAliveModel`: HTTP/1.1 keep-alive, as the OpenAI SDK, LiteLLM and
  every agent harness do), and
- per-call connections (`HTTPModel`: a fresh connection per call);
each calling the policy directly ("direct", with the token flags the gateway adds: the same
reply) and through the gateway. The built-in harness's path, `Session.complete` in this
process (no HTTP front), is timed against the direct kept connection too. With --stream every
call is `stream: true` (kept connections only): the gateway streams from the server and
forwards event by event, the direct path streams too.

Printed: p50 and p99 of each way; the overhead (gateway - direct, same client) as the
difference of the p50s and of the p99s, and p50/p99 of the paired per-call differences;
the p50 ratio; the gateway's own time per call (`gateway_s` of its rows: its work outside
the upstream exchange, until the reply went out), reported by the gateway process; that
process's CPU time per call (all of its work, on the path or not); and the load average.

    .venv/bin/python benchmarks/gateway.py [--calls 2000] [--warmup 200] [--stream]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

from controller.demo.policy_server import PolicyServer
from controller.taskbank.builtin import builtin_taskset
from nodeagent.gateway.server import GatewayServer
from nodeagent.gateway.session import GatewayBudgets, Session, Upstream
from nodeagent.gateway.upstream import KeepAliveModel
from nodeagent.harness.model import HTTPModel

BUDGETS = GatewayBudgets(max_calls=10 ** 9, max_tokens=10 ** 12, wall_s=10 ** 6)


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def chunks(events) -> list:
    return [json.loads(e) for e in events if e != b"[DONE]"]


def serve(role: str, upstream: str | None) -> None:
    """A child process: serve the policy or the gateway, print the URL, run until stdin closes;
    the gateway then prints its rows' own-time figures."""
    if role == "policy":
        srv = PolicyServer(builtin_taskset()).start()
        print(srv.url, flush=True)
        sys.stdin.read()
        return
    session = Session(Upstream(0, upstream, "scripted-v0"), BUDGETS)
    with GatewayServer(session, tcp=("127.0.0.1", 0), require_key=False) as gw:
        print(gw.url, flush=True)
        cpu0 = time.process_time()
        sys.stdin.read()
        cpu = time.process_time() - cpu0      # the whole process: HTTP front, session, client
    print(json.dumps({"own": [r["gateway_s"] for r in session.rows], "cpu_s": cpu}), flush=True)


def child(role: str, upstream: str = "") -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    p = subprocess.Popen([sys.executable, __file__, "--serve", role, "--upstream", upstream],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
    return p


def measure(calls: int, warmup: int, stream: bool) -> tuple[dict[str, list[float]], list[float], float]:
    ts = builtin_taskset()
    payload = {"model": "scripted-v0", "seed": 1, "messages": [
        {"role": "system", "content": "You are an agent."}, {"role": "user", "content": ts.tasks[0].instruction}]}
    if stream:
        payload["stream"] = True
    flagged = dict(payload, logprobs=True, top_logprobs=0, return_token_ids=True,
                   return_tokens_as_token_ids=True, return_prompt_token_ids=True, return_meta_info=True)
    policy = child("policy")
    gateway = None
    try:
        policy_url = policy.stdout.readline().strip()
        gateway = child("gateway", policy_url)
        gw_url = gateway.stdout.readline().strip()
        session = Session(Upstream(0, policy_url, "scripted-v0"), BUDGETS)
        kept_d, kept_g = KeepAliveModel(policy_url), KeepAliveModel(gw_url)
        fresh_d, fresh_g = HTTPModel(policy_url), HTTPModel(gw_url)
        if stream:                  # HTTPModel does not stream: kept connections only
            ways = {                # a streaming client decodes each chunk (as the OpenAI SDK does)
                "direct, kept connection": lambda: chunks(kept_d.stream(flagged, 10)),
                "gateway, kept connection": lambda: chunks(kept_g.stream(payload, 10)),
                "gateway in process (builtin)": lambda: session.stream(payload, 10, lambda _d: None),
            }
        else:
            ways = {
                "direct, kept connection": lambda: kept_d.complete_raw(flagged, 10),
                "gateway, kept connection": lambda: kept_g.complete_raw(payload, 10),
                "gateway in process (builtin)": lambda: session.complete(payload, 10),
                "direct, per-call connections": lambda: fresh_d.complete(flagged, 10),
                "gateway, per-call connections": lambda: fresh_g.complete(payload, 10),
            }
        names = list(ways)
        out: dict[str, list[float]] = {name: [] for name in ways}
        for i in range(warmup + calls):
            order = names if i % 2 == 0 else names[::-1]
            for name in order:
                t0 = time.perf_counter()
                ways[name]()
                dt = time.perf_counter() - t0
                if i >= warmup:
                    out[name].append(dt)
        session.close()
        kept_d.close()
        kept_g.close()
        gateway.stdin.close()
        report = json.loads(gateway.stdout.readline())
        own = report["own"][warmup * 2:]
        cpu_per_call = report["cpu_s"] / max(len(report["own"]), 1)
    finally:
        for p in (gateway, policy):
            if p is not None:
                if p.stdin and not p.stdin.closed:
                    p.stdin.close()
                p.wait(timeout=30)
    return out, own, cpu_per_call


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--warmup", type=int, default=200)
    ap.add_argument("--stream", action="store_true", help="stream: true on every call")
    ap.add_argument("--serve", choices=("policy", "gateway"), help=argparse.SUPPRESS)
    ap.add_argument("--upstream", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.serve:
        return serve(args.serve, args.upstream)
    load0 = os.getloadavg()
    t0 = time.perf_counter()
    out, own, cpu_per_call = measure(args.calls, args.warmup, args.stream)
    ms = lambda s: f"{s * 1e3:7.3f} ms"
    print(f"calls: {args.calls} each way after {args.warmup} warm-up, interleaved; stream={args.stream}; "
          f"{time.perf_counter() - t0:.0f}s; load average before {load0[0]:.2f}, after {os.getloadavg()[0]:.2f}")
    for name, xs in out.items():
        print(f"{name:32s} p50 {ms(pct(xs, .5))}  p99 {ms(pct(xs, .99))}")
    pairs = [("kept connection", "gateway, kept connection", "direct, kept connection"),
             ("per-call connections", "gateway, per-call connections", "direct, per-call connections"),
             ("in process (builtin)", "gateway in process (builtin)", "direct, kept connection")]
    print("overhead = gateway - direct, same client:")
    for kind, gname, dname in pairs:
        if gname not in out:
            continue
        g, d = out[gname], out[dname]
        diff = [a - b for a, b in zip(g, d)]
        print(f"  {kind:21s} p50 {ms(pct(g, .5) - pct(d, .5))}  p99 {ms(pct(g, .99) - pct(d, .99))}"
              f"   paired p50 {ms(pct(diff, .5))} p99 {ms(pct(diff, .99))}"
              f"   p50 ratio gateway/direct {pct(g, .5) / pct(d, .5):.2f}")
    if own:
        print(f"gateway's own time per call (its rows, HTTP front) p50 {ms(pct(own, .5))}  p99 {ms(pct(own, .99))}")
    print(f"gateway process CPU per call (all its work: HTTP both sides, decoding and recording after the "
          f"reply went out, a thread per per-call connection) {ms(cpu_per_call)}")


if __name__ == "__main__":
    main()
