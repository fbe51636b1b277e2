"""The report in a real browser (Debian's chromium, headless; scripts/setup.sh installs it) and the
Chrome-trace export against the Trace Event Format that Perfetto's JSON importer reads."""
from __future__ import annotations

import json
import re
import shutil
import subprocess
from html.parser import HTMLParser

import numpy as np
import pytest
from PIL import Image
from test_account import H200L
from test_report import closing_trace

from boltbeam.account.price import Price
from boltbeam.bound.roofline import bound
from boltbeam.files import write_atomic
from boltbeam.read.census import take_census
from boltbeam.report.audit import assemble
from boltbeam.report.chrome import chrome_trace
from boltbeam.report.page import render

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--hide-scrollbars",
         "--enable-logging=stderr", "--v=0"]   # dev-shm: containers often give /dev/shm 64 MB


def browse(page, *extra: str) -> tuple[str, list[str]]:
    """Load a page headless: the DOM after load, and every console message the page produced."""
    assert CHROMIUM, "chromium is not installed: run scripts/setup.sh"
    done = subprocess.run([CHROMIUM, *FLAGS, *extra, f"file://{page}"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout, [line for line in done.stderr.splitlines() if ":CONSOLE" in line]


def screenshot(page, out) -> Image.Image:
    browse(page, f"--screenshot={out}", "--window-size=1400,2400")
    return Image.open(out).convert("RGB")


def inked(im: Image.Image) -> float:
    """The fraction of pixels that are not near-white."""
    return float((np.asarray(im).min(axis=2) < 235).mean())


def colours(im: Image.Image) -> int:
    return len(np.unique(np.asarray(im.resize((350, 600))).reshape(-1, 3), axis=0))


class _Charts(HTMLParser):
    """Per figure.chart: how many drawn SVG shapes it holds."""

    def __init__(self):
        super().__init__()
        self.shapes: dict[str, int] = {}
        self._in: str | None = None
        self._depth = 0

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "figure" and "chart" in (a.get("class") or ""):
            self._in, self._depth = a["id"], 0
            self.shapes[self._in] = 0
        elif self._in:
            self._depth += tag == "figure"
            self.shapes[self._in] += tag in ("path", "rect", "line", "polyline", "use")

    def handle_endtag(self, tag):
        if tag == "figure" and self._in:
            if self._depth == 0:
                self._in = None
            self._depth -= 1


@pytest.fixture(scope="module")
def page(tiny_model, tmp_path_factory):
    b = bound(take_census(tiny_model), H200L, context=8, batch=1)
    out = tmp_path_factory.mktemp("page")
    other = closing_trace(b, label="other-route")
    audit = assemble(closing_trace(b), "t.json", tiny_model, H200L, b, Price(3.5, "test"), [("o.json", other)])
    write_atomic(out / "report.html", render(audit))
    return out / "report.html"


def test_the_report_renders_in_chromium(page, tmp_path):
    dom, console = browse(page, "--dump-dom")
    assert console == []                                   # no error, no warning, nothing fetched and missed
    parser = _Charts()
    parser.feed(dom)
    assert set(parser.shapes) == {"roofline-chart", "tieout-chart", "compare-1-chart", "timeline-chart"}
    assert all(n >= 10 for n in parser.shapes.values()), parser.shapes   # every chart drawn, not an empty frame
    im = screenshot(page, tmp_path / "shot.png")
    assert inked(im) > 0.03 and colours(im) > 50           # text, bars, colours: not blank


# Run in a copy of the page only (the page itself runs no script): what a reader at 1280 px cannot see
# without scrolling sideways, written into the DOM for --dump-dom to read back.
MEASURE = """<script>
const clipped = [...document.querySelectorAll(".numbers")].filter(e => e.scrollWidth > e.clientWidth)
  .map(e => e.closest(".pair").querySelector("figure").id);
if (document.documentElement.scrollWidth > window.innerWidth) clipped.push("the page");
document.body.setAttribute("data-clipped", clipped.join(" ") || "none");
</script>"""


def clipped_at(page, width: int, tmp_path) -> str:
    measured = tmp_path / f"measured-{page.stem}.html"
    measured.write_text(page.read_text().replace("</body>", MEASURE + "</body>"))
    dom, _ = browse(measured, "--dump-dom", f"--window-size={width},2000")
    return re.search(r'data-clipped="([^"]*)"', dom).group(1)


def test_no_table_is_clipped_at_1280_px(page, tmp_path):
    """Every chart's table shows whole beside its chart or under it: none scrolls sideways (the roofline's
    "of bandwidth" column hid behind a scrollbar at 1280 px)."""
    assert clipped_at(page, 1280, tmp_path) == "none"
    old = tmp_path / "old.html"   # the check can fail: the rule that clipped it (a table given what is left)
    old.write_text(page.read_text().replace("</style>", ".pair .numbers { flex: 1 1 420px; min-width: 0; }</style>"))
    assert "roofline-chart" in clipped_at(old, 1280, tmp_path).split()


def test_the_browser_checks_can_fail(tmp_path):
    """The same checks catch a page that errs and a page that draws nothing."""
    bad = tmp_path / "bad.html"
    bad.write_text('<!DOCTYPE html><html><body><script>console.error("boom"); missing();</script></body></html>')
    _, console = browse(bad, "--dump-dom")
    assert any("boom" in line for line in console) and any("missing" in line for line in console)
    assert inked(screenshot(bad, tmp_path / "blank.png")) < 0.001


# --- the Chrome-trace export, as Perfetto's JSON importer reads it ------------------------------------
# Trace Event Format (the JSON object form): {"traceEvents": [...], "displayTimeUnit": "ms"|"ns"}; a
# complete event has ph "X", name, cat, ts and dur in microseconds, pid and tid; a metadata event has
# ph "M", name process_name or thread_name and args.name.

def test_chrome_export_follows_the_trace_event_format(tiny_model):
    b = bound(take_census(tiny_model), H200L, context=8, batch=1)
    trace = closing_trace(b)
    doc = json.loads(json.dumps(chrome_trace(trace), allow_nan=False))   # strict JSON: no NaN, no Infinity
    assert set(doc) >= {"traceEvents"} and doc["displayTimeUnit"] in ("ms", "ns")
    names = {}
    for e in doc["traceEvents"]:
        assert e["ph"] in ("X", "M") and isinstance(e["pid"], int) and isinstance(e["tid"], int)
        if e["ph"] == "M":
            assert e["name"] in ("process_name", "thread_name") and isinstance(e["args"]["name"], str)
            names[(e["name"], e["tid"])] = e["args"]["name"]
            continue
        assert isinstance(e["name"], str) and isinstance(e["cat"], str) and isinstance(e.get("args", {}), dict)
        assert isinstance(e["ts"], (int, float)) and isinstance(e["dur"], (int, float)) and e["ts"] >= 0 <= e["dur"]
    kernels = [e for e in doc["traceEvents"] if e["ph"] == "X" and e["cat"] == "kernel"]
    assert len(kernels) == len(trace.kernels)
    assert {("thread_name", k["tid"]) for k in kernels} <= set(names)     # every track is named
    tokens = sorted((e for e in doc["traceEvents"] if e.get("cat") == "user_annotation"), key=lambda e: e["ts"])
    for a, b_ in zip(tokens, tokens[1:]):
        assert a["ts"] + a["dur"] <= b_["ts"] + 1e-9                      # tokens laid end to end, never overlapping
