"""Canaries on real suites: for each unpacked sdist in $SDIST_DIR (its own tests), grade the
released source (the gold) twice in real sandboxes: without canaries (which tests pass) and with
canaries, the passing tests required (`fail_to_pass`: all of them, or a sample of
$F2P_SAMPLE with the rest as `pass_to_pass`). A canary-induced false negative shows as a test
that passed without canaries and fails with them, or as `tampered`. An empty conftest.py is
added at the root when there is none (the image would have the package installed). Not
collected by default; e.g.:

    mkdir -p /tmp/sd && cd /tmp/sd && for p in more-itertools==10.5.0 toolz==0.12.1 six==1.16.0 idna==3.7 tabulate==0.9.0 \
        parse==1.20.2 jmespath==1.0.1 simplejson==3.19.2 inflection==0.5.1; do \
        pip download -q --no-deps --no-binary :all: $p; done && for f in *.tar.gz; do tar xzf $f; done
    SDIST_DIR=/tmp/sd F2P_SAMPLE=5 python -m pytest -q -s -p no:cacheprovider tests/verifier/real_sdists.py
"""
import json
import os
import time
from pathlib import Path

from nodeagent.verifier import canaries as C
from nodeagent.verifier import grade as G
from nodeagent.verifier import pytestcheck as P

SD = Path(os.environ.get("SDIST_DIR", "/tmp/sd"))
TEXT = (".py", ".cfg", ".toml", ".ini", ".txt", ".rst", ".in", ".json", ".md")

def task_of(root, tests, f2p, p2p=()):
    files = {}
    for p in root.rglob("*"):
        if p.is_file() and p.suffix in TEXT and p.stat().st_size < 2_000_000:
            try:
                files[str(p.relative_to(root))] = p.read_text()
            except UnicodeDecodeError:
                pass
    files.setdefault("conftest.py", "")     # the repository root on sys.path (the image would have it installed)
    return {"name": f"swe/{root.name}", "family": "swe", "image": "builtin:python", "instruction": "x",
            "files": files, "hidden": {t: files[t] for t in tests},
            "checker": {"kind": "pytest", "tests": tests, "fail_to_pass": f2p, "pass_to_pass": list(p2p), "timeout_s": 900},
            "protected": [], "setup": [],
            "limits": {"memory_mb": 2048, "pids": 64, "disk_mb": 512, "cpu": 1.0, "nofile": 256}}

captured = {}
_translate = C.translate
def _capture(raw, plan):
    captured["raw"] = raw
    return _translate(raw, plan)
C.translate = _capture

def passing(raw):
    r = json.loads(raw)
    outs = {}
    for e in r["events"]:
        if e.get("ev") == "test":
            outs.setdefault(e["id"], []).append(e["outcome"])
    return sorted(i for i, o in outs.items() if all(x == "passed" for x in o))

def run(runtime, image, only=None):
    for root in sorted(p for p in SD.iterdir() if p.is_dir()):
        if only and root.name not in only:
            continue
        tests = sorted(str(p.relative_to(root)) for p in root.rglob("test*.py")
                       if p.name.startswith("test_") and "/." not in str(p))
        if not tests:
            print(f"{root.name}: no test files"); continue
        task = task_of(root, tests, [])
        plain = P.plant_canaries
        P.plant_canaries = lambda task, spec, changes=(): C.Plan()
        t = time.monotonic()
        try:
            v0 = G.verify(runtime, image, G.graded_task(task), [], None)
        except Exception as exc:
            print(f"{root.name}: no-canary run: {type(exc).__name__}: {str(exc)[:200]}"); P.plant_canaries = plain; continue
        finally:
            P.plant_canaries = plain
        t0 = time.monotonic() - t
        ok = passing(captured["raw"])
        if not ok:
            print(f"{root.name}: nothing passes without canaries: {v0.checks[-1]['detail'][:300]}"); continue
        sample = int(os.environ.get("F2P_SAMPLE", "0"))
        if sample:
            import random
            f2p = sorted(random.Random(root.name).sample(ok, min(sample, len(ok))))
            task = task_of(root, tests, f2p, [i for i in ok if i not in f2p])
        else:
            task = task_of(root, tests, ok)
        t = time.monotonic()
        v1 = G.verify(runtime, image, G.graded_task(task), [], None)
        t1 = time.monotonic() - t
        print(f"{root.name}: {len(ok)} passing tests without canaries ({t0:.1f}s); with canaries: {v1.outcome} "
              f"reward={v1.reward} tampered={v1.tampered} ({t1:.1f}s, {t1 / max(t0, 0.01):.1f}x) {v1.checks[-1]['detail'][:400]}", flush=True)

def test_real(runtime, python_image):
    run(runtime, python_image, os.environ.get("ONLY", "").split(",") if os.environ.get("ONLY") else None)
