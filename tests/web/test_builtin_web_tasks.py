"""Every built-in web task is sound: doing nothing fails it (its checks over the untouched seed
database, evaluated on the host) and its reference (the web player's full plan, played in a real
chromium in a real sandbox and graded by the real verifier) passes it."""
import pytest

from controller.taskbank.webtasks import SEED_SQL, web_tasks
from nodeagent.browser.apps import shop

TASKS = web_tasks()


@pytest.mark.parametrize("task", TASKS, ids=[t.name for t in TASKS])
def test_the_untouched_shop_fails_the_task(tmp_path, task):
    db = tmp_path / "app.db"
    shop.init_db(str(db), SEED_SQL)
    checks = [c for c in task.checker["checks"] if "sql" in c]
    out = shop.evaluate({"db": str(db), "key_hex": "00" * 32, "seed_digest": shop.seed_digest(SEED_SQL),
                         "checks": checks})
    assert out["verdict"] == "fail", out


def test_the_reference_plan_of_every_task_passes(play):
    failed = {}
    for task in TASKS:
        v = play(task, "solve").verdict
        if v.outcome != "pass":
            failed[task.name] = v.checks[-1]["detail"]
    assert failed == {}
