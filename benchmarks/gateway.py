"""Model gateway overhead per call, side by side with calling the model server directly.

The scripted policy server (token-level replies) on 127.0.0.1; the same conversation turn is
sent --calls times each way, interleaved:
- direct: `HTTPModel(policy).complete` (a fresh HTTP connection per call, as the harness does);
- in process: `Session.complete` (what the built-in harness calls: budgets, token flags,
  extraction, parent search, the row), over the same HTTP client;
- over HTTP: `HTTPModel(gateway).complete` to the gateway's HTTP front (what a harness inside
  the sandbox calls), which forwards to the policy.
Overhead = gateway latency - direct latency, p50 and p99 over the calls; the gateway's own
time (`gateway_s` of the rows: its work outside the upstream call) is reported too.

    .venv/bin/python benchmarks/gateway.py [--calls 2000]
"""
from __future__ import annotations

import argparse
import statistics
import time

from controller.demo.policy_server import PolicyServer
from controller.taskbank.builtin import builtin_taskset
from nodeagent.gateway.server import GatewayServer
from nodeagent.gateway.session import GatewayBudgets, Session, Upstream
from nodeagent.harness.model import HTTPModel


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=2000)
    args = ap.parse_args()
    ts = builtin_taskset()
    task = ts.tasks[0]
    payload = {"model": "scripted-v0", "seed": 1, "messages": [
        {"role": "system", "content": "You are an agent."}, {"role": "user", "content": task.instruction}]}
    budgets = GatewayBudgets(max_calls=10 ** 9, max_tokens=10 ** 12, wall_s=10 ** 6)
    with PolicyServer(ts) as policy:
        direct_client = HTTPModel(policy.url)
        session = Session(Upstream(0, policy.url, "scripted-v0"), budgets)
        http_session = Session(Upstream(0, policy.url, "scripted-v0"), budgets)
        with GatewayServer(http_session, tcp=("127.0.0.1", 0), require_key=False) as gw:
            via_http = HTTPModel(gw.url)
            flagged = dict(payload, logprobs=True, return_token_ids=True)    # same reply size as via the gateway
            direct, inproc, over_http = [], [], []
            for _ in range(args.calls):
                for out, fn in ((direct, lambda: direct_client.complete(flagged, 10)),
                                (inproc, lambda: session.complete(payload, 10)),
                                (over_http, lambda: via_http.complete(payload, 10))):
                    t0 = time.perf_counter()
                    fn()
                    out.append(time.perf_counter() - t0)
    ms = lambda s: f"{s * 1e3:7.3f} ms"
    print(f"calls: {args.calls} each way")
    for name, xs in (("direct", direct), ("gateway in process", inproc), ("gateway over HTTP", over_http)):
        print(f"{name:20s} p50 {ms(pct(xs, .5))}  p99 {ms(pct(xs, .99))}")
    for name, xs in (("in process", inproc), ("over HTTP", over_http)):
        d = [g - c for g, c in zip(xs, direct)]
        print(f"overhead {name:11s} p50 {ms(statistics.median(d))}  p99 {ms(pct(d, .99))}"
              f"   (p50 of gateway - p50 of direct: {ms(pct(xs, .5) - pct(direct, .5))})")
    own = [r["gateway_s"] for r in http_session.rows]
    print(f"gateway's own time per call (over HTTP rows) p50 {ms(pct(own, .5))}  p99 {ms(pct(own, .99))}")


if __name__ == "__main__":
    main()
