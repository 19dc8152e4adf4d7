"""Grading outside the agent's reach.

After the agent stops, its changes under /work (from the sandbox's `diff()`) are checked
against the task's protected files by hash (any change or deletion is tampering: reward 0),
then a *fresh* sandbox is created from the same image, the agent's files are applied, the
protected originals and the hidden tests are added read-only (owned by the namespace root,
not the sandbox's uid) and the checker runs there under its own timeout. Answers (math,
exact, regex) are checked outside any sandbox.

Outcomes: pass / fail (reward 1 / 0), or `VerifierInfraError` (the sandbox could not start,
the report is missing): never scored as 0. Must not import zmq or the controller.
"""
from __future__ import annotations

import hashlib
import secrets
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from nodeagent import checkers
from nodeagent.sandbox import Change, SandboxError, SandboxRuntime, SandboxSpec

VERIFIER_VERSION = "v1"
CHECK_TIMEOUT_S = 60.0


class VerifierInfraError(Exception):
    """The verifier could not reach a verdict for reasons that are not the policy's fault."""


@dataclass
class Verdict:
    outcome: str                    # pass | fail
    reward: float
    components: dict = field(default_factory=dict)
    checks: list[dict] = field(default_factory=list)
    tampered: bool = False
    verify_s: float = 0.0


def _sha(data: bytes | str) -> str:
    return hashlib.sha256(data.encode() if isinstance(data, str) else data).hexdigest()


def agent_files(changes: list[Change]) -> dict[str, bytes | None]:
    """Final state of /work as the agent left it: relative path -> bytes (None if deleted)."""
    out: dict[str, bytes | None] = {}
    for c in changes:
        if c.path.startswith("/work/") and c.kind in ("added", "modified", "deleted"):
            out[c.path[len("/work/"):]] = c.data if c.kind != "deleted" else None
    return out


def check_protected(task: dict, final: dict[str, bytes | None]) -> list[dict]:
    checks = []
    for rel in task.get("protected", ()):
        want = _sha(task["files"][rel])
        got = final.get(rel)
        verdict = "ok" if got is not None and _sha(got) == want else "tampered"
        detail = "deleted" if got is None else ("unchanged" if verdict == "ok" else "content changed")
        checks.append({"check": f"protected:{rel}", "verdict": verdict, "detail": detail, "wall_s": 0.0})
    return checks


def verify(runtime: SandboxRuntime, image: Path, task: dict, changes: list[Change], answer: str | None,
           clock: Callable[[], float] = time.monotonic) -> Verdict:
    t0 = clock()
    checker = task["checker"]
    final = agent_files(changes)
    checks = check_protected(task, final)
    tampered = any(c["verdict"] == "tampered" for c in checks)
    if tampered:
        v = Verdict("fail", 0.0, {"tamper": 1.0, "correct": 0.0}, checks, tampered=True)
    elif checker["kind"] == "pytest":
        v = _verify_pytest(runtime, image, task, final, checks, clock)
    else:
        t = clock()
        ok = {"math": checkers.math_equal, "exact": checkers.exact_match,
              "regex": checkers.regex_match}[checker["kind"]](checker["answer"], answer)
        checks.append({"check": checker["kind"], "verdict": "pass" if ok else "fail",
                       "detail": f"extracted={checkers.extract_answer(answer)!r}"[:500], "wall_s": clock() - t})
        v = Verdict("pass" if ok else "fail", float(ok), {"correct": float(ok)}, checks)
    v.verify_s = clock() - t0
    return v


def _verify_pytest(runtime, image, task, final, checks, clock) -> Verdict:
    report = f"/tmp/.report-{secrets.token_hex(8)}.xml"
    files = {rel: data for rel, data in final.items() if data is not None}
    try:
        sb = runtime.create(SandboxSpec(image=image, limits=dict(task.get("limits") or {}), files=files,
                                        hostname="verifier"))
    except SandboxError as exc:
        raise VerifierInfraError(f"verifier sandbox failed to start: {exc}") from None
    try:
        system = {f"/work/{rel}": task["files"][rel] for rel in task.get("protected", ())}
        system.update({f"/work/{rel}": text for rel, text in task["hidden"].items() if rel.startswith("test")})
        sb.write_files(system, owner="system", mode=0o444)
        tests = list(task["checker"]["tests"])
        t = clock()
        r = sb.exec(["python3", "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={report}", *tests],
                    timeout_s=float(task.get("checker", {}).get("timeout_s", CHECK_TIMEOUT_S)), output_cap=16384)
        wall = clock() - t
        if r.timed_out:
            checks.append({"check": "pytest", "verdict": "timeout", "detail": "tests exceeded their time limit",
                           "wall_s": wall})
            return Verdict("fail", 0.0, {"correct": 0.0}, checks)
        try:
            xml = sb.read_file(report)
        except SandboxError:
            xml = b""
    except SandboxError as exc:
        raise VerifierInfraError(f"verifier sandbox failed: {exc}") from None
    finally:
        sb.destroy()
    passed, total, detail = _junit_counts(xml)
    out = (r.stdout + r.stderr).decode(errors="replace")[-1500:]
    if total == 0:
        if r.exit_code in (0, 5) and not xml:
            detail = "pytest exited without a report"
        checks.append({"check": "pytest", "verdict": "fail", "detail": f"{detail}; exit {r.exit_code}\n{out}",
                       "wall_s": wall})
        return Verdict("fail", 0.0, {"correct": 0.0}, checks)
    ok = passed == total and r.exit_code == 0
    checks.append({"check": "pytest", "verdict": "pass" if ok else "fail",
                   "detail": f"{passed}/{total} passed; exit {r.exit_code}" + ("" if ok else f"\n{out}"),
                   "wall_s": wall})
    return Verdict("pass" if ok else "fail", float(ok), {"correct": float(ok), "tests_passed": passed / total},
                   checks)


def _junit_counts(xml: bytes) -> tuple[int, int, str]:
    if not xml:
        return 0, 0, "no test report"
    try:
        root = ET.fromstring(xml)
    except ET.ParseError as exc:
        return 0, 0, f"unreadable test report: {exc}"
    suites = [root] if root.tag == "testsuite" else root.findall("testsuite")
    total = sum(int(s.get("tests", 0)) for s in suites)
    bad = sum(int(s.get("failures", 0)) + int(s.get("errors", 0)) + int(s.get("skipped", 0)) for s in suites)
    return total - bad, total, "report read"
