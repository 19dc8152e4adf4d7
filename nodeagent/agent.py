"""The node agent: a ZeroMQ DEALER that registers with the controller, takes leases up to its
free slots, runs each rollout attempt in a worker thread and reports results.

One loop does receive, dispatch, result sending and heartbeats each pass (the ZeroMQ socket is
touched only by this loop; workers hand results back through a queue). A silent controller
(no message within `liveness` heartbeat intervals) means a fresh socket and a new registration,
with exponential backoff. A malformed frame is counted and dropped. SIGTERM drains: no new
leases, running attempts finish and report, then the agent exits.
"""
from __future__ import annotations

import argparse
import logging
import os
import queue
import signal
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import psutil
import zmq

from controller import protocol as P
from nodeagent.rollout import Attempt, run_attempt
from nodeagent.sandbox import SandboxRuntime

log = logging.getLogger("nodeagent")
AGENT_VERSION = "0.1.0"


class NodeAgent:
    def __init__(self, node: str, endpoint: str, deployment: str, slots: int, image_store: str,
                 runtime: SandboxRuntime, heartbeat_interval_s: float = 1.0, liveness: int = 5,
                 clock=time.monotonic):
        self.node, self.endpoint, self.deployment = node, endpoint, deployment
        self.slots, self.image_store = slots, Path(image_store)
        self.runtime, self.clock = runtime, clock
        self.hb_s, self.liveness = heartbeat_interval_s, liveness
        self.active: dict[str, Attempt] = {}
        self.done: queue.Queue = queue.Queue()
        self.pool = ThreadPoolExecutor(max_workers=slots, thread_name_prefix=f"{node}-slot")
        self.draining = False
        self.stopped = False
        self.bad_frames = 0
        self.completed = 0
        self.ctx = zmq.Context.instance()
        self.sock = None

    # -- socket -----------------------------------------------------------------------------
    def _connect(self) -> None:
        if self.sock is not None:
            self.sock.close(linger=0)
        self.sock = self.ctx.socket(zmq.DEALER)
        self.sock.setsockopt(zmq.IDENTITY, self.node.encode())
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.connect(self.endpoint)
        self._send(P.Register(node=self.node, slots=self.slots, images=[],
                              mem_free_mb=int(psutil.virtual_memory().available / 2**20),
                              agent_version=AGENT_VERSION))
        self._send(P.Ready(node=self.node, credit=self._free()))

    def _send(self, msg) -> None:
        self.sock.send(P.encode(msg, self.deployment))

    def _free(self) -> int:
        return 0 if self.draining else max(self.slots - len(self.active), 0)

    # -- loop -------------------------------------------------------------------------------
    def run(self) -> int:
        self._connect()
        last_rx = last_hb = self.clock()
        backoff_s = self.hb_s
        while not self.stopped:
            if self.sock.poll(timeout=50):
                data = self.sock.recv()
                last_rx, backoff_s = self.clock(), self.hb_s
                try:
                    self._handle(P.decode(data, self.deployment))
                except P.ProtocolError as exc:
                    self.bad_frames += 1
                    log.warning("dropped a malformed frame from the controller: %s", exc)
            self._flush_results()
            now = self.clock()
            if now - last_hb >= self.hb_s:
                self._heartbeat()
                last_hb = now
            if now - last_rx > self.hb_s * self.liveness:
                log.warning("controller silent for %.1fs: reconnecting", now - last_rx)
                time.sleep(min(backoff_s, 30.0))
                backoff_s *= 2
                self._connect()
                last_rx = self.clock()
            if self.draining and not self.active and self.done.empty():
                self._send(P.Disconnect(node=self.node, reason="drained"))
                break
        self.pool.shutdown(wait=True)
        self.sock.close(linger=100)
        return 0

    def _handle(self, msg) -> None:
        if isinstance(msg, P.Lease):
            if msg.rollout_id in self.active:
                return   # a duplicate delivery of a lease we already run
            a = Attempt(msg.run_id, msg.run_dir, msg.rollout_id, msg.attempt, msg.token, msg.batch_id,
                        msg.seed, msg.task, msg.policy.version, msg.policy.endpoint, msg.policy.model)
            self.active[msg.rollout_id] = a
            self._send(P.Started(rollout_id=a.rollout_id, attempt=a.attempt, token=a.token))
            self.pool.submit(self._work, a)
        elif isinstance(msg, (P.Drain, P.Shutdown)):
            log.info("%s: %s", msg.TYPE, msg.reason)
            self.draining = True
            if isinstance(msg, P.Shutdown) and not self.active:
                self.stopped = True
        elif isinstance(msg, P.Reject):
            log.warning("result rejected: %s attempt %d token %d: %s", msg.rollout_id, msg.attempt,
                        msg.token, msg.reason)
        # welcome, ack and heartbeat only prove the controller is alive

    def _work(self, a: Attempt) -> None:
        try:
            image = self.image_store / "sha256" / (a.task["image_digest"].split(":", 1)[1] + ".sif")
            res = run_attempt(self.runtime, image, self.node, a, self.clock)
            self.done.put((a, res.outcome, res.reward, res.shards, res.infra_reason))
        except Exception as exc:  # a bug in one attempt must not take the node down
            log.exception("rollout %s crashed", a.rollout_id)
            self.done.put((a, "infra_error", None, {}, f"agent_crash: {type(exc).__name__}: {exc}"))

    def _flush_results(self) -> None:
        while True:
            try:
                a, outcome, reward, shards, infra = self.done.get_nowait()
            except queue.Empty:
                return
            self.active.pop(a.rollout_id, None)
            self.completed += 1
            self._send(P.Result(rollout_id=a.rollout_id, attempt=a.attempt, token=a.token, outcome=outcome,
                                reward=reward, shards=shards, infra_reason=infra,
                                idem=f"{a.rollout_id}:{a.attempt}:{a.token}"))
            self._send(P.Ready(node=self.node, credit=self._free()))

    def _heartbeat(self) -> None:
        from nodeagent.health import sampler_for   # health figures + JSON-lines stream (docs/operations.md)
        health = sampler_for(self).sample()
        self._send(P.Heartbeat(node=self.node, slots_free=self._free(), active=len(self.active), health=health))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="paddock agent", description="Run a node agent.")
    ap.add_argument("--node", default=os.uname().nodename)
    ap.add_argument("--controller", required=True, help="ZeroMQ endpoint, e.g. tcp://10.0.0.1:5555")
    ap.add_argument("--deployment", required=True)
    ap.add_argument("--slots", type=int, default=2)
    ap.add_argument("--image-store", required=True)
    ap.add_argument("--subid-base", type=int)
    ap.add_argument("--subid-count", type=int)
    ap.add_argument("--heartbeat-interval-s", type=float, default=1.0)
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format=f"%(asctime)s {args.node} %(name)s %(levelname)s %(message)s")
    subids = (args.subid_base, args.subid_count) if args.subid_base is not None else None
    runtime = SandboxRuntime(subids=subids).start()
    agent = NodeAgent(args.node, args.controller, args.deployment, args.slots, args.image_store, runtime,
                      heartbeat_interval_s=args.heartbeat_interval_s)
    signal.signal(signal.SIGTERM, lambda *_: setattr(agent, "draining", True))
    try:
        return agent.run()
    finally:
        runtime.close()


if __name__ == "__main__":
    sys.exit(main())
