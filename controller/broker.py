"""The controller: one ZeroMQ ROUTER loop over the durable queue.

Each pass: receive and handle messages (node agents and trainer clients on the same socket),
dispatch leases to nodes with credit (never more than their free slots), expire leases, declare
silent nodes dead (their leases go back to the queue), send heartbeats, flush the catalog.
Results are committed to the queue before they are acknowledged; committed rows go to the
catalog that the DuckDB views read. A malformed or foreign frame is logged, counted, dropped.
"""
from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import zmq

from controller import protocol as P
from controller.catalog import Catalog
from controller.queue import QueueConfig, RolloutQueue

log = logging.getLogger("controller")


@dataclass
class NodeView:
    node: str
    identity: bytes
    slots: int
    credit: int = 0
    active: int = 0
    last_seen: float = 0.0
    health: dict = field(default_factory=dict)
    state: str = "ready"          # ready | draining | lost


class Controller:
    def __init__(self, bind: str, deployment: str, run_dir: str, run_id: str, tasks: dict[str, dict],
                 db_path: str, heartbeat_interval_s: float = 1.0, liveness: int = 5,
                 queue_config: QueueConfig = QueueConfig(), clock=time.monotonic):
        self.deployment, self.run_dir, self.run_id = deployment, run_dir, run_id
        self.tasks = tasks                      # task ref (name or id) -> lease task dict
        self.clock = clock
        self.hb_s, self.liveness = heartbeat_interval_s, liveness
        self.queue = RolloutQueue(db_path, config=queue_config)
        self.catalog = Catalog(run_dir)
        self.nodes: dict[str, NodeView] = {}
        self.bad_frames = 0
        self.stopped = False
        self.ctx = zmq.Context.instance()
        self.sock = self.ctx.socket(zmq.ROUTER)
        self.sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.bind(bind)
        self.endpoint = self.sock.getsockopt(zmq.LAST_ENDPOINT).decode()

    def _send(self, identity: bytes, msg) -> None:
        try:
            self.sock.send_multipart([identity, P.encode(msg, self.deployment)])
        except zmq.ZMQError as exc:
            log.warning("cannot send %s to %r: %s", msg.TYPE, identity, exc)

    def serve(self) -> None:
        last_hb = last_sweep = self.clock()
        while not self.stopped:
            if self.sock.poll(timeout=20):
                for _ in range(256):
                    try:
                        identity, data = self.sock.recv_multipart(zmq.NOBLOCK)[:2]
                    except zmq.Again:
                        break
                    except ValueError:
                        self.bad_frames += 1
                        continue
                    self._receive(identity, data)
            self._dispatch()
            now = self.clock()
            if now - last_sweep >= 0.5:
                self._sweep(now)
                last_sweep = now
            if now - last_hb >= self.hb_s:
                for n in self.nodes.values():
                    if n.state != "lost":
                        self._send(n.identity, P.Heartbeat())
                last_hb = now
        self.catalog.flush()
        self.sock.close(linger=0)

    def _receive(self, identity: bytes, data: bytes) -> None:
        try:
            msg = P.decode(data, self.deployment)
        except P.ProtocolError as exc:
            self.bad_frames += 1
            log.warning("dropped a malformed frame from %r: %s", identity[:32], exc)
            return
        node = self.nodes.get(identity.decode(errors="replace"))
        if node is not None:
            node.last_seen = self.clock()   # any message counts as a heartbeat
        handler = getattr(self, f"_on_{msg.TYPE}", None)
        if handler is None:
            self._send(identity, P.Ack(ref=msg.id, ok=False, error=f"unexpected message type {msg.TYPE}"))
            return
        handler(identity, msg)

    # -- node agents ------------------------------------------------------------------------
    def _on_register(self, identity, msg: P.Register) -> None:
        old = self.nodes.get(msg.node)
        if old is not None and old.state != "lost":
            self.queue.release_node(msg.node, "agent re-registered")
        self.nodes[msg.node] = NodeView(msg.node, identity, msg.slots, msg.slots, 0, self.clock())
        log.info("node %s registered: %d slots, agent %s", msg.node, msg.slots, msg.agent_version)
        self._send(identity, P.Welcome(node=msg.node, heartbeat_interval_s=self.hb_s, liveness=self.liveness))

    def _on_ready(self, identity, msg: P.Ready) -> None:
        if msg.node in self.nodes:
            self.nodes[msg.node].credit = min(msg.credit, self.nodes[msg.node].slots)   # 0 while draining

    def _on_heartbeat(self, identity, msg: P.Heartbeat) -> None:
        n = self.nodes.get(msg.node or "")
        if n is not None:
            n.active, n.health = msg.active or 0, msg.health or {}
            self.queue.renew(n.node)

    def _on_started(self, identity, msg: P.Started) -> None:
        self.queue.mark_running(msg.rollout_id, msg.attempt, msg.token)

    def _on_result(self, identity, msg: P.Result) -> None:
        c = self.queue.complete(msg.rollout_id, msg.attempt, msg.token, msg.outcome, msg.reward,
                                msg.shards, msg.infra_reason, msg.idem)
        if not c.accepted:
            self._send(identity, P.Reject(rollout_id=msg.rollout_id, attempt=msg.attempt, token=msg.token,
                                          reason=c.reason or "stale_token"))
            return
        if c.committed:
            self.catalog.commit(msg.rollout_id, msg.attempt, msg.token, msg.shards, time.time())
        self._send(identity, P.Ack(ref=msg.id, ok=True))

    def _on_disconnect(self, identity, msg: P.Disconnect) -> None:
        n = self.nodes.get(msg.node)
        if n is not None:
            n.state = "lost"
            self.queue.release_node(msg.node, f"disconnected: {msg.reason}")

    # -- trainer clients --------------------------------------------------------------------
    def _on_submit(self, identity, msg: P.Submit) -> None:
        unknown = [t for t in msg.tasks if t not in self.tasks]
        if unknown:
            self._send(identity, P.Ack(ref=msg.id, ok=False, error=f"unknown tasks: {unknown[:5]}"))
            return
        items = [(self.tasks[t]["task_id"], msg.policy_version) for t in msg.tasks]
        batch_id, n, _dup = self.queue.submit_batch(msg.idem, items, msg.n_per_task)
        self._send(identity, P.Submitted(batch_id=batch_id, rollouts=n))

    def _on_publish_policy(self, identity, msg: P.PublishPolicy) -> None:
        try:
            self.queue.publish_policy(msg.version, msg.endpoint, msg.model, msg.idem)
        except ValueError as exc:
            self._send(identity, P.Ack(ref=msg.id, ok=False, error=str(exc)))
            return
        self._send(identity, P.Ack(ref=msg.id, ok=True))

    def _on_watch(self, identity, msg: P.Watch) -> None:
        self.catalog.flush()
        items, cursor = self.queue.results_after(msg.batch_id, msg.after)
        done = self.queue.batch_done(msg.batch_id) and not self.queue.results_after(msg.batch_id, cursor)[0]
        self._send(identity, P.Results(batch_id=msg.batch_id, items=items, cursor=cursor, done=done))

    def _on_status(self, identity, msg: P.Status) -> None:
        nodes = [{"node": n.node, "state": n.state, "slots": n.slots, "active": n.active,
                  "last_seen_s_ago": round(self.clock() - n.last_seen, 3), "health": n.health}
                 for n in self.nodes.values()]
        self._send(identity, P.StatusReply(counts=self.queue.counts(), nodes=nodes))

    def _on_shutdown(self, identity, msg: P.Shutdown) -> None:
        for n in self.nodes.values():
            if n.state != "lost":
                self._send(n.identity, P.Shutdown(reason=msg.reason or "controller stopping"))
        self._send(identity, P.Ack(ref=msg.id, ok=True))
        self.stopped = True

    # -- dispatch and liveness --------------------------------------------------------------
    def _dispatch(self) -> None:
        for n in self.nodes.values():
            if n.state != "ready":
                continue
            # Credit is derived from the queue, not counted here: a node never holds more
            # leases than its slots, whatever order leases and results cross in.
            free = min(n.slots - len(self.queue.leases_of(n.node)), n.credit)
            if free <= 0:
                continue
            for lease in self.queue.lease_next(n.node, free):
                policy = self.queue.policy(lease.policy_version)
                if policy is None:
                    self.queue.complete(lease.rollout_id, lease.attempt, lease.token, "infra_error", None, {},
                                        f"policy version {lease.policy_version} is not published",
                                        f"nopolicy:{lease.rollout_id}:{lease.token}")
                    continue
                self._send(n.identity, P.Lease(
                    rollout_id=lease.rollout_id, attempt=lease.attempt, token=lease.token,
                    lease_ttl_s=self.queue.config.lease_ttl_s, task=self.tasks[lease.task_ref],
                    policy=P.PolicyRef(version=policy.version, endpoint=policy.endpoint, model=policy.model),
                    seed=lease.seed, run_id=self.run_id, run_dir=self.run_dir, batch_id=lease.batch_id))

    def _sweep(self, now: float) -> None:
        for n in self.nodes.values():
            if n.state != "lost" and now - n.last_seen > self.hb_s * self.liveness:
                n.state = "lost"
                released = self.queue.release_node(n.node, "node lost: no heartbeat")
                log.warning("node %s lost (silent %.1fs): %d leases back to the queue",
                            n.node, now - n.last_seen, len(released))
        self.queue.expire_leases()
        self.catalog.flush()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="paddock controller")
    ap.add_argument("--bind", default="tcp://127.0.0.1:0")
    ap.add_argument("--deployment", required=True)
    ap.add_argument("--run-dir", required=True)
    ap.add_argument("--tasks-json", required=True, help="file mapping task refs to lease task dicts")
    ap.add_argument("--endpoint-file", required=True, help="where to publish the bound endpoint")
    ap.add_argument("--heartbeat-interval-s", type=float, default=1.0)
    ap.add_argument("--lease-ttl-s", type=float, default=300.0)
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s controller %(levelname)s %(message)s")
    run_dir = Path(args.run_dir)
    tasks = json.loads(Path(args.tasks_json).read_text())
    ctl = Controller(args.bind, args.deployment, str(run_dir), run_dir.name, tasks,
                     str(run_dir / "controller.db"), heartbeat_interval_s=args.heartbeat_interval_s,
                     queue_config=QueueConfig(lease_ttl_s=args.lease_ttl_s))
    tmp = Path(args.endpoint_file + ".tmp")
    tmp.write_text(ctl.endpoint)
    tmp.rename(args.endpoint_file)
    log.info("controller listening on %s", ctl.endpoint)
    ctl.serve()
    return 0


if __name__ == "__main__":
    sys.exit(main())
