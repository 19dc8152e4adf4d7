"""The in-sandbox grader's report read on the host: its events parsed (`parse_report`), the
reported tests matched to the ones a check expects in SWE-bench's id forms (`match_outcomes`),
a test environment that cannot import a dependency told apart from the agent's own import
errors (`environment_error`), and the verdict (`grade_report`).

Must not import: zmq, controller, nodeagent.sandbox, nodeagent.agent.
"""
from __future__ import annotations

import json
import re

from nodeagent.verifier.verdicts import Verdict, VerifierInfraError
from nodeagent.verifier.verdicts import check as _check

_MISSING_MODULE = re.compile(r"ModuleNotFoundError: No module named '([\w.]+)'")


def _touches(detail: str, module: str, changed: set[str]) -> bool:
    """Whether a traceback names a file the agent changed, or the missing module is one."""
    for rel in changed:
        if rel.split("/")[0].removesuffix(".py") == module:
            return True
        if re.search(rf"(?<![\w/.-]){re.escape(rel)}|/work/{re.escape(rel)}", detail):
            return True
    return False


def environment_error(errors: list[dict], changed: set[str]) -> str | None:
    """A collection error the test environment caused, not the agent: a module that is not
    installed (`ModuleNotFoundError`), in a traceback that touches no file the agent changed,
    naming no module the agent changed (a dependency missing from the image). None when the
    agent may be at fault."""
    for e in errors:
        detail = str(e.get("detail", ""))
        m = _MISSING_MODULE.search(detail)
        if m and not _touches(detail, m.group(1).split(".")[0], changed):
            return f"{e.get('id')}: {m.group(0)}"
    return None


def match_outcomes(wanted: str, results: dict[str, list[str]]) -> list[str]:
    """Outcomes of the reported tests that test id `wanted` names, in SWE-bench's forms: the
    exact node id (`file::Class::test[p]`); a node id without parameters (every
    parametrisation); a name without the file (`test_x[3]`, `Class::test_x`), matched as the
    tail of a node id."""
    if wanted in results:
        return results[wanted]
    out: list[str] = []
    for rid, outs in results.items():
        base = rid.split("[", 1)[0]
        if base == wanted or rid.endswith("::" + wanted) or base.endswith("::" + wanted):
            out += outs
    return out


def parse_report(raw: bytes) -> tuple[dict, list[dict]]:
    """The grader's report and its events, or VerifierInfraError when it is malformed: not JSON,
    nested past the parser's depth, not an object, or events that are not a list of objects."""
    try:
        report = json.loads(raw)
        if not isinstance(report, dict):
            raise TypeError("the report is not an object")
        events = report["events"]
        if not isinstance(events, list) or not all(isinstance(e, dict) for e in events):
            raise TypeError("events is not a list of objects")
    except (ValueError, KeyError, TypeError, RecursionError) as exc:
        raise VerifierInfraError(f"malformed grader report: {exc}") from None
    return report, events


def grade_report(raw: bytes, expected: list[str], spec: dict, wall_s: float = 0.0,
                 changed: set[str] | None = None) -> Verdict:
    """Turn the grader's report into a verdict. Malformed → infra error; ended early → fail;
    a test environment that cannot import a dependency → infra error (`environment_error`)."""
    report, events = parse_report(raw)
    if report.get("malformed_lines") or report.get("forged_lines"):
        events = events + [{"ev": "tamper", "forged_lines": report.get("forged_lines", 0),
                            "malformed_lines": report.get("malformed_lines", 0)}]
    if report.get("truncated"):
        events = events + [{"ev": "tamper", "detail": "the event stream was flooded past its cap"}]
    kinds = [e.get("ev") for e in events]
    if "start" not in kinds:
        raise VerifierInfraError(f"pytest did not start in the verifier sandbox (exit {report.get('exit_code')})")
    results: dict[str, list[str]] = {}
    errors = []
    tamper = [e for e in events if e.get("ev") == "tamper"]
    for e in events:
        if e.get("ev") == "test" and isinstance(e.get("id"), str):
            results.setdefault(e["id"], []).append(str(e.get("outcome")))
        elif e.get("ev") == "collect_error":
            errors.append(f"collection error in {e.get('id')}: {str(e.get('detail', ''))[-300:]}")
    env = environment_error([e for e in events if e.get("ev") == "collect_error"], changed or set())
    if env is not None and not tamper:
        raise VerifierInfraError(f"the test environment cannot import a dependency: {env}")
    f2p = list(spec.get("fail_to_pass") or expected)
    outcomes = {t: match_outcomes(t, results) for t in set(f2p) | set(spec.get("pass_to_pass") or [])}
    passed = {t for t, outs in outcomes.items() if outs and all(o == "passed" for o in outs)}
    p2p = list(spec.get("pass_to_pass") or [])
    comp = {"fail_to_pass": sum(t in passed for t in f2p) / max(len(f2p), 1),
            "pass_to_pass": sum(t in passed for t in p2p) / max(len(p2p), 1) if p2p else 1.0}
    ended = "end" in kinds
    ok = ended and not tamper and all(t in passed for t in f2p + p2p)
    comp["correct"] = float(ok)
    if tamper:
        comp["tamper"] = 1.0
    why = [f"{len(passed & set(f2p + p2p))}/{len(set(f2p + p2p))} required tests passed"]
    if not ended:
        why.append(f"the test session ended early (exit {report.get('exit_code')}): the code under test "
                   "exited or killed pytest")
    if tamper:
        why.append(f"test framework tampered with: {tamper[0]}")
    missing = [t for t in f2p + p2p if not outcomes.get(t)]
    if missing:
        why.append(f"not run: {missing[:5]}")
    failed = [t for t in f2p + p2p if outcomes.get(t) and t not in passed]
    if failed:
        why.append(f"failed: {failed[:5]}")
    checks = [_check("pytest", "pass" if ok else "fail", "; ".join(why + errors[:2]), wall_s)]
    return Verdict("pass" if ok else "fail", float(ok), comp, checks, tampered=bool(tamper))
