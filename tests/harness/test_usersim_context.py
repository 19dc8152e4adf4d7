"""The model-played user cannot be turned into an infrastructure error by what the agent says
(red team s11 §4): what it reads of the agent is bounded, and a context overflow or a spent
user-session budget ends the conversation (graded on its state), never `user_sim` infra. The
user's model server is a fake on loopback (outside Paddock) that refuses, with llama.cpp's 400
body, any request over its context, estimated as the red team did."""
import json

import pytest

from controller.contracts.services import STOP_TOKEN
from nodeagent.gateway.session import GatewayBudgets, Session, Upstream
from nodeagent.harness.model import HTTPModel
from nodeagent.harness.usersim import ModelUser, UserSimError
from tests.conftest import FakeChatServer

GOAL = {"kind": "model", "model": "sim", "instruction": "Move R2002 to a later flight.", "opening": "Hi",
        "hidden": {"reservation_id": "R2002"}, "stop": {"max_turns": 12}}
CTX = 8192
AGENT_MESSAGE_CHARS = 2000        # what the user reads of one agent message (usersim.AGENT_MESSAGE_CHARS)


def _tokens(req) -> int:
    text = "".join(m["content"] for m in req["messages"])
    return sum(1 for c in text if ord(c) < 128) // 4 + sum(1 for c in text if ord(c) >= 128)


def _llama_cpp(ctx: int):
    def answer(req):
        n = _tokens(req)
        if n > ctx:
            return 400, json.dumps({"error": {"code": 400, "message": f"request ({n} tokens) exceeds the available "
                                              f"context size ({ctx} tokens)", "type": "exceed_context_size_error"}})
        return 200, "Which flights are there?"
    return answer


@pytest.fixture
def server():
    fake = FakeChatServer(_llama_cpp(CTX))
    yield fake
    fake.close()


@pytest.mark.parametrize("padding", ["\u4e00" * 20000, "pad " * 10000, "\U0001F600" * 30000])
def test_a_long_agent_message_is_answered_not_infra(server, padding):
    u = ModelUser(GOAL, HTTPModel(server.url))
    turn = u.reply("Which flight would you like? " + padding)
    assert not turn.stop and turn.content == "Which flights are there?"
    sent = server.requests[-1]["messages"][-1]["content"]
    assert len(sent) < AGENT_MESSAGE_CHARS + 200 and sent.startswith("Which flight would you like?")


def test_a_long_conversation_stays_within_the_users_context(server):
    u = ModelUser(GOAL, HTTPModel(server.url))
    for _ in range(10):
        assert not u.reply("\u4e00" * 5000).stop
    assert max(_tokens(r) for r in server.requests) <= CTX
    assert all(r["messages"][0]["role"] == "system" and r["messages"][1]["content"] == "Hi" for r in server.requests)


def test_an_overflow_the_server_still_reports_ends_the_conversation():
    fake = FakeChatServer(_llama_cpp(10))          # nothing fits: the agent's turn overflows it
    try:
        turn = ModelUser(GOAL, HTTPModel(fake.url)).reply("hello there, which flight?")
    finally:
        fake.close()
    assert turn.stop and STOP_TOKEN in turn.content


def test_a_spent_user_session_budget_ends_the_conversation(server):
    """The user session's token budget is spent by the agent's text: the conversation ends."""
    session = Session(Upstream(1, server.url, "sim"), GatewayBudgets(max_calls=100, max_tokens=10, wall_s=60.0),
                      source="user_sim")
    u = ModelUser(GOAL, session)                            # usage (1, 1) a call: 5 calls spend it
    try:
        turns = [u.reply("which flight?") for _ in range(8)]
    finally:
        session.close()
    assert not any(t.stop for t in turns[:5]) and turns[-1].stop and STOP_TOKEN in turns[-1].content


def test_a_failing_user_server_is_still_infrastructure():
    fake = FakeChatServer(lambda req: (500, "boom"))
    try:
        with pytest.raises(UserSimError, match="HTTP 500"):
            ModelUser(GOAL, HTTPModel(fake.url)).reply("which flight?")
    finally:
        fake.close()
