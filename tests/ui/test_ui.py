"""The management web UI in a real browser (issue 17): Debian's Chromium,
headless, driven by Playwright, against a real 3-node cluster.

Log in; see the queues a client declared with their leader and members;
publish and get a message; create a policy and see it applied to a queue,
then delete it; purge a queue; close a connection; kill a node and see it
shown as down, restart it and see it back; create, edit and delete users,
virtual hosts and permissions and check them with a real client; see a real
memory alarm (a separate single node) on the overview; the node memory/disk
history charts; no page scrolls sideways on a phone. Screenshots go to
$QQ_UI_ARTIFACTS (default: the test's temporary directory) and their paths
are printed.
"""
from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path

import pika
import pika.exceptions
import pytest
from playwright.sync_api import Browser, Dialog, Page, Route, expect, sync_playwright

from tests.e2e.broker_proc import BrokerProcess, free_port
from tests.mgmt.conftest import Api, MgmtCluster, mgmt_cluster, wait_for  # noqa: F401 (fixture)

pytestmark = pytest.mark.slow
CHROMIUM = "/usr/bin/chromium"
FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync"]
QQ = {"x-queue-type": "quorum"}


@pytest.fixture(scope="module")
def cluster(mgmt_cluster: MgmtCluster) -> MgmtCluster:  # noqa: F811 (the imported fixture)
    """tests/mgmt's 3-node cluster with management ports (its own for this module)."""
    return mgmt_cluster


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = Path(os.environ.get("QQ_UI_ARTIFACTS") or tmp_path_factory.mktemp("ui-artifacts"))
    out.mkdir(parents=True, exist_ok=True)
    return out


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    assert Path(CHROMIUM).exists(), "Debian's chromium is needed (make test installs it as root)"
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=FLAGS)
        yield b
        b.close()


def new_page(browser: Browser, answer_yes: bool = True, asked: list[str] | None = None) -> Page:
    ctx = browser.new_context(viewport={"width": 1280, "height": 900})
    pg = ctx.new_page()
    pg.set_default_timeout(20_000)

    def answer(dialog: Dialog) -> None:  # confirmations are answered yes unless told
        if asked is not None:
            asked.append(dialog.message)
        dialog.accept() if answer_yes else dialog.dismiss()
    pg.on("dialog", answer)
    return pg


@pytest.fixture
def page(browser: Browser, cluster: MgmtCluster) -> Iterator[Page]:
    pg = new_page(browser)
    yield pg
    pg.context.close()


def shot(page: Page, artifacts: Path, name: str) -> None:
    path = artifacts / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    print(f"screenshot: {path}")


def login(page: Page, cluster: MgmtCluster, node: int = 0) -> None:
    login_at(page, cluster.nodes[node].management_port)


def login_at(page: Page, management_port: int) -> None:
    page.goto(f"http://127.0.0.1:{management_port}/")
    expect(page.get_by_role("heading", name="Log in")).to_be_visible()
    page.get_by_label("Username").fill("guest")
    page.get_by_label("Password").fill("guest")
    page.get_by_role("button", name="Log in").click()
    expect(page.get_by_role("heading", name="Overview")).to_be_visible()


def test_login_is_required_and_wrong_passwords_are_refused(page: Page, cluster: MgmtCluster,
                                                           artifacts: Path) -> None:
    page.goto(f"http://127.0.0.1:{cluster.nodes[0].management_port}/")
    page.get_by_label("Username").fill("guest")
    page.get_by_label("Password").fill("wrong")
    page.get_by_role("button", name="Log in").click()
    expect(page.locator("#login-error")).to_contain_text("Login failed")
    shot(page, artifacts, "login-refused")
    login(page, cluster)
    expect(page.locator("#served-by")).to_have_text(cluster.nodes[0].name)
    page.get_by_role("button", name="Log out").click()
    expect(page.get_by_role("heading", name="Log in")).to_be_visible()


def test_overview_queues_and_queue_detail(page: Page, cluster: MgmtCluster, artifacts: Path) -> None:
    conn = pika.BlockingConnection(pika.ConnectionParameters(
        "127.0.0.1", cluster.nodes[1].port, client_properties={"connection_name": "ui-client"}))
    ch = conn.channel()
    for i in range(3):
        ch.queue_declare(f"ui-q{i}", durable=True, arguments=QQ)
    ch.confirm_delivery()
    for i in range(5):
        ch.basic_publish("", "ui-q0", b"m%d" % i, pika.BasicProperties(delivery_mode=2))
    login(page, cluster)
    nodes = page.locator("#nodes tbody tr")
    expect(nodes).to_have_count(3)
    for n in cluster.nodes:
        expect(page.locator("#nodes")).to_contain_text(n.name)
    expect(page.locator("#nodes")).not_to_contain_text("down")
    size = re.compile(r"^\d+(\.\d+)? (B|KiB|MiB|GiB)$")
    for i in range(3):  # every node's own WAL and segment bytes (WAL: the metadata at least)
        cells = nodes.nth(i).locator("td")
        expect(cells.nth(4)).to_have_text(size)
        expect(cells.nth(5)).to_have_text(re.compile(r"^\d+(\.\d+)? (B|KiB|MiB|GiB) in \d+ files$"))
    shot(page, artifacts, "overview")

    page.get_by_role("link", name="Queues").click()
    table = page.locator("#queues")
    expect(table).to_contain_text("ui-q2")
    api = cluster.apis[0]
    q0 = api.get("/api/queues/%2F/ui-q0")[1]
    row = table.locator("tr", has_text="ui-q0")
    expect(row).to_contain_text(q0["leader"])
    expect(row).to_contain_text("3/3")
    page.get_by_label("Filter by name or vhost").fill("ui-q1")
    expect(table.locator("tbody tr")).to_have_count(1)
    expect(table).to_contain_text("ui-q1")
    shot(page, artifacts, "queues")
    page.get_by_label("Filter by name or vhost").fill("")

    # detail: members with Raft state; publish and get a message through the UI
    table.get_by_role("link", name="ui-q0").click()
    expect(page.locator("#queue-name")).to_have_text("ui-q0")
    members = page.locator("#members tbody tr")
    expect(members).to_have_count(3)
    expect(page.locator("#members")).to_contain_text("leader")
    expect(page.locator("#queue-ready")).to_have_text("5")
    storage = page.locator("#storage tbody tr")  # each member's segment and snapshot files
    expect(storage).to_have_count(3)
    for n in cluster.nodes:
        expect(page.locator("#storage")).to_contain_text(n.name)
    expect(storage.first.locator("td").nth(1)).to_have_text(re.compile(r"^\d+$"))
    expect(storage.first.locator("td").nth(2)).to_have_text(size)
    page.get_by_label("Payload").fill("hello from the browser")
    page.get_by_role("button", name="Publish message").click()
    expect(page.locator("#notice")).to_contain_text("Message published.")
    wait_for(lambda: api.get("/api/queues/%2F/ui-q0")[1]["messages_ready"] == 6, what="6 ready")
    page.get_by_label("Count").fill("6")
    page.get_by_label("Ack mode").select_option("ack_requeue_false")
    page.get_by_role("button", name="Get messages").click()
    got = page.locator("#got-table")
    expect(got).to_contain_text("hello from the browser")
    expect(got.locator("tbody tr")).to_have_count(6)
    shot(page, artifacts, "queue-detail")
    wait_for(lambda: api.get("/api/queues/%2F/ui-q0")[1]["messages"] == 0, what="queue emptied by get")

    # leadership moves to a follower the UI names
    follower = page.locator("#members tr", has_text="follower").first
    target = follower.locator("td").first.inner_text()
    follower.get_by_role("button", name="Make leader").click()
    expect(page.locator("#notice")).to_contain_text(f"Leadership moved to {target}.")
    wait_for(lambda: api.get("/api/queues/%2F/ui-q0")[1]["leader"] == target, what="new leader")
    expect(page.locator("#queue-leader")).to_have_text(target)

    # purge: publish through a client, purge in the UI
    for i in range(4):
        ch.basic_publish("", "ui-q0", b"p%d" % i)
    page.reload()
    expect(page.locator("#queue-ready")).to_have_text("4")
    page.get_by_role("button", name="Purge messages").click()
    expect(page.locator("#notice")).to_contain_text("Queue purged.")
    expect(page.locator("#queue-ready")).to_have_text("0")
    assert api.get("/api/queues/%2F/ui-q0")[1]["messages_ready"] == 0
    conn.close()


def test_policies_are_created_applied_and_deleted(page: Page, cluster: MgmtCluster,
                                                  artifacts: Path) -> None:
    api = cluster.apis[0]
    assert api.put("/api/queues/%2F/ui-pol-q", {"durable": True, "arguments": QQ})[0] in (201, 204)
    login(page, cluster)
    page.get_by_role("link", name="Policies").click()
    page.get_by_label("Name", exact=True).fill("ui-limit")
    page.get_by_label("Pattern").fill("^ui-pol-")
    page.get_by_label("Definition (JSON)").fill('{"max-length": "lots"}')
    page.get_by_role("button", name="Save policy").click()
    # the API's validation message is shown as is
    expect(page.locator("#policy-form .error")).to_contain_text("is not a valid maximum length")
    page.get_by_label("Definition (JSON)").fill('{"max-length": 5}')
    page.get_by_role("button", name="Save policy").click()
    expect(page.locator("#policies")).to_contain_text("ui-limit")
    shot(page, artifacts, "policies")
    wait_for(lambda: api.get("/api/queues/%2F/ui-pol-q")[1]["policy"] == "ui-limit",
             what="the policy applied")
    page.goto(f"http://127.0.0.1:{cluster.nodes[0].management_port}/#/queues/%2F/ui-pol-q")
    expect(page.locator("#queue-policy")).to_have_text("ui-limit")
    page.get_by_role("link", name="Policies").click()
    page.locator("#policies tr", has_text="ui-limit").get_by_role("button", name="Delete policy").click()
    expect(page.locator("#policies")).not_to_contain_text("ui-limit")
    wait_for(lambda: api.get("/api/queues/%2F/ui-pol-q")[1]["policy"] is None, what="policy gone")


def test_queues_are_grown_onto_a_node_from_the_overview(page: Page, cluster: MgmtCluster) -> None:
    api = cluster.apis[0]
    assert api.put("/api/queues/%2F/ui-grow", {"durable": True, "arguments": {
        "x-queue-type": "quorum", "x-quorum-initial-group-size": 1}})[0] == 201
    (holder,) = api.get("/api/queues/%2F/ui-grow")[1]["members"]
    target = next(n.name for n in cluster.nodes if n.name != holder)
    login(page, cluster)
    page.get_by_role("button", name=f"Grow every quorum queue onto {target}").click()
    expect(page.locator("#notice")).to_contain_text(f"onto {target}.", timeout=60_000)
    expect(page.locator("#notice")).to_contain_text("Grew ")
    wait_for(lambda: sorted(api.get("/api/queues/%2F/ui-grow")[1]["members"]) == sorted([holder, target]),
             what="a member on the target")


def test_a_connection_is_closed_from_the_ui(page: Page, cluster: MgmtCluster) -> None:
    conn = pika.BlockingConnection(pika.ConnectionParameters(
        "127.0.0.1", cluster.nodes[2].port, client_properties={"connection_name": "ui-victim"}))
    login(page, cluster)
    page.get_by_role("link", name="Connections").click()
    row = page.locator("#connections tr", has_text="ui-victim")
    expect(row).to_contain_text(cluster.nodes[2].name)
    row.get_by_role("button", name="Close connection").click()
    expect(page.locator("#notice")).to_contain_text("Connection closed.")
    with pytest.raises(pika.exceptions.ConnectionClosedByBroker):
        for _ in range(100):
            conn.process_data_events(0.05)


def test_a_node_down_is_shown_and_its_return_too(page: Page, cluster: MgmtCluster,
                                                 artifacts: Path) -> None:
    login(page, cluster)
    victim = cluster.nodes[2]
    victim.kill()
    try:
        # live refresh (every 5 s) shows it down without a reload
        expect(page.locator("#nodes tr", has_text=victim.name)).to_contain_text("down", timeout=40_000)
        expect(page.locator("#banner")).to_contain_text(re.compile(f"down: .*{re.escape(victim.name)}"))
        shot(page, artifacts, "node-down")
        # every page says so, not only the overview
        page.get_by_role("link", name="Queues").click()
        expect(page.locator("#queues")).to_be_visible()
        expect(page.locator("#banner")).to_contain_text(re.compile(f"down: .*{re.escape(victim.name)}"))
        page.get_by_role("link", name="Overview").click()
    finally:
        victim.start(timeout=120)
    expect(page.locator("#nodes tr", has_text=victim.name)).to_contain_text("running", timeout=60_000)
    expect(page.locator("#banner")).to_be_hidden()


def test_phone_sized_screen_and_keyboard(page: Page, cluster: MgmtCluster, artifacts: Path) -> None:
    page.set_viewport_size({"width": 390, "height": 844})
    login(page, cluster)
    # keyboard only: tab to the Queues link and follow it
    page.keyboard.press("Tab")  # the skip link
    for _ in range(8):
        page.keyboard.press("Tab")
        if page.evaluate("document.activeElement && document.activeElement.textContent") == "Queues":
            break
    page.keyboard.press("Enter")
    expect(page.get_by_role("heading", name="Queues")).to_be_visible()
    expect(page.locator("#queues")).to_be_visible()
    # (every page, with wide tables: test_no_page_scrolls_sideways_on_a_phone)
    assert page.evaluate("document.documentElement.scrollWidth") <= 390 + 1
    shot(page, artifacts, "phone-queues")


def wait_for_refresh(page: Page) -> None:
    """Until the 5 s auto refresh has redrawn the page (its old content is
    detached from the document)."""
    old = page.locator("#view > *").first.element_handle()
    page.wait_for_function("el => !el.isConnected", arg=old, timeout=15_000)


def amqp_refusal(port: int, user: str, password: str, vhost: str) -> str | None:
    """None if `user` can connect to `vhost` and declare a queue there, else
    the refusal pika reports."""
    try:
        conn = pika.BlockingConnection(pika.ConnectionParameters(
            "127.0.0.1", port, vhost, pika.PlainCredentials(user, password),
            connection_attempts=1, socket_timeout=5))
    except pika.exceptions.AMQPConnectionError as exc:
        return f"{type(exc).__name__}: {exc!r}"
    try:
        conn.channel().queue_declare("ui-alice-q", durable=True, arguments=QQ)
        return None
    except pika.exceptions.AMQPError as exc:
        return f"{type(exc).__name__}: {exc!r}"
    finally:
        if conn.is_open:
            conn.close()


def test_users_vhosts_and_permissions_are_edited_on_the_admin_page(
        page: Page, cluster: MgmtCluster, artifacts: Path) -> None:
    api, port = cluster.apis[0], cluster.nodes[0].port
    login(page, cluster)
    page.get_by_role("link", name="Admin").click()
    expect(page.locator("#users")).to_contain_text("guest")

    # a user with a password and a tag
    page.get_by_label("User name").fill("ui-alice")
    page.get_by_label("New password").fill("first-pw")
    page.get_by_label("Tags (comma-separated)").fill("monitoring")
    page.get_by_role("button", name="Save user").click()
    expect(page.locator("#notice")).to_contain_text("User 'ui-alice' saved.")
    user_row = page.locator("#users tbody tr", has_text="ui-alice")
    expect(user_row).to_contain_text("monitoring")
    assert api.get("/api/users/ui-alice")[1]["tags"] == ["monitoring"]
    assert api.as_user("ui-alice", "first-pw").get("/api/whoami")[0] == 200
    # its tags changed, its password kept (left empty)
    user_row.get_by_role("button", name="Edit user ui-alice").click()
    expect(page.get_by_label("Tags (comma-separated)")).to_have_value("monitoring")
    expect(page.get_by_label("Tags (comma-separated)")).to_be_focused()
    page.get_by_label("Tags (comma-separated)").fill("management, policymaker")
    page.get_by_role("button", name="Save user").click()
    expect(user_row).to_contain_text("management, policymaker")
    assert api.get("/api/users/ui-alice")[1]["tags"] == ["management", "policymaker"]
    assert api.as_user("ui-alice", "first-pw").get("/api/whoami")[0] == 200
    # then its password changed
    user_row.get_by_role("button", name="Edit user ui-alice").click()
    page.get_by_label("New password").fill("second-pw")
    page.get_by_role("button", name="Save user").click()
    expect(page.locator("#notice")).to_contain_text("User 'ui-alice' saved.")
    # (the notice of the previous save may still show: wait for this one's effect)
    wait_for(lambda: api.as_user("ui-alice", "second-pw").get("/api/whoami")[0] == 200,
             what="the new password in force")
    assert api.as_user("ui-alice", "first-pw").get("/api/whoami")[0] == 401

    # a virtual host
    page.get_by_label("Virtual host name").fill("ui-vh")
    page.get_by_label("Description").fill("made in the browser")
    page.get_by_role("button", name="Add virtual host").click()
    expect(page.locator("#vhosts tbody tr", has_text="ui-vh")).to_contain_text("made in the browser")
    assert api.get("/api/vhosts/ui-vh")[0] == 200
    assert amqp_refusal(port, "ui-alice", "second-pw", "ui-vh") is not None  # no permission yet

    # the API's messages as they come: an invalid regex, a missing vhost
    form = page.locator("#permission-form")
    form.get_by_label("User").fill("ui-alice")
    form.get_by_label("Virtual host").fill("ui-vh")
    form.get_by_label("Configure regex").fill("(")
    form.get_by_role("button", name="Set permissions").click()
    expect(form.locator(".error")).to_contain_text("configure: invalid regular expression '('")
    shot(page, artifacts, "admin-invalid-regex")
    # what was typed and the message survive the auto refresh
    wait_for_refresh(page)
    expect(form.get_by_label("Configure regex")).to_have_value("(")
    expect(form.get_by_label("User")).to_have_value("ui-alice")
    expect(form.locator(".error")).to_contain_text("invalid regular expression")
    form.get_by_label("Configure regex").fill(".*")
    form.get_by_label("Virtual host").fill("ui-no-such-vhost")
    form.get_by_role("button", name="Set permissions").click()
    expect(form.locator(".error")).to_have_text("no vhost 'ui-no-such-vhost'")
    assert api.get("/api/permissions/ui-vh/ui-alice")[0] == 404

    # permissions set through the UI work for a real client
    form.get_by_label("Virtual host").fill("ui-vh")
    form.get_by_role("button", name="Set permissions").click()
    perm_row = page.locator("#permissions tbody tr", has_text="ui-alice")
    expect(perm_row).to_contain_text("ui-vh")
    expect(form.locator(".error")).to_have_text("")
    assert api.get("/api/permissions/ui-vh/ui-alice")[1]["configure"] == ".*"
    wait_for(lambda: amqp_refusal(port, "ui-alice", "second-pw", "ui-vh") is None, timeout=15,
             what="ui-alice declares a queue in ui-vh")
    assert api.get("/api/queues/ui-vh/ui-alice-q")[0] == 200
    shot(page, artifacts, "admin")

    # cleared through the UI: the client is refused again
    perm_row.get_by_role("button", name="Clear permissions").click()
    expect(page.locator("#notice")).to_contain_text("Permissions of 'ui-alice' on 'ui-vh' cleared.")
    expect(page.locator("#permissions")).not_to_contain_text("ui-alice")
    refusal = wait_for(lambda: amqp_refusal(port, "ui-alice", "second-pw", "ui-vh"), timeout=15,
                       what="ui-alice refused in ui-vh")
    assert re.search(r"ACCESS_REFUSED|NOT_ALLOWED|access|refused|530|403", refusal, re.I), refusal

    # the user and the vhost deleted (with confirmation, answered yes)
    page.locator("#users tbody tr", has_text="ui-alice").get_by_role("button", name="Delete user").click()
    expect(page.locator("#notice")).to_contain_text("User 'ui-alice' deleted.")
    expect(page.locator("#users")).not_to_contain_text("ui-alice")
    page.locator("#vhosts tbody tr", has_text="ui-vh").get_by_role("button", name="Delete virtual host").click()
    expect(page.locator("#notice")).to_contain_text("Virtual host 'ui-vh' deleted.")
    expect(page.locator("#vhosts")).not_to_contain_text("ui-vh")
    assert api.get("/api/users/ui-alice")[0] == 404
    assert api.get("/api/vhosts/ui-vh")[0] == 404
    assert api.get("/api/queues/ui-vh/ui-alice-q")[0] == 404


def test_what_is_typed_while_a_refresh_is_under_way_is_kept(page: Page, cluster: MgmtCluster) -> None:
    """The auto refresh takes the form's values when it redraws, not before its
    API calls: hold one of them, type, let it go."""
    login(page, cluster)
    page.get_by_role("link", name="Admin").click()
    expect(page.locator("#permissions")).to_contain_text("guest")
    held: list[Route] = []
    page.route("**/api/permissions", lambda route: held.append(route))
    with page.expect_request(lambda r: r.url.endswith("/api/permissions"), timeout=15_000):
        pass  # the next refresh asks, and waits
    # (Playwright calls its route handlers only while the test is inside one of its calls)
    wait_for(lambda: page.wait_for_timeout(20) or held, what="the held request")
    old = page.locator("#users").element_handle()
    page.get_by_label("User name").fill("typed-during-a-refresh")
    held[0].continue_()
    page.unroute("**/api/permissions")
    page.wait_for_function("el => !el.isConnected", arg=old)
    expect(page.get_by_label("User name")).to_have_value("typed-during-a-refresh")


def test_deleting_asks_first_and_a_no_keeps_the_user(browser: Browser, cluster: MgmtCluster) -> None:
    api = cluster.apis[0]
    assert api.put("/api/users/ui-bob", {"password": "pw", "tags": ""})[0] in (201, 204)
    asked: list[str] = []
    pg = new_page(browser, answer_yes=False, asked=asked)
    try:
        login(pg, cluster)
        pg.get_by_role("link", name="Admin").click()
        pg.locator("#users tbody tr", has_text="ui-bob").get_by_role("button", name="Delete user").click()
        wait_for(lambda: asked, what="a confirmation")
        assert "ui-bob" in asked[0]
        expect(pg.locator("#users")).to_contain_text("ui-bob")
        assert api.get("/api/users/ui-bob")[0] == 200
    finally:
        pg.context.close()
        api.delete("/api/users/ui-bob")


def test_a_real_memory_alarm_is_shown_on_the_overview(browser: Browser, tmp_path: Path,
                                                      artifacts: Path) -> None:
    """The alarm health check answers 503 while an alarm is in effect: the
    overview shows the alarms from that answer's body. A single extra node
    whose memory watermark (1 MB) is below any Python process is in alarm
    from the start."""
    node = BrokerProcess(tmp_path / "alarm-node", management_port=free_port(), config=(
        "vm_memory_high_watermark.absolute = 1MB\nalarms.check_interval_ms = 100\n")).start()
    pg = new_page(browser)
    try:
        api = Api(node.management_port)
        status, body = wait_for(lambda: (r := api.get("/api/health/checks/alarms"))[0] == 503 and r,
                                what="the alarm check answering 503")
        assert body["alarms"] == [{"node": node.name, "resource": "memory"}]
        login_at(pg, node.management_port)
        alarms = pg.locator("#alarms")
        expect(alarms).to_have_text(f"memory alarm on {node.name}")
        expect(alarms).to_have_class(re.compile(r"\bbad\b"))
        expect(pg.locator("#nodes tr", has_text=node.name).locator("td").nth(2)).to_contain_text("alarm")
        shot(pg, artifacts, "overview-memory-alarm")
    finally:
        pg.context.close()
        node.kill()


def test_node_memory_and_disk_history_charts(page: Page, cluster: MgmtCluster,
                                             artifacts: Path) -> None:
    login(page, cluster)
    names = sorted(n.name for n in cluster.nodes)
    for chart in ("#mem-history", "#disk-history"):
        # a sample per node at each refresh: a line per node once there are two
        expect(page.locator(f"{chart} polyline")).to_have_count(3, timeout=30_000)
        assert int(page.locator(chart).get_attribute("data-samples") or 0) >= 2
        lines = page.locator(f"{chart} polyline")
        assert sorted(lines.nth(i).get_attribute("data-node") or "" for i in range(3)) == names
        for i in range(3):
            points = (lines.nth(i).get_attribute("points") or "").split()
            assert len(points) >= 2, points
            assert all(re.fullmatch(r"[\d.]+,[\d.]+", pt) for pt in points), points
    legend = page.locator("#mem-history + .legend")
    for n in names:
        expect(legend).to_contain_text(re.compile(rf"{re.escape(n)} \d+(\.\d+)? (B|KiB|MiB|GiB)"))
    # the samples are kept while other pages are shown (they poll /api/nodes too)
    before = int(page.locator("#mem-history").get_attribute("data-samples") or 0)
    page.get_by_role("link", name="Exchanges").click()
    expect(page.get_by_role("heading", name="Exchanges")).to_be_visible()
    wait_for_refresh(page)
    page.get_by_role("link", name="Overview").click()
    expect(page.get_by_role("heading", name="Overview")).to_be_visible()
    # at least: the Exchanges page drawn, its refresh, the overview drawn again
    assert int(page.locator("#mem-history").get_attribute("data-samples") or 0) >= before + 3
    shot(page, artifacts, "overview-history")


PHONE_CHECK = """() => {
  const iw = window.innerWidth;
  const wraps = [...document.querySelectorAll('#view .table-wrap')].map((w) => ({
    table: w.querySelector('table') && (w.querySelector('table').id || w.querySelector('caption').textContent),
    overflow: getComputedStyle(w).overflowX, right: w.getBoundingClientRect().right,
    scrolls: w.scrollWidth > w.clientWidth + 1 }));
  const wide = [...document.querySelectorAll('body *')].filter((e) => e.getBoundingClientRect().right > iw + 1
    && !e.closest('.table-wrap') && getComputedStyle(e).position !== 'absolute')
    .map((e) => e.tagName + (e.id ? '#' + e.id : ''));
  return { scrollWidth: document.documentElement.scrollWidth, innerWidth: iw, wraps, wide };
}"""


def test_no_page_scrolls_sideways_on_a_phone(page: Page, cluster: MgmtCluster, artifacts: Path) -> None:
    api = cluster.apis[0]
    assert api.put("/api/queues/%2F/ui-phone-queue-with-a-rather-long-name",
                   {"durable": True, "arguments": QQ})[0] in (201, 204)
    assert api.put("/api/policies/%2F/ui-phone-policy", {
        "pattern": "^ui-phone-nothing-matches$", "apply-to": "queues",
        "definition": {"max-length": 100, "delivery-limit": 5}})[0] in (201, 204)
    conn = pika.BlockingConnection(pika.ConnectionParameters(
        "127.0.0.1", cluster.nodes[0].port, client_properties={"connection_name": "ui-phone-client"}))
    conn.channel()
    try:
        page.set_viewport_size({"width": 390, "height": 844})
        login(page, cluster)
        base = f"http://127.0.0.1:{cluster.nodes[0].management_port}/"
        pages = [  # route, what shows it is drawn, a table that must be wider than the phone
            ("#/overview", "#nodes", "nodes"),
            ("#/queues", "#queues", "queues"),
            ("#/queues/%2F/ui-phone-queue-with-a-rather-long-name", "#members", "members"),
            ("#/connections", "#connections", "connections"),
            ("#/exchanges", "text=Bindings", None),
            ("#/policies", "#policies", "policies"),
            ("#/admin", "#permissions", "permissions"),
        ]
        for route, ready, wide_table in pages:
            page.goto(base + route)
            expect(page.locator(ready).first).to_be_visible()
            if route == "#/connections":
                expect(page.locator("#connections")).to_contain_text("ui-phone-client")
            got = page.evaluate(PHONE_CHECK)
            name = route.strip("#/").split("/")[0] + ("-detail" if route.count("/") > 2 else "")
            shot(page, artifacts, f"phone-{name}")
            assert got["scrollWidth"] <= got["innerWidth"] + 1, (route, got)
            assert not got["wide"], (route, got["wide"])
            assert got["wraps"], route
            for w in got["wraps"]:  # each table within the screen, scrolling in its own box
                assert w["right"] <= got["innerWidth"] + 1, (route, w)
                if w["scrolls"]:
                    assert w["overflow"] in ("auto", "scroll"), (route, w)
            if wide_table:
                assert any(w["table"] == wide_table and w["scrolls"] for w in got["wraps"]), (route, got)
    finally:
        conn.close()
        api.delete("/api/policies/%2F/ui-phone-policy")
        api.delete("/api/queues/%2F/ui-phone-queue-with-a-rather-long-name")
