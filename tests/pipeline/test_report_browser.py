"""The reports a person reads (issue 25 point 5), loaded in headless Chromium: two nodes with
the same traffic both show in the per-node chart, the last partial window is marked and not
drawn as a fall, and a payload counter (``seq``) is left out of the statistics.

The archive: nodes n1 and n2 with the same messages, from 12:00:00 in 30 s windows of 30, 45,
60 or 75 messages (so the line zigzags), on topics s/a/dev-N, payload ``{"temperature": T,
"seq": N}``; the last window, 12:09:30, holds the first 15 s of its 30 only.
"""

from __future__ import annotations

import functools
import http.server
import json
import threading

import pytest

pytest.importorskip("pyarrow")
pytest.importorskip("selenium")

from mqttmesh.archive.recorder import ArchiveLimits, Chunk  # noqa: E402
from mqttmesh.archive.schema import PUBLISH  # noqa: E402
from mqttmesh.archive.writer import FileWriter  # noqa: E402
from mqttmesh.pipeline.jobs import job_options, run_payloads, run_traffic  # noqa: E402

pytestmark = [pytest.mark.spark, pytest.mark.process]

T12 = 1769947200.0  # 2026-02-01T12:00:00Z
WINDOW = 30
WINDOWS = 20


def _times() -> list[float]:
    out = []
    for k in range(WINDOWS):
        n = 30 + (k % 4) * 15
        last = WINDOW / 2 if k == WINDOWS - 1 else WINDOW
        out += [T12 + k * WINDOW + i * WINDOW / n for i in range(n) if i * WINDOW / n < last]
    return out


def _archive(root) -> None:
    for node in ("n1", "n2"):
        w = FileWriter(str(root / node), node, 1, ArchiveLimits())
        rows = []
        for i, t in enumerate(_times()):
            dev = i % 3
            payload = json.dumps({"temperature": 20.0 + dev + (i % 10) / 10, "seq": i // 3 + 1}).encode()
            rows.append((t, i + 1, f"dev-{dev}", f"s/a/dev-{dev}", 1, False, payload))
        w.add(Chunk(PUBLISH, rows, sum(len(r[6]) for r in rows), 0), now=0.0)
        w.close()


@pytest.fixture
def served(tmp_path):
    """An HTTP server of ``tmp_path`` on loopback (a page's images read into a canvas must
    come from its own origin): yields its base URL."""
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(tmp_path))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)


# the page's images, whether each loaded, and for the per-node chart the number of pixels of
# each of matplotlib's first two line colours (C0, C1), read through a canvas
PAGE = """
const imgs = Array.from(document.images);
const out = {images: imgs.map((i) => [i.getAttribute("src"), i.complete && i.naturalWidth > 0])};
const chart = imgs.find((i) => i.getAttribute("src").endsWith(arguments[0]));
if (chart) {
  const c = document.createElement("canvas");
  c.width = chart.naturalWidth; c.height = chart.naturalHeight;
  const g = c.getContext("2d");
  g.drawImage(chart, 0, 0);
  const d = g.getImageData(0, 0, c.width, c.height).data;
  const colours = {C0: [31, 119, 180], C1: [255, 127, 14]};
  out.pixels = {};
  for (const [name, [r, gr, b]] of Object.entries(colours)) {
    let n = 0;
    for (let p = 0; p < d.length; p += 4) {
      if (Math.abs(d[p] - r) + Math.abs(d[p + 1] - gr) + Math.abs(d[p + 2] - b) < 40) n++;
    }
    out.pixels[name] = n;
  }
}
out.notes = Array.from(document.querySelectorAll("p.note")).map((p) => p.textContent);
out.tables = Object.fromEntries(Array.from(document.querySelectorAll("h2")).map((h) => {
  const t = h.nextElementSibling.nextElementSibling;
  return [h.nextElementSibling.querySelector("code").textContent,
          Array.from(t.querySelectorAll("tr")).map((r) => Array.from(r.children).map((c) => c.textContent))];
}));
out.summary = Object.fromEntries(Array.from(document.querySelector("table").querySelectorAll("tr")).slice(1)
  .map((r) => [r.children[0].textContent, r.children[1].textContent]));
return out;
"""


def _load(browser, url: str, chart: str) -> dict:
    browser.get(url)
    # (the page is static: loaded when every image has, or failed to)
    deadline = 30
    from selenium.webdriver.support.ui import WebDriverWait

    WebDriverWait(browser, deadline).until(
        lambda d: d.execute_script("return Array.from(document.images).every((i) => i.complete)")
    )
    return browser.execute_script(PAGE, chart)


def test_the_reports_in_a_browser(spark, tmp_path, served, browser):
    _archive(tmp_path / "archive")
    roots = [str(tmp_path / "archive" / n) for n in ("n1", "n2")]
    opts = dict(archive=roots, window=WINDOW, level=1)
    run_traffic(spark, job_options(out=str(tmp_path / "traffic"), **opts), lambda s: None)
    run_payloads(spark, job_options(out=str(tmp_path / "payloads"), **opts), lambda s: None)

    page = _load(browser, f"{served}/traffic/report.html", "traffic_nodes.png")
    assert page["images"] and all(ok for _, ok in page["images"]), page["images"]
    # n1 and n2 carry the same traffic: their lines coincide, and both colours show along it
    # (a legend entry alone is a few dozen pixels)
    assert page["pixels"]["C0"] > 300 and page["pixels"]["C1"] > 300, page["pixels"]
    per_node = page["tables"]["per_node"]
    assert per_node[0][-1] == "complete"
    # the last window holds 15 s of data: partial, and said so; the others are whole
    complete = {(r[0], r[2]): r[-1] for r in per_node[1:]}
    assert len(complete) == 2 * WINDOWS
    assert {k for k, v in complete.items() if v != "True"} == {
        ("2026-02-01T12:09:30.000000Z", "n1"),
        ("2026-02-01T12:09:30.000000Z", "n2"),
    }
    assert any("partial" in n and "12:09:30" in n for n in page["notes"]), page["notes"]

    page = _load(browser, f"{served}/payloads/report.html", "payload_0.png")
    assert page["images"] and all(ok for _, ok in page["images"]), page["images"]
    assert page["summary"]["numeric_fields"] == "temperature"
    assert page["summary"]["left_out"] == "seq"
    assert any("seq" in n and "left out" in n for n in page["notes"]), page["notes"]
    fields = {r[3] for r in page["tables"]["payload_stats"][1:]} | {r[1] for r in page["tables"]["payload_totals"][1:]}
    assert fields == {"temperature"}
