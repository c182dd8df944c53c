"""The report in a real headless browser (Debian's chromium, driven over the DevTools protocol):
the page loads with no console errors and no network requests, every plot renders, and a
screenshot shows them (non-blank, many colours inside each plot's box)."""
from __future__ import annotations

import json

import numpy as np
import pytest

from dynamiccl.detector.events import RegimeChange
from dynamiccl.cli import main
from report_browser import Browser, chromium_path, decode_png
from report_helpers import make_run

pytestmark = pytest.mark.skipif(chromium_path() is None, reason="Debian chromium (/usr/bin/chromium) is not installed")

START = 1_767_225_600.0


@pytest.fixture(scope="module")
def page(tmp_path_factory):
    root = tmp_path_factory.mktemp("browser")
    d = make_run(root, records=40_000)
    rc = RegimeChange(id="rc-1", kind="bandwidth", job_id="synthetic-job", start_s=START + 36, detected_s=START + 38,
                      magnitude=2.5, comm_names=["dp0"], funcs=["AllReduce"], size_buckets=[24])
    (root / "changes.jsonl").write_text(rc.to_json() + "\n")
    (root / "retuner-audit.jsonl").write_text(json.dumps(
        {"ts": 1.0, "t": START + 40, "action": "commit", "dry_run": True, "target": "dp0/AllReduce/24",
         "candidate": "RING/LL128/0", "expected_gain": 1.2}) + "\n")
    out = root / "report.html"
    assert main(["report", d, "-o", str(out)]) == 0
    with Browser(width=1400, height=1000) as b:
        b.load(out.as_uri())
        # plotly draws asynchronously after the load event: wait until every plot has its SVG
        n = b.evaluate("""new Promise(resolve => { const t0 = Date.now(); (function poll() {
            const divs = [...document.querySelectorAll('.js-plotly-plot')];
            const done = divs.filter(d => d._fullLayout && d.querySelector('.main-svg')).length;
            if ((divs.length && done === divs.length) || Date.now() - t0 > 30000) resolve(done); else setTimeout(poll, 100);
        })(); })""")
        boxes = b.evaluate("""[...document.querySelectorAll('.js-plotly-plot')].map(d => {
            const r = d.getBoundingClientRect();
            return {id: d.id, x: r.left + window.scrollX, y: r.top + window.scrollY, w: r.width, h: r.height,
                    traces: d.data.length, points: d.querySelectorAll('.trace, .hm, image').length}; })""")
        # switching the heatmap to another collective must not raise either
        assert b.evaluate("Plotly.restyle('fig-heatmap', {visible: [false, true, false, false, false]}).then(() => true)")
        png = b.screenshot(full_page=True)
        yield {"rendered": n, "boxes": boxes, "errors": b.errors(), "requests": b.requests(),
               "png": png, "out": out}


def test_loads_without_console_errors(page):
    assert page["errors"] == []


def test_no_network_requests(page):
    external = [u for u in page["requests"] if not u.startswith(("file:", "data:", "blob:", "about:"))]
    assert external == []


def test_every_plot_renders(page):
    assert page["rendered"] == 4
    assert [b["id"] for b in page["boxes"]] == ["fig-timeline", "fig-heatmap", "fig-spread", "fig-mix"]
    for box in page["boxes"]:
        assert box["traces"] > 0 and box["w"] > 600 and box["h"] > 300, box


def test_screenshot_shows_the_plots(page):
    img = decode_png(page["png"])[:, :, :3].astype(np.int32)
    h, w, _ = img.shape
    assert h > 2000 and w >= 1300
    for box in page["boxes"]:
        y0, y1 = int(box["y"]), min(h, int(box["y"] + box["h"]))
        x0, x1 = int(box["x"]), min(w, int(box["x"] + box["w"]))
        region = img[y0:y1, x0:x1]
        ink = (region < 235).any(axis=2).mean()  # share of non-white pixels
        q = region // 16
        colours = len(np.unique(q[:, :, 0] * 256 + q[:, :, 1] * 16 + q[:, :, 2]))
        assert ink > 0.04, (box["id"], ink)
        assert colours > 40, (box["id"], colours)
    # the heatmaps really are colour fields, not empty axes: plenty of saturated pixels
    hm = next(b for b in page["boxes"] if b["id"] == "fig-heatmap")
    region = img[int(hm["y"]):int(hm["y"] + hm["h"]), int(hm["x"]):int(hm["x"] + hm["w"])]
    sat = (region.max(axis=2) - region.min(axis=2)) > 60
    assert sat.mean() > 0.05
