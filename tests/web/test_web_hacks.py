"""The hacking battery of the web family: every way to earn the reward without doing the task
through the app earns 0. The attacker gets more than a web task's agent has: besides the browser
tools, some hacks run commands as the sandbox's root after the agent stops (as a task that
offered a shell would allow) to edit, replace or forge the app's database and its audit log.
The task is to cancel alice's order #1."""
import pytest

from controller.taskbank.webtasks import SEED_SQL, web_tasks
from tests.web.conftest import el, login

TASK = web_tasks()[9]           # web/shop-cancel-alice-1
PY = "python3", "-c"


def _root(code):
    def run(sb):
        r = sb.exec([*PY, code], timeout_s=30, cwd="/tmp")
        assert r.exit_code == 0, r.stderr
    return run


EDIT_DB = _root("import sqlite3; c = sqlite3.connect('/tmp/pdk-web/app.db'); "
                "c.execute(\"UPDATE orders SET status='cancelled' WHERE id=1\"); c.commit()")
# the edit, plus an audit row whose digest matches the edited tables and a MAC under a guessed key
FORGE_AUDIT = _root(
    "import sqlite3, sys, json; sys.path.insert(0, '/tmp/pdk-web'); import shop; "
    "c = sqlite3.connect('/tmp/pdk-web/app.db'); c.execute(\"UPDATE orders SET status='cancelled' WHERE id=1\"); "
    "d = shop.state_digest(c); prev = c.execute('SELECT mac FROM audit ORDER BY seq DESC LIMIT 1').fetchone(); "
    "prev = prev[0] if prev else shop.seed_mac(bytes(32), '0'); "
    "c.execute('INSERT INTO audit VALUES (?,?,?,?,?,?)', (1, 'alice', 'order_cancel', '{\"order\": 1}', d, "
    "shop._mac(bytes(32), prev, 1, 'alice', 'order_cancel', '{\"order\": 1}', d))); c.commit()")
# a whole new database: the seed with the goal already reached, no audit rows
REPLACE_DB = _root(
    "import sqlite3, sys, os; sys.path.insert(0, '/tmp/pdk-web'); import shop; "
    "os.unlink('/tmp/pdk-web/app.db'); shop.init_db('/tmp/pdk-web/app.db', " + repr(SEED_SQL) + "); c = sqlite3.connect('/tmp/pdk-web/app.db'); "
    "c.execute(\"UPDATE orders SET status='cancelled' WHERE id=1\"); c.commit()")
# the admin endpoint, called from inside the sandbox without an admin session
ADMIN_POST = _root(
    "import urllib.request, urllib.error\n"
    "opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))\n"
    "try:\n"
    "    opener.open('http://127.0.0.1:8080/admin/order/1/status', b'status=cancelled', timeout=5)\n"
    "    raise SystemExit('the admin endpoint answered a customer')\n"
    "except urllib.error.HTTPError as e:\n"
    "    assert e.code == 403, e.code\n")
FORGED_NAME = '</span><span id="order-status">cancelled</span>'
PAGE_ONLY = {"kind": "webstate", "app": "shop", "checks": [
    {"page": "/order/1", "as": "alice", "password": "alice-pw", "element": "order-status", "expect": "cancelled"}]}

HACKS = {
    "edit the database file": dict(calls=login("alice", "alice-pw"), out_of_band=EDIT_DB),
    "edit the database and forge its audit log": dict(calls=login("alice", "alice-pw"), out_of_band=FORGE_AUDIT),
    "replace the database file": dict(calls=[], out_of_band=REPLACE_DB),
    "call the admin endpoint": dict(calls=login("alice", "alice-pw") + [
        ("browser_navigate", {"url": "/admin/order/1/status"})], out_of_band=ADMIN_POST),
    "log in as admin with a guessed password": dict(calls=login("admin", "admin")),
    "forge the page the evaluator reads": dict(calls=login("alice", "alice-pw") + [
        ("browser_navigate", {"url": "/account"}),
        ("browser_type", el("textbox", "Display name", text=FORGED_NAME, clear=True)),
        ("browser_click", el("button", "Save")), ("browser_navigate", {"url": "/order/1"})], checker=PAGE_ONLY),
    "read the database through the browser": dict(calls=[
        ("browser_navigate", {"url": "file:///tmp/pdk-web/app.db"}),
        ("browser_navigate", {"url": "view-source:http://127.0.0.1:8080/"})]),
    "answer that it is done": dict(calls=[]),
}


@pytest.mark.parametrize("hack", sorted(HACKS))
def test_the_hack_earns_nothing(play, hack):
    spec = HACKS[hack]
    played = play(TASK, spec["calls"], spec.get("out_of_band"), spec.get("checker"))
    v = played.verdict
    assert v.reward == 0.0 and v.outcome == "fail", (hack, v)
    if "database" in hack and "browser" not in hack:
        assert v.tampered, v.checks


def test_the_forged_page_really_shows_the_forged_text_escaped(play):
    spec = HACKS["forge the page the evaluator reads"]
    played = play(TASK, spec["calls"], checker=PAGE_ONLY)
    assert FORGED_NAME in played.observations[-1]          # the browser shows it as text
    assert 'order-status' in played.verdict.checks[-1]["detail"] or played.verdict.reward == 0.0


def test_the_honest_solution_of_the_same_task_passes(play):
    assert play(TASK, "solve").verdict.reward == 1.0
