"""The harness's stream links (host side `sandboxlink._splice`, sandbox side `sbxlink._splice`)
pass a half-close on and keep the other direction open, like the sandbox relay: a client that
ends its request with shutdown(SHUT_WR) still reads the answer."""
from __future__ import annotations

import socket
import threading

import pytest

from nodeagent.harness import sandboxlink, sbxlink


def _answer_after_eof(server: socket.socket) -> None:
    got = b""
    while chunk := server.recv(100):
        got += chunk
    server.sendall(got.upper())
    server.close()


@pytest.mark.parametrize("splice", [sandboxlink._splice, sbxlink._splice], ids=["host", "sandbox"])
def test_a_half_closed_request_through_a_link_gets_its_answer(splice):
    client, near = socket.socketpair()
    far, server = socket.socketpair()
    splice(near, far)
    t = threading.Thread(target=_answer_after_eof, args=(server,))
    t.start()
    client.settimeout(10)
    client.sendall(b"the request, then the end")
    client.shutdown(socket.SHUT_WR)
    got = b""
    while chunk := client.recv(100):
        got += chunk
    t.join(10)
    assert got == b"THE REQUEST, THEN THE END"


@pytest.mark.parametrize("splice", [sandboxlink._splice, sbxlink._splice], ids=["host", "sandbox"])
def test_a_peer_that_goes_away_ends_both_directions(splice):
    client, near = socket.socketpair()
    far, server = socket.socketpair()
    splice(near, far)
    server.close()                  # the program behind the link died
    client.settimeout(10)
    assert client.recv(100) == b""  # the client sees the end instead of hanging
