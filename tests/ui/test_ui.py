"""The management web UI in a real browser (issue 17): Debian's Chromium,
headless, driven by Playwright, against a real 3-node cluster.

Log in; see the queues a client declared with their leader and members;
publish and get a message; create a policy and see it applied to a queue,
then delete it; purge a queue; close a connection; kill a node and see it
shown as down, restart it and see it back. Screenshots go to
$QQ_UI_ARTIFACTS (default: the test's temporary directory) and their paths
are printed.
"""
from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path

import pika
import pytest
from playwright.sync_api import Browser, Page, expect, sync_playwright

from tests.mgmt.conftest import MgmtCluster, mgmt_cluster, wait_for  # noqa: F401 (fixture)

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


@pytest.fixture
def page(browser: Browser, cluster: MgmtCluster) -> Iterator[Page]:
    ctx = browser.new_context(viewport={"width": 1280, "height": 900})
    pg = ctx.new_page()
    pg.set_default_timeout(20_000)
    pg.on("dialog", lambda d: d.accept())  # confirmations are answered yes
    yield pg
    ctx.close()


def shot(page: Page, artifacts: Path, name: str) -> None:
    path = artifacts / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    print(f"screenshot: {path}")


def login(page: Page, cluster: MgmtCluster, node: int = 0) -> None:
    page.goto(f"http://127.0.0.1:{cluster.nodes[node].management_port}/")
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
    assert page.evaluate("document.documentElement.scrollWidth") <= 390 + 1 or \
        page.locator(".table-wrap").count() > 0  # wide tables scroll inside their box
    shot(page, artifacts, "phone-queues")
