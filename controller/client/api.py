"""The trainer's client: submit rollouts, publish policy versions, iterate results as they
commit, cancel batches, drain nodes, read the farm's status. Sync (`Client`) and asyncio
(`AsyncClient`), same methods, same errors.

A DEALER socket to the controller's ROUTER, used Lazy-Pirate style: a request waits
`timeout_s` for its reply; on silence the socket is replaced by a fresh one and the SAME
message (same idempotency key) is sent again, until `give_up_s` has passed. So a client
carries on by itself across a controller restart, and a retried submit can never submit
twice. Results are read by long-polling `watch` with a cursor, so a reconnect resumes
exactly where it stopped; every result carries its `cursor`, and `results(batch, after=c)`
resumes after it, so a trainer that checkpoints the cursor resumes across its own restart.
`submit(..., key=...)` makes a re-run of the same training step get the same batch.

Given the endpoint file (`endpoint_file=`, or `Client.for_run(run_dir, ...)`), a client whose
controller is silent looks at the file (a stat; it is read only when written since) every
`reread_s` (0.1 s): a controller restarted on another port is found within about that long.

The control plane is CURVE-encrypted and authenticated: the client loads the run's key file
(`key_file=`, default: `controller.key` next to the endpoint file, else `$PADDOCK_KEY_FILE`),
0600 and its own user's or refused (`BadKeyFile`, naming the path and the fix). Without it a
controller gives no answer at all. `insecure=True` talks to a `--insecure` controller.

Errors are typed: `ControllerUnavailable` (no reply before give_up_s), `BadKeyFile`, and for a refusal
`RequestRefused` or the subclass for its code (`UnknownTask`, `UnknownPolicy`,
`UnknownBatch`, `UnknownNode`, `PolicyConflict`, `BadRequest`).

Must not import controller.store.queue (the client talks only the wire protocol).
"""
from __future__ import annotations

import asyncio
import os
import time
import uuid
from pathlib import Path
from typing import AsyncIterator, Iterator, Optional

import zmq
import zmq.asyncio

from controller.contracts import protocol as P
from controller.contracts import states as S
from controller.contracts.protocol import BandRequest  # noqa: F401 - re-exported for trainers
from controller.ondisk.keys import KEY_FILE, KeyFileError, RunKeys, read_key_file


class ClientError(Exception):
    pass


class ControllerUnavailable(ClientError):
    pass


class BadKeyFile(ClientError):
    """No usable key file (missing, another user's, readable by others): the message names
    the path and the fix."""


class RequestRefused(ClientError):
    """The controller answered no. `code` is one of contracts.states.ERROR_CODES."""

    def __init__(self, message: str, code: Optional[str] = None):
        super().__init__(message)
        self.code = code


class UnknownTask(RequestRefused):
    pass


class UnknownPolicy(RequestRefused):
    pass


class UnknownBatch(RequestRefused):
    pass


class UnknownNode(RequestRefused):
    pass


class PolicyConflict(RequestRefused):
    pass


class BadRequest(RequestRefused):
    pass


_REFUSALS = {S.UNKNOWN_TASK: UnknownTask, S.UNKNOWN_POLICY: UnknownPolicy,
             S.UNKNOWN_BATCH: UnknownBatch, S.UNKNOWN_NODE: UnknownNode,
             S.POLICY_CONFLICT: PolicyConflict, S.BAD_REQUEST: BadRequest}


def _refused(ack: P.Ack) -> RequestRefused:
    return _REFUSALS.get(ack.code or "", RequestRefused)(ack.error or "refused", ack.code)


def _match(msg: P.Message, reply: P.Message, expect: tuple[type, ...]) -> Optional[P.Message]:
    """The reply if it answers msg; raises for a refusal; None for anything else (late
    replies of earlier tries, controller heartbeats, welcomes)."""
    if isinstance(reply, P.Ack) and reply.ref == msg.id and not reply.ok:
        raise _refused(reply)
    if isinstance(reply, expect) and getattr(reply, "ref", None) == msg.id:
        return reply
    return None


ENDPOINT_FILE = "controller.endpoint"  # in the run directory: the bound endpoint
KEY_PREFIX = "key:"  # a caller's submit key, as an idempotency key (never a uuid4 hex)


# The message builders, shared by both clients.

def _submit(tasks, n_per_task, policy, sampler, key) -> P.Submit:
    if policy is None:
        raise TypeError("submit: policy (a published policy version) is required")
    if (tasks is None) == (sampler is None):
        raise TypeError("submit: give tasks or a sampler (BandRequest), not both")
    if key is not None and (not isinstance(key, str) or not key):
        raise TypeError(f"submit: key must be a non-empty string, got {key!r}")
    idem = uuid.uuid4().hex if key is None else KEY_PREFIX + key
    return P.Submit(idem=idem, tasks=list(tasks or ()), n_per_task=n_per_task,
                    policy_version=policy, sampler=sampler)


def _with_cursors(items: list[dict]) -> list[dict]:
    """Each result with its `cursor`: `results(batch, after=cursor)` resumes after it."""
    for item in items:
        item["cursor"] = item["commit_seq"]
    return items


def _publish(version, endpoint, model) -> P.PublishPolicy:
    return P.PublishPolicy(idem=uuid.uuid4().hex, version=version, endpoint=endpoint,
                           model=model if model is not None else f"policy-v{version}")


class _Base:
    def __init__(self, endpoint: Optional[str], deployment: str, timeout_s: float = 5.0,
                 give_up_s: float = 60.0, watch_wait_s: float = 1.0, retries: int | None = None,
                 endpoint_file: Optional[str | Path] = None, reread_s: float = 0.1,
                 key_file: Optional[str | Path] = None, insecure: bool = False):
        """`endpoint` may be None when `endpoint_file` names the file the controller
        publishes its endpoint in (read now, and again whenever the controller is silent
        for `reread_s`). `key_file`: the run's CURVE keys (see the module's docstring)."""
        self.endpoint_file = Path(endpoint_file) if endpoint_file is not None else None
        self.reread_s = reread_s
        self._endpoint_stamp: Optional[tuple[int, int]] = None
        if self.endpoint_file is not None and endpoint is not None:
            self._read_endpoint()  # the version of the file this endpoint is from
        self.timeout_s = timeout_s
        # `retries` (tries of timeout_s each) is the older spelling of give_up_s.
        self.give_up_s = give_up_s if retries is None else timeout_s * retries
        if endpoint is None:
            if self.endpoint_file is None:
                raise TypeError("Client: give an endpoint or an endpoint_file")
            endpoint = self._wait_endpoint()
        self.endpoint, self.deployment = endpoint, deployment
        self.keys: Optional[RunKeys] = None if insecure else self._load_keys(key_file)
        self.watch_wait_s = watch_wait_s
        self.reconnects = 0
        self.sock = None

    def _new_socket(self, ctx):
        if self.sock is not None:
            self.sock.close(linger=0)
            self.reconnects += 1
        self.sock = ctx.socket(zmq.DEALER)
        self.sock.setsockopt(zmq.IDENTITY, f"client-{uuid.uuid4().hex[:12]}".encode())
        self.sock.setsockopt(zmq.LINGER, 0)
        if self.keys is not None:  # before connect: the handshake uses them
            self.sock.setsockopt(zmq.CURVE_SERVERKEY, self.keys.server_public.encode())
            self.sock.setsockopt(zmq.CURVE_PUBLICKEY, self.keys.client_public.encode())
            self.sock.setsockopt(zmq.CURVE_SECRETKEY, self.keys.client_secret.encode())
        self.sock.connect(self.endpoint)

    def _load_keys(self, key_file: Optional[str | Path]) -> RunKeys:
        """The run's keys: `key_file`, else the endpoint file's neighbour, else
        $PADDOCK_KEY_FILE; BadKeyFile when there is none or it may not be used."""
        if key_file is None and self.endpoint_file is not None:
            key_file = self.endpoint_file.with_name(KEY_FILE)
        key_file = key_file or os.environ.get("PADDOCK_KEY_FILE")
        if not key_file:
            raise BadKeyFile("no key file: the controller answers only holders of the run's "
                             "keys; give key_file=RUN_DIR/controller.key, use "
                             "Client.for_run(run_dir, ...), or set PADDOCK_KEY_FILE")
        try:
            return read_key_file(key_file)
        except KeyFileError as exc:
            raise BadKeyFile(str(exc)) from None

    @classmethod
    def for_run(cls, run_dir: str | Path, deployment: str, **kw):
        """A client of the controller of a run directory, found through (and followed
        across restarts by) its `controller.endpoint` file, with the keys of its
        `controller.key`."""
        return cls(None, deployment, endpoint_file=Path(run_dir) / ENDPOINT_FILE, **kw)

    def _wait_endpoint(self) -> str:
        """The endpoint file's endpoint; while there is none (the controller is starting or
        restarting), look again every `reread_s`, up to `give_up_s`."""
        give_up = time.monotonic() + self.give_up_s
        while (endpoint := self._read_endpoint()) is None:
            if time.monotonic() >= give_up:
                raise ControllerUnavailable(f"no controller endpoint in {self.endpoint_file} "
                                            f"within {self.give_up_s}s")
            time.sleep(self.reread_s)  # polling a file another process writes
        return endpoint

    def _read_endpoint(self) -> Optional[str]:
        """The endpoint the file names (None: no file, or empty), noting which version of
        the file it was (every controller start writes it anew)."""
        try:
            st = self.endpoint_file.stat()
            text = self.endpoint_file.read_text().strip()
        except OSError:  # being replaced, or not written yet
            return None
        self._endpoint_stamp = (st.st_ino, st.st_mtime_ns)
        return text or None

    def _moved(self) -> bool:
        """The endpoint file was written since it was last read (a controller started, on
        another endpoint or the same one): adopt what it names and say so, so that the
        request is sent again at once rather than after `timeout_s`."""
        if self.endpoint_file is None:
            return False
        before = self._endpoint_stamp
        try:  # a stat is cheap: the file is read only when it was written since
            st = self.endpoint_file.stat()
        except OSError:
            return False
        if (st.st_ino, st.st_mtime_ns) == before:
            return False
        endpoint = self._read_endpoint()
        if endpoint is None or (endpoint == self.endpoint and self._endpoint_stamp == before):
            return False
        self.endpoint = endpoint
        return True

    def _slice_s(self, left: float) -> float:
        """How long to wait for a reply before looking at the endpoint file again."""
        return left if self.endpoint_file is None else min(left, self.reread_s)

    def _unavailable(self) -> ControllerUnavailable:
        return ControllerUnavailable(f"no reply from the controller at {self.endpoint} "
                                     f"within {self.give_up_s}s")

    def _decode(self, data: bytes) -> Optional[P.Message]:
        try:
            return P.decode(data, self.deployment)
        except P.RemoteProtocolError:
            return None  # not for us (foreign deployment) or garbage: ignore


class Client(_Base):
    """Synchronous trainer client. Use as a context manager or call close()."""

    def __init__(self, *args, **kw):
        super().__init__(*args, **kw)
        self.ctx = zmq.Context.instance()
        self._new_socket(self.ctx)

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close(linger=0)
            self.sock = None

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _request(self, msg: P.Message, expect: tuple[type, ...], extra_s: float = 0.0):
        give_up = time.monotonic() + self.give_up_s + extra_s
        data = P.encode(msg, self.deployment)
        if self._moved():  # a controller started since the last request: go there first
            self._new_socket(self.ctx)
        while True:
            self.sock.send(data)
            deadline = min(time.monotonic() + self.timeout_s + extra_s, give_up)
            while (left := deadline - time.monotonic()) > 0:
                if not self.sock.poll(timeout=int(self._slice_s(left) * 1000) + 1):
                    if self._moved():
                        break  # a fresh socket to the new endpoint, the same message
                    continue
                reply = self._decode(self.sock.recv())
                got = reply and _match(msg, reply, expect)
                if got:
                    return got
            if time.monotonic() >= give_up:
                raise self._unavailable()
            self._new_socket(self.ctx)  # Lazy Pirate: fresh socket, same message

    def submit(self, tasks: Optional[list[str]] = None, n_per_task: int = 1,
               policy: Optional[int] = None, sampler: Optional[BandRequest] = None, *,
               key: Optional[str] = None) -> str:
        """Enqueue n_per_task rollouts of each task under policy version `policy`; the tasks
        are named (`tasks`) or picked by the controller's curriculum (`sampler`, e.g.
        `BandRequest(n_tasks=8, band=[0.2, 0.8], seed=1)`). Returns the batch id.

        `key` (e.g. f"{run}/step-{step}") names the batch: every submit with the same key
        gets the batch the first one made, whatever it asks (a trainer restarted inside or
        after `submit` gets its batch back instead of an orphan)."""
        msg = _submit(tasks, n_per_task, policy, sampler, key)
        return self._request(msg, (P.Submitted,)).batch_id

    def submit_from_band(self, curriculum, n: int, policy: int, rng) -> str:
        """N rollouts from the learning band of a curriculum the TRAINER holds:
        `curriculum.sample(n, rng, policy)` picks the task ids (band tasks plus an
        exploration share, see controller/taskbank/curriculum.py) and `submit` sends them, one rollout
        each. (`submit(sampler=BandRequest(...))` has the controller's curriculum pick.)"""
        return self.submit(curriculum.sample(n, rng, policy), 1, policy)

    def publish_policy(self, version: int, endpoint: str, model: str | None = None) -> None:
        self._request(_publish(version, endpoint, model), (P.Ack,))

    def cancel(self, batch_id: str, reason: str = "cancelled_by_trainer") -> int:
        """Cancel what is not finished of a batch; returns how many rollouts that was. `reason`:
        cancelled_by_trainer, deadline or shutdown (recorded on the rollouts and counted)."""
        msg = P.Cancel(idem=uuid.uuid4().hex, batch_id=batch_id, reason=reason)
        return self._request(msg, (P.Cancelled,)).rollouts

    def drain(self, node: str, deadline_s: float | None = None) -> None:
        self._request(P.DrainNode(node=node, deadline_s=deadline_s), (P.Ack,))

    def status(self) -> P.StatusReply:
        return self._request(P.Status(), (P.StatusReply,))

    def shutdown(self, reason: str = "") -> None:
        self._request(P.Shutdown(reason=reason), (P.Ack,))

    def results(self, batch_id: str, after: int = 0) -> Iterator[dict]:
        """Yield the batch's results (committed, dead-lettered, dropped) as they commit,
        each once, until the batch is done; only those after cursor `after` (a result's
        `cursor`: checkpoint it with what the result fed, resume from it)."""
        cursor = after
        while True:
            msg = P.Watch(batch_id=batch_id, after=cursor, wait_s=self.watch_wait_s)
            reply = self._request(msg, (P.Results,), extra_s=self.watch_wait_s)
            yield from _with_cursors(reply.items)
            cursor = reply.cursor
            if reply.done:
                return

    def wait(self, batch_id: str, n: int | None = None) -> list[dict]:
        """The first n results of the batch (all of them when n is None)."""
        out = []
        for item in self.results(batch_id):
            out.append(item)
            if n is not None and len(out) >= n:
                break
        return out


class AsyncClient(_Base):
    """asyncio trainer client: the same methods as Client, awaitable; results() is an
    async iterator (also spelled aresults())."""

    def __init__(self, *args, **kw):
        super().__init__(*args, **kw)
        self.ctx = zmq.asyncio.Context.instance()
        self._new_socket(self.ctx)

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close(linger=0)
            self.sock = None

    async def __aenter__(self) -> "AsyncClient":
        return self

    async def __aexit__(self, *exc) -> None:
        self.close()

    async def _request(self, msg: P.Message, expect: tuple[type, ...], extra_s: float = 0.0):
        loop = asyncio.get_running_loop()
        give_up = loop.time() + self.give_up_s + extra_s
        data = P.encode(msg, self.deployment)
        if self._moved():
            self._new_socket(self.ctx)
        while True:
            await self.sock.send(data)
            deadline = min(loop.time() + self.timeout_s + extra_s, give_up)
            while (left := deadline - loop.time()) > 0:
                if not await self.sock.poll(timeout=int(self._slice_s(left) * 1000) + 1):
                    if self._moved():
                        break
                    continue
                reply = self._decode(await self.sock.recv())
                got = reply and _match(msg, reply, expect)
                if got:
                    return got
            if loop.time() >= give_up:
                raise self._unavailable()
            self._new_socket(self.ctx)

    async def submit(self, tasks: Optional[list[str]] = None, n_per_task: int = 1,
                     policy: Optional[int] = None, sampler: Optional[BandRequest] = None, *,
                     key: Optional[str] = None) -> str:
        msg = _submit(tasks, n_per_task, policy, sampler, key)
        return (await self._request(msg, (P.Submitted,))).batch_id

    async def submit_from_band(self, curriculum, n: int, policy: int, rng) -> str:
        return await self.submit(curriculum.sample(n, rng, policy), 1, policy)

    async def publish_policy(self, version: int, endpoint: str, model: str | None = None) -> None:
        await self._request(_publish(version, endpoint, model), (P.Ack,))

    async def cancel(self, batch_id: str, reason: str = "cancelled_by_trainer") -> int:
        msg = P.Cancel(idem=uuid.uuid4().hex, batch_id=batch_id, reason=reason)
        return (await self._request(msg, (P.Cancelled,))).rollouts

    async def drain(self, node: str, deadline_s: float | None = None) -> None:
        await self._request(P.DrainNode(node=node, deadline_s=deadline_s), (P.Ack,))

    async def status(self) -> P.StatusReply:
        return await self._request(P.Status(), (P.StatusReply,))

    async def results(self, batch_id: str, after: int = 0) -> AsyncIterator[dict]:
        cursor = after
        while True:
            msg = P.Watch(batch_id=batch_id, after=cursor, wait_s=self.watch_wait_s)
            reply = await self._request(msg, (P.Results,), extra_s=self.watch_wait_s)
            for item in _with_cursors(reply.items):
                yield item
            cursor = reply.cursor
            if reply.done:
                return

    aresults = results

    async def wait(self, batch_id: str, n: int | None = None) -> list[dict]:
        out = []
        async for item in self.results(batch_id):
            out.append(item)
            if n is not None and len(out) >= n:
                break
        return out
