"""A real ~38 MB instance through the whole farm: babel 2.14.0 (its PyPI source distribution,
the CLDR data included) with the U+00A0 parsing fix reverse-applied (tests/data/swe/instances.py),
imported with its own test-dependency image, validated (gold passes; no change and a wrong fix
fail), then run by `paddock run` and by a Slurm job with the scripted policy playing it from a
policy script (controller/demo/swe_policy.py): version 0 plays the wrong fix, version 1 the
gold one. DuckDB over the run's Parquet: no infra_error, reward 1 for the gold rollouts and 0 for
the wrong ones, and each rollout's diff is the one file the agent edited, not the repository.

The sdist is cached under the image store's tmp/sdists (as benchmarks/swe_task.py does), the
test image by recipe in the store, the repository layer by content: a second run rebuilds none.
"""
from __future__ import annotations

import json
import shutil
import subprocess
import tarfile
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from controller.analysis.query import connect
from controller.taskbank.bank import TaskBank
from layers.store import ImageStore
from tests.conftest import wait_for
from tests.data.swe import instances

pytestmark = [pytest.mark.slow, pytest.mark.sandbox,
              pytest.mark.skipif(shutil.which("mksquashfs") is None, reason="needs mksquashfs")]

SPEC = instances.INSTANCES["babel"]
SET = "babel"
# The agent runs the visible tests near the fix, writing no bytecode or cache into /work.
CHECK = ("PYTHONDONTWRITEBYTECODE=1 python3 -m pytest -q -p no:cacheprovider tests/test_numbers.py "
         "-k parse_decimal")
FIXED = "babel/numbers.py"
MAX_DIFF_BYTES = 128 * 1024          # the one edited file (~61 KB), not the 38 MB tree
JOB_DEADLINE_S = 420.0


def policy_script(task, wrong: str) -> dict:
    """The oracle the fake model reads outside the sandbox: the gold fix (from the instance's
    files, not from the task), a wrong one, nothing; version 0 wrong, version 1 gold."""
    gold = (instances.HERE / SPEC["gold"]).read_text()
    return {"tasks": {task.name: {"solve": {"patch": gold, "commands": [CHECK]},
                                  "wrong": {"patch": wrong, "commands": [CHECK]}, "null": {}}},
            "versions": ["wrong", "solve"]}


@pytest.fixture(scope="module")
def babel(tmp_path_factory, python_image):
    from controller.cli.main import main
    store = ImageStore(python_image.parent.parent)
    try:
        image = instances.test_image(store, python_image)
        sdist = instances.sdist_path(SPEC, store.root / "tmp" / "sdists")
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as exc:   # no package index
        pytest.skip(f"cannot fetch babel's sdist or the test dependencies: {exc!r:.300}")
    work = tmp_path_factory.mktemp("babel")
    repo, base = instances.make_repo(SPEC, sdist, work)
    (work / "swe.jsonl").write_text(json.dumps(instances.record(SPEC, repo, base, image)) + "\n")
    bank = work / "bank"
    t0 = time.monotonic()
    assert main(["tasks", "--bank", str(bank), "import", "swe", str(work / "swe.jsonl"), "--set", SET,
                 "--store", str(store.root), "--no-contamination"]) == 0
    print(f"babel import: {time.monotonic() - t0:.1f} s")
    [task] = TaskBank(bank).load_set(SET).tasks
    wrong = instances.wrong_patch(SPEC, repo)
    (work / "policy.json").write_text(json.dumps(policy_script(task, wrong)))
    return SimpleNamespace(store=store, bank=bank, task=task, repo=repo, base=base, wrong=wrong,
                           script=work / "policy.json", image=image, work=work)


def _task_dict(task) -> dict:
    return dict(task.canonical(), task_id=task.task_id)


def test_the_instance_is_one_layer_of_the_whole_repository_the_same_every_time(babel, tmp_path):
    from controller.taskbank.swe import scrubbed_checkout
    from layers.treelayer import ensure_tree_layer
    task = babel.task
    assert task.image == babel.image and len(task.layers) == 1 and task.files == {}
    tree = sum(p.stat().st_size for p in babel.repo.rglob("*") if p.is_file() and ".git" not in p.parts)
    assert tree > 30 * 2**20, f"the repository is {tree} bytes, not the ~38 MB instance"
    scrubbed_checkout(babel.repo, babel.base, tmp_path / "again")   # the same record, checked out again
    assert ensure_tree_layer(babel.store, tmp_path / "again", "/work")[0] == task.layers[0], \
        "the same record gives the same bytes, hence the same (reused) layer"


def test_gold_passes_and_doing_nothing_or_a_wrong_fix_fails(babel, runtime, python_image, capsys):
    from controller.cli.main import main
    from nodeagent.verifier.validate import validate_task
    v = validate_task(runtime, python_image, _task_dict(babel.task), quick=True)
    assert v.ok, v.reasons
    assert (v.cases["reference"]["outcome"], v.cases["null"]["outcome"]) == ("pass", "fail")
    (babel.work / "wrong.patch").write_text(babel.wrong)
    capsys.readouterr()
    assert main(["verify", "--task", babel.task.task_id, "--bank", str(babel.bank), "--image-store",
                 str(babel.store.root), "--solution", str(babel.work / "wrong.patch")]) == 1
    wrong = json.loads(capsys.readouterr().out)
    assert (wrong["outcome"], wrong["reward"], wrong["components"]["fail_to_pass"]) == ("fail", 0.0, 0.0)


def assert_rollouts(run_dir: Path, task, expect: int) -> None:
    """Every rollout committed with no infra_error; gold rewarded, wrong not; each diff is the
    one edited file with the variant's content."""
    con = connect(run_dir)
    rows = con.execute(
        "SELECT r.rollout_id, r.policy_version, r.outcome, r.reward, r.diff_files, r.diff_bytes, r.changes_path, "
        "split_part(s.content, chr(10), 1) FROM rollouts r JOIN steps s USING (rollout_id, attempt, fencing_token) "
        "WHERE s.step = 0 ORDER BY r.policy_version").fetchall()
    assert len(rows) == expect, rows
    assert con.execute("SELECT count(*) FROM rollouts WHERE outcome = 'infra_error'").fetchone()[0] == 0
    gold = task.hidden[f"gold/{FIXED}"]
    gold = gold.encode() if isinstance(gold, str) else gold
    for rid, version, outcome, reward, files, size, changes, plan in rows:
        want = {0: ("plan: wrong", "fail", 0.0), 1: ("plan: solve", "pass", 1.0)}[version]
        assert (plan, outcome, reward) == want, rid
        assert files == 1 and 0 < size <= MAX_DIFF_BYTES, (rid, files, size)
        with tarfile.open(run_dir / changes) as tf:
            [member] = [m for m in tf.getmembers() if m.isfile()]
            assert member.name.lstrip("/") == f"work/{FIXED}"
            data = tf.extractfile(member).read()
        assert (data == gold) == (version == 1), "the gold rollout's file is the gold post-image"


def test_paddock_run_plays_the_instance_from_the_policy_script(babel, tmp_path):
    from controller.cli.main import main
    runs = tmp_path / "runs"
    t0 = time.monotonic()
    assert main(["run", "--taskset", SET, "--bank", str(babel.bank), "--policy-script", str(babel.script),
                 "--versions", "2", "--rollouts-per-task", "2", "--runs-dir", str(runs)]) == 0
    print(f"paddock run: {time.monotonic() - t0:.1f} s")
    [run_dir] = [p for p in runs.iterdir() if p.is_dir()]
    assert_rollouts(run_dir, babel.task, expect=4)
    rate = dict(connect(run_dir).execute(
        "SELECT policy_version, avg((outcome = 'pass')::INT) FROM rollouts GROUP BY 1").fetchall())
    assert rate == {0: 0.0, 1: 1.0}


def test_paddock_run_refuses_the_swe_set_without_a_policy_script(babel, tmp_path, capsys):
    from controller.cli.main import main
    assert main(["run", "--taskset", SET, "--bank", str(babel.bank), "--runs-dir", str(tmp_path)]) == 2
    assert "--policy-script" in capsys.readouterr().err


@pytest.mark.slurm
def test_a_slurm_job_plays_the_instance_on_two_nodes(babel, slurm_cluster, job_user_dir):
    """The het batch script as the ordinary user paddock-u1: the bank and the policy script on
    its storage, the image and layer read from the shared store, two environment nodes."""
    from tests.slurm.test_sbatch import give_to_user, job_components, logs, submit
    bank = job_user_dir / "bank"
    shutil.copytree(babel.bank, bank)
    script = job_user_dir / "policy.json"
    shutil.copy(babel.script, script)
    give_to_user(bank), give_to_user(script)
    t0 = time.monotonic()
    job_id, run_dir = submit(slurm_cluster, job_user_dir, layout="het", taskset=SET, bank=str(bank),
                             policy_script=str(script), versions=2, rollouts_per_task=2, tasks_limit=0,
                             time_limit="15", agents_wait_s=180, controller_wait_s=180)
    done = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL")
    try:
        comps = wait_for(lambda: (c := job_components(slurm_cluster, job_id)) and all(x["JobState"] in done for x in c)
                         and c, JOB_DEADLINE_S, f"job {job_id} to end", interval_s=1.0)
    except AssertionError as exc:
        subprocess.run(["scancel", job_id], env=slurm_cluster.env)
        raise AssertionError(f"{exc}\n" + logs(job_user_dir)) from None
    print(f"slurm job {job_id}: {time.monotonic() - t0:.1f} s")
    assert [c["JobState"] for c in comps] == ["COMPLETED", "COMPLETED"], logs(job_user_dir)
    assert_rollouts(run_dir, babel.task, expect=4)
    nodes = {r[0] for r in connect(run_dir).execute("SELECT DISTINCT node FROM rollouts").fetchall()}
    assert nodes and all(n.startswith("node") for n in nodes), nodes
