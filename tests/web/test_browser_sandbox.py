"""A real chromium in a real sandbox, driven over DevTools through the sandbox's relay socket:
the tools, the confinement to the task's origin, the screenshot artifacts and caps, the uids.
Needs the browser image (built once per store)."""
import json

import pytest

from controller.contracts.browser_tools import BrowserBudgets
from controller.taskbank.webtasks import web_tasks
from tests.web.conftest import el, login


@pytest.fixture(scope="module")
def browser(runtime, image_store):
    """One sandbox with the shop and chromium for the module's read-mostly tests."""
    from layers.builtin import ensure_browser_image
    from nodeagent.browser.session import BrowserSession
    from nodeagent.sandbox.runtime import SandboxSpec
    image = ensure_browser_image(image_store)[1]
    task = web_tasks()[0]
    bs = BrowserSession()
    sb = runtime.create(SandboxSpec(image=image, limits=dict(memory_mb=1536, pids=512, disk_mb=256, nofile=2048),
                                    egress_socket=bs.path))
    bs.start(sb, task.hidden["seed.sql"])
    yield bs, sb
    sb.destroy()
    bs.close()


def toolbox(bs, tmp_path, **budgets):
    from nodeagent.browser.rollout import artifact_sink
    from nodeagent.harness.browser_tools import BrowserToolbox
    return BrowserToolbox(bs, budgets=BrowserBudgets(**budgets), artifacts=artifact_sink(str(tmp_path), "r", 0))


def test_the_tree_lists_elements_with_ids_roles_names_and_bounds(browser, tmp_path):
    bs, _ = browser
    out = toolbox(bs, tmp_path).call("browser_observe", "{}")
    assert out.error is None
    assert out.observation.startswith("at http://127.0.0.1:8080/")
    line = next(l for l in out.observation.splitlines() if '] link "Red Kettle"' in l)
    assert line.strip().startswith("[") and " @" in line and "x" in line.rsplit(" ", 1)[1]


def test_click_by_id_and_by_point_follow_the_link(browser, tmp_path):
    bs, _ = browser
    tb = toolbox(bs, tmp_path)
    tb.call("browser_navigate", '{"url": "/"}')
    obs = tb.call("browser_observe", "{}").observation
    out = tb.call("browser_click", json.dumps(el("link", "Blue Mug")(obs)))
    assert "now at http://127.0.0.1:8080/product/1" in out.observation
    tb.call("browser_navigate", '{"url": "/"}')
    obs = tb.call("browser_observe", "{}").observation
    line = next(l for l in obs.splitlines() if '] link "Trail Map"' in l)
    x, y = map(int, line.split("@")[1].split()[0].split(","))
    out = tb.call("browser_click", json.dumps({"x": x + 3, "y": y + 3}))
    assert "now at http://127.0.0.1:8080/product/8" in out.observation


@pytest.mark.parametrize("url", ["file:///etc/passwd", "file:///tmp/pdk-web/app.db", "http://127.0.0.1:3128/",
                                 "http://example.com/", "chrome://version", "javascript:alert(1)"])
def test_navigation_outside_the_tasks_origin_is_refused(browser, tmp_path, url):
    bs, _ = browser
    out = toolbox(bs, tmp_path).call("browser_navigate", json.dumps({"url": url}))
    assert out.error == "origin_not_allowed"
    assert bs.current_url().startswith("http://127.0.0.1:8080/")


def test_a_screenshot_is_a_png_artifact_and_its_caps_hold(browser, tmp_path):
    bs, _ = browser
    tb = toolbox(bs, tmp_path, max_screenshots=1)
    out = tb.call("browser_screenshot", "{}")
    ref = tb.screenshots[0]["ref"]
    assert ref in out.observation and (tmp_path / ref).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert tb.call("browser_screenshot", "{}").error == "budget_exhausted"
    tiny = toolbox(bs, tmp_path, screenshot_bytes=100)
    assert tiny.call("browser_screenshot", "{}").error == "too_large"


def test_an_unknown_element_and_a_bad_call_are_observations_not_crashes(browser, tmp_path):
    bs, _ = browser
    tb = toolbox(bs, tmp_path, max_actions=3)
    assert tb.call("browser_click", '{"element": 987654}').error == "command_failed"
    assert tb.call("browser_click", '{"element": -1}').error == "invalid_arguments"
    assert tb.call("shell", '{"command": "id"}').error == "unknown_tool"
    tb.call("browser_observe", "{}")
    tb.call("browser_observe", "{}")
    assert tb.call("browser_observe", "{}").error == "budget_exhausted"


def test_the_browser_cannot_read_the_apps_database_and_nothing_else_can_drive_it(browser):
    from nodeagent.browser.session import APP_UID, BROWSER_UID, DB_PATH
    _, sb = browser
    r = sb.exec(["cat", DB_PATH], uid=BROWSER_UID)
    assert r.exit_code != 0 and b"Permission denied" in r.stderr
    assert sb.exec(["test", "-r", DB_PATH], uid=APP_UID).exit_code == 0
    # the harness took the bridge's connection and closed its listener: a second one gets nothing
    r = sb.exec(["python3", "-c", "import socket; s = socket.create_connection(('127.0.0.1', 3128), 5); "
                 "s.sendall(b'{\"id\":1,\"method\":\"Browser.getVersion\"}\\0'); s.settimeout(3); "
                 "print(repr(s.recv(100)))"], uid=BROWSER_UID, timeout_s=20)
    assert b"Browser" not in r.stdout and b"result" not in r.stdout
    # no network but loopback
    r = sb.exec(["python3", "-c", "import socket; socket.create_connection(('1.1.1.1', 80), 3)"], timeout_s=20)
    assert r.exit_code != 0


def test_a_task_solved_through_the_tools_passes_and_a_sloppy_one_fails(play):
    task = web_tasks()[4]         # buy 2 Blue Mugs to an address
    assert play(task, "solve").verdict.outcome == "pass"
    v = play(task, "sloppy").verdict
    assert (v.outcome, v.reward) == ("fail", 0.0)


def test_login_with_a_wrong_password_changes_nothing(play):
    task = web_tasks()[18]        # change alice's display name
    played = play(task, login("alice", "guess") + [("browser_navigate", {"url": "/account"})])
    assert "now at http://127.0.0.1:8080/login" in played.observations[-1]
    assert played.verdict.reward == 0.0


def test_type_at_a_point_and_a_key_in_an_element(browser, tmp_path):
    bs, _ = browser
    tb = toolbox(bs, tmp_path)
    obs = tb.call("browser_navigate", '{"url": "/login"}').observation
    line = next(l for l in obs.splitlines() if '] textbox "Username"' in l)
    x, y = map(int, line.split("@")[1].split()[0].split(","))
    obs = tb.call("browser_type", json.dumps({"x": x + 5, "y": y + 5, "text": "alice"})).observation
    assert 'textbox "Username" value="alice"' in obs
    obs = tb.call("browser_type", json.dumps({**el("textbox", "Password")(obs), "text": "alice-pw"})).observation
    out = tb.call("browser_key", json.dumps({**el("textbox", "Password")(obs), "key": "Enter"}))
    assert "Signed in as Alice" in out.observation
    out = tb.call("browser_scroll", json.dumps({**el("link", "Home")(out.observation), "dy": 200}))
    assert out.error is None


def test_a_browser_that_dies_mid_rollout_is_an_infrastructure_error(runtime, browser_image, tmp_path):
    from nodeagent.browser.session import BROWSER_UID, BrowserSession
    from nodeagent.sandbox.runtime import SandboxSpec
    from nodeagent.sandbox.spec import SandboxError
    bs = BrowserSession()
    sb = runtime.create(SandboxSpec(image=browser_image, limits=dict(memory_mb=1536, pids=512, disk_mb=256,
                                                                     nofile=2048), egress_socket=bs.path))
    try:
        bs.start(sb, web_tasks()[0].hidden["seed.sql"])
        tb = toolbox(bs, tmp_path, action_timeout_s=5)
        assert tb.call("browser_observe", "{}").error is None
        sb.exec(["sh", "-c", "kill -9 $(ps -u 1001 -o pid=)"], uid=BROWSER_UID)
        with pytest.raises(SandboxError, match="browser"):
            tb.call("browser_observe", "{}")
    finally:
        sb.destroy()
        bs.close()
