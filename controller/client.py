"""The trainer's client: submit rollouts, publish policy versions, iterate results as they commit.

A DEALER socket to the controller's ROUTER. Every mutating request carries an idempotency key
generated once per call, so a retry after a timeout (on a fresh socket) can never submit twice.
Errors are typed: `ControllerUnavailable` (no reply within the deadline after retries),
`RequestRefused` (the controller answered no, with its reason).
"""
from __future__ import annotations

import time
import uuid
from typing import Iterator

import zmq

from controller import protocol as P


class ClientError(Exception):
    pass


class ControllerUnavailable(ClientError):
    pass


class RequestRefused(ClientError):
    pass


class Client:
    def __init__(self, endpoint: str, deployment: str, timeout_s: float = 10.0, retries: int = 3):
        self.endpoint, self.deployment = endpoint, deployment
        self.timeout_s, self.retries = timeout_s, retries
        self.ctx = zmq.Context.instance()
        self.sock = None
        self._connect()

    def _connect(self) -> None:
        if self.sock is not None:
            self.sock.close(linger=0)
        self.sock = self.ctx.socket(zmq.DEALER)
        self.sock.setsockopt(zmq.IDENTITY, f"client-{uuid.uuid4().hex[:12]}".encode())
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.connect(self.endpoint)

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close(linger=0)
            self.sock = None

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _request(self, msg, expect: tuple[type, ...]):
        for attempt in range(self.retries):
            self.sock.send(P.encode(msg, self.deployment))
            deadline = time.monotonic() + self.timeout_s
            while (left := deadline - time.monotonic()) > 0:
                if not self.sock.poll(timeout=int(left * 1000) + 1):
                    break
                reply = P.decode(self.sock.recv(), self.deployment)
                if isinstance(reply, P.Ack) and reply.ref == msg.id and not reply.ok:
                    raise RequestRefused(reply.error or "refused")
                if isinstance(reply, expect) and (not isinstance(reply, P.Ack) or reply.ref == msg.id):
                    return reply
            self._connect()   # Lazy Pirate: a fresh socket, then resend with the same keys
        raise ControllerUnavailable(f"no reply from the controller at {self.endpoint} "
                                    f"after {self.retries} tries of {self.timeout_s}s")

    def submit(self, tasks: list[str], n_per_task: int, policy_version: int) -> tuple[str, int]:
        msg = P.Submit(idem=uuid.uuid4().hex, tasks=list(tasks), n_per_task=n_per_task,
                       policy_version=policy_version)
        reply = self._request(msg, (P.Submitted,))
        return reply.batch_id, reply.rollouts

    def publish_policy(self, version: int, endpoint: str, model: str) -> None:
        msg = P.PublishPolicy(idem=uuid.uuid4().hex, version=version, endpoint=endpoint, model=model)
        self._request(msg, (P.Ack,))

    def status(self) -> P.StatusReply:
        return self._request(P.Status(), (P.StatusReply,))

    def shutdown(self, reason: str = "") -> None:
        self._request(P.Shutdown(reason=reason), (P.Ack,))

    def results(self, batch_id: str, poll_interval_s: float = 0.2) -> Iterator[dict]:
        """Yield committed (and dead-lettered) results of a batch as they arrive, until it is done."""
        cursor = 0
        while True:
            reply = self._request(P.Watch(batch_id=batch_id, after=cursor), (P.Results,))
            yield from reply.items
            cursor = reply.cursor
            if reply.done:
                return
            if not reply.items:
                time.sleep(poll_interval_s)

    def wait(self, batch_id: str) -> list[dict]:
        return list(self.results(batch_id))
