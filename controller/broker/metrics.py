"""The controller's figures in Prometheus text format, served over HTTP from a thread.

`serve_metrics(snapshot, port, addr)` starts prometheus_client's HTTP server on its own thread;
every scrape calls `snapshot()` (the controller's `Controller.snapshot()`: a dict cached by the
loop, safe from another thread) and turns it into metric families:

  paddock_rollouts{state}                      rollouts in the queue by state
  paddock_nodes{state}                         nodes by state (live, draining, lost)
  paddock_node_up{node,state}                  1 for a live or draining node, 0 for a lost one
  paddock_node_last_seen_timestamp_seconds{node}
  paddock_node_slots{node} / _slots_free / _leases / _active
  paddock_node_<figure>{node}                  numeric health figures (nodeagent/agent/health.py)
  paddock_node_errors{node,kind}               error counts from health
  paddock_controller_events_total{event}       the controller's counters

Must not import: zmq, sqlite3 (it reads a snapshot, never the queue).
"""
from __future__ import annotations

import logging
import re
from typing import Callable

from prometheus_client import start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector, CollectorRegistry

log = logging.getLogger(__name__)

NODE_STATES = ("live", "draining", "drained", "lost")
HEALTH_FIGURES = ("cpu_percent", "mem_used_mb", "mem_free_mb", "mem_percent", "rss_mb",
                  "sandboxes_active", "warm_pool", "rollouts_total", "rollouts_per_s",
                  "tmpfs_used_mb", "disk_used_mb", "disk_free_mb", "image_mounts", "slots_used")
_NAME = re.compile(r"[^a-zA-Z0-9_]")


def _num(v) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


class SnapshotCollector(Collector):
    """A prometheus_client collector over a controller snapshot function."""

    def __init__(self, snapshot: Callable[[], dict]):
        self.snapshot = snapshot

    def collect(self):
        try:
            snap = self.snapshot() or {}
        except Exception as exc:  # a scrape must not take the controller down
            log.warning("metrics snapshot failed: %s", exc)
            snap = {}
        rollouts = GaugeMetricFamily("paddock_rollouts", "Rollouts in the queue by state", labels=["state"])
        for state, n in sorted((snap.get("counts") or {}).items()):
            if _num(n) is not None:
                rollouts.add_metric([str(state)], _num(n))
        yield rollouts

        nodes = snap.get("nodes") or []
        by_state = GaugeMetricFamily("paddock_nodes", "Node agents by state", labels=["state"])
        for state in NODE_STATES:
            by_state.add_metric([state], sum(n.get("state") == state for n in nodes))
        yield by_state
        up = GaugeMetricFamily("paddock_node_up", "1 if the node agent heartbeats (live or draining)",
                               labels=["node", "state"])
        seen = GaugeMetricFamily("paddock_node_last_seen_timestamp_seconds",
                                 "Unix time of the last message from the node agent", labels=["node"])
        per_node = {k: GaugeMetricFamily(f"paddock_node_{k}", f"Node {k.replace('_', ' ')}", labels=["node"])
                    for k in ("slots", "slots_free", "leases", "active")}
        health = {k: GaugeMetricFamily(f"paddock_node_{k}", f"Node agent health: {k}", labels=["node"])
                  for k in HEALTH_FIGURES}
        errors = GaugeMetricFamily("paddock_node_errors", "Node agent error counts", labels=["node", "kind"])
        for n in nodes:
            name = str(n.get("node"))
            up.add_metric([name, str(n.get("state"))], 0.0 if n.get("state") == "lost" else 1.0)
            if _num(n.get("last_seen")) is not None:
                seen.add_metric([name], _num(n.get("last_seen")))
            for k, fam in per_node.items():
                if _num(n.get(k)) is not None:
                    fam.add_metric([name], _num(n.get(k)))
            h = n.get("health") or {}
            for k, fam in health.items():
                if _num(h.get(k)) is not None:
                    fam.add_metric([name], _num(h.get(k)))
            for kind, v in sorted((h.get("errors") or {}).items()):
                if _num(v) is not None:
                    errors.add_metric([name, str(kind)], _num(v))
        yield from (up, seen, *per_node.values(), *health.values(), errors)

        events = CounterMetricFamily("paddock_controller_events", "Controller event counters", labels=["event"])
        for k, v in sorted((snap.get("counters") or {}).items()):
            if isinstance(v, dict):
                for sub, x in sorted(v.items()):
                    if _num(x) is not None:
                        events.add_metric([_NAME.sub("_", f"{k}_{sub}")], _num(x))
            elif _num(v) is not None:
                events.add_metric([_NAME.sub("_", str(k))], _num(v))
        yield events


def serve_metrics(snapshot: Callable[[], dict], port: int, addr: str = "0.0.0.0"):
    """Serve /metrics on addr:port (0: a free port) from a daemon thread.
    Returns (server, thread); `server.server_address[1]` is the bound port; `server.shutdown()` stops it."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(SnapshotCollector(snapshot))
    server, thread = start_http_server(port, addr=addr, registry=registry)
    log.info("metrics on http://%s:%d/metrics", addr, server.server_address[1])
    return server, thread
