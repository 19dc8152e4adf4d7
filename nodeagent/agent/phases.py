"""The node agent's state tables and the small types its core hands its owner: the phases
(`Phase`, `PHASES`, `ENDED`) and registration links (`Link`, `LINKS`) the core checks on every
change, the outbox's `RECONNECT` marker (`Outgoing`), and what a `watch` reports
(`EndpointNews`, `Watch`). Re-exported by nodeagent.agent.core, where the rules live.

Must not import: zmq, psutil, threading, os, nodeagent.sandbox, nodeagent.harness, nodeagent.verifier,
nodeagent.egress, nodeagent.store, controller other than controller.contracts.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Callable, Optional, Union

from controller.contracts import protocol as P


class Phase(str, enum.Enum):
    SERVING = "serving"
    DRAINING = "draining"
    DONE = "done"  # drained and disconnected: the owner ends the agent
    STOPPED = "stopped"  # a `shutdown`, the controller stopped on purpose, or the owner
    REFUSED = "refused"  # the controller will not take this agent (`refused` says why)
    GAVE_UP = "gave_up"  # never welcomed within give_up_s of the start


ENDED = frozenset({Phase.STOPPED, Phase.REFUSED, Phase.GAVE_UP})
PHASES: dict[Phase, frozenset[Phase]] = {
    Phase.SERVING: frozenset({Phase.DRAINING}) | ENDED,
    Phase.DRAINING: frozenset({Phase.DONE}) | ENDED,
    Phase.DONE: frozenset(),
    Phase.STOPPED: frozenset(),
    Phase.REFUSED: frozenset(),
    Phase.GAVE_UP: frozenset(),
}


class Link(str, enum.Enum):
    """The registration with the controller: `registering` until the first welcome, then
    `registered`, `reregistering` after each new `register` (a reconnect, a new endpoint, an
    unsolicited welcome) until the next welcome."""
    NEW = "new"
    REGISTERING = "registering"
    REGISTERED = "registered"
    REREGISTERING = "reregistering"


LINKS: dict[Link, frozenset[Link]] = {
    # (a welcome before the first registration makes the agent register as one welcomed)
    Link.NEW: frozenset({Link.REGISTERING, Link.REREGISTERING}),
    Link.REGISTERING: frozenset({Link.REGISTERING, Link.REGISTERED}),
    Link.REGISTERED: frozenset({Link.REREGISTERING}),
    Link.REREGISTERING: frozenset({Link.REREGISTERING, Link.REGISTERED}),
}


class _Reconnect:
    """Outbox marker: close the socket, open a fresh one, send what follows on it."""

    def __repr__(self) -> str:
        return "RECONNECT"


RECONNECT = _Reconnect()
Outgoing = Union[P.Message, _Reconnect]


@dataclass(frozen=True)
class EndpointNews:
    """What a `watch` saw: a controller now at `endpoint`, or `stopped` on purpose."""
    endpoint: Optional[str] = None
    stopped: bool = False


Watch = Callable[[], Optional[EndpointNews]]
