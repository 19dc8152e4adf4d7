"""Batch scripts (slurm/sbatch.py) and the job steps (slurm/jobsteps.py).

Pure parts: golden files (the example scripts in slurm/) pin the rendered scripts (regenerate with PADDOCK_UPDATE_GOLDEN=1 and
review the diff), parameters are validated with the valid ones listed, hostile paths stay data.
Real parts: the rendered scripts are submitted with sbatch to the in-test cluster (three nodes,
each in its own network and UTS namespace) and run the scripted-policy training loop. They are
submitted by the ordinary user paddock-u1 (its own `sbatch`, its run directory, the interpreter
every user can run, the shared image store read-only to it), and no process of the farm — head,
controller, policy server, trainer, agents, node holders, sandbox inits — ever runs as root.
"""
from __future__ import annotations

import json
import os
import re
import shlex
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from slurm.sbatch import ParamError, load_job_file, render, time_limit_s, valid_parameters
from tests.conftest import wait_for
from tests.farmprocs import FarmWatch
from tests.slurm_fixture import JOB_USER, USER_PYTHON, job_env

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = ROOT / "slurm"          # the example batch scripts are the golden files
GOLDEN_PARAMS = dict(run_dir="/scratch/paddock/runs/exp-1", env_nodes=4, time_limit="02:00:00",
                     partition="cpu", account="rl-team", python="/opt/paddock/.venv/bin/python",
                     versions=8, slots_per_node=8, head_cpus=4, agent_cpus=16, signal_before_s=300)
TERMINAL = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL"}
JOB_DEADLINE_S = 120.0


# ------------------------------------------------------------------ rendering (pure)
@pytest.mark.parametrize("layout", ["het", "single"])
def test_rendered_script_matches_its_golden_file(layout):
    text = render(dict(GOLDEN_PARAMS, layout=layout))
    golden = GOLDEN / f"{layout}.sbatch"
    if os.environ.get("PADDOCK_UPDATE_GOLDEN"):
        golden.parent.mkdir(parents=True, exist_ok=True)
        golden.write_text(text)
    assert text == golden.read_text()


def test_a_rendered_script_with_your_trainer_and_task_set_matches_its_golden_file():
    text = render(dict(GOLDEN_PARAMS, layout="het", taskset="swe-lite", bank="/scratch/paddock/bank",
                       trainer="/opt/paddock/.venv/bin/python train.py --lr 1e-6 --out \"$HOME/ckpt\""))
    golden = GOLDEN / "het-trainer.sbatch"
    if os.environ.get("PADDOCK_UPDATE_GOLDEN"):
        golden.write_text(text)
    assert text == golden.read_text()


GPU_JOB = ROOT / "slurm" / "examples" / "gpu-job.yaml"


def test_the_gpu_cluster_job_description_renders_its_golden_file():
    """trainer on 4 GPUs, two inference replicas on GPU nodes, a judge, three farm nodes."""
    text = render(load_job_file(str(GPU_JOB)))
    golden = GPU_JOB.with_suffix(".sbatch")
    if os.environ.get("PADDOCK_UPDATE_GOLDEN"):
        golden.write_text(text)
    assert text == golden.read_text()


def _het_components(text: str) -> list[list[str]]:
    """The #SBATCH options of each heterogeneous component, in order."""
    comps, cur = [], []
    for line in text.splitlines():
        if line == "#SBATCH hetjob":
            comps.append(cur)
            cur = []
        elif line.startswith("#SBATCH --"):
            cur.append(line.removeprefix("#SBATCH "))
    return comps + [cur]


def test_each_component_gets_its_own_node_type_and_every_step_its_cpus_and_gpus():
    text = render(load_job_file(str(GPU_JOB)))
    comps = _het_components(text)
    assert len(comps) == 4                                   # trainer, farm, inference, judge
    trainer, farm, inference, judge = comps
    assert {"--nodes=1", "--gpus-per-node=4", "--cpus-per-task=32", "--mem=480G", "--partition=gpu",
            "--qos=high", "--constraint=h100", "--account=rl-team"} <= set(trainer)
    assert {"--nodes=3", "--cpus-per-task=64", "--partition=cpu"} <= set(farm)
    assert not any(o.startswith(("--gpus", "--gres")) for o in farm)
    assert {"--nodes=2", "--gpus-per-node=8", "--partition=gpu"} <= set(inference)
    assert {"--nodes=1", "--gres=gpu:a100:2", "--partition=gpu-a100"} <= set(judge)
    steps = [ln for ln in text.splitlines() if ln.startswith("srun ")]
    assert len(steps) == 4
    for line in steps:        # srun may not inherit --cpus-per-task (22.05-23.02): every step names it
        assert re.search(r"--cpus-per-task=\d+", line), line
    by_group = {re.search(r"--het-group=(\d)", ln).group(1): ln for ln in steps}
    assert "--gpus-per-node=4" in by_group["0"] and "job head" in by_group["0"]
    assert "--cpus-per-task=64" in by_group["1"] and "job agent" in by_group["1"]
    assert "--gpus-per-node=8" in by_group["2"] and "job server --component inference" in by_group["2"]
    assert "--gres=gpu:a100:2" in by_group["3"] and "job server --component judge" in by_group["3"]
    assert "--servers inference=2,judge=1" in by_group["0"]


def test_the_same_keys_work_on_the_command_line():
    words = ["run_dir=/scratch/r", "env_nodes=3", "trainer.gpus_per_node=4", "inference.nodes=2",
             "inference.gpus_per_node=1", "inference.command=serve --port $PADDOCK_SERVER_PORT"]
    cp = subprocess.run([sys.executable, "-m", "controller.cli", "sbatch", "render", *words],
                        capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=str(ROOT)), cwd=ROOT)
    assert cp.returncode == 0, cp.stderr
    comps = _het_components(cp.stdout)
    assert "--gpus-per-node=4" in comps[0] and "--gpus-per-node=1" in comps[2]


@pytest.mark.parametrize("extra, key", [
    ({"trainer.gpus": 4}, "'trainer.gpus'"),                              # unknown key (gpus_per_node is the key)
    ({"cache.nodes": 1}, "'cache.nodes'"),                                # unknown component
    ({"trainer.nodes": 2}, "'trainer.nodes'"),                            # the head is one node
    ({"judge.gpus_per_node": 2, "judge.gres": "gpu:2", "judge.nodes": 1, "judge.command": "x"}, "'judge.gres'"),
    ({"inference.nodes": 2}, "'inference.command'"),                      # a server without its command
    ({"inference.command": "vllm serve m"}, "'inference.nodes'"),         # a command on no nodes
    ({"farm.command": "x"}, "'farm.command'"),
    ({"trainer.mem": "lots"}, "'trainer.mem'"),
    ({"trainer.time": "03:00:00"}, "'trainer.time'"),                    # above the job's 02:00:00
    ({"inference.nodes": 1, "inference.command": "x", "inference.health": "health"}, "'inference.health'"),
    ({"farm.cpus_per_task": 0}, "'farm.cpus_per_task'"),
    ({"farm.nodes": 7}, "'farm.nodes'"),                                  # differs from env_nodes=4
    ({"layout": "single", "trainer.gpus_per_node": 4}, "'farm.gpus_per_node'"),   # one node type only
    ({"trainer.partition": "bad partition"}, "'trainer.partition'"),
    ({"trainer.mem": "8G"}, "'farm.mem'"),                                # sbatch would carry 8G over to farm
    ({"inference.nodes": 1, "inference.command": "x", "inference.ready_wait_s": 7000}, "'inference.ready_wait_s'"),
])
def test_an_impossible_component_is_refused_naming_its_key(extra, key):
    with pytest.raises(ParamError) as e:
        render(dict(GOLDEN_PARAMS, **extra))
    assert key in str(e.value)
    assert "gpus_per_node" in str(e.value) and "cpus_per_task" in str(e.value)   # the valid keys listed


def test_a_job_file_with_an_unknown_key_is_refused_naming_it(tmp_path):
    f = tmp_path / "job.yaml"
    f.write_text("run_dir: /r\nenv_nodes: 2\ncomponents:\n  inference:\n    nodes: 1\n    gpu: 1\n")
    with pytest.raises(ParamError, match=r"'inference.gpu'"):
        render(load_job_file(str(f)))
    f.write_text("- not a mapping\n")
    with pytest.raises(ParamError, match="must be a mapping"):
        load_job_file(str(f))


def test_single_layout_places_each_component_on_its_own_slice_of_the_nodes():
    text = render(dict(GOLDEN_PARAMS, layout="single", **{"inference.nodes": 2, "inference.command": "srv"}))
    assert "#SBATCH --nodes=7" in text                       # 1 + 4 + 2
    assert '--nodelist="$(nodes_of 1 4)"' in text and '--nodelist="$(nodes_of 5 2)"' in text


def test_a_hostile_trainer_command_reaches_the_head_as_one_literal_argument():
    hostile = "python t.py; touch pwned $(id) `id` 'q' \"dq\" & *"
    text = render({"run_dir": "/r", "env_nodes": 2, "trainer": hostile, "taskset": "mine", "bank": "/b b"})
    [line] = [ln for ln in text.splitlines() if " job head " in ln]
    argv = shlex.split(line.rstrip("\\"))
    assert argv[argv.index("--trainer") + 1] == hostile
    assert argv[argv.index("--bank") + 1] == "/b b" and argv[argv.index("--taskset") + 1] == "mine"


def test_het_layout_runs_the_head_in_component_0_and_one_agent_per_node_in_component_1():
    text = render(dict(GOLDEN_PARAMS, layout="het"))
    assert "#SBATCH hetjob" in text
    assert re.search(r"^srun --het-group=0 .* job head ", text, re.M)
    assert re.search(r"^srun --het-group=1 --nodes=4 --ntasks-per-node=1 .* job agent ", text, re.M)
    assert "#SBATCH --signal=B:TERM@300" in text


def test_unknown_parameter_is_refused_with_the_list_of_valid_ones():
    with pytest.raises(ParamError, match="unknown batch parameter 'nodes'") as e:
        render({"run_dir": "/r", "env_nodes": 2, "nodes": 3})
    assert valid_parameters() in str(e.value) and "env_nodes" in str(e.value)


@pytest.mark.parametrize("bad, name", [
    ({"layout": "mesh"}, "layout"), ({"env_nodes": 0}, "env_nodes"), ({"env_nodes": "2"}, "env_nodes"),
    ({"time_limit": "1:2"}, "time_limit"), ({"signal": "KILL"}, "signal"),
    ({"run_dir": "relative/run"}, "run_dir"), ({"run_dir": "/runs/a\nb"}, "run_dir"),
    ({"partition": "gpu;rm"}, "partition"), ({"controller_wait_s": 3600}, "controller_wait_s"),
    ({"min_agents": 3}, "min_agents"), ({"signal_before_s": 4000}, "signal_before_s"),
    ({"taskset": "mine"}, "bank"), ({"taskset": "a/b", "bank": "/b"}, "taskset"),
    ({"taskset": "mine", "bank": "bank"}, "bank"), ({"trainer": "a\nb"}, "trainer"),
])
def test_invalid_parameter_is_named_and_the_valid_ones_listed(bad, name):
    with pytest.raises(ParamError, match=f"'{name}'") as e:
        render({"run_dir": "/r", "env_nodes": 2, **bad})
    assert "valid parameters: run_dir, env_nodes" in str(e.value)


def test_missing_required_parameter_is_named():
    with pytest.raises(ParamError, match="missing batch parameter 'env_nodes'"):
        render({"run_dir": "/r"})


def test_time_limits_in_slurm_formats():
    assert [time_limit_s(t) for t in ("30", "01:00:00", "1-00:00:00", "0:90:00", "x")] == [1800, 3600, 86400, None, None]


def test_hostile_run_dir_stays_one_literal_path_in_the_shell(tmp_path):
    hostile = tmp_path / "it's a $(touch pwned); `touch pwned2` \"q\" & *"
    text = render({"run_dir": str(hostile), "env_nodes": 2, "python": "/bin/py thon"})
    subprocess.run(["bash", "-n"], input=text, text=True, check=True)
    preamble = text.split("\nsrun ")[0]          # settings and the writability check, no srun
    cp = subprocess.run(["bash", "-c", preamble + '\nprintf "%s\\n%s" "$RUN_DIR" "$PY"'],
                        capture_output=True, text=True, cwd=tmp_path)
    assert cp.returncode == 0, cp.stderr
    assert cp.stdout == f"{hostile}\n/bin/py thon"
    assert (hostile / "logs").is_dir()
    assert not list(tmp_path.glob("pwned*"))


def test_script_stops_with_a_clear_error_when_the_run_directory_is_not_writable(tmp_path):
    text = render({"run_dir": "/proc/paddock-run", "env_nodes": 2})
    cp = subprocess.run(["bash", "-c", text], capture_output=True, text=True, cwd=tmp_path,
                        env={k: v for k, v in os.environ.items() if not k.startswith("SLURM_")})
    assert cp.returncode == 2
    assert "run directory /proc/paddock-run is not writable" in cp.stderr


def test_sbatch_render_cli_prints_a_script_or_names_the_bad_parameter():
    ok = subprocess.run([sys.executable, "-m", "controller.cli", "sbatch", "render", "run_dir=/r", "env_nodes=3",
                         "layout=single"], capture_output=True, text=True, cwd=ROOT)
    assert ok.returncode == 0 and "#SBATCH --nodes=4" in ok.stdout
    bad = subprocess.run([sys.executable, "-m", "controller.cli", "sbatch", "render", "run_dir=/r", "env_nodes=3",
                          "slots=4"], capture_output=True, text=True, cwd=ROOT)
    assert bad.returncode == 2 and "'slots'" in bad.stderr and "slots_per_node" in bad.stderr


# ------------------------------------------------------------------ job steps without Slurm
def agent_step(run_dir: Path, deployment: str, wait_s: float) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "controller.cli", "job", "agent", "--run-dir", str(run_dir),
                           "--deployment", deployment, "--image-store", "/var/tmp/paddock/images",
                           "--controller-wait-s", str(wait_s)], capture_output=True, text=True, cwd=ROOT,
                          timeout=wait_s + 30)


def test_agent_gives_up_with_a_clear_message_when_the_controller_never_comes_up(tmp_path):
    t0 = time.monotonic()
    cp = agent_step(tmp_path, "slurm-1", 1.0)
    assert cp.returncode == 3
    assert "no controller endpoint" in cp.stderr and "not on storage shared" in cp.stderr
    assert time.monotonic() - t0 < 20


@pytest.mark.parametrize("job, words", [
    ({"deployment": "slurm-99", "agent_version": None}, "deployment 'slurm-99'"),
    ({"deployment": "slurm-1", "agent_version": "0.0.0-other"}, "agent version"),
])
def test_agent_of_another_deployment_or_version_is_refused(tmp_path, job, words):
    from nodeagent.agent.version import AGENT_VERSION
    job = dict(job, agent_version=job["agent_version"] or AGENT_VERSION)
    (tmp_path / "job.json").write_text(json.dumps(job))
    (tmp_path / "controller.endpoint").write_text("tcp://127.0.0.1:1")
    cp = agent_step(tmp_path, "slurm-1", 5.0)
    assert cp.returncode == 3 and words in cp.stderr


@pytest.mark.sandbox
def test_head_gives_up_with_a_clear_message_when_too_few_agents_register(tmp_path, python_image):
    cp = subprocess.run([sys.executable, "-m", "controller.cli", "job", "head", "--run-dir", str(tmp_path / "run"),
                         "--deployment", "slurm-7", "--image-store", str(python_image.parents[1]),
                         "--agents", "2", "--agents-wait-s", "1", "--bind-addr", "127.0.0.1"],
                        capture_output=True, text=True, cwd=ROOT, timeout=90)
    assert cp.returncode == 3, cp.stderr
    assert "only 0 of 2 node agents registered within 1s" in cp.stderr
    assert json.loads((tmp_path / "run" / "job.json").read_text())["deployment"] == "slurm-7"


def test_the_head_validates_the_task_set_as_paddock_run_does_and_serves_no_quarantined_task(tmp_path, python_image):
    from controller.contracts.tasks import Task, TaskSet
    from controller.farm.assemble import load_taskset
    from controller.taskbank.bank import TaskBank
    good = load_taskset("builtin", "").by_name()["math/lcm_12_18"]
    broken = Task(name="math/broken", family="math", instruction="What is 2+2?",
                  hidden={"answer.txt": "5"}, checker={"kind": "math", "answer": "4"})
    bank = TaskBank(tmp_path / "bank")
    bank.put_set(TaskSet(name="two", tasks=(good, broken)))
    run = tmp_path / "run"
    cp = subprocess.run([sys.executable, "-m", "controller.cli", "job", "head", "--run-dir", str(run),
                         "--deployment", "slurm-8", "--image-store", str(python_image.parents[1]),
                         "--taskset", "two", "--bank", str(bank.root),
                         "--agents", "1", "--agents-wait-s", "1", "--bind-addr", "127.0.0.1"],
                        capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert cp.returncode == 3, cp.stderr           # no agent came: it gave up, after validating
    q = json.loads((run / "quarantine.json").read_text())
    assert list(q) == ["math/broken"] and "reference solution does not pass" in q["math/broken"]["reasons"][0]
    assert json.loads((run / "run.json").read_text())["served_tasks"] == 1
    assert "quarantined 1" in cp.stdout


def test_head_refuses_a_run_directory_it_cannot_write():
    from slurm.jobsteps import JobStepError, check_run_dir
    with pytest.raises(JobStepError, match="not writable"):
        check_run_dir(Path("/proc/paddock-run"))


# ------------------------------------------------------------------ the real thing on the in-test cluster
def slurm_out(cluster, *argv: str) -> str:
    cp = subprocess.run(argv, env=cluster.env, capture_output=True, text=True, timeout=30)
    assert cp.returncode == 0, f"{argv}: {cp.stderr}"
    return cp.stdout


def give_to_user(path: Path) -> None:
    """chown -R to the job user what the test prepared for it (a task bank, a script)."""
    pw = __import__("pwd").getpwnam(JOB_USER)
    for p in [path, *path.rglob("*")]:
        os.chown(p, pw.pw_uid, pw.pw_gid, follow_symlinks=False)


def submit(cluster, tmp_path: Path, **params) -> tuple[str, Path]:
    """Render the script into the job user's directory `tmp_path` and submit it as that user."""
    run_dir = tmp_path / "run"
    p = dict(run_dir=str(run_dir), env_nodes=2, time_limit="10", python=USER_PYTHON, versions=1,
             tasks_limit=8, heartbeat_interval_s=0.5, controller_wait_s=90, agents_wait_s=90,
             signal_before_s=60, slots_per_node=2)
    p.update(params)
    script = tmp_path / "job.sh"
    script.write_text(render(p))
    give_to_user(script)
    cp = subprocess.run(cluster.job_argv(["sbatch", "--parsable", "-o", str(tmp_path / "slurm-%j.out"), str(script)]),
                        env=job_env(cluster), capture_output=True, text=True, timeout=30, cwd=tmp_path)
    assert cp.returncode == 0, f"sbatch as {JOB_USER}: {cp.stderr}"
    return cp.stdout.strip().split(";")[0], run_dir


def job_components(cluster, job_id: str) -> list[dict]:
    out = slurm_out(cluster, "scontrol", "show", "job", "-o", job_id)
    return [dict(re.findall(r"(\w+)=(\S*)", line)) for line in out.splitlines() if line.strip()]


def wait_job(cluster, job_id: str, tmp_path: Path, watch: FarmWatch | None = None) -> list[dict]:
    """The job's components once all are done; meanwhile each poll takes a census of its processes."""
    deadline = time.monotonic() + JOB_DEADLINE_S
    while True:
        comps = job_components(cluster, job_id)
        if watch is not None:
            watch.sample_job({c["JobId"] for c in comps} | {job_id})
        if comps and all(c["JobState"] in TERMINAL for c in comps):
            return comps
        if time.monotonic() > deadline:
            subprocess.run(["scancel", job_id], env=cluster.env)
            raise AssertionError(f"job {job_id} not done after {JOB_DEADLINE_S}s: {comps}\n"
                                 + logs(tmp_path))
        time.sleep(0.2)


def logs(tmp_path: Path) -> str:
    parts = []
    for f in sorted(tmp_path.glob("slurm-*.out")) + sorted((tmp_path / "run" / "logs").glob("*.log")):
        parts.append(f"--- {f.name}\n" + "\n".join(f.read_text(errors="replace").splitlines()[-25:]))
    return "\n".join(parts)



def committed(run_dir: Path) -> int:
    try:
        con = sqlite3.connect(f"file:{run_dir / 'controller.db'}?mode=ro", uri=True, timeout=5)
        try:
            return con.execute("SELECT count(*) FROM rollouts WHERE state = 'committed'").fetchone()[0]
        finally:
            con.close()
    except sqlite3.Error:
        return 0


def _cmdline(pid: str) -> bytes:
    """A process's command line; b"" for one that is gone meanwhile (sandboxes come and go)."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def wait_no_strays(cluster, timeout_s: float) -> None:
    """Every process of the job has left the nodes; the failure names what stayed."""
    try:
        wait_for(lambda: not stray_processes(cluster), timeout_s, "job processes to leave the nodes")
    except AssertionError as exc:
        raise AssertionError(f"{exc}: {stray_processes(cluster)}") from None


def stray_processes(cluster) -> dict[str, list[str]]:
    """Processes other than slurmd/slurmstepd left in the nodes' namespaces."""
    out = {}
    for host, ns in cluster.netns.items():
        cp = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True)
        names = []
        for pid in cp.stdout.split():
            try:
                names.append(Path(f"/proc/{pid}/comm").read_text().strip())
            except OSError:
                continue
        stray = [n for n in names if n not in ("slurmd", "slurmstepd", "sleep")]
        if stray:
            out[host] = stray
    return out


def assert_no_farm_process_ran_as_root(watch: FarmWatch, agents: int) -> None:
    assert watch.as_root() == [], "farm processes with a uid 0:\n" + watch.describe(watch.as_root())
    # the interpreters themselves (srun's command lines name them too)
    assert len(watch.matching(r"^\S+ -m controller\.cli job head ")) == 1
    assert len(watch.matching(r"^\S+ -m controller\.cli controller ")) == 1
    assert len(watch.matching(r"^\S+ -m controller\.cli job agent ")) == agents
    assert watch.sandbox_side(), "no holder or sandbox process seen: the census would prove nothing"
    uid = __import__("pwd").getpwnam(JOB_USER).pw_uid
    others = watch.foreign(uid)
    assert others == [], watch.describe(others)


def paddock_mounts() -> list[str]:
    return [ln for ln in Path("/proc/mounts").read_text().splitlines() if "paddock" in ln]


@pytest.mark.slurm
@pytest.mark.sandbox
def test_het_job_trains_on_two_environment_nodes_and_completes_leaving_nothing(slurm_cluster, job_user_dir, python_image):
    from controller.analysis.query import connect
    tmp_path = job_user_dir
    mounts_before = paddock_mounts()
    job_id, run_dir = submit(slurm_cluster, tmp_path, layout="het")
    watch = FarmWatch(JOB_USER)
    comps = wait_job(slurm_cluster, job_id, tmp_path, watch)
    assert [c["JobState"] for c in comps] == ["COMPLETED", "COMPLETED"], logs(tmp_path)
    assert comps[0]["ExitCode"] == "0:0"
    env_nodes = set(slurm_out(slurm_cluster, "scontrol", "show", "hostnames", comps[1]["NodeList"]).split())
    con = connect(run_dir)
    n, distinct = con.execute("SELECT count(*), count(DISTINCT rollout_id) FROM rollouts").fetchone()
    assert n == distinct == 8
    assert {r[0] for r in con.execute("SELECT DISTINCT node FROM rollouts").fetchall()} == env_nodes
    assert len(env_nodes) == 2
    assert con.execute("SELECT count(*) FROM rollouts WHERE outcome = 'infra_error'").fetchone()[0] == 0
    assert {p.stem for p in (run_dir / "health").glob("*.jsonl")} == env_nodes
    assert_no_farm_process_ran_as_root(watch, agents=2)
    wait_no_strays(slurm_cluster, 15)
    assert paddock_mounts() == mounts_before


@pytest.mark.slurm
@pytest.mark.sandbox
def test_single_layout_job_survives_a_killed_agent_with_nothing_lost_or_doubled(slurm_cluster, job_user_dir, python_image):
    tmp_path = job_user_dir
    from controller.analysis.query import connect
    job_id, run_dir = submit(slurm_cluster, tmp_path, layout="single", versions=1, tasks_limit=10,
                             slots_per_node=3)
    wait_for(lambda: committed(run_dir) >= 2, 60, "the first committed rollouts")
    comps = job_components(slurm_cluster, job_id)
    hosts = slurm_out(slurm_cluster, "scontrol", "show", "hostnames", comps[0]["NodeList"]).split()
    victim = hosts[-1]                                  # an environment node (the head is on hosts[0])
    victim_ns = slurm_cluster.netns[victim]
    pids = subprocess.run(["ip", "netns", "pids", victim_ns], capture_output=True, text=True).stdout.split()
    agents = [int(p) for p in pids if b"job\0agent" in _cmdline(p)]
    assert len(agents) == 1, f"agent processes on {victim}: {agents}"
    killed_at = time.time()
    os.kill(agents[0], signal.SIGKILL)
    comps = wait_job(slurm_cluster, job_id, tmp_path, watch := FarmWatch(JOB_USER))
    assert comps[0]["JobState"] == "COMPLETED", logs(tmp_path)
    con = connect(run_dir)
    n, distinct = con.execute("SELECT count(*), count(DISTINCT rollout_id) FROM rollouts").fetchone()
    assert n == distinct == 10
    survivors = con.execute("SELECT count(*) FROM rollouts WHERE node <> ? AND epoch(started_at) > ?",
                            [victim, killed_at]).fetchone()[0]
    assert survivors > 0
    assert watch.as_root() == [], watch.describe(watch.as_root())   # no farm process ran as root
    wait_no_strays(slurm_cluster, 15)


@pytest.mark.slurm
@pytest.mark.sandbox
def test_end_of_time_signal_drains_agents_and_every_committed_rollout_is_stored(slurm_cluster, job_user_dir, python_image):
    tmp_path = job_user_dir
    from controller.analysis.query import connect
    job_id, run_dir = submit(slurm_cluster, tmp_path, layout="het", versions=4, tasks_limit=16)
    wait_for(lambda: committed(run_dir) >= 2, 60, "the first committed rollouts")
    # what --signal=B:TERM@secs delivers before the time limit, now instead of in minutes
    slurm_out(slurm_cluster, "scancel", "--batch", "--signal=TERM", job_id)
    comps = wait_job(slurm_cluster, job_id, tmp_path, watch := FarmWatch(JOB_USER))
    assert comps[0]["JobState"] == "COMPLETED", logs(tmp_path)
    stored = connect(run_dir).execute("SELECT count(*) FROM rollouts").fetchone()[0]
    assert stored == committed(run_dir)
    assert 2 <= stored < 4 * 16
    head_log = (run_dir / "logs" / "head.log").read_text()
    assert "waiting for agents to drain" in head_log
    assert watch.as_root() == [], watch.describe(watch.as_root())   # no farm process ran as root
    wait_no_strays(slurm_cluster, 15)


@pytest.mark.slurm
@pytest.mark.sandbox
def test_your_trainer_runs_in_the_job_on_a_task_set_from_the_bank(slurm_cluster, job_user_dir, python_image):
    """The user's training command (docs/examples/slurm_trainer.py) in place of the built-in
    trainer, on a task set stored in a bank on shared storage (the user's own)."""
    tmp_path = job_user_dir
    from controller.analysis.query import connect
    from controller.taskbank.bank import TaskBank, make_set
    from controller.taskbank.builtin import builtin_taskset
    bank = TaskBank(tmp_path / "bank")
    mine = make_set("mine", builtin_taskset().tasks[:3] + builtin_taskset().tasks[-1:])
    bank.put_set(mine)
    give_to_user(bank.root)
    trainer = (f"PADDOCK_EXAMPLE_SAMPLER=1 {shlex.quote(USER_PYTHON)} "
               f"{shlex.quote(str(ROOT / 'docs' / 'examples' / 'slurm_trainer.py'))}")
    job_id, run_dir = submit(slurm_cluster, tmp_path, layout="het", taskset="mine", bank=str(bank.root),
                             trainer=trainer)
    comps = wait_job(slurm_cluster, job_id, tmp_path, watch := FarmWatch(JOB_USER))
    assert [c["JobState"] for c in comps] == ["COMPLETED", "COMPLETED"], logs(tmp_path)
    result = json.loads((run_dir / "trainer-result.json").read_text())
    assert result["taskset_hash"] == mine.manifest_hash
    # the controller's curriculum picked 4 tasks (all unexplored: a seeded cycle over the set)
    assert sorted(result["rewards"]) == sorted(t.task_id for t in mine.tasks)
    con = connect(run_dir)
    assert con.execute("SELECT count(*), count(DISTINCT task_id) FROM rollouts WHERE taskset_hash = ?",
                       [mine.manifest_hash]).fetchone() == (4, 4)
    from controller.taskbank.curriculum import Curriculum
    with Curriculum(bank.root / "curriculum.sqlite", [t.task_id for t in mine.tasks]) as cur:
        assert sum(e.evidence for e in cur.estimates(0).values()) == 4      # every commit was counted
    head_log = (run_dir / "logs" / "head.log").read_text()
    assert "starting trainer" in head_log and "trainer exited with 0" in head_log
    assert "4 scored rollouts of 4 tasks" in (run_dir / "logs" / "trainer.log").read_text()
    assert watch.as_root() == [], watch.describe(watch.as_root())   # no farm process ran as root
    wait_no_strays(slurm_cluster, 15)


@pytest.mark.slurm
def test_a_task_set_missing_from_the_bank_stops_the_head_with_its_name(slurm_cluster, job_user_dir):
    tmp_path = job_user_dir
    (tmp_path / "bank").mkdir()
    give_to_user(tmp_path / "bank")
    job_id, run_dir = submit(slurm_cluster, tmp_path, layout="het", taskset="nope", bank=str(tmp_path / "bank"),
                             controller_wait_s=20)
    comps = wait_job(slurm_cluster, job_id, tmp_path, watch := FarmWatch(JOB_USER))
    assert comps[0]["JobState"] == "FAILED"
    assert "task set 'nope' not found" in (run_dir / "logs" / "head.log").read_text()
    assert watch.as_root() == [], watch.describe(watch.as_root())


@pytest.mark.slurm
@pytest.mark.sandbox
def test_the_end_of_time_signal_reaches_your_trainer_and_the_job_completes(slurm_cluster, job_user_dir, python_image):
    tmp_path = job_user_dir
    trainer = (f"PADDOCK_EXAMPLE_TASKS=40 {shlex.quote(USER_PYTHON)} "
               f"{shlex.quote(str(ROOT / 'docs' / 'examples' / 'slurm_trainer.py'))}")
    job_id, run_dir = submit(slurm_cluster, tmp_path, layout="het", tasks_limit=0, trainer=trainer)
    wait_for(lambda: committed(run_dir) >= 2, 60, "the first committed rollouts")
    slurm_out(slurm_cluster, "scancel", "--batch", "--signal=TERM", job_id)
    comps = wait_job(slurm_cluster, job_id, tmp_path, watch := FarmWatch(JOB_USER))
    assert comps[0]["JobState"] == "COMPLETED", logs(tmp_path)
    result = json.loads((run_dir / "trainer-result.json").read_text())
    assert result["stopped"] is True and 2 <= len(result["rewards"]) < 40
    assert "trainer stopped after the end-of-time signal" in (run_dir / "logs" / "head.log").read_text()
    assert watch.as_root() == [], watch.describe(watch.as_root())   # no farm process ran as root
    wait_no_strays(slurm_cluster, 15)


def test_a_job_file_and_words_render_together_the_words_winning(tmp_path):
    f = tmp_path / "job.yaml"
    f.write_text("run_dir: /scratch/r\nenv_nodes: 2\ncomponents:\n  trainer:\n    gpus_per_node: 4\n"
                 "    partition: gpu\n")
    cp = subprocess.run([sys.executable, "-m", "controller.cli", "sbatch", "render", "--job", str(f),
                         "trainer.gpus_per_node=2", "farm.cpus_per_task=8"],
                        capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=str(ROOT)), cwd=ROOT)
    assert cp.returncode == 0, cp.stderr
    trainer, farm = _het_components(cp.stdout)
    assert "--gpus-per-node=2" in trainer and "--partition=gpu" in trainer   # the word won, the file's rest stays
    assert "--cpus-per-task=8" in farm
    cp = subprocess.run([sys.executable, "-m", "controller.cli", "sbatch", "render", "--job", str(tmp_path / "none.yaml")],
                        capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=str(ROOT)), cwd=ROOT)
    assert cp.returncode == 2 and "none.yaml" in cp.stderr
