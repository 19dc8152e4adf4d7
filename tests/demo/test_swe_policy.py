"""The scripted policy's swe player (controller/demo/swe_policy.py): a policy-script file read
outside the sandbox, its patches turned into the agent's own tool calls, played over the real
OpenAI wire format by the policy server."""
from __future__ import annotations

import json
import urllib.request

import pytest

from controller.contracts.tasks import Task, TaskError, TaskSet
from controller.demo.localrun import scripted_players
from controller.demo.policy_server import FinalStep, PolicyServer, ToolStep
from controller.demo.swe_policy import (
    PolicyScriptError,
    SwePlayer,
    load_policy_script,
    parse_patch,
    parse_policy_script,
    patch_steps,
)

BASE = "def add(a, b):\n    return abs(a) + abs(b)\n\n\ndef sub(a, b):\n    return a - b\n"
GOLD = """diff --git a/calc.py b/calc.py
index 1..2 100644
--- a/calc.py
+++ b/calc.py
@@ -1,2 +1,2 @@
 def add(a, b):
-    return abs(a) + abs(b)
+    return a + b
@@ -5,2 +5,3 @@
 def sub(a, b):
     return a - b
+# end
--- /dev/null
+++ b/NEWS
@@ -0,0 +1 @@
+fixed add
\\ No newline at end of file
--- a/old.txt
+++ /dev/null
@@ -1 +0,0 @@
-gone
"""


def _edit(text: str, step: ToolStep) -> str:
    """What the `edit` tool does: `old` must occur exactly once."""
    assert text.count(step.arguments["old"]) == 1, step.arguments["old"]
    return text.replace(step.arguments["old"], step.arguments["new"])


def test_a_patch_becomes_one_edit_per_hunk_a_write_per_new_file_and_an_rm_per_deleted_one():
    steps = patch_steps(GOLD)
    assert [s.name for s in steps] == ["edit", "edit", "write_file", "shell"]
    text = BASE
    for s in steps[:2]:
        assert s.arguments["path"] == "/work/calc.py"
        text = _edit(text, s)
    assert text == "def add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n    return a - b\n# end\n"
    assert steps[2].arguments == {"path": "/work/NEWS", "content": "fixed add"}
    assert steps[3].arguments == {"command": "rm -f -- /work/old.txt"}


def test_a_malformed_patch_is_refused_naming_the_variant():
    with pytest.raises(PolicyScriptError, match=r"tasks\['t'\]\['solve'\].patch: .*line counts"):
        parse_policy_script({"tasks": {"t": {"solve": {"patch": "--- a/x\n+++ b/x\n@@ -1,3 +1,3 @@\n a\n"}}}})
    with pytest.raises(PolicyScriptError, match="no '--- a/<path>'"):
        parse_patch("just words\n")
    with pytest.raises(PolicyScriptError, match="keys among"):
        parse_policy_script({"tasks": {"t": {"solve": {"diff": GOLD}}}})
    with pytest.raises(PolicyScriptError, match=r"versions\[1\] is 'wrong', which task 't'"):
        parse_policy_script({"tasks": {"t": {"solve": {}}}, "versions": ["solve", "wrong"]})


def _task(name="swe/acme__calc-1", family="swe"):
    return Task(name=name, family=family, instruction=f"Fix {name}.", image="builtin:python",
                files={}, hidden={"gold.patch": "not what the policy plays", "tests/test_calc.py": "def test(): pass\n"},
                checker={"kind": "pytest", "tests": ["tests/test_calc.py"]})


def test_versions_pin_the_variant_and_without_pins_the_seed_draws_one():
    script = parse_policy_script({"tasks": {"acme__calc-1": {"solve": {"patch": GOLD, "commands": ["pytest -q"]},
                                                             "wrong": {}}}, "versions": ["wrong", "solve"]})
    player, task = SwePlayer(script), _task()
    assert [player.choose(task, v, seed=7)[0] for v in (0, 1, 5)] == ["wrong", "solve", "solve"]
    steps = player.script(task, "solve", [])
    assert [getattr(s, "name", None) for s in steps] == ["edit", "edit", "write_file", "shell", "shell", None]
    assert steps[-2].arguments == {"command": "pytest -q"} and steps[-1] == FinalStep("done")
    free = SwePlayer(parse_policy_script({"tasks": {"acme__calc-1": {"solve": {}, "wrong": {}}}}))
    drawn = {free.choose(task, 0, seed)[0] for seed in range(40)}
    assert drawn == {"solve", "wrong"} and free.choose(task, 0, 3) == free.choose(task, 0, 3)


def test_the_local_run_refuses_swe_tasks_without_a_script_naming_the_task(tmp_path):
    ts = TaskSet(name="repo", tasks=(_task(), _task("swe/other")))
    with pytest.raises(TaskError, match="also has swe tasks .*--policy-script"):
        scripted_players(ts)
    (tmp_path / "p.yaml").write_text("tasks:\n  swe/acme__calc-1:\n    null: {}\n")
    with pytest.raises(TaskError, match="no variants for task 'swe/other'"):
        scripted_players(ts, str(tmp_path / "p.yaml"))
    (tmp_path / "bad.json").write_text("{")
    with pytest.raises(TaskError, match="bad.json is not valid JSON"):
        scripted_players(ts, str(tmp_path / "bad.json"))
    assert load_policy_script(tmp_path / "p.yaml").versions == ()


def test_the_policy_server_plays_a_swe_task_from_the_script_over_http(tmp_path):
    task, other = _task(), _task("python/x", family="python")
    script = parse_policy_script({"tasks": {task.name: {"solve": {"patch": GOLD}}}, "versions": ["solve"]})
    with PolicyServer(TaskSet(name="s", tasks=(task, other)), players={"swe": SwePlayer(script)}) as server:
        messages = [{"role": "user", "content": task.instruction}]
        replies = []
        for _ in range(6):
            req = urllib.request.Request(server.url + "/chat/completions", method="POST",
                                         data=json.dumps({"model": "scripted-v0", "messages": messages, "seed": 1}).encode(),
                                         headers={"Content-Type": "application/json"})
            with urllib.request.urlopen(req, timeout=10) as r:
                msg = json.loads(r.read())["choices"][0]["message"]
            replies.append(msg)
            messages += [msg]
            for call in msg.get("tool_calls") or []:
                messages.append({"role": "tool", "tool_call_id": call["id"], "content": "ok"})
            if not msg.get("tool_calls"):
                break
    assert replies[0]["content"].startswith("plan: solve")
    calls = [m["tool_calls"][0]["function"] for m in replies if m.get("tool_calls")]
    assert [c["name"] for c in calls] == ["edit", "edit", "write_file", "shell"]
    assert json.loads(calls[0]["arguments"])["new"] == "def add(a, b):\n    return a + b\n"
    assert replies[-1]["content"] == "done" and "not what the policy plays" not in json.dumps(replies)


def test_a_slurm_job_takes_the_policy_script_as_an_absolute_path_to_the_head():
    import shlex

    from slurm.sbatch import ParamError, render
    text = render({"run_dir": "/r", "env_nodes": 2, "taskset": "s", "bank": "/b", "policy_script": "/p q/x.yaml"})
    [line] = [ln for ln in text.splitlines() if " job head " in ln]
    argv = shlex.split(line.rstrip("\\"))
    assert argv[argv.index("--policy-script") + 1] == "/p q/x.yaml"
    assert "--policy-script" not in render({"run_dir": "/r", "env_nodes": 2})
    with pytest.raises(ParamError, match="'policy_script' must be an absolute path"):
        render({"run_dir": "/r", "env_nodes": 2, "policy_script": "x.yaml"})
