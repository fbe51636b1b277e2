"""What fixing it could return (price), the audit record, the HTML page and the `audit`/`report` commands,
on traces built against the tiny synthetic model's bound (test_account's helpers), so every number
the page must show is known in advance."""
from __future__ import annotations

import dataclasses
import json
import re
from html.parser import HTMLParser

import pytest
from test_account import H200L, PER_CALL_US, PER_KERNEL_US, full_token, make_trace, span

from boltbeam.account import account
from boltbeam.account.price import Price, cost_per_mtok, price_of, returns
from boltbeam.bound.roofline import bound
from boltbeam.bound.targets import get_target
from boltbeam.cli import main
from boltbeam.errors import BadInput
from boltbeam.files import sha256_file
from boltbeam.measure.trace import save
from boltbeam.read.census import take_census
from boltbeam.report import charts
from boltbeam.report.audit import assemble, line_of
from boltbeam.report.page import render


@pytest.fixture(scope="module")
def tiny_bound(tiny_model):
    return bound(take_census(tiny_model), H200L, context=0, batch=1)


def closing_trace(b, tokens: int = 3, sha: str | None = None, label: str = "test-route"):
    ks = [full_token(b, t) for t in range(tokens)]
    plain = span(ks[0]) + PER_CALL_US + PER_KERNEL_US * len(ks[0])
    t = make_trace(ks, [plain] * tokens, [plain + 10.0] * tokens, sha=sha)
    t.route.label = label
    return t


# --- price: the formula, the what-ifs ---------------------------------------------------------------

def test_cost_per_million_tokens():
    assert cost_per_mtok(100.0, 3.6) == pytest.approx(10.0)   # 3.6 USD/h at 100 tok/s: 1e-5 USD a token
    assert cost_per_mtok(200.0, 3.6) == pytest.approx(5.0)


def test_every_removable_line_gets_its_whatif(tiny_bound):
    acc = account(closing_trace(tiny_bound), tiny_bound, H200L)
    ret = returns(acc, Price(3.6, "test"))
    by_label = {w.label: w for w in ret.whatifs}
    removable = [x for x in acc.lines if x.kind in ("role", "boundary", "gap", "launch") and x.us > 0]
    assert set(by_label) == {x.label for x in removable}
    assert "floor" not in by_label and "activations" not in by_label and "overlap" not in by_label
    down = next(x for x in acc.lines if x.label == "ffn_down")
    w = by_label["ffn_down"]
    assert w.saves_us == pytest.approx(down.us) and w.at_floor.token_us == pytest.approx(acc.wall_us - down.us)
    assert w.at_floor.usd_per_mtok == pytest.approx(cost_per_mtok(1e6 / (acc.wall_us - down.us), 3.6))
    assert [x.saves_us for x in ret.whatifs] == sorted((x.saves_us for x in ret.whatifs), reverse=True)
    assert ret.measured.tok_s == pytest.approx(1e6 / acc.wall_us)
    assert ret.ceiling.token_us == acc.floor_us and ret.ceiling.usd_per_mtok < ret.measured.usd_per_mtok
    assert returns(acc, None).measured.usd_per_mtok is None        # no price: time only


def test_a_whatif_is_never_faster_than_the_floor(tiny_bound):
    acc = account(closing_trace(tiny_bound), tiny_bound, H200L)
    inflated = dataclasses.replace(acc, lines=[*acc.lines, dataclasses.replace(acc.lines[1], label="huge",
                                                                              us=acc.wall_us * 3)])
    w = next(x for x in returns(inflated, None).whatifs if x.label == "huge")
    assert w.at_floor.token_us == acc.floor_us and w.saves_us == pytest.approx(acc.wall_us - acc.floor_us)


def test_price_comes_from_the_flag_then_the_target():
    h200 = get_target("h200")
    assert price_of(h200, None).usd_per_hour == h200.fact("price_per_hour") and price_of(h200, None).date
    assert price_of(h200, 9.0) == Price(9.0, "--price-per-hour")
    bare = dataclasses.replace(h200, facts={k: f for k, f in h200.facts.items() if k != "price_per_hour"})
    assert price_of(bare, None) is None
    for bad in (0.0, -1.0, float("nan"), 1e9):
        with pytest.raises(BadInput, match="--price-per-hour"):
            price_of(h200, bad)


# --- the charts draw the numbers they are given -------------------------------------------------------

def test_chart_numbers(tiny_model, tiny_bound):
    acc = account(closing_trace(tiny_bound), tiny_bound, H200L)
    svg, rows = charts.waterfall(acc)
    assert svg.startswith("<svg") and rows[-1]["line"] == "wall" and rows[-2]["line"] == "residual"
    assert [r["line"] for r in rows[:-2]] == [x.label for x in acc.lines]
    bars = charts.bars(rows)
    assert bars[-2].label == "residual"
    assert bars[-2].from_us + bars[-2].us == pytest.approx(acc.wall_us)   # the lines meet the wall
    svg, rows = charts.roofline(tiny_bound, acc, H200L)
    down = next(r for r in rows if r["role"] == "ffn_down")
    measured = next(x for x in acc.lines if x.label == "ffn_down").measured_us
    assert down["achieved_bytes_per_s"] == pytest.approx(tiny_bound.role("ffn_down").bytes / measured * 1e6)
    assert down["of_bandwidth"] < 1 and "kv_cache" not in {r["role"] for r in rows}   # context 0: no KV bytes
    deep = bound(take_census(tiny_model), H200L, context=64, batch=1)
    kv = next(r for r in charts.roofline(deep, acc, H200L)[1] if r["role"] == "kv_cache")
    assert kv["measured_us"] == next(x for x in acc.lines if x.label == "attention").measured_us
    # Roles a stacked product reads together are one point, at their summed bytes over their one time.
    trace = closing_trace(tiny_bound)
    both = [t.name for t in tiny_bound.tensors if t.role in ("ffn_gate", "ffn_up")]
    trace.kernels = [dataclasses.replace(k, tensors=both) if k.role == "ffn_gate" else k for k in trace.kernels]
    stacked = account(trace, tiny_bound, H200L)
    rows = charts.roofline(tiny_bound, stacked, H200L)[1]
    point = next(r for r in rows if r["role"] == "ffn_gate+ffn_up")
    assert not {"ffn_gate", "ffn_up"} & {r["role"] for r in rows}
    assert point["bytes"] == tiny_bound.role("ffn_gate").bytes + tiny_bound.role("ffn_up").bytes
    assert point["measured_us"] == next(x for x in stacked.lines if x.label == "ffn_gate+ffn_up").measured_us
    kernels = closing_trace(tiny_bound).kernels_of_token(0)
    svg, rows = charts.gantt(kernels, [k.start_us for k in kernels], line_of(acc), [x.label for x in acc.lines])
    assert sum(r["kernels"] for r in rows) == len(kernels)
    assert sum(r["us"] for r in rows) == pytest.approx(sum(k.duration_us for k in kernels))


def test_no_two_roles_or_lines_share_a_colour(tiny_model, tiny_bound):
    """Each role of the roofline and each line of the timeline has a colour of its own (tab10 alone repeats
    past ten: the roofline's eleventh role took the first one's colour)."""
    for n in (1, 10, 11, 20, 21, 40):
        assert len(set(charts.distinct_colors(n))) == n
    deep = bound(take_census(tiny_model), H200L, context=64, batch=1)
    acc = account(closing_trace(deep), deep, H200L)
    roofline = charts.roofline(deep, acc, H200L)[1]
    assert len(roofline) > 10 and len({r["color"] for r in roofline}) == len(roofline)
    kernels = closing_trace(deep).kernels_of_token(0)
    timeline = charts.gantt(kernels, [k.start_us for k in kernels], line_of(acc), [x.label for x in acc.lines])[1]
    assert len(timeline) > 10 and len({r["color"] for r in timeline}) == len(timeline)


def test_the_timeline_names_what_the_tie_out_names(tiny_bound):
    """A kernel's row on the timeline is its line in the tie-out: a constant recomputed every token is
    `constant` in both (it was `other` on the timeline), a stacked product's roles one row."""
    trace = closing_trace(tiny_bound)
    both = [t.name for t in tiny_bound.tensors if t.role in ("ffn_gate", "ffn_up")]
    trace.kernels = [dataclasses.replace(k, category="constant") if k.category == "copy" else
                     dataclasses.replace(k, tensors=both) if k.role == "ffn_gate" else k for k in trace.kernels]
    acc = account(trace, tiny_bound, H200L)
    kernels = trace.kernels_of_token(0)
    rows = charts.gantt(kernels, [k.start_us for k in kernels], line_of(acc), [x.label for x in acc.lines])[1]
    with_kernels = [x.label for x in acc.lines if x.kernels]
    assert [r["line"] for r in rows] == with_kernels            # the same names, in the tie-out's order
    assert "constant" in with_kernels and "ffn_gate+ffn_up" in with_kernels and "other" not in with_kernels
    for r in rows:
        assert r["us"] == pytest.approx(next(x.measured_us for x in acc.lines if x.label == r["line"]))


def test_small_lines_are_one_bar_and_every_bar_shows(tiny_bound):
    acc = account(closing_trace(tiny_bound), tiny_bound, H200L)
    rows = charts.waterfall_rows(acc)
    under = charts.small_under_us(acc.wall_us)
    assert under <= charts.SMALL_SHARE * acc.wall_us and str(under)[0] in "125"   # a round number
    small = [r for r in rows if r["small"]]
    assert len(small) > 1 and all(abs(r["us"]) < under for r in small)
    assert not any(r["small"] for r in rows if r["kind"] in ("floor", "residual", "wall"))
    bars = charts.bars(rows)
    group = next(b for b in bars if b.kind == "small lines")
    assert group.label == f"{len(small)} lines under {under:,g} µs"
    assert group.us == pytest.approx(sum(r["us"] for r in small))
    assert len(bars) == len(rows) - len(small) + 1
    assert sum(b.us for b in bars[:-1]) == pytest.approx(acc.wall_us)   # the bars still add up to the wall


# --- the page ---------------------------------------------------------------------------------------

class _Page(HTMLParser):
    """Collects what a reader (and a browser) would fetch or run, and each chart's figure."""

    def __init__(self):
        super().__init__()
        self.fetches, self.scripts, self.figures, self.svgs = [], 0, [], 0

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        self.scripts += tag == "script"
        self.svgs += tag == "svg"
        if tag == "figure":
            self.figures.append(a.get("id"))
        for key in ("src", "href"):
            if a.get(key) and not a[key].startswith("#"):
                self.fetches.append(a[key])
        if tag == "link":
            self.fetches.append(a.get("href"))


def test_page_is_self_contained_and_escaped(tiny_model, tiny_bound, tmp_path):
    other = tmp_path / "other.json"
    save(closing_trace(tiny_bound, label="other-route"), str(other))
    from boltbeam.report.audit import load_other
    trace = closing_trace(tiny_bound, label="<script>alert(1)</script>")
    audit = assemble(trace, "t.json", tiny_model, H200L, tiny_bound, Price(3.6, "test"),
                     [(str(other), load_other(str(other), 0))])
    html = render(audit)
    page = _Page()
    page.feed(html)
    assert page.fetches == [] and page.scripts == 0                 # opens with no network, runs nothing
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html         # a route label is text, never markup
    assert page.figures == ["roofline-chart", "tieout-chart", "compare-1-chart", "timeline-chart"]
    assert page.svgs == 4
    assert f"{audit.account.wall_us:,.2f}" in html and "closed" in html
    assert f"${audit.returns.measured.usd_per_mtok:,.3f}" in html   # the money is on the page
    assert audit.to_dict()["returns"]["price"]["usd_per_hour"] == 3.6
    assert render(audit) == html                                    # the same audit, the same bytes


def test_the_page_says_what_each_number_is(tiny_model, tiny_bound):
    """Two token times, each named, the difference said; the negative lines and the small bar explained;
    which tie-out lines each compared region gathers."""
    trace = closing_trace(tiny_bound, tokens=8)
    # the tie-out's mean of the middle half of the pairs (0, 1, 2, 9) against the median of all (1.5)
    trace.token_wall_us = [w + d for w, d in zip(trace.token_wall_us, (0.0, 0.0, 0.0, 1.0, 2.0, 9.0, 30.0, 60.0))]
    audit = assemble(trace, "t.json", tiny_model, H200L, tiny_bound, Price(3.6, "test"),
                     [("o.json", closing_trace(tiny_bound, label="other-route"))])
    html = render(audit)
    acc, median = audit.account, audit.wall_us
    assert acc.wall_us != pytest.approx(median)
    assert f"the median of the 8 plain token(s)</td><td class=\"n\">{median:,.2f} µs" in html
    assert f"${cost_per_mtok(1e6 / median, 3.6):,.3f} per million tokens" in html   # the headline's cost is its own
    d = acc.wall_us - median
    assert f"the tie-out's wall</td><td colspan=\"3\">{acc.wall_us:,.2f} µs: the {acc.method}" in html
    assert f"{abs(d):,.2f} µs ({abs(d) / median:.2%}) {'under' if d < 0 else 'over'} the median above" in html
    caption = re.search(r'id="tieout-chart">.*?<figcaption class="note">(.*?)</figcaption>', html, re.S).group(1)
    negative = [x for x in acc.lines if x.us < 0]
    assert negative and "Negative lines take time back out of the sum" in caption
    assert all(x.label in caption for x in negative) and "activations" in caption and "weight kernels" in caption
    assert "lines under" in caption and "drawn as one bar" in caption
    assert re.search(r"Regions gather A&#39;s tie-out lines: qkv: attn_q, attn_k, attn_v; .*; "
                     r"other: token_embd, copy, elementwise\.", html)


def test_a_whole_token_trace_still_gets_a_page(tiny_model, tiny_bound):
    whole = make_trace([], [1000.0, 1001.0], None)
    audit = assemble(whole, "w.json", tiny_model, H200L, tiny_bound, None)
    assert audit.account is None and "whole-token" in audit.no_account
    html = render(audit)
    assert "no account" in html and "roofline-chart" in html and "tieout-chart" not in html


# --- the commands ----------------------------------------------------------------------------------

def run(capsys, *argv) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_audit_of_a_trace_writes_its_files(capsys, tmp_path, tiny_model, tiny_bound):
    trace = tmp_path / "t.json"
    save(closing_trace(tiny_bound, sha=sha256_file(tiny_model)), str(trace))
    out = tmp_path / "audit"
    code, stdout, _ = run(capsys, "audit", tiny_model, "--trace", trace, "--target", "h200", "--out", out,
                          "--price-per-hour", "2", "--json")
    assert code == 0
    summary = json.loads(stdout)
    assert sorted(p.name for p in out.iterdir()) == ["account.json", "audit.json", "report.html"]
    assert summary["report"] == str(out / "report.html") and summary["bytes"] < 5_000_000
    acc = json.loads((out / "account.json").read_text())
    assert acc["returns"]["price"] == {"usd_per_hour": 2.0, "source": "--price-per-hour", "date": None}
    assert summary["usd_per_mtok"] == pytest.approx(cost_per_mtok(1e6 / acc["wall_us"], 2.0))
    doc = json.loads((out / "audit.json").read_text())
    assert doc["trace"] == str(trace) and doc["account"]["closed"] == (summary["account"] == "closed")
    code, stdout, _ = run(capsys, "report", trace, "--model", tiny_model, "--target", "h200",
                          "--out", tmp_path / "r.html")
    assert code == 0 and (tmp_path / "r.html").read_text().startswith("<!DOCTYPE html>")


@pytest.mark.parametrize("case", ["other model", "empty trace", "out is a file", "missing compare",
                                  "missing ledger", "unknown target"])
def test_bad_input_writes_nothing(case, capsys, tmp_path, tiny_model, tiny_bound):
    trace = tmp_path / "t.json"
    save(closing_trace(tiny_bound, sha="0" * 64 if case == "other model" else None), str(trace))
    if case == "empty trace":
        trace.write_text("{}")
    out = tmp_path / "audit"
    if case == "out is a file":
        out.write_text("x")
    extra = {"missing compare": ["--compare", tmp_path / "nope.json"],
             "missing ledger": ["--ledger", tmp_path / "nope.sqlite"]}.get(case, [])
    target = "no-such-chip" if case == "unknown target" else "h200"
    code, _, err = run(capsys, "audit", tiny_model, "--trace", trace, "--target", target, "--out", out, *extra)
    assert code == (3 if case == "other model" else 2)
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert not out.is_dir() or list(out.iterdir()) == []
    assert not (tmp_path / "nope.sqlite").exists()
    page = tmp_path if case == "out is a file" else tmp_path / "r.html"   # report's --out: a folder
    code, _, err = run(capsys, "report", trace, "--model", tiny_model, "--target", target, "--out", page, *extra)
    assert code == (3 if case == "other model" else 2) and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "r.html").exists() and not list(tmp_path.glob("*.partial"))


def test_exclusive_comparisons_on_the_page(capsys, tmp_path, tiny_model, tiny_bound):
    """--exclusive: the page's comparison counts each µs once (no overlap row, said on the page); a trace
    to compare without kernel start times is refused in one line before anything is written."""
    trace, other, bare = tmp_path / "t.json", tmp_path / "o.json", tmp_path / "bare.json"
    t = closing_trace(tiny_bound)
    save(t, str(trace))
    o = closing_trace(tiny_bound)
    o.kernels = [dataclasses.replace(k, start_us=k.start_us - 0.5 * (k.index > 0)) for k in o.kernels]  # overlapping
    save(o, str(other))
    save(dataclasses.replace(o, kernels=[dataclasses.replace(k, start_us=None) for k in o.kernels]), str(bare))
    for exclusive in (False, True):
        out = tmp_path / f"audit{exclusive}"
        code, _, _ = run(capsys, "audit", tiny_model, "--trace", trace, "--target", "h200", "--out", out,
                         "--compare", other, *(["--exclusive"] if exclusive else []))
        assert code == 0
        cmp = json.loads((out / "audit.json").read_text())["compared"][0]
        regions = {r["region"] for r in cmp["regions"]}
        assert ("overlap" in regions) != exclusive and cmp["method"].endswith("exclusive device time") == exclusive
        assert ("counted once" in (out / "report.html").read_text()) == exclusive
    code, _, err = run(capsys, "audit", tiny_model, "--trace", trace, "--target", "h200", "--out", tmp_path / "x",
                       "--compare", bare, "--exclusive")
    assert code == 2 and "start time" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "x").exists() or list((tmp_path / "x").iterdir()) == []


def test_strict_refuses_an_account_that_does_not_close(capsys, tmp_path, tiny_model, tiny_bound):
    t = closing_trace(tiny_bound)
    t.token_wall_us = [w * 1.2 for w in t.token_wall_us]
    trace = tmp_path / "t.json"
    save(t, str(trace))
    assert run(capsys, "report", trace, "--model", tiny_model, "--target", "h200", "--out", tmp_path / "a.html")[0] == 0
    code, _, err = run(capsys, "report", trace, "--model", tiny_model, "--target", "h200",
                       "--out", tmp_path / "b.html", "--strict")
    assert code == 3 and "does not close" in err
    assert re.search(r"refused</span>: the account does not close", (tmp_path / "b.html").read_text())


SEARCH_SUMMARY = {"space": {"settings": 1280, "legal": 176, "survivors": 154,
                            "rejected_by_reason": {"does not divide the reduce axis": 700}},
                  "timed_now": 60, "reused_from_ledger": 2, "routed_kernels": 9,
                  "per_kernel": [{"kernel": "k", "name": "r_4", "launches": 2, "legal": 176, "settings": 1280,
                                  "survivors": 154, "timed": 60, "default_us": 9.0, "best_us": 7.5,
                                  "floor_us": 0.5, "choice": {"unroll": 4}}]}


def test_the_page_draws_a_search_funnel(tiny_model, tiny_bound, tmp_path):
    from boltbeam.report.audit import load_funnel
    path = tmp_path / "search.json"
    path.write_text(json.dumps(SEARCH_SUMMARY))
    f = load_funnel(str(path))
    assert [n for _, n in f.steps] == [1280, 176, 154, 62, 9]     # timed counts the ledger's too
    audit = assemble(closing_trace(tiny_bound), "t.json", tiny_model, H200L, tiny_bound, None, funnel=f)
    page = _Page()
    page.feed(render(audit))
    assert "funnel-chart" in page.figures and audit.to_dict()["search"]["legal (BubbleBeam)"] == 176
    svg, rows = charts.funnel(f.steps)
    assert rows[1]["of_previous"] == pytest.approx(176 / 1280) and rows[0]["of_previous"] is None


@pytest.mark.parametrize("doc", [[], {"space": []}, {"space": {"settings": -1, "legal": 1, "survivors": 1},
                                                     "routed_kernels": 0},
                                 {**SEARCH_SUMMARY, "routed_kernels": "nine"},
                                 {**SEARCH_SUMMARY, "per_kernel": [{"launches": -1}]},
                                 {**SEARCH_SUMMARY, "space": {**SEARCH_SUMMARY["space"], "settings": 10**44}}])
def test_a_search_summary_that_is_not_one_is_one_line(doc, tmp_path):
    from boltbeam.report.audit import load_funnel
    path = tmp_path / "search.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(BadInput, match="search summary"):
        load_funnel(str(path))
