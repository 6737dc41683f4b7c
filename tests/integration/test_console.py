"""The web console (issue 22 point 3) in a real browser: headless Chromium driven by
selenium loads a node's console, which shows every node of a 3-node mesh with its links and
their costs, the shortest-path tree from a node chosen by a click, the clients with a kick
button that disconnects one on another node, and a killed node marked down within the
failure-detection time (3 x --mesh-keepalive, plus a poll)."""

from __future__ import annotations

import os
import signal
import time

import pytest
from selenium.webdriver.common.by import By

from support.integration import Client, connack
from support.mesh import start_mesh, wait_converged
from support.processes import wait_for

pytestmark = [pytest.mark.process]

NAMES = ["a", "b", "c"]
EDGES = [("b", "a"), ("c", "a"), ("c", "b")]
KEEPALIVE = 0.5  # --mesh-keepalive: a link silent for 1.5 s is dead


# what the page shows, read in one go (the console redraws every second: elements held
# across calls would go stale)
SNAPSHOT = """
const q = (sel) => Array.from(document.querySelectorAll(sel));
return {
  here: document.getElementById("here").textContent,
  root: document.getElementById("root").textContent,
  nodes: Object.fromEntries(q("#graph g.node").map((g) => {
    const t = g.querySelectorAll("text");
    return [t[0].textContent, t[1].textContent];
  })),
  links: q("#graph line.link").length,
  tree: q("#graph line.tree").length,
  costs: q("#graph text.cost").map((t) => t.textContent),
  table: Object.fromEntries(q("#nodes tbody tr").map((tr) =>
    [tr.dataset.node, Array.from(tr.cells).map((td) => td.textContent)])),
  clients: Object.fromEntries(q("#clients tbody tr").map((tr) =>
    [tr.dataset.client, Array.from(tr.cells).slice(0, 4).map((td) => td.textContent)])),
  tokenBox: getComputedStyle(document.getElementById("token-box")).display !== "none",
};
"""


def shown(driver) -> dict:
    return driver.execute_script(SNAPSHOT)


def click(driver, selector: str) -> None:
    """A click on the element the selector finds now (a DOM event, as a user's click)."""
    found = driver.execute_script(
        "const e = document.querySelector(arguments[0]);"
        "if (!e) return false;"
        "e.dispatchEvent(new MouseEvent('click', {bubbles: true})); return true;",
        selector,
    )
    assert found, selector


def test_the_console_shows_the_mesh_its_tree_and_clients_and_kicks_one(broker_factory, browser, tmp_path):
    nodes = start_mesh(
        broker_factory, NAMES, EDGES, connect="all", http=True, extra=["--mesh-keepalive", str(KEEPALIVE)]
    )
    wait_converged(nodes, EDGES)
    a, c = nodes["a"], nodes["c"]
    on_b = Client(nodes["b"].host, nodes["b"].port)
    on_c = Client(c.host, c.port)
    try:
        assert connack(on_b.connect(client_id="sensor-on-b"))[1] == 0
        assert connack(on_c.connect(client_id="kick-me-on-c"))[1] == 0
        browser.get(f"http://{a.host}:{a.http_port}/")
        wait_for(lambda: shown(browser)["nodes"] == dict.fromkeys(NAMES, "up"), 15, what="the three nodes shown up")
        page = wait_for(lambda: (lambda p: p if p["tree"] == 2 else None)(shown(browser)), 10, what="a's tree")
        assert page["here"] == "a" and page["root"] == "a"
        # every link drawn with its cost
        assert page["links"] == 3 and len(page["costs"]) == 3 and all(int(x) > 0 for x in page["costs"])
        # a click on b: the tree from b
        click(browser, '#graph g.node[data-node="b"]')
        wait_for(lambda: shown(browser)["root"] == "b" and shown(browser)["tree"] == 2, 10, what="the tree from b")
        # the node table: every node, with its message rates once two polls came
        page = wait_for(
            lambda: (lambda p: p if len(p["table"]) == 3 and p["table"]["c"][4] != "-" else None)(shown(browser)),
            10,
            what="per-node message rates",
        )
        assert [page["table"][n][1] for n in NAMES] == ["up"] * 3

        # the clients of the whole mesh; kick the one on c from a's console
        page = wait_for(
            lambda: (lambda p: p if {"kick-me-on-c", "sensor-on-b"} <= set(p["clients"]) else None)(shown(browser)),
            10,
            what="both clients listed",
        )
        assert page["clients"]["kick-me-on-c"][:2] == ["kick-me-on-c", "c"]
        assert page["clients"]["sensor-on-b"][:2] == ["sensor-on-b", "b"]
        if os.environ.get("MQTTMESH_CONSOLE_SHOT"):  # (the screenshot in docs/)
            browser.save_screenshot(os.environ["MQTTMESH_CONSOLE_SHOT"])
        click(browser, '#clients tr[data-client="kick-me-on-c"] button.kick')
        on_c.expect_closed(10)
        wait_for(lambda: "kick-me-on-c" not in shown(browser)["clients"], 10, what="the kicked client gone")
        on_b.ping()  # the other one is untouched

        # kill c: the console marks it down within the failure-detection time
        killed = time.monotonic()
        os.kill(c.pid, signal.SIGKILL)
        wait_for(lambda: shown(browser)["nodes"].get("c") == "down", 15, what="c marked down")
        took = time.monotonic() - killed
        assert took < 3 * KEEPALIVE + 3.0, took  # detection, a route recomputation, a poll (1 s)
        page = shown(browser)
        assert page["nodes"]["a"] == "up" and page["nodes"]["b"] == "up" and page["table"]["c"][1] == "down"
    finally:
        on_b.close()
        on_c.close()


def test_the_console_asks_for_the_token_and_uses_it(broker_factory, browser):
    """With http.token set, the console's page loads without it, asks for it, and shows the
    node once it is given."""
    from support.processes import free_port

    port = free_port()
    b = broker_factory("--http-port", str(port), "--http-token", "s3cret-token")
    browser.get(f"http://{b.host}:{port}/")
    wait_for(lambda: shown(browser)["tokenBox"], 10, what="the token box")
    browser.find_element(By.ID, "token").send_keys("s3cret-token")
    click(browser, "#token-save")
    page = wait_for(lambda: (lambda p: p if len(p["nodes"]) == 1 else None)(shown(browser)), 10, what="the node")
    assert list(page["nodes"].values()) == ["up"] and not page["tokenBox"]
