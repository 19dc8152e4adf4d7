"""Deterministic simulation of the farm: the real BrokerCore and RolloutQueue (a real SQLite
file), the real node-agent cores, a simulated trainer, network, clock and attempt runner, and
seeded faults.

Everything that varies comes from one `random.Random(seed)`: message loss, delay (and so
reordering), duplication, agent crash and restart, agent drain, controller crash (the
objects are dropped without close, the database file stays) and restart, clock jumps.
`World.run()` checks the safety invariants after every tick while faults are on, then
heals the faults and checks liveness: every rollout ends committed or dead-lettered within
a bound of simulated time, and the trainer got each of those results exactly once.

`ScaleWorld` is the same world at a training run's size and without faults (`agents` x `slots`,
thousands of tasks, attempts of a minute): it measures the controller's CPU per event
(tests/sim/test_sim_scale.py, benchmarks/scale.py).

The agents are the real `nodeagent.agent.core.AgentCore` (credit, Started, results resent until
acked, re-register on an unsolicited welcome, reconnect on silence, drain with release), with
a simulated attempt runner; the network delivers encoded frames both ways, so decode and
validation run for real on both sides.
"""
from __future__ import annotations

import heapq
import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from controller.broker.core import BrokerCore
from controller.contracts import protocol as P
from controller.store import queue as qm
from controller.store.queue import QueueConfig, RolloutQueue
from nodeagent.agent.core import RECONNECT, AgentCore, Attempt, AttemptResult

DEP = "sim"
CTL = b"controller"
TRAINER = b"trainer"
TASKS = {f"t{i}": {"task_id": f"t{i}", "image_digest": f"sha256:{i:02x}"} for i in range(3)}
TICK_S = 0.5



def _infra_reason(a) -> str:
    """An agent's infra_reason: half the model server's (a loss), half the task's (a
    failure), by token (no draw from the world's generator: replays stay as they were)."""
    return "model_server: sim outage" if a.token % 2 else "task: sim"


class SimClock:
    """Monotonic and wall time of the world; a jump moves both forward."""

    def __init__(self, start: float = 1_700_000_000.0):
        self.now = start

    def __call__(self) -> float:
        return self.now


@dataclass
class Faults:
    loss: float = 0.0
    dup: float = 0.0
    delay_max_s: float = 0.0
    agent_crash: float = 0.0
    agent_drain: float = 0.0
    client_drain: float = 0.0
    controller_crash: float = 0.0
    clock_jump: float = 0.0

    @classmethod
    def draw(cls, rng: random.Random) -> "Faults":
        return cls(loss=rng.uniform(0, 0.15), dup=rng.uniform(0, 0.1),
                   delay_max_s=rng.uniform(0, 2.0), agent_crash=rng.uniform(0, 0.006),
                   agent_drain=rng.uniform(0, 0.003), client_drain=rng.uniform(0, 0.003),
                   controller_crash=rng.uniform(0, 0.01),
                   clock_jump=rng.uniform(0, 0.004))


class Network:
    """Frames in flight: (deliver_at, seq, dst, src, bytes). Faults apply at send."""

    def __init__(self, rng: random.Random, clock: SimClock):
        self.rng, self.clock = rng, clock
        self.faults = Faults()
        self.heap: list[tuple[float, int, bytes, bytes, bytes]] = []
        self.seq = 0

    def send(self, src: bytes, dst: bytes, msg: P.Message) -> None:
        data = P.encode(msg, DEP)
        copies = 0 if self.rng.random() < self.faults.loss else 1
        if copies and self.rng.random() < self.faults.dup:
            copies = 2
        for _ in range(copies):
            self.seq += 1
            at = self.clock.now + self.rng.uniform(0, self.faults.delay_max_s)
            heapq.heappush(self.heap, (at, self.seq, dst, src, data))

    def due(self) -> list[tuple[bytes, bytes, bytes]]:
        out = []
        while self.heap and self.heap[0][0] <= self.clock.now:
            _, _, dst, src, data = heapq.heappop(self.heap)
            out.append((dst, src, data))
        return out

    def drop_to(self, dst: bytes) -> None:
        self.heap = [f for f in self.heap if f[2] != dst]
        heapq.heapify(self.heap)


class SimAgent:
    """A node agent: the real AgentCore on the simulated network and clock, with a simulated
    attempt runner (an attempt ends after a drawn duration, with a drawn outcome). A crash
    drops the core (the process); a restart is a fresh core that registers."""

    def __init__(self, world: "World", node: str, slots: int, version: str = "0.2.0",
                 prefetch: int = 0):
        self.w, self.node, self.slots, self.prefetch = world, node, slots, prefetch
        self.leases: dict[int, P.Lease] = {}  # by token: what a prefetched lease runs when promoted
        self.started: set[int] = set()  # tokens this core gave its runner (each at most once)
        self.version = version  # "0.3.0" takes batches (protocol.speaks_batches), "0.2.0" not
        self.ident = node.encode()
        self.up = True
        self.restart_at = 0.0
        self.core: Optional[AgentCore] = None
        self.running: list[tuple[float, int, Attempt]] = []  # (done_at, seq, attempt) heap

    def boot(self) -> None:
        """A new agent process: a fresh core, registered."""
        self.core = AgentCore(self.node, self.slots, DEP, agent_version=self.version,
                              heartbeat_interval_s=self.w.hb_s, liveness=self.w.liveness,
                              drain_deadline_s=2.0, backoff_max_s=8.0, clock=self.w.clock,
                              health=dict, mem_free_mb=lambda: 1, prefetch=self.prefetch,
                              rng=random.Random(self.w.rng.random()))
        self.running, self.leases, self.started = [], {}, set()
        self.core.start()
        self.flush()

    def crash(self, down_s: float) -> None:
        self.up, self.restart_at = False, self.w.clock.now + down_s
        self.core, self.running = None, []
        self.w.net.drop_to(self.ident)

    def flush(self, leases: Optional[dict[int, P.Lease]] = None) -> None:
        """What the core decided: frames onto the network, attempts onto the runner (only a
        lease just delivered, one of `leases` by token, makes an attempt)."""
        for msg in self.core.take_outbox():
            if msg is not RECONNECT:  # a fresh socket: same identity on the simulated network
                self.w.net.send(self.ident, CTL, msg)
                if isinstance(msg, P.Release) and msg.reason == "draining: not started":
                    self.w.handed_back += 1
        if leases:
            self.leases.update(leases)
        for a in self.core.take_attempts():
            assert a.token not in self.started, f"{self.node}: token {a.token} started twice"
            self.w.promoted += not leases or a.token not in leases  # a lease that waited
            self.started.add(a.token)
            self.w.leases_seen.append(self.leases.pop(a.token))
            self.w.net.seq += 1
            heapq.heappush(self.running, (self.w.clock.now + self.w.attempt_s(),
                                          self.w.net.seq, a))

    def deliver(self, data: bytes) -> None:
        """One frame from the controller, as the daemon hands it to its core."""
        msg = P.decode(data, DEP)
        if isinstance(msg, (P.LeaseBatch, P.AckBatch)):
            assert P.speaks_batches(self.version), f"a batch sent to agent {self.version}"
        leases = {m.token: m for m in P.unbatched(msg) if isinstance(m, P.Lease)}
        self.core.receive_data(data)
        self.flush(leases)

    def drain(self, deadline_s: float) -> None:
        self.core.drain(deadline_s)
        self.flush()

    def step(self) -> None:
        now = self.w.clock.now
        if not self.up:
            if now >= self.restart_at:
                self.up = True
                self.boot()
            return
        done = []
        while self.running and self.running[0][0] <= now:
            a = heapq.heappop(self.running)[2]
            outcome = self.w.rng.choices(["pass", "fail", "timeout", "infra_error"], [4, 2, 1, 3])[0]
            done.append((a, AttemptResult(outcome, 1.0 if outcome == "pass" else None, {},
                                          _infra_reason(a) if outcome == "infra_error" else None)))
        self.core.attempts_done(done)
        self.core.tick()
        self.flush()
        if self.core.done:  # drained and disconnected: the job step ends; a new one starts later
            self.crash(self.w.rng.uniform(1, 10))


class SimTrainer:
    """Publishes a policy, submits batches (resending until answered, same idem) and
    watches results with a cursor, like controller.client.api."""

    def __init__(self, world: "World", batches: list[tuple[list[str], int]]):
        self.w = world
        self.todo = [P.PublishPolicy(idem="pol1", version=1, endpoint="http://sim/v1",
                                     model="m")]
        self.todo += [P.Submit(idem=f"sub{i}", tasks=tasks, n_per_task=n, policy_version=1)
                      for i, (tasks, n) in enumerate(batches)]
        self.pending: Optional[tuple[P.Message, float]] = None
        self.batches: dict[str, int] = {}  # batch id -> cursor
        self.submitted: dict[str, str] = {}  # idem -> batch id
        self.results: dict[str, dict] = {}  # rollout id -> the item received
        self.watch_sent: dict[str, float] = {}

    def send(self, msg: P.Message) -> None:
        self.w.net.send(TRAINER, CTL, msg)

    def receive(self, msg: P.Message) -> None:
        if isinstance(msg, P.Submitted):
            if self.pending and msg.ref == self.pending[0].id:
                idem = self.pending[0].idem
                assert self.submitted.setdefault(idem, msg.batch_id) == msg.batch_id, \
                    "a repeated submit made a second batch"
                self.batches.setdefault(msg.batch_id, 0)
                self.pending = None
        elif isinstance(msg, P.Ack):
            if self.pending and msg.ref == self.pending[0].id:
                assert msg.ok, msg.error
                self.pending = None
        elif isinstance(msg, P.Results):
            cursor = self.batches[msg.batch_id]
            for item in msg.items:
                if item["commit_seq"] <= cursor:
                    continue  # a duplicated or late reply: already consumed
                rid = item["rollout_id"]
                assert rid not in self.results, f"{rid} delivered twice to the trainer"
                self.results[rid] = item
                cursor = item["commit_seq"]
            self.batches[msg.batch_id] = cursor
            self.watch_sent.pop(msg.batch_id, None)

    def step(self) -> None:
        now = self.w.clock.now
        if self.pending is None and self.todo:
            self.pending = (self.todo.pop(0), now)
            self.send(self.pending[0])
        elif self.pending is not None and now - self.pending[1] > 3.0:
            self.pending = (self.pending[0], now)  # Lazy Pirate: same message, same idem
            self.send(self.pending[0])
        for bid, cursor in self.batches.items():
            if now - self.watch_sent.get(bid, -1e18) > 3.0:
                self.watch_sent[bid] = now
                self.send(P.Watch(batch_id=bid, after=cursor, wait_s=1.0))


class World:
    def __init__(self, seed: int, db_dir: Path, fault_ticks: int = 120, prefetch: int = 0):
        self.seed, self.prefetch = seed, prefetch
        self.promoted = self.handed_back = 0  # prefetched leases started later / given back
        self.rng = random.Random(seed)
        self.clock = SimClock()
        self.net = Network(self.rng, self.clock)
        self.db = db_dir / f"sim-{seed}.db"
        self.hb_s, self.liveness = 1.0, 3
        self.config = QueueConfig(lease_ttl_s=self.rng.choice([4.0, 8.0]), max_attempts=3,
                                  backoff_base_s=0.5, backoff_max_s=4.0)
        self.fault_ticks = fault_ticks
        self.faults = Faults.draw(self.rng)
        self.trace: list[str] = []
        self.leases_seen: list[P.Lease] = []
        self.committed: dict[str, tuple] = {}  # rid -> (attempt, token, outcome, reward, seq)
        self.max_token = 0
        self.core: Optional[BrokerCore] = None
        self.controller_up_at = 0.0
        self.start_controller()
        self.agents = [SimAgent(self, f"n{i}", self.rng.randint(1, 3),
                                self.rng.choice(["0.2.0", "0.3.0"]), prefetch)
                       for i in range(self.rng.randint(2, 4))]
        batches = [([self.rng.choice(list(TASKS)) for _ in range(self.rng.randint(1, 2))],
                    self.rng.randint(1, 4)) for _ in range(self.rng.randint(2, 3))]
        self.trainer = SimTrainer(self, batches)
        for a in self.agents:
            a.boot()

    # ---- the controller ----

    def start_controller(self) -> None:
        self.queue = RolloutQueue(self.db, clock=self.clock,
                                  rng=random.Random(self.rng.random()), config=self.config)
        self.core = BrokerCore(self.queue, TASKS, DEP, "sim", "/nonexistent",
                               session=f"s{self.rng.getrandbits(32):08x}",
                               heartbeat_interval_s=self.hb_s, liveness=self.liveness,
                               clock=self.clock, wall=self.clock, sweep_interval_s=0.5)
        self.trace.append(f"t={self.t():.2f} controller start")

    def crash_controller(self) -> None:
        """kill -9: no close(), no flush; what the queue committed is all that stays.
        The frames of the pass in progress are lost, so is whatever was in flight to it."""
        self.trace.append(f"t={self.t():.2f} controller crash")
        self.core = None
        del self.queue
        self.net.drop_to(CTL)
        self.controller_up_at = self.clock.now + self.rng.uniform(0, 3)

    def t(self) -> float:
        return self.clock.now - 1_700_000_000.0

    def attempt_s(self) -> float:
        """How long an attempt runs (simulated seconds)."""
        return self.rng.uniform(0.2, 6.0)

    # ---- one tick ----

    def tick(self, faults: bool) -> None:
        self.net.faults = self.faults if faults else Faults()
        self.clock.now += TICK_S
        if faults and self.rng.random() < self.faults.clock_jump:
            jump = self.rng.uniform(1, 20)
            self.clock.now += jump
            self.trace.append(f"t={self.t():.2f} clock jump +{jump:.1f}s")
        frames = self.net.due()
        if self.core is None and self.clock.now >= self.controller_up_at:
            self.start_controller()
        to_ctl = [(src, data) for dst, src, data in frames if dst == CTL]
        if self.core is not None:
            with self.queue.batch():
                for src, data in to_ctl:
                    self.core.receive(src, data)
                self.core.tick()
            if faults and self.rng.random() < self.faults.controller_crash:
                self.crash_controller()  # after the commit, before the replies leave
            else:
                for dst, msg in self.core.take_outbox():
                    self.net.send(CTL, dst, msg)
        for dst, src, data in frames:
            if dst == CTL:
                continue
            if dst == TRAINER:
                self.trainer.receive(P.decode(data, DEP))
            else:
                agent = next(a for a in self.agents if a.ident == dst)
                if agent.up:
                    agent.deliver(data)
        if faults and self.rng.random() < self.faults.client_drain:
            node = self.rng.choice(self.agents).node
            self.net.send(TRAINER, CTL, P.DrainNode(node=node, deadline_s=self.rng.uniform(0, 4)))
            self.trace.append(f"t={self.t():.2f} drain_node {node} requested")
        for a in self.agents:
            if faults and a.up and self.rng.random() < self.faults.agent_crash:
                a.crash(self.rng.uniform(0.5, 15))
                self.trace.append(f"t={self.t():.2f} agent {a.node} crash")
            elif faults and a.up and self.rng.random() < self.faults.agent_drain:
                a.drain(self.rng.uniform(0, 4))
                self.trace.append(f"t={self.t():.2f} agent {a.node} drain")
            a.step()
        self.trainer.step()

    # ---- invariants ----

    def check_safety(self) -> None:
        db = self.queue if self.core is not None else RolloutQueue(self.db, clock=self.clock,
                                                                    config=self.config)
        by_token: dict[int, str] = {}
        for lease in self.leases_seen:  # a duplicated delivery is the same message id
            assert by_token.setdefault(lease.token, lease.id) == lease.id, \
                f"fencing token {lease.token} was issued twice"
        attempts: dict[str, list[tuple[int, bool]]] = {}
        for rid, token, finished in db._db.execute(
                "SELECT rollout_id, token, finished_at FROM attempts ORDER BY rollout_id, attempt"):
            attempts.setdefault(rid, []).append((token, finished is None))
        states = {}
        for rid, state, attempt, token, outcome, reward, seq in db._db.execute(
                "SELECT rollout_id, state, attempt, token, outcome, reward, commit_seq"
                " FROM rollouts"):
            states[rid] = state
            # An attempt's row is written when it ends; the one held now is the rollout's row.
            att = attempts.get(rid, [])
            att_tokens = [t for t, _ in att]
            assert att_tokens == sorted(set(att_tokens)), \
                f"{rid}: tokens must grow with every lease: {att_tokens}"
            live = [t for t, open_ in att if open_]
            assert not live, f"{rid}: attempt rows {live} written before the attempt ended"
            if state in qm.HELD or state == qm.COMMITTED:  # the attempt is the rollout's row
                assert all(t < token for t in att_tokens), \
                    f"{rid}: {state} with token {token}, not newer than ended {att_tokens}"
            if state == qm.COMMITTED:
                value = (attempt, token, outcome, reward, seq)
                assert self.committed.setdefault(rid, value) == value, \
                    f"{rid}: committed twice or changed: {self.committed[rid]} -> {value}"
        for rid in self.committed:
            assert states.get(rid) == qm.COMMITTED, \
                f"{rid}: a commit was lost (now {states.get(rid)})"
        for rid, item in self.trainer.results.items():
            if item["state"] == qm.COMMITTED:
                assert self.committed[rid][1] == item["token"], f"{rid}: trainer saw another token"
        self.check_agents()

    def check_agents(self) -> None:
        """Each agent runs at most its slots and holds at most slots + prefetch leases; a
        draining agent holds none waiting (handed back); the controller never leases a node
        more than its slots + prefetch."""
        for a in self.agents:
            core = a.core
            if not a.up or core is None:
                continue
            assert core.running() <= a.slots, f"{a.node}: {core.running()} running > {a.slots} slots"
            assert len(core.active) <= a.slots + a.prefetch, \
                f"{a.node}: {len(core.active)} leases held > {a.slots} + {a.prefetch}"
            assert not (core.draining and core._waiting), f"{a.node}: draining with leases waiting"
            assert all(core.active.get(w.rollout_id) is w for w in core._waiting), \
                f"{a.node}: a waiting lease it no longer holds"
        if self.core is not None:
            for view in self.core.nodes.values():
                assert len(view.leases) <= view.slots + view.prefetch, \
                    f"{view.node}: leased {len(view.leases)} > {view.slots} + {view.prefetch}"
                # the heartbeat's fencing fast path (core.py) trusts a node's mirror: what it
                # lists as the node's is the holder map's for that node
                holder = self.core.holder
                wrong = [r for r in view.leases if holder.get(r, ("",))[0] != view.node]
                assert not wrong, f"{view.node}: mirror lists {wrong[:3]} the holder map does not give it"

    def done(self) -> bool:
        if self.core is None or self.trainer.todo or self.trainer.pending:
            return False
        rows = self.queue.rollouts()
        return bool(rows) and all(r["state"] in (qm.COMMITTED, qm.DEAD_LETTER) for r in rows) \
            and set(self.trainer.results) == {r["rollout_id"] for r in rows}

    def run(self, heal_bound_s: float = 600.0) -> None:
        for _ in range(self.fault_ticks):
            self.tick(faults=True)
            self.check_safety()
        self.trace.append(f"t={self.t():.2f} faults healed")
        for a in self.agents:  # crashed or drained agents come back
            if not a.up:
                a.restart_at = min(a.restart_at, self.clock.now)
        deadline = self.clock.now + heal_bound_s
        while not self.done():
            assert self.clock.now < deadline, (
                f"not finished {heal_bound_s}s after the faults healed: "
                f"{self.queue.counts() if self.core else 'controller down'}")
            self.tick(faults=False)
            self.check_safety()
        states = {r["state"] for r in self.queue.rollouts()}
        assert states <= {qm.COMMITTED, qm.DEAD_LETTER}


@dataclass
class ScaleStats:
    """What the controller did in a `ScaleWorld` run: its CPU (decode, decide, commit,
    encode), the frames in and out and their bytes, the passes (one SQLite commit each)."""
    cpu_s: float = 0.0
    frames_in: int = 0
    frames_out: int = 0
    bytes_in: int = 0
    bytes_out: int = 0
    max_frame_in: int = 0
    max_frame_out: int = 0
    passes: int = 0
    sim_s: float = 0.0


class ScaleWorld(World):
    """The farm at size, no faults: `agents` agents of `slots` slots (all speaking batches),
    `n_tasks` SWE-shaped task references, a trainer keeping ~1.5x the slots queued in batches
    of `batch` rollouts, attempts of `attempt_s` +- 50% simulated seconds, heartbeats every
    `hb_s`; `prefetch`: leases each agent holds ahead of its slots (`AgentConfig.prefetch`).
    The controller's part of each tick is timed (process CPU), in passes of at most
    `max_frames_per_pass` frames as the daemon reads them."""

    def __init__(self, seed: int, db_dir: Path, agents: int, slots: int, n_tasks: int = 2000,
                 attempt_s: float = 60.0, batch: int = 1024, hb_s: float = 5.0, liveness: int = 3,
                 prefetch: int = 0):
        self.seed, self.rng, self.clock, self.prefetch = seed, random.Random(seed), SimClock(), prefetch
        self.net = Network(self.rng, self.clock)
        self.db = db_dir / f"scale-{seed}.db"
        self.hb_s, self.liveness, self.mean_attempt_s = hb_s, liveness, attempt_s
        self.config = QueueConfig(lease_ttl_s=max(30.0, 3 * hb_s), max_attempts=3,
                                  backoff_base_s=0.5, backoff_max_s=4.0)
        self.fault_ticks, self.faults = 0, Faults()
        self.trace, self.leases_seen, self.committed = [], [], {}
        self.promoted = self.handed_back = 0
        self.max_token, self.core, self.controller_up_at = 0, None, 0.0
        self.tasks = scale_tasks(n_tasks)
        self.stats = ScaleStats()
        self.start_controller()
        self.agents = [SimAgent(self, f"node{i:05d}", slots, "0.3.0", prefetch) for i in range(agents)]
        self.names, self.batch, self.submits = [t["name"] for t in self.tasks.values()], batch, 0
        self.trainer = SimTrainer(self, [])
        for a in self.agents:
            a.boot()

    def start_controller(self) -> None:
        self.queue = RolloutQueue(self.db, clock=self.clock, rng=random.Random(self.rng.random()),
                                  config=self.config)
        self.core = BrokerCore(self.queue, self.tasks, DEP, "sim", "/nonexistent",
                               session="scale", heartbeat_interval_s=self.hb_s,
                               liveness=self.liveness, clock=self.clock, wall=self.clock)

    def attempt_s(self) -> float:
        return self.rng.uniform(0.5, 1.5) * self.mean_attempt_s

    def refill(self) -> None:
        """The trainer submits another batch whenever fewer than ~1.5x the slots are queued."""
        if not self.trainer.todo and self.trainer.pending is None:
            counts = self.queue.counts()
            open_ = sum(v for k, v in counts.items() if k not in (qm.COMMITTED, qm.DEAD_LETTER))
            slots = sum(a.slots for a in self.agents)
            if open_ < 1.5 * slots:
                self.submits += 1
                start = (self.submits * self.batch) % len(self.names)
                self.trainer.todo.append(P.Submit(idem=f"more{self.submits}", n_per_task=1, policy_version=1,
                                                  tasks=(self.names * 2)[start:start + self.batch]))

    def tick(self, faults: bool = False) -> None:
        self.clock.now += TICK_S
        frames = self.net.due()
        to_ctl = [(src, data) for dst, src, data in frames if dst == CTL]
        st, per = self.stats, self.core.config.max_frames_per_pass
        for i in range(0, max(len(to_ctl), 1), per):
            c0 = time.process_time()
            with self.queue.batch():
                for src, data in to_ctl[i:i + per]:
                    self.core.receive(src, data)
                self.core.tick()
            for dst, msg in self.core.take_outbox():
                self.net.send(CTL, dst, msg)
            st.cpu_s += time.process_time() - c0
            st.passes += 1
        for data in (d for _, d in to_ctl):
            st.bytes_in += len(data)
            st.max_frame_in = max(st.max_frame_in, len(data))
        st.frames_in += len(to_ctl)
        for dst, src, data in frames:
            if dst == CTL:
                continue
            st.frames_out += 1
            st.bytes_out += len(data)
            st.max_frame_out = max(st.max_frame_out, len(data))
            if dst == TRAINER:
                self.trainer.receive(P.decode(data, DEP))
            else:
                self.by_ident[dst].deliver(data)
        for a in self.agents:
            a.step()
        self.refill()
        self.trainer.step()
        st.sim_s += TICK_S

    def run_for(self, sim_s: float) -> ScaleStats:
        self.by_ident = {a.ident: a for a in self.agents}
        for _ in range(int(sim_s / TICK_S)):
            self.tick()
        return self.stats


def scale_tasks(n: int) -> dict[str, dict]:
    """`n` SWE-shaped task references (as the tasks file lists them: by id; names are aliases)."""
    out = {}
    for i in range(n):
        tid = f"sha256:{i:064x}"
        out[tid] = {"task_id": tid, "name": f"swe/repo__proj-{i}", "family": "swe",
                    "image_digest": f"sha256:{i + 1:064x}", "taskset_hash": "sha256:" + "5" * 64,
                    "split": "train", "limits": {"memory_mb": 4096, "pids": 512, "disk_mb": 4096,
                                                 "cpu": 2.0, "nofile": 1024},
                    "blob": {"root": "/shared/taskbank/blobs", "digest": f"sha256:{i + 7:064x}", "bytes": 9000}}
    return out
