"""The audit as one self-contained HTML page: inline CSS and inline SVG, no script, nothing fetched.

Every chart has its numbers beside it as a table, so the page reads without the pictures. The page is
rendered by Jinja2 with autoescaping on: every name, path and reason is text, never markup.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jinja2

from boltbeam import __version__
from boltbeam.account.compare import label as trace_label
from boltbeam.measure.trace import TIMINGS
from boltbeam.report import charts, fmt_bytes
from boltbeam.report.audit import Audit


@dataclass
class Cell:
    text: str
    numeric: bool = False


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
    """Cells from row dicts: (heading, key, formatter or None for text)."""
    return [[Cell(fmt(r[key]), True) if fmt else Cell("" if r[key] is None else str(r[key]))
             for _, key, fmt in columns] for r in rows]


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
        svg, rows = charts.waterfall(audit.account)
        cols = [("line", "line", None), ("µs", "us", _num), ("of wall", "of_wall", _pct), ("cause", "cause", None)]
        out.append(Chart("tieout", "Where the token goes: the tie-out",
                         "The floor, each line with its cause, the residual (computed, never a plug), the wall.",
                         svg, [c[0] for c in cols], _table(rows, cols), notes=list(audit.account.notes)))
    for i, c in enumerate(audit.compared):
        cmp = c.comparison
        svg, rows = charts.regions(cmp)
        cols = [("region", "region", None), ("A µs", "a_us", _num), ("B µs", "b_us", _num),
                ("floor µs", "floor_us", _num), ("winner", "winner", None)]
        notes = [f"A: {audit.trace_path} ({cmp.a_label}); B: {c.path} ({cmp.b_label})",
                 *(f"cannot compare {x['region']}: {x['reason']}" for x in cmp.incomparable), *cmp.notes]
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
    if (drawn := audit.token_kernels()) is not None:
        token, kernels, offsets = drawn
        svg, rows = charts.gantt(kernels, offsets)
        cols = [("region", "region", None), ("kernels", "kernels", lambda x: _num(x, 0)), ("µs", "us", _num),
                ("first start µs", "first_start_us", _num), ("last end µs", "last_end_us", _num)]
        placed = "on the device timeline" if all(k.start_us is not None for k in kernels) else \
            "laid end to end (the trace has no device start times)"
        out.append(Chart("timeline", "One token's kernels",
                         f"Token {token} (the median of the measured tokens by kernel time), {placed}.",
                         svg, [x[0] for x in cols], _table(rows, cols)))
    return out


def _environment() -> jinja2.Environment:
    env = jinja2.Environment(loader=jinja2.PackageLoader("boltbeam.report", "templates"),
                             autoescape=True, undefined=jinja2.StrictUndefined, trim_blocks=True)
    env.filters.update(us=_num, num=_num, pct=_pct, money=_money)
    return env


def render(audit: Audit) -> str:
    acc, ret = audit.account, audit.returns
    price = ret.price if ret else None
    timing = acc.timing if acc else None
    env_text = ", ".join(f"{k} {v}" for k, v in audit.trace.environment.items()
                         if k not in ("model_path", "model_sha256") and v is not None)
    return _environment().get_template("audit.html.j2").render(
        title=f"{Path(audit.model).name} on {audit.target.name}", model=audit.model, target=audit.target,
        context=audit.bound.context, route_label=trace_label(audit.trace), wall_us=audit.wall_us,
        floor_us=audit.bound.token_floor_us, ceiling_tok_s=audit.bound.ceiling_tok_s,
        measured_cost=f"{_money(ret.measured.usd_per_mtok)} per million tokens" if price else "",
        ceiling_cost=f"{_money(ret.ceiling.usd_per_mtok)} per million tokens" if price else "",
        price_text=(f"{price.usd_per_hour:,.2f} USD an hour ({price.source}"
                    f"{', ' + price.date if price.date else ''})") if price
        else "no price: the target has no price_per_hour fact (pass --price-per-hour)",
        account=acc, no_account=audit.no_account, returns=ret,
        timing_text=(f"{timing}: {TIMINGS[timing]}, {acc.tokens_used} token(s)" if timing else "timing not recorded"),
        charts=_charts(audit), unread=audit.unread, ledger_path=audit.ledger_path, ledger=audit.ledger, version=__version__,
        trace_path=audit.trace_path, source=audit.trace.provenance.get("source", "unknown source"),
        environment=env_text, notes=audit.bound.notes)
