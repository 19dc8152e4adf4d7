"""The `command` check: a custom command in a fresh sandbox of the rollout's image
(`verify_command`).

The sandbox (`nodeagent.verifier.freshbox`) holds the task's visible files and the agent's
changes; then the protected originals go back to /work and the spec's `support` files (hidden,
else visible) go under `/verifier/tests`, 0400 and owned by the sandbox's root (the checker). The
command runs under the in-sandbox runner (`cmdrunner.py` of this package, shipped as
`RUNNER_PATH`): a fresh HOME and environment (no Python user site, no shell start-up files of the
agent's), and the agent's programs the command starts -- through the image's interpreters, or
`paddock-callee` -- run under another uid (`CALLEE_UID`) that can neither read the support files
nor signal the checker. An image without `python3` runs the command without the runner (fresh
HOME, no user site; said in the check's detail; only when the runner's marker `STARTED` is
absent). The command's exit status decides
(`pass_exit_codes`, default [0]); killed at `timeout_s` it is a `timeout`. A command the image
cannot run (the runner says so with the check's nonce, exit 126/127; or the init, for an image
without python3), the runner failing to prepare (exit 125, with the nonce) or a support file the
task does not carry is a VerifierInfraError.

Must not import: zmq, controller.* outside contracts, nodeagent.agent, nodeagent.harness.loop,
nodeagent.verifier.grade, nodeagent.verifier.pytestcheck.
"""
from __future__ import annotations

import json
import secrets
from pathlib import Path
from typing import Callable

from controller.contracts.tasks import GradedTask
from nodeagent.sandbox.runtime import Change, SandboxError
from nodeagent.verifier.freshbox import (
    CHECK_TIMEOUT_S,
    OUTPUT_CAP,
    TESTS_DIR,
    as_bytes,
    callee_uid,
    fresh_sandbox,
)
from nodeagent.verifier.verdicts import Verdict, VerifierInfraError, check

RUNNER_PATH = "/verifier/paddock_cmdrun.py"
RUNNER_SOURCE = Path(__file__).with_name("cmdrunner.py").read_bytes()
NONCE_ENV = "PADDOCK_CMDRUN_NONCE"      # cmdrunner.NONCE_ENV (the runner is shipped as bytes, not imported)
STARTED = "/tmp/.paddock-bin/.started"   # written by the runner once it has prepared the check
HOME = "/tmp/.paddock-home"       # made by the runner: empty, the checker's (never /work, the agent's HOME)
# the environment of every check command: no HOME of the agent's, no Python user site
CHECK_ENV = {"HOME": HOME, "PYTHONNOUSERSITE": "1"}


def _runner_started(sb) -> bool:
    """Did the runner start (its marker, root's, in a directory only root writes)? Then a
    "cannot run python3" came from the command, not from an image without Python."""
    try:
        sb.read_file(STARTED, max_bytes=1)
        return True
    except SandboxError:
        return False


def public(rel: str) -> bool:
    """A support file of Paddock's own, readable by the agent's programs too (0444): the Harbor
    runner and its `paddock_site` (the sitecustomize the agent's Python programs load)."""
    return rel.split("/", 1)[0].startswith("paddock_")


def verify_command(runtime, image, layers: tuple, task: GradedTask, changes: list[Change],
                   clock: Callable[[], float]) -> Verdict:
    """The command's verdict (see the module docstring). Raises VerifierInfraError."""
    spec = task.checker
    sb = fresh_sandbox(runtime, image, layers, task, changes)
    try:
        support = {rel: task.hidden.get(rel, task.files.get(rel)) for rel in spec.support}
        missing = [rel for rel, text in support.items() if text is None]
        if missing:
            raise VerifierInfraError(f"task {task.name!r}: checker file {missing[0]!r} is in neither "
                                     f"'hidden' nor 'files'")
        files = {f"{TESTS_DIR}/{rel}": as_bytes(text) for rel, text in support.items()
                 if text is not None and not public(rel)}
        sb.write_files(files or {f"{TESTS_DIR}/.paddock": b""}, owner="agent", mode=0o400)
        system = {f"/work/{rel}": as_bytes(task.files[rel]) for rel in task.protected}
        system.update({f"{TESTS_DIR}/{rel}": as_bytes(text) for rel, text in support.items()
                       if text is not None and public(rel)})
        sb.write_files({**system, RUNNER_PATH: RUNNER_SOURCE}, owner="system", mode=0o444)
        nonce = secrets.token_hex(8)
        # the nonce goes in the runner's environment (readable by root only), never its argv:
        # /proc/<pid>/cmdline of the runner's broker is readable by the agent's programs
        config = json.dumps({"callee_uid": callee_uid(runtime), "tests_dir": TESTS_DIR})
        timeout_s = spec.timeout_s if spec.timeout_s is not None else CHECK_TIMEOUT_S
        t = clock()
        r = sb.exec(["python3", "-I", "-B", RUNNER_PATH, config, *spec.argv], cwd=spec.cwd,
                    env={**CHECK_ENV, NONCE_ENV: nonce},
                    output_cap=OUTPUT_CAP, timeout_s=timeout_s)
        note, bare = "", False
        if r.exit_code in (126, 127) and r.stderr.startswith(b"paddock: cannot run python3 ") \
                and not _runner_started(sb):
            note, bare = "(no python3 in the image: the command ran without the runner's callee uid)\n", True
            r = sb.exec(list(spec.argv), cwd=spec.cwd, env=CHECK_ENV, output_cap=OUTPUT_CAP,
                        timeout_s=max(timeout_s - (clock() - t), 1.0))
        wall = clock() - t
    except SandboxError as exc:
        raise VerifierInfraError(f"verifier sandbox failed: {exc}") from None
    finally:
        sb.destroy()
    if r.timed_out:
        return Verdict("timeout", 0.0, {"correct": 0.0}, [check("command", "timeout", "killed at the deadline", wall)])
    tail = (r.stdout + r.stderr).decode(errors="replace")[-1500:]
    # only the runner's own words, marked with the nonce no code of the agent's saw, are infrastructure
    # (the agent's program is free to print "paddock: cannot run ..." and exit 127)
    said = r.stderr.startswith(f"paddock-cmdrun[{nonce}]: ".encode())
    if r.exit_code == 125 and said:
        raise VerifierInfraError(f"the command check's runner failed: {r.stderr.decode(errors='replace')[:300]}")
    if r.exit_code in (126, 127) and (said or (bare and r.stderr.startswith(b"paddock: cannot run "))):
        raise VerifierInfraError(f"checker command cannot run: {r.stderr.decode(errors='replace')[:300]}")
    ok = r.exit_code in spec.pass_exit_codes
    return Verdict("pass" if ok else "fail", float(ok), {"correct": float(ok)},
                   [check("command", "pass" if ok else "fail", f"exit {r.exit_code}\n{note}{tail}", wall)])


__all__ = ["CHECK_ENV", "RUNNER_PATH", "verify_command"]
