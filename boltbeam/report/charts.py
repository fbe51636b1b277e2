"""The audit's charts as static SVG from matplotlib: no script, nothing fetched, text kept as text.

Each function takes the step's own records and returns (svg, rows): the picture and the numbers it
draws, so the page can print them beside it as a table.
"""
from __future__ import annotations

import io
import math
from dataclasses import dataclass
from typing import Any, Callable

import matplotlib
from matplotlib.colors import to_hex
from matplotlib.figure import Figure
from matplotlib.patches import Patch
from matplotlib.ticker import FuncFormatter

from boltbeam.account.compare import Comparison
from boltbeam.account.tieout import Account, merged_line
from boltbeam.bound.roofline import Bound
from boltbeam.bound.targets import Target
from boltbeam.measure.trace import Kernel

matplotlib.rcParams.update({"svg.fonttype": "none",       # text stays text: smaller, searchable
                            "svg.hashsalt": "boltbeam",   # stable element ids: the same audit, the same file
                            "font.size": 9})
PALETTE = matplotlib.colormaps["tab10"].colors
KIND_COLOR = {"floor": "#4c72b0", "role": "#dd8452", "boundary": "#c44e52", "gap": "#8172b3",
              "overlap": "#55a868", "launch": "#937860", "timing": "#da8bc3", "residual": "#8c8c8c", "wall": "#222222",
              "small lines": "#c9c9c9"}
SMALL_SHARE = 0.005  # waterfall lines under about 0.5% of the wall are drawn together as one bar
LEAST_SHARE = 0.01   # and no waterfall bar is drawn narrower than 1% of the wall (its value printed beside it)
Rows = list[dict[str, Any]]
MICROSECONDS = FuncFormatter(lambda x, _: f"{x:,.0f}")   # 12,000 on the axis, never 1.2 with "1e4" in a corner


def distinct_colors(n: int) -> list[str]:
    """n colours, no two alike: tab10's, then tab20's lighter tints; past 20, hues spaced evenly."""
    tab20 = matplotlib.colormaps["tab20"].colors
    ordered = tab20[0::2] + tab20[1::2]
    if n <= len(ordered):
        return [to_hex(c) for c in ordered[:n]]
    return [to_hex(matplotlib.colormaps["turbo"](i / (n - 1))) for i in range(n)]


def _svg(fig: Figure) -> str:
    buf = io.StringIO()
    fig.savefig(buf, format="svg", bbox_inches="tight", metadata={"Date": None})
    text = buf.getvalue()
    return text[text.index("<svg"):]   # drop the XML prolog and doctype: the SVG is inlined in HTML


def roofline(bound: Bound, acc: Account | None, target: Target) -> tuple[str, Rows]:
    """Each weight role and the KV cache at its operational intensity: achieved operations per second
    (its floor's operations over its measured time) under the memory and compute ceilings."""
    measured = {line.role or line.label: line.measured_us for line in acc.lines} if acc else {}
    if acc:   # the KV cache is measured by the attention line
        measured["kv_cache"] = next((line.measured_us for line in acc.lines if line.label == "attention"), None)
    rows: Rows = []
    fig = Figure(figsize=(7.5, 4.6))
    ax = fig.subplots()
    lines = list(bound.roles)
    for stacked in (x.stacked for x in (acc.lines if acc else []) if x.stacked):
        # roles one kernel reads together have one measured time: one point for them all
        lines = [b for b in lines if b.role not in stacked] + [merged_line([b for b in lines if b.role in stacked])]
    for line in lines:
        if not line.flops or not line.bytes:
            continue
        us = measured.get(line.role)
        rows.append({"role": line.role, "bytes": line.bytes, "operations": line.flops,
                     "intensity_ops_per_byte": line.intensity, "floor_us": line.floor_us, "measured_us": us,
                     "achieved_ops_per_s": line.flops / us * 1e6 if us else None,
                     "achieved_bytes_per_s": line.bytes / us * 1e6 if us else None,
                     "of_bandwidth": line.bytes / us * 1e6 / bound.bandwidth_bytes_per_s if us else None})
    if not rows:
        ax.text(0.5, 0.5, "no role with both bytes and operations", ha="center", transform=ax.transAxes)
        return _svg(fig), rows
    xs = [r["intensity_ops_per_byte"] for r in rows]
    lo, hi = min(xs) / 4, max(xs) * 8
    ceilings = {u: target.fact(u) for u in {line.unit for line in bound.roles if line.flops}}
    top = max([v for v in ceilings.values() if v] or [bound.bandwidth_bytes_per_s * hi])
    knee_x = [lo, hi]
    ax.plot(knee_x, [min(bound.bandwidth_bytes_per_s * x, top) for x in knee_x], color="#333333", lw=1.2,
            label=f"memory: {bound.bandwidth_bytes_per_s / 1e9:,.0f} GB/s ({bound.bandwidth_fact})")
    for unit, peak in sorted(ceilings.items()):
        if peak:
            ax.axhline(peak, color="#999999", ls="--", lw=1, label=f"compute: {unit} {peak / 1e12:,.1f} TFLOP/s")
    for r, color in zip(rows, distinct_colors(len(rows))):
        r["color"] = color
        floor_rate = r["operations"] / r["floor_us"] * 1e6
        measured = bool(r["achieved_ops_per_s"])
        ax.scatter([r["intensity_ops_per_byte"]], [floor_rate], facecolors="none", edgecolors=[color], s=60,
                   label=None if measured else f"{r['role']} (no kernel of its own)")
        if measured:
            ax.scatter([r["intensity_ops_per_byte"]], [r["achieved_ops_per_s"]], color=[color], s=36,
                       label=r["role"])
            ax.plot([r["intensity_ops_per_byte"]] * 2, [r["achieved_ops_per_s"], floor_rate], color=color,
                    lw=0.8, alpha=0.6)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(lo, hi)
    ax.set_xlabel("operational intensity (operations per byte)")
    ax.set_ylabel("operations per second")
    ax.set_title("Roofline: filled = measured, hollow = at its floor")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return _svg(fig), rows


@dataclass(frozen=True)
class Bar:
    """One bar of the waterfall: a line, or the small lines together, from where the lines before it end."""
    label: str
    kind: str
    from_us: float
    us: float


def small_under_us(wall_us: float) -> float:
    """The waterfall's small line: under the largest of 1, 2 and 5 x 10^k µs within SMALL_SHARE of the wall."""
    limit = SMALL_SHARE * wall_us
    decade = 10 ** math.floor(math.log10(limit))
    return max(m * decade for m in (1, 2, 5) if m * decade <= limit)


def waterfall_rows(acc: Account) -> Rows:
    """The tie-out's lines, the residual and the wall; `small` marks the lines drawn together as one bar
    (under small_under_us each, two or more of them; never the floor, the residual or the wall)."""
    rows: Rows = [{"line": line.label, "kind": line.kind, "us": line.us, "cause": line.cause} for line in acc.lines]
    rows.append({"line": "residual", "kind": "residual", "us": acc.residual_us,
                 "cause": "closed" if acc.closed else "NOT CLOSED"})
    rows.append({"line": "wall", "kind": "wall", "us": acc.wall_us,
                 "cause": f"the mean of the {acc.tokens_used} plain token(s) the account keeps"})
    under = small_under_us(acc.wall_us)
    small = [r["line"] for r in rows if r["kind"] not in ("floor", "residual", "wall") and abs(r["us"]) < under]
    for r in rows:
        r["of_wall"] = r["us"] / acc.wall_us
        r["small"] = len(small) > 1 and r["line"] in small
    return rows


def bars(rows: Rows) -> list[Bar]:
    """The bars drawn: each line that is not small, stacked in order; the small lines' sum; the residual;
    then the wall from zero. Lines add in any order, so the small ones can go last."""
    out: list[Bar] = []
    start = 0.0
    lines = [r for r in rows if r["kind"] not in ("residual", "wall")]
    small = [r for r in lines if r["small"]]
    under = f"{len(small)} lines under {small_under_us(rows[-1]['us']):,g} µs"
    drawn = [(r["line"], r["kind"], r["us"]) for r in lines if not r["small"]]
    drawn += [(under, "small lines", sum(r["us"] for r in small))] if small else []
    drawn += [(r["line"], r["kind"], r["us"]) for r in rows if r["kind"] == "residual"]
    for label, kind, us in drawn:
        out.append(Bar(label, kind, start, us))
        start += us
    wall = rows[-1]
    return [*out, Bar(wall["line"], wall["kind"], 0.0, wall["us"])]


def waterfall(acc: Account) -> tuple[str, Rows]:
    """The tie-out: each line stacked on the ones before it, the small lines as one bar, the residual, then
    the wall from zero. A bar narrower than LEAST_SHARE of the wall is drawn that wide, its value beside it."""
    rows = waterfall_rows(acc)
    drawn = bars(rows)
    least = LEAST_SHARE * acc.wall_us
    widths = [b.us if abs(b.us) >= least else math.copysign(least, b.us) for b in drawn]
    fig = Figure(figsize=(7.5, 0.28 * len(drawn) + 1.0))
    ax = fig.subplots()
    y = list(range(len(drawn)))
    ax.barh(y, widths, left=[b.from_us for b in drawn], color=[KIND_COLOR[b.kind] for b in drawn], height=0.7)
    for i, b, w in zip(y, drawn, widths):
        ax.text(max(b.from_us, b.from_us + w) + least / 2, i, f"{b.us:,.1f}", va="center", fontsize=7)
    ax.set_yticks(y, [b.label for b in drawn])
    ax.invert_yaxis()
    ax.set_xlim(right=max(max(b.from_us, b.from_us + w) for b, w in zip(drawn, widths)) * 1.2)
    ax.xaxis.set_major_formatter(MICROSECONDS)
    ax.set_xlabel("µs per token (lines add up left to right; the last bar is the measured wall)")
    ax.set_title("Tie-out of one token")
    kinds = dict.fromkeys(b.kind for b in drawn)
    ax.legend(handles=[Patch(color=KIND_COLOR[k], label=k) for k in kinds], fontsize=7, loc="upper left",
              bbox_to_anchor=(1.01, 1.0))
    return _svg(fig), rows


def regions(cmp: Comparison) -> tuple[str, Rows]:
    """Two traces side by side per region, each with the region's floor marked; the whole token first."""
    token_floor = sum(r.floor_us or 0.0 for r in cmp.regions) if cmp.floors_shown else None   # regions partition the floors
    rows: Rows = [{"region": "whole token", "a_us": cmp.a_wall_us, "b_us": cmp.b_wall_us, "floor_us": token_floor,
                   "winner": "tie" if cmp.a_wall_us == cmp.b_wall_us else "A" if cmp.a_wall_us < cmp.b_wall_us
                   else "B"}]
    rows += [{"region": r.region, "a_us": r.a_us, "b_us": r.b_us, "floor_us": r.floor_us, "winner": r.winner}
             for r in cmp.regions if r.winner is not None]
    fig = Figure(figsize=(7.5, 0.45 * len(rows) + 1.6), layout="constrained")
    ax = fig.subplots()
    y = list(range(len(rows)))
    ax.barh([i - 0.2 for i in y], [r["a_us"] or 0 for r in rows], height=0.4, color=PALETTE[0], label=f"A: {cmp.a_label}")
    ax.barh([i + 0.2 for i in y], [r["b_us"] or 0 for r in rows], height=0.4, color=PALETTE[1], label=f"B: {cmp.b_label}")
    floors = [(i, r["floor_us"]) for i, r in zip(y, rows) if r["floor_us"]]
    if floors:
        ax.scatter([f for _, f in floors], [i for i, _ in floors], marker="|", s=300, color="black",
                   label="floor", zorder=3)
    ax.set_yticks(y, [r["region"] for r in rows])
    ax.invert_yaxis()
    ax.xaxis.set_major_formatter(MICROSECONDS)
    ax.set_xlabel("µs per token")
    ax.set_title("Region by region")
    fig.legend(fontsize=7, loc="outside lower center")
    return _svg(fig), rows


def gantt(kernels: list[Kernel], offsets: list[float], line_of: Callable[[Kernel], str],
          order: list[str]) -> tuple[str, Rows]:
    """One token's kernels on the device timeline, a row per tie-out line (`line_of` names a kernel's,
    `order` lists them as the tie-out does), each line its own colour."""
    by_line: dict[str, list[tuple[float, float]]] = {}
    for k, start in zip(kernels, offsets):
        by_line.setdefault(line_of(k), []).append((start, k.duration_us))
    names = [x for x in order if x in by_line] + sorted(by_line.keys() - set(order))
    t0 = min(offsets) if offsets else 0.0
    rows: Rows = [{"line": x, "kernels": len(by_line[x]), "us": sum(d for _, d in by_line[x]),
                   "first_start_us": min(s for s, _ in by_line[x]) - t0,
                   "last_end_us": max(s + d for s, d in by_line[x]) - t0, "color": color}
                  for x, color in zip(names, distinct_colors(len(names)))]
    fig = Figure(figsize=(7.5, 0.3 * len(rows) + 1.2))
    ax = fig.subplots()
    for i, r in enumerate(rows):
        ax.broken_barh([(s - t0, d) for s, d in by_line[r["line"]]], (i - 0.4, 0.8), color=r["color"])
    ax.set_yticks(range(len(rows)), [r["line"] for r in rows])
    ax.invert_yaxis()
    ax.xaxis.set_major_formatter(MICROSECONDS)
    ax.set_xlabel("µs from the token's first kernel")
    ax.set_title(f"One token's {len(kernels)} kernels")
    return _svg(fig), rows


def funnel(steps: list[tuple[str, int]]) -> tuple[str, Rows]:
    """A search's space narrowing step by step (linear bars: each the share of the whole it is)."""
    rows: Rows = [{"step": name, "count": n, "of_previous": n / prev if prev else None}
                  for (name, n), prev in zip(steps, [None, *(n for _, n in steps)])]
    fig = Figure(figsize=(7.5, 0.4 * len(rows) + 1.0))
    ax = fig.subplots()
    y = list(range(len(rows)))
    ax.barh(y, [r["count"] for r in rows], color=PALETTE[2], height=0.6)
    ax.set_yticks(y, [r["step"] for r in rows])
    ax.invert_yaxis()
    ax.set_xlabel("settings")
    ax.set_title("The search's space, step by step")
    return _svg(fig), rows


def depths(sweeps: list) -> tuple[str, Rows]:
    """Tokens a second against KV depth, a line an engine or route (account.sweep's Sweep each)."""
    rows: Rows = [{"sweep": name, "context": d.context, "tok_s": d.tok_s, "wall_us": d.wall_us, "route": d.route}
                  for name, sw in sweeps for d in sw.depths]
    fig = Figure(figsize=(7.5, 3.6))
    ax = fig.subplots()
    for (name, sw), color in zip(sweeps, distinct_colors(len(sweeps))):
        ax.plot([d.context for d in sw.depths], [d.tok_s for d in sw.depths], marker="o", color=color, label=name)
    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_formatter(MICROSECONDS)      # plain digits with commas: 4,096, not 2^12
    ax.set_xlabel("KV depth (positions before the token)")
    ax.set_ylabel("tokens/s")
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=8)
    ax.set_title("The token against depth")
    return _svg(fig), rows



def journey(tuned) -> tuple[str, Rows]:
    """Tokens a second of the route after each promoted step of a tune (search.tune's Tune), from tinygrad's own."""
    rows: Rows = [{"step": "tinygrad's own route", "tok_s": 1e6 / tuned.start_us if tuned.start_us else None}]
    rows += [{"step": f"+ {s.family} {s.setting}", "tok_s": 1e6 / s.after_us} for s in tuned.promoted]
    beside = tuned.beside and tuned.beside.median_us
    if beside:      # --compare: the other engine at the same depth, drawn apart
        rows.append({"step": f"{tuned.beside.engine}, beside", "tok_s": 1e6 / beside})
    fig = Figure(figsize=(7.5, 0.9 + 0.35 * len(rows)))
    ax = fig.subplots()
    y = list(range(len(rows)))
    ax.barh(y, [r["tok_s"] or 0 for r in rows], height=0.6,
            color=[PALETTE[1] if beside and i == len(rows) - 1 else PALETTE[0] for i in range(len(rows))])
    ax.set_yticks(y, [r["step"] for r in rows])
    ax.invert_yaxis()
    ax.set_xlabel("tokens/s (median whole token)")
    ax.set_title("The route, step by step")
    return _svg(fig), rows
