"""The local farm run end to end, at a smaller count: real processes, ZeroMQ, sandboxes, Parquet."""
from __future__ import annotations

import json
import pwd
import subprocess

import pytest

from controller.analysis.query import connect, summary
from controller.demo.localrun import ConfigError, RunConfig, run_local
from controller.store.catalog import compaction_holder
from nodeagent.verifier.validate import validate_for_run
from slurm.clusterhost import RUNUSER
from tests.conftest import wait_for
from tests.farmprocs import FarmWatch
from tests.slurm_fixture import JOB_USER, REPO, USER_PYTHON

pytestmark = [pytest.mark.slow, pytest.mark.sandbox]

ROLLOUT_COLUMNS = {"run_id", "rollout_id", "attempt", "task_id", "task_family", "policy_version", "outcome",
                   "reward", "node", "started_at", "finished_at", "wall_s"}


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory, python_image):
    runs = tmp_path_factory.mktemp("runs")
    return run_local(validate=validate_for_run, cfg=RunConfig(versions=2, tasks_limit=16, runs_dir=str(runs), heartbeat_interval_s=0.5))


def test_every_requested_rollout_is_committed_once(run_dir):
    con = connect(run_dir)
    n, distinct = con.execute("SELECT count(*), count(DISTINCT rollout_id) FROM rollouts").fetchone()
    assert n == distinct == 2 * 16


def test_the_local_run_prebuilds_the_task_index_as_the_slurm_head_does(run_dir):
    """The controller opens the on-disk index (controller/store/taskindex.py) without building
    it: the run's assembler (controller/farm/assemble.py) wrote it before the controller started."""
    from controller.store.taskindex import index_path, open_index
    assert index_path(run_dir / "tasks.json").exists()
    assert "indexing the task set" not in (run_dir / "logs" / "controller.log").read_text()
    assert open_index(run_dir / "tasks.json").task_count() >= 16   # every task of the set, by reference


def test_rollouts_view_has_the_stable_columns(run_dir):
    cols = {d[0] for d in connect(run_dir).execute("SELECT * FROM rollouts LIMIT 0").description}
    assert ROLLOUT_COLUMNS <= cols


def test_both_node_agents_ran_rollouts_and_none_was_an_infra_error(run_dir):
    con = connect(run_dir)
    nodes = {r[0] for r in con.execute("SELECT DISTINCT node FROM rollouts").fetchall()}
    assert nodes == {"local-1", "local-2"}
    assert con.execute("SELECT count(*) FROM rollouts WHERE outcome = 'infra_error'").fetchone()[0] == 0


def test_cheats_never_score(run_dir):
    con = connect(run_dir)
    rows = con.execute("SELECT s.content, r.reward FROM rollouts r JOIN steps s USING (rollout_id, attempt) "
                       "WHERE s.step = 0").fetchall()
    plans = {}
    for content, reward in rows:
        plans.setdefault(content.splitlines()[0], []).append(reward)
    for plan, rewards in plans.items():
        if any(c in plan for c in ("edit_tests", "delete_tests", "fake_pass", "claim_passed", "peek")):
            assert set(rewards) == {0.0}, plan


def test_summary_counts_match_the_views(run_dir):
    s = summary(run_dir)
    assert s["rollouts"] == 32
    meta = json.loads((run_dir / "run.json").read_text())
    assert meta["taskset"] == "builtin-v1"


def test_invalid_config_names_the_key(tmp_path):
    bad = tmp_path / "cfg.yaml"
    bad.write_text("versions: 3\nslotz: 2\n")
    with pytest.raises(ConfigError, match="slotz"):
        RunConfig.load(str(bad), {})
    with pytest.raises(ConfigError, match="versions"):
        RunConfig.load(None, {"versions": 0})


def _bank_with_set(tmp_path, name="mine"):
    """A bank holding an imported set: three HumanEval-shaped tasks and two GSM8K-shaped ones."""
    from controller.contracts.tasks import TaskSet
    from controller.taskbank.bank import TaskBank
    from controller.taskbank.importers import import_source
    src = tmp_path / "he.jsonl"
    src.write_text("\n".join(json.dumps({
        "task_id": f"Mine/{i}", "entry_point": f"f{i}",
        "prompt": f'def f{i}(x: int) -> int:\n    """Return x + {i}."""\n',
        "canonical_solution": f"    return x + {i}\n",
        "test": f"def check(candidate):\n    assert candidate(1) == {1 + i}\n"}) for i in range(3)) + "\n")
    math = tmp_path / "gsm.jsonl"
    math.write_text("\n".join(json.dumps({"question": f"What is {i} + {i}?", "answer": f"{i}+{i}={2 * i}\n#### {2 * i}"})
                              for i in range(1, 3)) + "\n")
    tasks = import_source("humaneval", src) + import_source("math", math)
    bank = TaskBank(tmp_path / "bank")
    bank.put_set(TaskSet(name=name, tasks=tuple(tasks)))
    return bank, tasks


def test_the_local_run_plays_a_task_set_from_the_bank(tmp_path, python_image):
    bank, tasks = _bank_with_set(tmp_path)
    run_dir = run_local(validate=validate_for_run, cfg=RunConfig(versions=1, taskset="mine", bank=str(bank.root), runs_dir=str(tmp_path / "runs"),
                                  heartbeat_interval_s=0.5))
    con = connect(run_dir)
    names = {r[0] for r in con.execute("SELECT task_id FROM rollouts").fetchall()}
    assert names == {t.task_id for t in tasks}
    assert con.execute("SELECT count(*) FROM rollouts WHERE outcome = 'infra_error'").fetchone()[0] == 0
    assert json.loads((run_dir / "run.json").read_text())["taskset"] == "mine"


def test_a_task_set_the_local_run_cannot_play_is_refused_by_name(tmp_path):
    from dataclasses import replace

    from controller.contracts.tasks import TaskSet
    bank, tasks = _bank_with_set(tmp_path)
    with pytest.raises(ConfigError, match=r"'taskset'.*'nope' not found.*known sets: mine"):
        run_local(validate=validate_for_run, cfg=RunConfig(taskset="nope", bank=str(bank.root), runs_dir=str(tmp_path / "runs")))
    bank.put_set(TaskSet(name="repo", tasks=(replace(tasks[0], name="swe/x", family="swe"),)))
    with pytest.raises(ConfigError, match="plays python, math and conversational tasks; task set 'repo' also has swe"):
        run_local(validate=validate_for_run, cfg=RunConfig(taskset="repo", bank=str(bank.root), runs_dir=str(tmp_path / "runs")))
    bank.put_set(TaskSet(name="elsewhere", tasks=(replace(tasks[0], image="sha256:" + "0" * 64),)))
    with pytest.raises(ConfigError, match="image sha256:0000.* is not in the image store"):
        run_local(validate=validate_for_run, cfg=RunConfig(taskset="elsewhere", bank=str(bank.root), runs_dir=str(tmp_path / "runs")))


def test_an_exported_database_opens_in_plain_duckdb_with_the_same_views(run_dir, tmp_path):
    import subprocess
    import sys

    from controller.cli.main import build_parser
    out = tmp_path / "run.duckdb"
    args = build_parser().parse_args(["query", "--run", str(run_dir), "--export", str(out)])
    assert args.func(args) == 0
    sql = ("SELECT count(*), count(DISTINCT rollout_id), (SELECT count(*) FROM steps), "
           "(SELECT count(*) FROM bad_shards) FROM rollouts")
    want = list(connect(run_dir).execute(sql).fetchone())
    code = f"import duckdb, json; print(json.dumps(list(duckdb.connect({str(out)!r}, read_only=True).execute({sql!r}).fetchone())))"
    got = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert json.loads(got) == want and want[0] == 32
    assert not list(tmp_path.glob(".*tmp*"))


def test_the_controller_compacts_a_run_as_it_goes_and_nothing_is_lost_or_doubled(tmp_path, python_image):
    run_dir = run_local(validate=validate_for_run, cfg=RunConfig(versions=1, tasks_limit=16, compact_every=4, runs_dir=str(tmp_path / "runs"),
                                  heartbeat_interval_s=0.5))
    assert list((run_dir / "catalog").glob("compact-*.parquet")), (run_dir / "logs" / "compact.log").read_text()
    assert list((run_dir / "rollouts").glob("compact-*.parquet"))
    assert compaction_holder(run_dir) is None       # the run returned with no compaction running
    con = connect(run_dir)
    assert con.execute("SELECT count(*), count(DISTINCT rollout_id) FROM rollouts").fetchone() == (16, 16)
    assert con.execute("SELECT count(*) FROM bad_shards").fetchone()[0] == 0
    # every step row once: the count each rollout row records equals the rows the steps view has
    declared, stored = con.execute("SELECT (SELECT sum(steps) FROM rollouts), (SELECT count(*) FROM steps)").fetchone()
    assert declared == stored > 0


def test_compact_every_must_be_a_count():
    with pytest.raises(ConfigError, match="compact_every"):
        RunConfig(compact_every=-1)


def test_the_local_run_completes_as_an_ordinary_user_and_none_of_its_processes_is_root(job_user_dir, python_image):
    """`paddock run` as paddock-u1 (its own subordinate range, no cgroup delegation, the shared image
    store read-only to it): every rollout scored, no infra_error, and no process of the farm
    (controller, agents, policy server, node holders, sandbox inits) ever has a uid 0."""
    runs = job_user_dir / "runs"
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": f"/home/{JOB_USER}", "LANG": "C.UTF-8",
           "PYTHONPATH": str(REPO)}
    log = job_user_dir / "run.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([RUNUSER, "-u", JOB_USER, "--", USER_PYTHON, "-m", "controller.cli", "run",
                                 "--versions", "1", "--tasks-limit", "4", "--runs-dir", str(runs)],
                                env=env, cwd=job_user_dir, stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL)
    watch = FarmWatch(JOB_USER)
    try:
        # runuser itself (the test's tool, root) is the root of the tree, not part of the farm
        wait_for(lambda: watch.sample({proc.pid}, exclude_roots=True) or proc.poll() is not None, 180,
                 "the local run as an ordinary user to finish", interval_s=0.1)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, log.read_text()[-3000:]
    [run_dir] = [p for p in runs.iterdir() if p.is_dir()]
    con = connect(run_dir)
    assert con.execute("SELECT count(*), count(*) FILTER (outcome = 'infra_error') FROM rollouts").fetchone() == (4, 0)
    assert watch.as_root() == [], watch.describe(watch.as_root())
    assert len(watch.matching(r"controller\.cli controller ")) == 1
    assert len(watch.matching(r"controller\.cli agent ")) == 2
    assert watch.sandbox_side(), "no holder or sandbox process was seen: the census would prove nothing"
    uid = pwd.getpwnam(JOB_USER).pw_uid
    others = watch.foreign(uid)
    assert others == [], watch.describe(others)   # each one runs as the user or as one of its subordinate ids
