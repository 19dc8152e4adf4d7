"""Model gateway overhead per call, side by side with calling the model server directly.

The scripted policy server (token-level replies) on 127.0.0.1; the same conversation turn is
sent --calls times each way, interleaved, by two kinds of client:
- per-call connections (`HTTPModel`: a fresh connection per call, as the built-in harness's
  judge does), and
- a kept connection (`KeepAliveModel`: HTTP/1.1 keep-alive, as the OpenAI SDK, LiteLLM and
  every agent harness do).
Each client calls
- the policy directly ("direct", with the token flags the gateway would add: same reply size);
- the gateway's HTTP front ("gateway"), which forwards to the policy over its kept upstream
  connection (what a harness inside the sandbox calls);
and the built-in harness's path, `Session.complete` in process, is timed too.
Overhead = gateway latency - direct latency with the same kind of client, p50 and p99 over the
calls; the gateway's own time (`gateway_s` of the rows: its work outside the upstream call) too.

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
from nodeagent.gateway.upstream import KeepAliveModel
from nodeagent.harness.model import HTTPModel


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def measure(calls: int) -> tuple[dict[str, list[float]], list[float]]:
    ts = builtin_taskset()
    payload = {"model": "scripted-v0", "seed": 1, "messages": [
        {"role": "system", "content": "You are an agent."}, {"role": "user", "content": ts.tasks[0].instruction}]}
    flagged = dict(payload, logprobs=True, return_token_ids=True)    # same reply size as via the gateway
    budgets = GatewayBudgets(max_calls=10 ** 9, max_tokens=10 ** 12, wall_s=10 ** 6)
    with PolicyServer(ts) as policy:
        session = Session(Upstream(0, policy.url, "scripted-v0"), budgets)
        http_session = Session(Upstream(0, policy.url, "scripted-v0"), budgets)
        with GatewayServer(http_session, tcp=("127.0.0.1", 0), require_key=False) as gw:
            ways = {
                "direct, per-call connections": lambda c=HTTPModel(policy.url): c.complete(flagged, 10),
                "gateway, per-call connections": lambda c=HTTPModel(gw.url): c.complete(payload, 10),
                "direct, kept connection": lambda c=KeepAliveModel(policy.url): c.complete(flagged, 10),
                "gateway, kept connection": lambda c=KeepAliveModel(gw.url): c.complete(payload, 10),
                "gateway in process": lambda: session.complete(payload, 10),
            }
            out: dict[str, list[float]] = {name: [] for name in ways}
            for _ in range(calls):
                for name, fn in ways.items():
                    t0 = time.perf_counter()
                    fn()
                    out[name].append(time.perf_counter() - t0)
        session.close()
        http_session.close()
    return out, [r["gateway_s"] for r in http_session.rows]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=2000)
    args = ap.parse_args()
    out, own = measure(args.calls)
    ms = lambda s: f"{s * 1e3:7.3f} ms"
    print(f"calls: {args.calls} each way")
    for name, xs in out.items():
        print(f"{name:32s} p50 {ms(pct(xs, .5))}  p99 {ms(pct(xs, .99))}")
    for kind in ("per-call connections", "kept connection"):
        g, d = out[f"gateway, {kind}"], out[f"direct, {kind}"]
        diff = [a - b for a, b in zip(g, d)]
        print(f"overhead over HTTP, {kind:21s} p50 {ms(statistics.median(diff))}  p99 {ms(pct(diff, .99))}"
              f"   (p50 ratio gateway/direct {pct(g, .5) / pct(d, .5):.2f})")
    diff = [a - b for a, b in zip(out["gateway in process"], out["direct, kept connection"])]
    print(f"overhead in process (vs kept)        p50 {ms(statistics.median(diff))}  p99 {ms(pct(diff, .99))}")
    print(f"gateway's own time per call (HTTP rows) p50 {ms(pct(own, .5))}  p99 {ms(pct(own, .99))}")


if __name__ == "__main__":
    main()
