"""`paddock launch` (slurm/launch.py) driven as an ordinary user, for tests/slurm/test_launch.py: run as
`runuser -u paddock-u1 -- /opt/paddock/venv/bin/python -c <this file's text>` with SLURM_CONF
and PYTHONPATH in its environment, so submitit's sbatch and sacct calls are the user's own. JSON
lines on stdin, one JSON line answered on stdout for each:

    {"op": "launch", "params": {...}}          -> {"job_id": "12", "run_dir": "/tmp/..."}
    {"op": "state"}                            -> {"state": "RUNNING"}
    {"op": "wait", "timeout_s": 120, "poll_s": 0.5} -> {"state": "COMPLETED"}
    {"op": "results"}                          -> {"results": [0, 0, 0]}
    {"op": "quit"}
An exception becomes {"error": "<type>: <message>"}. Not a test module (no test_ prefix); imports
only slurm.launch and the standard library.
"""
from __future__ import annotations

import json
import sys

from slurm.launch import launch


def say(obj) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def main() -> None:
    handle = None
    for line in sys.stdin:
        req = json.loads(line)
        try:
            if req["op"] == "launch":
                handle = launch(req["params"])
                say({"job_id": handle.job_id, "run_dir": str(handle.run_dir)})
            elif req["op"] == "state":
                say({"state": handle.state()})
            elif req["op"] == "wait":
                say({"state": handle.wait(timeout_s=req["timeout_s"], poll_s=req["poll_s"])})
            elif req["op"] == "results":
                say({"results": handle.job.results()})
            elif req["op"] == "quit":
                break
        except Exception as exc:  # noqa: BLE001 - reported to the test, which asserts on it
            say({"error": f"{type(exc).__name__}: {exc}"})


if __name__ == "__main__":
    main()
