"""The HTML report as a person sees it: rendered by headless Chromium, checked from the laid-out
DOM (bounding boxes measured by the browser) and from a screenshot (the pixels under each
legend swatch). Skips when Chromium is missing (Debian package `chromium`)."""
from __future__ import annotations

import json
import re
import shutil
import struct
import subprocess
import zlib
from pathlib import Path

import numpy as np
import pytest

from controller.analysis.charts import bar_chart
from controller.analysis.report import build_report, render_html
from tests.analysis.test_report import run  # noqa: F401  (the fixture: a small real store)

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = pytest.mark.skipif(CHROMIUM is None,
                                reason="chromium is not installed (Debian package chromium)")
WINDOW = (1100, 4000)

# Runs in the page after layout: every chart's legend boxes, marks, axis labels and plot box.
MEASURE = """
<script>
window.addEventListener('load', () => {
  const box = e => { const r = e.getBoundingClientRect();
                     return {x: r.left, y: r.top, w: r.width, h: r.height}; };
  const charts = [...document.querySelectorAll('svg.chart')].map(svg => ({
    title: svg.querySelector('title').textContent,
    legend: [...svg.querySelectorAll('.legend-item')].map(g => ({
      series: g.dataset.series, box: box(g), swatch: box(g.querySelector('rect')),
      fill: g.querySelector('rect').getAttribute('fill'),
      text: g.querySelector('text').textContent})),
    marks: [...new Set([...svg.querySelectorAll('.mark')].map(m => m.dataset.series))],
    x_label: (svg.querySelector('.x-label') || {}).textContent || '',
    y_label: (svg.querySelector('.y-label') || {}).textContent || '',
    y_ticks: [...svg.querySelectorAll('.y-tick')].map(t => t.textContent),
    x_ticks: [...svg.querySelectorAll('.x-tick')].map(t => t.textContent),
    axis_bottom: Math.max(...[...svg.querySelectorAll('.x-label, .x-tick')]
                          .map(t => t.getBoundingClientRect().bottom)),
  }));
  const pre = document.createElement('pre');
  pre.id = 'layout';
  pre.textContent = JSON.stringify(charts);
  document.body.appendChild(pre);
});
</script>
"""


def chromium(tmp_path: Path, page: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
         "--no-first-run", "--disable-background-networking", "--disable-component-update",
         "--disable-sync", "--hide-scrollbars", "--force-device-scale-factor=1",
         f"--user-data-dir={tmp_path / 'chromium-profile'}",
         f"--window-size={WINDOW[0]},{WINDOW[1]}", *args, page.as_uri()],
        capture_output=True, text=True, timeout=120, check=True)


def layout(tmp_path: Path, html: str) -> list[dict]:
    page = tmp_path / "measure.html"
    page.write_text(html.replace("</body>", MEASURE + "</body>"))
    dom = chromium(tmp_path, page, "--dump-dom").stdout
    m = re.search(r'<pre id="layout">(.*?)</pre>', dom, re.S)
    assert m, "the page's measuring script did not run"
    return json.loads(m.group(1).replace("&quot;", '"').replace("&lt;", "<")
                      .replace("&gt;", ">").replace("&amp;", "&"))


def read_png(path: Path) -> np.ndarray:
    """RGB(A) 8-bit non-interlaced PNG -> array (h, w, channels); what Chromium writes."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat, header = 8, b"", None
    while pos < len(data):
        n, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + n]
        if kind == b"IHDR":
            header = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            idat += body
        pos += 12 + n
    w, h, depth, colour, _, _, interlace = header
    assert depth == 8 and colour in (2, 6) and not interlace, header
    ch = 3 if colour == 2 else 4
    raw = np.frombuffer(zlib.decompress(idat), np.uint8).reshape(h, 1 + w * ch)
    out = np.zeros((h, w * ch), np.int32)
    for y in range(h):
        f, line = raw[y, 0], raw[y, 1:].astype(np.int32)
        prev = out[y - 1] if y else np.zeros(w * ch, np.int32)
        if f == 0:
            cur = line
        elif f == 2:
            cur = (line + prev) % 256
        else:   # 1 (sub), 3 (average), 4 (Paeth) depend on the pixel to the left
            cur = np.zeros(w * ch, np.int32)
            for i in range(w * ch):
                a = cur[i - ch] if i >= ch else 0
                b, c = prev[i], (prev[i - ch] if i >= ch else 0)
                if f == 1:
                    pred = a
                elif f == 3:
                    pred = (a + b) // 2
                else:
                    p = a + b - c
                    pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                    pred = a if pa <= pb and pa <= pc else (b if pb <= pc else c)
                cur[i] = (line[i] + pred) % 256
        out[y] = cur
    return out.reshape(h, w, ch).astype(np.uint8)


def overlaps(a: dict, b: dict) -> bool:
    return (a["x"] < b["x"] + b["w"] and b["x"] < a["x"] + a["w"]
            and a["y"] < b["y"] + b["h"] and b["y"] < a["y"] + a["h"])


def check_chart(chart: dict) -> None:
    legend = chart["legend"]
    names = [item["series"] for item in legend]
    assert set(chart["marks"]) <= set(names), (chart["title"], chart["marks"], names)
    assert all(item["text"] == item["series"] for item in legend)
    for i, a in enumerate(legend):
        for b in legend[i + 1:]:
            assert not overlaps(a["box"], b["box"]), (chart["title"], a, b)
        assert a["box"]["y"] >= chart["axis_bottom"], (chart["title"], "legend over the axis", a)
    assert chart["x_label"] and chart["y_label"], chart["title"]
    assert len(chart["y_ticks"]) >= 2 and chart["x_ticks"], chart["title"]


@pytest.fixture(scope="module")
def report_page(run, tmp_path_factory):  # noqa: F811
    return render_html(build_report(run["dir"]))


def test_every_chart_has_labelled_axes_and_a_legend_of_every_series_that_never_overlaps(
        report_page, tmp_path):
    charts = layout(tmp_path, report_page)
    assert [c["title"] for c in charts] == ["Pass rate by policy version", "Tasks per band class",
                                            "Time per span kind"]
    for chart in charts:
        check_chart(chart)
    by_title = {c["title"]: c for c in charts}
    assert [i["series"] for i in by_title["Tasks per band class"]["legend"]] == [
        "too hard", "in band", "too easy", "explore (little data)"]
    assert by_title["Pass rate by policy version"]["x_ticks"] == ["v0", "v1"]
    assert by_title["Pass rate by policy version"]["y_ticks"][-1] == "100%"
    assert by_title["Time per span kind"]["y_label"] == "duration (ms)"


def test_many_long_series_names_wrap_into_rows_without_overlapping(tmp_path):
    series = {f"series number {i} with a long name": [float(i), 2.0] for i in range(12)}
    svg = bar_chart(["a", "b"], series, "many", x_label="category", y_label="value", y_unit="s")
    charts = layout(tmp_path, f"<!doctype html><html><body>{svg}</body></html>")
    check_chart(charts[0])
    assert len({round(i["box"]["y"]) for i in charts[0]["legend"]}) > 1      # it wrapped


def test_the_screenshot_shows_each_legend_swatch_in_its_series_colour(report_page, tmp_path):
    charts = layout(tmp_path, report_page)
    page, shot = tmp_path / "report.html", tmp_path / "report.png"
    page.write_text(report_page)
    chromium(tmp_path, page, f"--screenshot={shot}")
    img = read_png(shot)
    seen = 0
    for chart in charts:
        for item in chart["legend"]:
            s = item["swatch"]
            x, y = int(s["x"] + s["w"] / 2), int(s["y"] + s["h"] / 2)
            if y >= img.shape[0]:
                continue
            want = [int(item["fill"][i:i + 2], 16) for i in (1, 3, 5)]
            got = img[y, x, :3].astype(int)
            assert np.abs(got - want).max() <= 8, (chart["title"], item["series"], got, want)
            seen += 1
    assert seen >= 8


def test_an_empty_run_says_so_in_sentences_instead_of_bare_headers(tmp_path):
    (tmp_path / "run" / "rollouts").mkdir(parents=True)
    page = render_html(build_report(tmp_path / "run"))
    for sentence in ("No hack suspects", "No infra errors", "No timed spans were recorded",
                     "No scored rollout is committed yet"):
        assert sentence in page
    for chart in layout(tmp_path, page):
        assert chart["x_label"] and chart["y_label"]
