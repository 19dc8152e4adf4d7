"""A service engine killed by the agent is the rollout's failure, never infrastructure (red team
s11 §5): in a real sandbox, the agent's root kills every process of the engine's uid; with a
shell among the agent's tools the operation is refused as tampering (the state checker fails
the rollout), without one (nothing of the agent runs there) it stays a SandboxError. An
engine that fails once (load) is run again. Deeply nested arguments are the call's error."""
import pytest

from nodeagent.sandbox.runtime import SandboxError, SandboxSpec
from nodeagent.services.host import SERVICE_UID, ServiceHost
from tests.conversational.test_services import COUNTER

KILLER = ("nohup setsid sh -c 'while :; do for p in /proc/[0-9]*; do [ \"$(stat -c %u $p 2>/dev/null)\" = "
          f"{SERVICE_UID} ] && kill -9 ${{p#/proc/}} 2>/dev/null; done; done' >/dev/null 2>&1 &")


@pytest.fixture
def sandbox(runtime, python_image):
    sb = runtime.create(SandboxSpec(image=python_image))
    yield sb
    sb.destroy()


def _start_killer(sb):
    """The agent's kill loop; the engine's start is slowed (a test's stand-in for load) so that
    the loop finds it whatever the machine's speed."""
    sb.write_files({"/usr/local/bin/python3": "#!/bin/sh\nsleep 2\nexec /usr/bin/python3 \"$@\"\n"},
                   owner="system", mode=0o755)
    r = sb.exec(["sh", "-c", KILLER], timeout_s=10)
    assert r.exit_code == 0, r.stderr


@pytest.mark.sandbox
def test_an_engine_the_agents_shell_kills_is_tampering_not_infra(sandbox):
    host = ServiceHost({"c": COUNTER}, sandbox)
    host.agent_has_shell = True
    assert host.call("bump", '{"by": 1}').observation == "1"            # the control, before the killer
    _start_killer(sandbox)
    out = host.call("bump", '{"by": 1}')
    assert out.error == "service_unavailable" and "nothing changed" in out.observation
    assert host.final_state() == {"c": {"n": 1}} and host.tampered and "signal" in host.tampered[0]


@pytest.mark.sandbox
def test_without_a_shell_a_killed_engine_stays_infrastructure(sandbox):
    host = ServiceHost({"c": COUNTER}, sandbox)                         # agent_has_shell defaults to False
    _start_killer(sandbox)                                              # (no agent code could have done it)
    with pytest.raises(SandboxError, match=r"engine failed in the sandbox \(exit"):
        host.call("bump", '{"by": 1}')
    assert host.tampered == []


@pytest.mark.sandbox
def test_an_engine_that_fails_once_is_run_again(sandbox):
    host = ServiceHost({"c": COUNTER}, sandbox)
    host.agent_has_shell = True
    # the first run finds a marker and dies as if killed by load; the second runs the engine
    sandbox.write_files({"/usr/local/bin/python3": "#!/bin/sh\nif [ ! -e /tmp/ran ]; then : > /tmp/ran; "
                         "kill -9 $$; fi\nexec /usr/bin/python3 \"$@\"\n"}, owner="system", mode=0o755)
    sandbox.exec(["sh", "-c", "chmod 1777 /tmp"], timeout_s=10)
    out = host.call("bump", '{"by": 1}')
    assert out.observation == "1" and host.tampered == [] and host.sandbox_ops == 2


@pytest.mark.parametrize("raw", ["[" * 30000 + "]" * 30000, '{"by": ' + "[" * 20000 + "]" * 20000 + "}",
                                 '{"by": ' + "[" * 40 + "]" * 40 + "}"])
def test_deeply_nested_arguments_are_the_calls_error(raw):
    host = ServiceHost({"c": COUNTER})
    out = host.call("bump", raw)
    assert out.error in ("malformed_json", "invalid_arguments") and host.final_state() == {"c": {"n": 0}}
