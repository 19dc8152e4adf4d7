"""Atheris fuzz target for the grader's report path: the in-sandbox parent's event parser
(`grader_plugin._verified_events`: socket messages → signed events) and the host's
`grade.grade_report` (report.json → verdict).

Each input drives one of two cases:
1. *pipeline*: messages from the pytest child's pid or another sender, either a whole passing
   session whose events the fuzzer perturbs (`_session`), or a free mix of lines the harness
   signs with the parent's key (start, test results, end, tamper; sometimes with a wrong
   sequence number or a damaged signature) and fuzzed text (JSON fragments, nesting far past the
   parser's depth, unsigned look-alike events). The report is built as `grader_plugin.parent`
   builds it and graded.
2. *raw report*: a fuzzed report.json (any JSON shape, or bytes that are not JSON) graded directly.
Properties checked on every input: neither parser lets an exception escape (`grade_report` may
raise only VerifierInfraError); every accepted event is one the harness signed and sent from the
child's pid; a `pass` only for a report with start and end, no tamper event, no forged or
malformed line, not truncated, and every required test reported and passed (`_pass_is_earned`).
Run alone:  python tests/fuzz/fuzz_grader_report.py -atheris_runs=5000
(`tests/fuzz/test_report_fuzz.py` runs it for a bounded number of iterations in CI.)
Must not import zmq or the controller.
"""
from __future__ import annotations

import json
import sys

import atheris

with atheris.instrument_imports(include=["nodeagent.verifier.grade", "nodeagent.verifier.grader_plugin"]):
    from nodeagent.verifier import grade, grader_plugin

KEY = bytes(range(32))
CHILD_PID = 4242
IDS = ("test_hidden.py::test_check", "test_hidden.py::test_0", "test_hidden.py::test_1",
       "x::test_hidden.py::test_check", "test_hidden.py::test_0[1]", "test_0", "")
OUTCOMES = ("passed", "failed", "skipped", "error", "xfailed", None)
FRAGMENTS = ('{"ev": ', '{"ev": {"ev": "test", "id": ', '"mac": "', '"start"', '"end"', '"test"', '"tamper"',
             '"passed"', "}", "{", "[", "]", ",", ":", '"', "\\u0000", "\n", "null", "1e999", "-0", "NaN",
             '{"events": []}', '"events"', '"forged_lines"', '"truncated"', "DEEP")
SPECS = ({}, {"fail_to_pass": ["test_hidden.py::test_0"]},
         {"fail_to_pass": ["test_0"], "pass_to_pass": ["test_hidden.py::test_1"]},
         {"fail_to_pass": ["test_hidden.py::test_check"], "pass_to_pass": []})
EXPECTED = ["test_hidden.py::test_check"]


def _text(fdp: atheris.FuzzedDataProvider, n: int) -> str:
    parts = []
    for _ in range(fdp.ConsumeIntInRange(0, n)):
        if fdp.ConsumeBool():
            frag = FRAGMENTS[fdp.ConsumeIntInRange(0, len(FRAGMENTS) - 1)]
            parts.append("[" * 100_000 if frag == "DEEP" else frag)
        else:
            parts.append(fdp.ConsumeUnicodeNoSurrogates(fdp.ConsumeIntInRange(0, 12)))
    return "".join(parts)


def _event(fdp: atheris.FuzzedDataProvider) -> dict:
    kind = fdp.ConsumeIntInRange(0, 4)
    if kind == 0:
        return {"ev": "start"}
    if kind == 1:
        return {"ev": "end", "exit": fdp.ConsumeIntInRange(-2, 5)}
    if kind == 2:
        return {"ev": "tamper", "detail": _text(fdp, 2)}
    return {"ev": "test", "id": IDS[fdp.ConsumeIntInRange(0, len(IDS) - 1)],
            "when": ("setup", "call", "teardown")[fdp.ConsumeIntInRange(0, 2)],
            "outcome": OUTCOMES[fdp.ConsumeIntInRange(0, len(OUTCOMES) - 1)]}


def _messages(fdp: atheris.FuzzedDataProvider) -> tuple[list, list[str], bool]:
    """(messages as `_collect` returns them; the signed events sent from the child's pid, as
    canonical JSON; whether every line the parser will see is one of those, correctly signed)."""
    msgs, signed, good, seq = [], [], set(), 0
    for _ in range(fdp.ConsumeIntInRange(0, 8)):
        sender = CHILD_PID if fdp.ConsumeIntInRange(0, 9) < 8 else -1
        lines = []
        for _ in range(fdp.ConsumeIntInRange(0, 6)):
            if fdp.ConsumeIntInRange(0, 9) >= 3:
                ev = _event(fdp)
                body = json.dumps(ev, sort_keys=True)
                tweak = fdp.ConsumeIntInRange(0, 9)
                mac = grader_plugin._mac(KEY, seq + (tweak == 0), body)
                if tweak == 1:
                    mac = mac[:-1] + ("0" if mac[-1] != "0" else "1")
                lines.append(json.dumps({"ev": ev, "mac": mac}))
                if sender == CHILD_PID:
                    signed.append(body)
                    seq += tweak > 1
                    if tweak > 1:
                        good.add(lines[-1])
            else:
                lines.append(_text(fdp, 6))
        msgs.append((sender, "\n".join(lines).encode("utf-8", "surrogatepass")))
    clean = all(line in good for _s, data in msgs for line in data.decode("utf-8", "replace").splitlines())
    return msgs, signed, clean


def _required(spec: dict) -> list[str]:
    return list(spec.get("fail_to_pass") or EXPECTED) + list(spec.get("pass_to_pass") or [])


def _session(fdp: atheris.FuzzedDataProvider, spec: dict) -> tuple[list, list[str], bool]:
    """A whole passing session (start, every required test passed, end), one message per event
    as the plugin sends them, each perhaps perturbed: another sender, a wrong sequence number, a
    damaged signature, another outcome, dropped, or followed by a fuzzed line. Unperturbed (the
    fuzzer's zero), it is a genuine pass."""
    script = [{"ev": "start"}] + [{"ev": "test", "id": t, "when": "call", "outcome": "passed"}
                                  for t in _required(spec)] + [{"ev": "end", "exitstatus": 0}]
    msgs, signed, good, seq = [], [], set(), 0
    for ev in script:
        how = fdp.ConsumeIntInRange(0, 15)
        if how == 1:
            continue
        if how == 2 and ev["ev"] == "test":
            ev = {**ev, "outcome": OUTCOMES[fdp.ConsumeIntInRange(0, len(OUTCOMES) - 1)]}
        body = json.dumps(ev, sort_keys=True)
        mac = grader_plugin._mac(KEY, seq + (how == 3), body)
        if how == 4:
            mac = mac[:-1] + ("0" if mac[-1] != "0" else "1")
        sender = -1 if how == 5 else CHILD_PID
        line = json.dumps({"ev": ev, "mac": mac})
        if sender == CHILD_PID:
            signed.append(body)
            if how not in (3, 4):
                good.add(line)
                seq += 1
        extra = ("\n" + _text(fdp, 4)) if how == 6 else ""
        msgs.append((sender, (line + extra).encode("utf-8", "surrogatepass")))
    clean = all(line in good for _s, data in msgs for line in data.decode("utf-8", "replace").splitlines())
    return msgs, signed, clean


def _matches(rid: str, wanted: str) -> bool:
    base = rid.split("[", 1)[0]
    return rid == wanted or base == wanted or rid.endswith("::" + wanted) or base.endswith("::" + wanted)


def _pass_is_earned(raw: bytes, spec: dict) -> bool:
    """The oracle, written apart from grade_report: what a report must show to be a pass."""
    report = json.loads(raw)
    events = report["events"]
    kinds = [e.get("ev") for e in events]
    if "start" not in kinds or "end" not in kinds or "tamper" in kinds:
        return False
    if report.get("malformed_lines") or report.get("forged_lines") or report.get("truncated"):
        return False
    for wanted in _required(spec):
        outs = [e.get("outcome") for e in events if e.get("ev") == "test" and isinstance(e.get("id"), str)
                and _matches(e["id"], wanted)]
        if not outs or any(str(o) != "passed" for o in outs):
            return False
    return True


def _grade(raw: bytes, spec: dict) -> str | None:
    try:
        v = grade.grade_report(raw, EXPECTED, spec)
    except grade.VerifierInfraError:
        return None
    assert v.outcome in ("pass", "fail") and v.reward in (0.0, 1.0), v
    assert (v.outcome == "pass") == (v.reward == 1.0), v
    if v.outcome == "pass":
        assert _pass_is_earned(raw, spec), ("a report the oracle rejects was graded pass", raw[:2000])
    return v.outcome


def check_pipeline(fdp: atheris.FuzzedDataProvider) -> None:
    spec = SPECS[fdp.ConsumeIntInRange(0, len(SPECS) - 1)]
    msgs, signed, clean = _session(fdp, spec) if fdp.ConsumeBool() else _messages(fdp)
    events, bad, forged = grader_plugin._verified_events(msgs, KEY)
    assert isinstance(bad, int) and isinstance(forged, int)
    for ev in events:
        assert json.dumps(ev, sort_keys=True) in signed, ("an unsigned event was accepted", ev)
    report = {"grader": 2, "exit_code": 0, "events": events, "malformed_lines": bad, "forged_lines": forged,
              "truncated": False}
    outcome = _grade(json.dumps(report).encode(), spec)
    if outcome == "pass":
        assert clean, ("a pass with forged, unsigned or malformed lines in the stream", msgs)


def check_raw(fdp: atheris.FuzzedDataProvider) -> None:
    if fdp.ConsumeBool():
        raw = fdp.ConsumeBytes(fdp.ConsumeIntInRange(0, 200))
    else:
        events = ", ".join(json.dumps(_event(fdp)) if fdp.ConsumeBool() else _text(fdp, 3)
                           for _ in range(fdp.ConsumeIntInRange(0, 8)))
        tail = (", " + _text(fdp, 4)) if fdp.ConsumeBool() else ""
        raw = ('{"grader": 2, "exit_code": 0, "events": [' + events + "]" + tail + "}").encode("utf-8", "surrogatepass")
    _grade(raw, SPECS[fdp.ConsumeIntInRange(0, len(SPECS) - 1)])


def check_one(data: bytes) -> None:
    fdp = atheris.FuzzedDataProvider(data)
    (check_pipeline if fdp.ConsumeBool() else check_raw)(fdp)


def main(argv: list[str]) -> None:
    atheris.Setup(argv, check_one)
    atheris.Fuzz()


if __name__ == "__main__":
    main(sys.argv)
