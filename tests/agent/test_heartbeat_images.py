"""A heartbeat names the node's images only when the set grew since the controller was last
told (a register names them all), and at least every IMAGES_REFRESH_BEATS heartbeats; the
controller keeps its last list when a heartbeat names none. A node that ran hundreds of task
images sent them all in every heartbeat (tens of KB every few seconds per node)."""
from __future__ import annotations

from controller.contracts import protocol as P
from nodeagent.agent.core import IMAGES_REFRESH_BEATS, AgentCore
from tests.conftest import FakeClock

DEP = "images-test"


def welcomed() -> tuple[AgentCore, FakeClock]:
    clock = FakeClock()
    core = AgentCore("n1", 2, DEP, heartbeat_interval_s=1.0, liveness=3, clock=clock,
                     rng=type("NoPhase", (), {"uniform": staticmethod(lambda a, b: 0.0)})())
    core.images.update(f"sha256:{i:064x}" for i in range(300))
    core.start()
    core.receive_data(P.encode(P.Welcome(node="n1", heartbeat_interval_s=1.0, liveness=3,
                                         session="s1"), DEP))
    return core, clock


def beats(core: AgentCore, clock: FakeClock, n: int) -> list[P.Heartbeat]:
    out = []
    for _ in range(n):
        clock.advance(1.0)
        core.receive_data(P.encode(P.Heartbeat(), DEP))   # the controller is alive
        core.tick()
        out += [m for m in core.take_outbox() if isinstance(m, P.Heartbeat)]
    return out


def test_a_heartbeat_names_the_images_only_when_they_grew_or_to_refresh():
    core, clock = welcomed()
    (reg,) = [m for m in core.take_outbox() if isinstance(m, P.Register)]
    assert len(reg.images) == 300
    first = beats(core, clock, 3)
    assert len(first) == 3 and all(h.images is None for h in first), "nothing new since the register"
    core.images.add("sha256:" + "f" * 64)
    (grew,) = beats(core, clock, 1)
    assert grew.images is not None and len(grew.images) == 301
    later = beats(core, clock, 2 * IMAGES_REFRESH_BEATS)
    named = [i for i, h in enumerate(later) if h.images is not None]
    assert named == [IMAGES_REFRESH_BEATS - 1, 2 * IMAGES_REFRESH_BEATS - 1]
    assert all(len(later[i].images) == 301 for i in named)
    # the frame without images is small; with them it is tens of KB
    assert len(P.encode(later[0], DEP)) < 2_000 < 20_000 < len(P.encode(grew, DEP))


def test_a_re_register_names_every_image_and_restarts_the_count():
    core, clock = welcomed()
    core.take_outbox()
    core.images.add("sha256:" + "e" * 64)
    regs: list[P.Register] = []
    for _ in range(10):   # the controller falls silent: the agent reconnects and registers again
        clock.advance(1.0)
        core.tick()
        regs += [m for m in core.take_outbox() if isinstance(m, P.Register)]
    assert regs and len(regs[-1].images) == 301
    core.receive_data(P.encode(P.Welcome(node="n1", heartbeat_interval_s=1.0, liveness=3,
                                         session="s2"), DEP))
    core.take_outbox()
    assert all(h.images is None for h in beats(core, clock, 3))
