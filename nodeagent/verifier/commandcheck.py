"""The `command` check: a custom command in a fresh sandbox of the rollout's image
(`verify_command`).

The sandbox (`nodeagent.verifier.freshbox`) holds the task's visible files and the agent's
changes; then the protected originals go back to /work and the spec's `support` files (hidden,
else visible) go under `/verifier/tests`, read-only. The command's exit status decides
(`pass_exit_codes`, default [0]); killed at `timeout_s` it is a `timeout`. A command the image
cannot run (`paddock: cannot run ...`, exit 126/127) or a support file the task does not carry
is a VerifierInfraError.

Must not import: zmq, controller.* outside contracts, nodeagent.agent, nodeagent.harness.loop,
nodeagent.verifier.grade, nodeagent.verifier.pytestcheck.
"""
from __future__ import annotations

from typing import Callable

from controller.contracts.tasks import GradedTask
from nodeagent.sandbox.runtime import Change, SandboxError
from nodeagent.verifier.freshbox import CHECK_TIMEOUT_S, OUTPUT_CAP, TESTS_DIR, as_bytes, fresh_sandbox
from nodeagent.verifier.verdicts import Verdict, VerifierInfraError, check


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
        files = {f"{TESTS_DIR}/{rel}": as_bytes(text) for rel, text in support.items() if text is not None}
        files.update({f"/work/{rel}": as_bytes(task.files[rel]) for rel in task.protected})
        sb.write_files(files, owner="system", mode=0o444)
        t = clock()
        r = sb.exec(list(spec.argv), cwd=spec.cwd, output_cap=OUTPUT_CAP,
                    timeout_s=spec.timeout_s if spec.timeout_s is not None else CHECK_TIMEOUT_S)
        wall = clock() - t
    except SandboxError as exc:
        raise VerifierInfraError(f"verifier sandbox failed: {exc}") from None
    finally:
        sb.destroy()
    if r.timed_out:
        return Verdict("timeout", 0.0, {"correct": 0.0}, [check("command", "timeout", "killed at the deadline", wall)])
    tail = (r.stdout + r.stderr).decode(errors="replace")[-1500:]
    if r.exit_code in (126, 127) and r.stderr.startswith(b"paddock: cannot run "):
        raise VerifierInfraError(f"checker command cannot run: {r.stderr.decode(errors='replace')[:300]}")
    ok = r.exit_code in spec.pass_exit_codes
    return Verdict("pass" if ok else "fail", float(ok), {"correct": float(ok)},
                   [check("command", "pass" if ok else "fail", f"exit {r.exit_code}\n{tail}", wall)])


__all__ = ["verify_command"]
