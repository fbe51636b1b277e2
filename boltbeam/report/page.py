"""The audit as one self-contained HTML page: inline CSS and inline SVG, no script, nothing fetched.

Every chart has its numbers beside it as a table, so the page reads without the pictures. The page is
rendered by Jinja2 with autoescaping on: every name, path and reason is text, never markup.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import jinja2

from boltbeam import __version__
from boltbeam.account.compare import REGIONS, region_of
from boltbeam.account.compare import label as trace_label
from boltbeam.account.price import cost_per_mtok
from boltbeam.measure.trace import TIMINGS
from boltbeam.report import charts, fmt_bytes
from boltbeam.report.audit import Audit, line_of

# Why a tie-out line is below zero: by its cause (a role's or a boundary's line), else by its kind.
NEGATIVE = {"no kernel": "no kernel of its own (fused into another): its floor, counted in the floor line, taken "
                         "back out",
            "inside other kernels": "a floor counted in the floor line whose bytes move inside the weight kernels, "
                                    "taken back out",
            "below floor": "measured faster than its floor: the trace's role labels or the target's bandwidth "
                           "are wrong",
            "attention": "the attention kernels took less than the KV cache's floor",
            "overlap": "kernel time that ran beside other kernels, which their own lines count already",
            "timing": "what timing the kernels added to them, taken back out",
            "residual": "the lines add up to more than the measured wall"}


@dataclass
class Cell:
    text: str
    numeric: bool = False
    color: str | None = None    # a swatch of the chart's colour for the row


@dataclass
class Chart:
    id: str
    heading: str
    caption: str
    svg: str
    columns: list[str]
    rows: list[list[Cell]]
    notes: list[str] = field(default_factory=list)


def _num(x: Any, digits: int = 2) -> str:
    return "" if x is None else f"{x:,.{digits}f}"


def _pct(x: Any, digits: int = 1) -> str:
    return "" if x is None else f"{x:.{digits}%}"


def _money(x: Any) -> str:
    return "" if x is None else f"${x:,.3f}" if x < 10 else f"${x:,.2f}"


def _table(rows: list[dict[str, Any]], columns: list[tuple[str, str, Any]]) -> list[list[Cell]]:
    """Cells from row dicts: (heading, key, formatter or None for text); a row's colour on its first cell."""
    return [[Cell(fmt(r[key]), True) if fmt else Cell("" if r[key] is None else str(r[key]),
                                                      color=None if i else r.get("color"))
             for i, (_, key, fmt) in enumerate(columns)] for r in rows]


def _tieout_caption(rows: list[dict[str, Any]]) -> str:
    """What the waterfall draws: which small lines are one bar, and why each negative line is negative."""
    said = ["The floor, each line with its cause, the residual (computed, never a plug), the wall."]
    if small := [r for r in rows if r["small"]]:
        said.append(f"The {len(small)} lines under {charts.small_under_us(rows[-1]['us']):,g} µs each "
                    f"({', '.join(r['line'] for r in small)}) are drawn as one bar, their sum "
                    f"({sum(r['us'] for r in small):+,.2f} µs); the table lists each.")
    said.append(f"A bar narrower than {charts.LEAST_SHARE:.0%} of the wall is drawn that wide, its value beside it.")
    why: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        if r["us"] < 0:
            key = r["cause"] if r["kind"] in ("role", "boundary") else r["kind"]
            why.setdefault(NEGATIVE.get(key, "below zero as measured"), []).append(r)
    if why:
        said.append("Negative lines take time back out of the sum: " + "; ".join(
            f"{', '.join(r['line'] for r in rs)} ({sum(r['us'] for r in rs):+,.2f} µs): {reason}"
            for reason, rs in why.items()) + ".")
    return " ".join(said)


def _tieout_chart(acc, title: str) -> Chart:
    """An account's waterfall and its lines (account.tieout's Account)."""
    svg, rows = charts.waterfall(acc)
    cols = [("line", "line", None), ("µs", "us", _num), ("of wall", "of_wall", _pct), ("cause", "cause", None)]
    return Chart("tieout", title, _tieout_caption(rows), svg, [c[0] for c in cols], _table(rows, cols),
                 notes=list(acc.notes))


def _regions_note(audit: Audit) -> list[str]:
    """The comparisons group kernels by region: which of the tie-out's lines each region gathers."""
    if not audit.account:
        return []
    of, order = line_of(audit.account), [line.label for line in audit.account.lines]
    gathered: dict[str, set[str]] = {}
    for k in audit.trace.kernels:
        gathered.setdefault(region_of(k), set()).add(of(k))
    return ["Regions gather A's tie-out lines: " + "; ".join(
        f"{r}: {', '.join(sorted(gathered[r], key=lambda x: order.index(x) if x in order else len(order)))}"
        for r in REGIONS if r in gathered) + "."]


def _charts(audit: Audit) -> list[Chart]:
    out: list[Chart] = []
    svg, rows = charts.roofline(audit.bound, audit.account, audit.target)
    cols = [("role", "role", None), ("bytes", "bytes", fmt_bytes),
            ("ops/byte", "intensity_ops_per_byte", _num),
            ("floor µs", "floor_us", _num), ("measured µs", "measured_us", _num),
            ("achieved GB/s", "achieved_bytes_per_s", lambda x: _num(x and x / 1e9, 1)),
            ("of bandwidth", "of_bandwidth", _pct)]
    out.append(Chart("roofline", "How far each role is from its roofline",
                     "Each weight role and the KV cache (measured by the attention kernels); a role with no "
                     "kernel of its own has no filled point.", svg, [c[0] for c in cols], _table(rows, cols)))
    if audit.account:
        out.append(_tieout_chart(audit.account, "Where the token goes: the tie-out"))
    for i, c in enumerate(audit.compared):
        cmp = c.comparison
        svg, rows = charts.regions(cmp)
        cols = [("region", "region", None), ("A µs", "a_us", _num), ("B µs", "b_us", _num),
                ("floor µs", "floor_us", _num), ("winner", "winner", None)]
        notes = [f"A: {audit.trace_path} ({cmp.a_label}); B: {c.path} ({cmp.b_label})",
                 *(f"cannot compare {x['region']}: {x['reason']}" for x in cmp.incomparable), *cmp.notes,
                 *_regions_note(audit)]
        out.append(Chart(f"compare-{i + 1}", f"Who wins where: against {cmp.b_label}",
                         "Bars per region, each region's floor marked; the whole token first."
                         + (" Each µs of device time counted once: where kernels overlap, it goes to the one that "
                            "started first." if cmp.exclusive else ""),
                         svg, [x[0] for x in cols], _table(rows, cols), notes=notes))
    if audit.funnel is not None:
        svg, rows = charts.funnel(audit.funnel.steps)
        cols = [("step", "step", None), ("count", "count", lambda x: _num(x, 0)), ("of the step before", "of_previous", _pct)]
        out.append(Chart("funnel", "The search: legal, survived FutureSight, timed, chosen",
                         f"From {audit.funnel.path}. 'In the route' counts kernels given a setting.", svg,
                         [x[0] for x in cols], _table(rows, cols),
                         notes=[f"rejected {n:,}: {why}" for why, n in audit.funnel.rejected_by_reason.items()]))
    if audit.account and (drawn := audit.token_kernels()) is not None:
        token, kernels, offsets = drawn
        svg, rows = charts.gantt(kernels, offsets, line_of(audit.account), [x.label for x in audit.account.lines])
        cols = [("line", "line", None), ("kernels", "kernels", lambda x: _num(x, 0)), ("µs", "us", _num),
                ("first start µs", "first_start_us", _num), ("last end µs", "last_end_us", _num)]
        placed = "on the device timeline" if all(k.start_us is not None for k in kernels) else \
            "laid end to end (the trace has no device start times)"
        out.append(Chart("timeline", "One token's kernels",
                         f"Token {token} (the median of the measured tokens by kernel time), {placed}; a row "
                         f"per line of the tie-out, by its names.",
                         svg, [x[0] for x in cols], _table(rows, cols)))
    return out


def _environment() -> jinja2.Environment:
    env = jinja2.Environment(loader=jinja2.PackageLoader("boltbeam.report", "templates"),
                             autoescape=True, undefined=jinja2.StrictUndefined, trim_blocks=True)
    env.filters.update(us=_num, num=_num, pct=_pct, money=_money)
    return env


def _tieout_wall(audit: Audit) -> str | None:
    """The tie-out's own token time, said against the headline's median in one sentence."""
    acc = audit.account
    if acc is None:
        return None
    d = acc.wall_us - audit.wall_us
    return (f"{acc.wall_us:,.2f} µs: the {acc.method} ({acc.tokens_used} tokens), as means add up where medians do "
            f"not; {abs(d):,.2f} µs ({abs(d) / audit.wall_us:.2%}) {'under' if d < 0 else 'over'} the median above. "
            f"The tie-out and the what-ifs start from it.")


def render(audit: Audit) -> str:
    acc, ret = audit.account, audit.returns
    price = ret.price if ret else None
    timing = acc.timing if acc else None
    env_text = ", ".join(f"{k} {v}" for k, v in asdict(audit.trace.environment).items()
                         if k not in ("model_path", "model_sha256") and v is not None)
    return _environment().get_template("audit.html.j2").render(
        title=f"{Path(audit.model).name} on {audit.target.name}", model=audit.model, target=audit.target,
        context=audit.bound.context, route_label=trace_label(audit.trace), wall_us=audit.wall_us,
        floor_us=audit.bound.token_floor_us, ceiling_tok_s=audit.bound.ceiling_tok_s,
        plain_tokens=len(audit.trace.token_wall_us), tieout_wall=_tieout_wall(audit),
        measured_cost=f"{_money(cost_per_mtok(1e6 / audit.wall_us, price.usd_per_hour))} per million tokens"
        if price else "",
        ceiling_cost=f"{_money(ret.ceiling.usd_per_mtok)} per million tokens" if price else "",
        price_text=(f"{price.usd_per_hour:,.2f} USD an hour ({price.source}"
                    f"{', ' + price.date if price.date else ''})") if price
        else "no price: the target has no price_per_hour fact (pass --price-per-hour)",
        account=acc, no_account=audit.no_account, returns=ret,
        timing_text=(f"{timing}: {TIMINGS[timing]}, {acc.tokens_used} token(s)" if timing else "timing not recorded"),
        charts=_charts(audit), unread=audit.unread, output=audit.output, ledger_path=audit.ledger_path, ledger=audit.ledger, version=__version__,
        trace_path=audit.trace_path, source=audit.trace.provenance.source or "unknown source",
        environment=env_text, notes=audit.bound.notes)


def render_sweep(sweeps: list) -> str:
    """A depth sweep's page: tokens a second against depth (each sweep a line: this one and any compared),
    then each sweep's token by region at every depth. `sweeps`: (name, account.sweep.Sweep) pairs."""
    svg, rows = charts.depths(sweeps)
    cols = [("sweep", "sweep", None), ("depth", "context", lambda x: f"{x:,}"), ("tokens/s", "tok_s", _num),
            ("µs a token", "wall_us", _num), ("what ran", "route", None)]
    chart = Chart("depths", "The token against depth",
                  "Each point the median plain token of one profile at that depth, in a process of its own.",
                  svg, [c[0] for c in cols], _table(rows, cols))
    tables = []
    for name, sw in sweeps:
        placed = [d for d in sw.depths if d.regions_us]
        rows = [[Cell(region)] + [Cell(_num(d.regions_us.get(region)), True) for d in placed] for region in REGIONS]
        tables.append((name, [f"{d.context:,}" for d in placed], rows))
    return _environment().get_template("sweep.html.j2").render(
        title=", ".join(name for name, _ in sweeps), charts=[chart], tables=tables, version=__version__,
        sources=[(name, sw) for name, sw in sweeps])


def sides_text(sides) -> str:
    """A verdict's processes, the baseline's + the candidate's ("" where read from a ledger that kept no count)."""
    return f"{sides[0]} + {sides[1]}" if sides else ""


def render_tune(tuned) -> str:
    """A tune's page: tokens a second after each promoted step, then every setting judged and every family
    skipped. `tuned`: search.tune's Tune."""
    svg, rows = charts.journey(tuned)
    cols = [("route", "step", None), ("tokens/s", "tok_s", _num)]
    chart = Chart("journey", "The journey", "Each bar the median whole token of the route with every setting above "
                  "it, judged against the route before it (each in a process of its own).",
                  svg, [c[0] for c in cols], _table(rows, cols))
    shown = [chart]
    if tuned.final_account:
        acc = tuned.final_account
        shown.append(_tieout_chart(acc, f"The route written, accounted on {tuned.target}: "
                                        f"{'closes' if acc.closed else 'does not close'} "
                                        f"(residual {acc.residual_us:+,.2f} µs)"))
    steps = [[Cell(str(s.round), True), Cell(s.family), Cell(s.setting + (" (joined the route)" if s.promoted else "")),
              Cell(s.verdict),
              *(Cell(_num(1e6 / us if us else None, 1), True) for us in (s.before_us, s.after_us)),
              Cell(sides_text(s.sides)), Cell(f"#{s.ledger_id}"), Cell("; ".join(s.reasons))]
             for s in tuned.steps if s.verdict]
    return _environment().get_template("tune.html.j2").render(
        title=f"{Path(tuned.model).name} on {tuned.target}", tuned=tuned, charts=shown, steps=steps,
        unjudged=[(u.family, u.why, u.settings) for u in tuned.not_judged()], version=__version__)
