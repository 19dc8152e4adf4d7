"""The broker dispatches by one message table (type -> handler, built once with the class): every
message an agent or a trainer client sends has its handler, and only those; a type outside it is
refused as `unexpected_type` (tests/test_broker.py drives that over the real core)."""
from __future__ import annotations

import inspect

from controller.broker.core import _GREET_STRANGERS, BrokerCore
from controller.contracts import protocol as P

FROM_AGENTS = {P.Register, P.Ready, P.Heartbeat, P.Started, P.Result, P.ResultBatch, P.Release, P.Disconnect}
FROM_CLIENTS = {P.Submit, P.PublishPolicy, P.Cancel, P.DrainNode, P.Watch, P.Status, P.Shutdown}


def test_the_table_takes_what_agents_and_clients_send_and_nothing_else():
    assert set(BrokerCore.HANDLERS) == FROM_AGENTS | FROM_CLIENTS
    for kind in (P.Welcome, P.Lease, P.LeaseBatch, P.AckBatch, P.Ack, P.Reject, P.Drain, P.Refused,
                 P.PolicyUpdate, P.Submitted, P.Results, P.Cancelled, P.StatusReply):
        assert kind not in BrokerCore.HANDLERS, kind.TYPE


def test_each_handler_is_the_method_named_for_its_type():
    for kind, handler in BrokerCore.HANDLERS.items():
        assert handler is getattr(BrokerCore, f"_on_{kind.TYPE}"), kind.TYPE
        assert list(inspect.signature(handler).parameters)[:3] == ["self", "identity", "msg"]


def test_only_an_agents_messages_but_register_and_disconnect_greet_a_stranger():
    assert _GREET_STRANGERS == FROM_AGENTS - {P.Register, P.Disconnect}
