"""The `webstate` checker: grade a web task by the state its app was left in.

The agent's sandbox is gone when this runs. What the attempt captured (`state_changes`: the
app's database file, read by the sandbox's file operation, and the app's audit key) comes in
as the rollout's changes; the starting database's digest is recomputed here from the task's
hidden `seed.sql` (never taken from the capture). In a fresh sandbox of the task's image, as
in-sandbox uid 1000 in a 0700 directory:

1. the database is written there; when a check reads a page, the app serves it read-only;
2. `shop.py evaluate` verifies the audit chain (HMAC under the key) and that the tables hash to
   its last digest: a database changed by anything but the app is **tampered** (reward 0,
   `tampered` set), never graded;
3. the task's checks run: SQL `SELECT`s over the database (opened read-only) compared with
   their expected rows, and page checks (log in as a user, fetch a page, read the element with
   an id: user strings are escaped, so no review or name can forge one).

Pass when every check holds. What the evaluator repeats of the state (each check's `got`,
the failing check's `detail`) is bounded (`shop.ECHO_CHARS`, `ECHO_CHARS` here) and its reply
is read with its own cap (`OUTPUT_CAP`): the agent's strings cannot make it unreadable. A
sandbox that fails, an evaluator that dies or answers garbage, or missing captured state are
`WebStateError` (a `VerifierInfraError`: retried, never a score). Whether such a failure
reproduces without the agent is decided by the verifier's baseline (`nodeagent.verifier.baseline`,
through `Watched.create`): a web task's null solution is its **initial state** (the database
built from `seed.sql` alone, `initial_changes`, as `baseline.null_changes` gives it), graded
the same way; when that reaches a verdict, the failure was the agent's state's and the rollout
is `fail`. `verify_webstate` takes the typed task (`controller.contracts.tasks.GradedTask`, its
checker spec's `checks` and `timeout_s`) and returns the `Verdict`.
Must not import: zmq, controller.* outside contracts, nodeagent.agent, nodeagent.verifier.grade.
"""
from __future__ import annotations

import json
import tempfile
import time
from typing import Callable

from controller.contracts.tasks import GradedTask
from nodeagent.browser.apps import shop
from nodeagent.browser.session import APP_UID, BrowserStartError, app_files, launch
from nodeagent.sandbox.runtime import Change, SandboxError, SandboxRuntime, SandboxSpec
from nodeagent.verifier.verdicts import Verdict, VerifierInfraError
from nodeagent.verifier.verdicts import check as _check

STATE_DIR = "/.paddock-web"           # where the captured state sits among the rollout's changes
DB_CHANGE = f"{STATE_DIR}/app.db"
KEY_CHANGE = f"{STATE_DIR}/state.json"
GRADE_DIR = "/tmp/pdk-grade"
GRADE_PORT = 8090
GRADE_LIMITS = {"memory_mb": 512, "pids": 128, "disk_mb": 128, "nofile": 512}
EVAL_TIMEOUT_S = 60.0
OUTPUT_CAP = 1 << 20            # the evaluator's reply (bounded by its echo caps far below this)
ECHO_CHARS = 300                # what a check row here repeats of a value


class WebStateError(VerifierInfraError):
    """No verdict for reasons that are not the policy's."""


def as_bytes(content: str | bytes) -> bytes:
    return content if isinstance(content, bytes) else content.encode()


def state_changes(state: dict) -> list[Change]:
    """The captured state (`BrowserSession.capture`) as the rollout's changes."""
    meta = json.dumps({"key_hex": state["key_hex"]}).encode()
    return [Change(STATE_DIR, "dir", None, 0o700), Change(DB_CHANGE, "added", state["db"], 0o600),
            Change(KEY_CHANGE, "added", meta, 0o600)]


INITIAL_KEY_HEX = "00" * 32      # the initial state has no audit rows: its key signs nothing


def initial_changes(seed_sql: str) -> list[Change]:
    """The task's initial state as a rollout's captured state: the app's database built from the
    schema and `seed_sql` alone (no audit row), what a rollout that did nothing would leave."""
    with tempfile.TemporaryDirectory() as d:
        shop.init_db(f"{d}/app.db", seed_sql)
        with open(f"{d}/app.db", "rb") as f:
            db = f.read()
    return state_changes({"db": db, "key_hex": INITIAL_KEY_HEX})


def _captured(changes: list[Change]) -> tuple[bytes, str]:
    got = {c.path: c.data for c in changes if c.kind in ("added", "modified")}
    if DB_CHANGE not in got or KEY_CHANGE not in got:
        raise WebStateError("the rollout carries no captured web state (database and key)")
    try:
        key_hex = json.loads(got[KEY_CHANGE])["key_hex"]  # type: ignore[arg-type]  # no data: TypeError, caught
        bytes.fromhex(key_hex)
    except (ValueError, KeyError, TypeError):
        raise WebStateError("the captured web state's key is malformed") from None
    return got[DB_CHANGE] or b"", key_hex


def verify_webstate(runtime: SandboxRuntime, image, task: GradedTask, changes: list[Change],
                    clock: Callable[[], float] = time.monotonic) -> Verdict:
    """The verdict of a web task's captured state (module docstring); raises WebStateError."""
    t = clock()
    spec = task.checker
    seed_sql = as_bytes(task.hidden.get("seed.sql", "")).decode()
    db, key_hex = _captured(changes)
    seed_digest = shop.seed_digest(seed_sql)
    db_path = f"{GRADE_DIR}/app.db"
    needs_page = any("page" in c for c in spec.checks)
    try:
        sb = runtime.create(SandboxSpec(image=image, limits=dict(GRADE_LIMITS)))
    except SandboxError as exc:
        raise WebStateError(f"grading sandbox: {exc}") from None
    try:
        r = sb.exec(["sh", "-c", f'umask 077 && mkdir -p {GRADE_DIR} && cat > {db_path}'], stdin=db,
                    timeout_s=30, cwd="/tmp", uid=APP_UID)
        if r.exit_code != 0:
            raise WebStateError(f"writing the captured database: {r.stderr.decode(errors='replace')[-500:]}")
        if needs_page:
            config = {"db": db_path, "port": GRADE_PORT, "key_hex": key_hex, "seed_sql": "",
                      "seed_digest": seed_digest, "ready_file": f"{GRADE_DIR}/ready"}
            launch(sb, APP_UID, GRADE_DIR, app_files(config),
                   ["python3", f"{GRADE_DIR}/shop.py", "serve", f"{GRADE_DIR}/config.json"], f"{GRADE_DIR}/ready", 30)
        req = {"db": db_path, "key_hex": key_hex, "seed_digest": seed_digest, "port": GRADE_PORT,
               "checks": list(spec.checks)}
        files = app_files({})
        r = sb.exec(["python3", "-c", _EVAL_MAIN], stdin=json.dumps({"source": files["shop.py"], "req": req}).encode(),
                    timeout_s=spec.timeout_s if spec.timeout_s is not None else EVAL_TIMEOUT_S, cwd="/tmp", uid=APP_UID,
                    output_cap=OUTPUT_CAP)
    except (SandboxError, BrowserStartError, ValueError) as exc:     # ValueError: a database past stdin's cap
        raise WebStateError(f"grading sandbox: {exc}") from None
    finally:
        sb.destroy()
    wall = clock() - t
    if r.timed_out:
        return Verdict("timeout", 0.0, {"correct": 0.0}, [_check("webstate", "timeout", "the evaluator timed out", wall)])
    try:
        out = json.loads(r.stdout.decode().strip().splitlines()[-1])
        verdict, detail = out["verdict"], str(out["detail"])
    except (ValueError, IndexError, KeyError, TypeError):
        raise WebStateError(f"the web state evaluator answered no verdict (exit {r.exit_code}"
                            f"{', its reply cut at the cap' if r.truncated else ''}): "
                            f"{(r.stderr or r.stdout).decode(errors='replace')[-300:]}") from None
    detail = _bound(detail, 2000)
    if verdict == "tampered":
        return Verdict("fail", 0.0, {"tamper": 1.0, "correct": 0.0}, [_check("webstate", "tampered", detail, wall)],
                       tampered=True)
    if verdict == "error":
        raise WebStateError(f"task {task.name!r}: {detail}")
    checks = [_check(f"webstate:{c['check']}"[:200], "pass" if c["ok"] else "fail",
                     f"got {_bound(repr(c['got']))}, expected {_bound(repr(c['expect']))}") for c in out.get("checks", [])]
    ok = verdict == "pass"
    return Verdict("pass" if ok else "fail", float(ok), {"correct": float(ok)},
                   checks + [_check("webstate", "pass" if ok else "fail", detail, wall)])


def _bound(text: str, limit: int = ECHO_CHARS) -> str:
    return text if len(text) <= limit else f"{text[:limit]}... [{len(text)} characters]"


# The evaluator's entry point in the grading sandbox: the app module's source arrives on stdin
# with the request (no file the grading run did not write is imported).
_EVAL_MAIN = r"""
import json, sys, types
data = json.load(sys.stdin)
mod = types.ModuleType("shop")
exec(compile(data["source"], "shop.py", "exec"), mod.__dict__)
print(json.dumps(mod.evaluate(data["req"])))
"""

__all__ = ["DB_CHANGE", "KEY_CHANGE", "WebStateError", "initial_changes", "state_changes", "verify_webstate"]
