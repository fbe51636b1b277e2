"""Two traces of one model, region by region: who wins each part of the token and by how much.

A region's time is the per-token median of its summed kernel time. Weight kernels go to their
role's region (roles.REGION_OF_ROLE); the rest by category: attention, the KV write and rope to
"attention", norms without a role to "norms", everything else to "other". A region's floor sums the
bound's floors the same way (the KV cache's to attention; the embedding row and activations to other).
Two rows follow the regions, from each token's device timeline: the idle gaps between kernels, and the
overlap (negative: kernel time that ran beside other kernels, so the regions' sum counts it twice). An
engine whose kernels overlap is compared kernel by kernel this way without its regions seeming to add
up past its token.

`exclusive` counts each microsecond of a token's device time once instead: where kernels overlap, the
time goes to the kernel that started first, and no overlap row is left. It is the fairer view of an
engine whose kernels start before their predecessors end (launched with programmatic dependent launch,
a kernel is resident and waiting, and its recorded duration includes the wait): summed durations put
that wait in the later kernel's region and take it back only in the overlap row.
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import asdict, dataclass, field
from statistics import median
from typing import Any

from boltbeam.account.tieout import role_of
from boltbeam.bound.roofline import Bound
from boltbeam.errors import Refused
from boltbeam.measure.trace import Kernel, Trace, timeline
from boltbeam.read import roles

# The weight regions come from the roles; attention and everything else are added here.
REGIONS = (*roles.REGIONS, "attention", "other")
REGION_OF_ROLE = roles.REGION_OF_ROLE
REGION_OF_CATEGORY = {"attention": "attention", "kv_write": "attention", "rope": "attention", "norm": "norms"}
REGION_OF_FLOOR = {"kv_cache": "attention"}
TIMELINE_ROWS = ("gaps", "overlap")
# Without roles a side's weight time all lands in "other": these regions then say nothing.
ROLE_REGIONS = (*(r for r in roles.REGIONS if r != "norms"), "other")


def region_of(k: Kernel) -> str:
    role = role_of(k)
    if role:
        return REGION_OF_ROLE.get(role, "other")
    return REGION_OF_CATEGORY.get(k.category, "other")


def region_floors(bound: Bound) -> dict[str, float]:
    floors = dict.fromkeys(REGIONS, 0.0)
    for line in bound.roles:
        floors[REGION_OF_FLOOR.get(line.role) or REGION_OF_ROLE.get(line.role, "other")] += line.floor_us
    return floors


def region_times(trace: Trace, exclusive: bool = False) -> dict[str, float]:
    """Per-token median of each region's summed kernel time; `exclusive`: of the device time each region's
    kernels alone account for (exclusive_times)."""
    per_token = []
    for kernels in trace.by_token().values():
        d: dict[str, float] = defaultdict(float)
        for k, us in exclusive_times(kernels) if exclusive else ((k, k.duration_us) for k in kernels):
            d[region_of(k)] += us
        per_token.append(d)
    return {r: median(d.get(r, 0.0) for d in per_token) for r in REGIONS}


def placed(trace: Trace) -> bool:
    """Every kernel of the trace has its start on the device timeline (what exclusive_times needs)."""
    return all(k.start_us is not None for k in trace.kernels)


def exclusive_times(kernels: list[Kernel]) -> list[tuple[Kernel, float]]:
    """Each kernel of one token with the part of its time no kernel that started before it covers (a
    kernel wholly inside an earlier one: 0), so the parts sum to the token's busy device time."""
    out, covered = [], float("-inf")
    for k in sorted(kernels, key=lambda k: k.start_us):
        end = k.start_us + k.duration_us
        out.append((k, max(0.0, end - max(k.start_us, covered))))
        covered = max(covered, end)
    return out


def timeline_times(trace: Trace, exclusive: bool = False) -> dict[str, float] | None:
    """Per-token median of the gaps and of the overlap (negative; no overlap row when the regions are
    exclusive); None when a kernel has no start."""
    lines = [timeline(ks) for ks in trace.by_token().values()]
    if not lines or any(t is None for t in lines):
        return None
    return {"gaps": median(t.gaps_us for t in lines)} | ({} if exclusive else
                                                         {"overlap": -median(t.overlap_us for t in lines)})


@dataclass
class Region:
    region: str
    a_us: float | None
    b_us: float | None
    diff_us: float | None      # b - a: positive when B is slower
    winner: str | None         # "A", "B" or "tie"; None when the region cannot be compared
    floor_us: float | None
    a_gap_us: float | None = None   # distance from the floor
    b_gap_us: float | None = None


@dataclass
class Comparison:
    a_label: str
    b_label: str
    a_wall_us: float
    b_wall_us: float
    regions: list[Region]
    incomparable: list[dict[str, str]]
    floors_shown: bool
    tokens: tuple[int, int]          # measured kernel tokens of A and B
    notes: list[str] = field(default_factory=list)
    exclusive: bool = False          # regions hold each µs of device time once (exclusive_times)

    @property
    def net_us(self) -> float:
        """Whole-token difference, B - A (medians of the plain tokens)."""
        return self.b_wall_us - self.a_wall_us

    @property
    def region_net_us(self) -> float | None:
        diffs = [r.diff_us for r in self.regions if r.diff_us is not None]
        return sum(diffs) if diffs else None

    def to_dict(self) -> dict[str, Any]:
        region_net = self.region_net_us
        return {"a_label": self.a_label, "b_label": self.b_label, "a_wall_us": self.a_wall_us,
                "b_wall_us": self.b_wall_us, "net_us": self.net_us, "region_net_us": region_net,
                "outside_kernels_us": None if region_net is None else self.net_us - region_net,
                "winner": _winner(self.a_wall_us, self.b_wall_us),
                "method": "median per token" + (", exclusive device time" if self.exclusive else ""),
                "regions": [asdict(r) for r in self.regions], "incomparable": self.incomparable,
                "floors_shown": self.floors_shown, "tokens": list(self.tokens), "notes": self.notes}


def _winner(a: float, b: float) -> str:
    return "tie" if a == b else "A" if a < b else "B"


def label(trace: Trace) -> str:
    env = trace.environment
    parts = [env.engine, trace.route.label, env.device]
    return " | ".join(str(p) for p in dict.fromkeys(parts) if p) or "trace"


def _why_incomparable(trace: Trace, side: str) -> tuple[tuple[str, ...], str] | None:
    if not trace.kernels:
        return (*REGIONS, *TIMELINE_ROWS), f"{side} has whole-token figures only (no kernels)"
    if not any(role_of(k) for k in trace.kernels):
        return ROLE_REGIONS, f"{side}'s kernels name no weight roles: its weight time cannot be placed in regions"
    return None


def compare(a: Trace, b: Trace, bound: Bound | None = None, exclusive: bool = False) -> Comparison:
    """Compare traces A and B region by region; floors when a bound is given; `exclusive`: each µs of device
    time once (exclusive_times), which needs every kernel's start."""
    notes: list[str] = []
    if exclusive and not (placed(a) and placed(b)):
        raise Refused("--exclusive needs every kernel's start time (a device timeline) in both traces")
    rows = (*REGIONS, *TIMELINE_ROWS[:1 if exclusive else None])
    if not a.token_wall_us or not b.token_wall_us:
        raise Refused("both traces need plain token walls to compare whole tokens")
    ctx_a, ctx_b = a.workload.context, b.workload.context
    if ctx_a != ctx_b:
        notes.append(f"the traces decoded at different contexts (A {ctx_a}, B {ctx_b}): attention is not like for like")
    sha_a, sha_b = a.environment.model_sha256, b.environment.model_sha256
    if sha_a and sha_b and sha_a != sha_b:
        notes.append(f"the traces ran different model files (sha256 A {sha_a[:12]}…, B {sha_b[:12]}…)")

    incomparable: dict[str, str] = {}
    for trace, side in ((a, "A"), (b, "B")):
        if found := _why_incomparable(trace, side):
            regions, reason = found
            for r in regions:
                incomparable[r] = f"{incomparable[r]}; {reason}" if r in incomparable else reason
    if bound:
        for trace, side in ((a, "A"), (b, "B")):
            if (fastest := min(trace.token_wall_us)) < bound.token_floor_us:
                raise Refused(f"measurement error: {side}'s fastest token took {fastest:,.2f} µs, under the physical "
                              f"floor of {bound.token_floor_us:,.2f} µs on {bound.target}: no winner can be declared")
    times_a = region_times(a, exclusive) if a.kernels else None
    times_b = region_times(b, exclusive) if b.kernels else None
    floors = region_floors(bound) if bound else None
    if bound and ctx_a is not None and bound.context != ctx_a:
        notes.append(f"floors are at context {bound.context}; A decoded at context {ctx_a}")
    lines_a, lines_b = timeline_times(a, exclusive), timeline_times(b, exclusive)
    for side, lines, trace in (("A", lines_a, a), ("B", lines_b, b)):
        if lines is None and trace.kernels:
            for r in TIMELINE_ROWS:
                incomparable.setdefault(r, f"{side}'s kernels have no start times: no device timeline")
    for times, lines in ((times_a, lines_a), (times_b, lines_b)):
        if times is not None and lines is not None:
            times.update(lines)

    regions = []
    for r in rows:
        ta = times_a.get(r) if times_a else None
        tb = times_b.get(r) if times_b else None
        fl = floors.get(r) if floors else None
        comparable = r not in incomparable     # every row a side has no time for is marked incomparable above
        regions.append(Region(region=r, a_us=ta, b_us=tb, diff_us=tb - ta if comparable else None,
                              winner=_winner(ta, tb) if comparable else None, floor_us=fl,
                              a_gap_us=None if ta is None or fl is None else ta - fl,
                              b_gap_us=None if tb is None or fl is None else tb - fl))
    return Comparison(a_label=label(a), b_label=label(b), a_wall_us=median(a.token_wall_us),
                      b_wall_us=median(b.token_wall_us), regions=regions,
                      incomparable=[{"region": r, "reason": why} for r, why in incomparable.items()],
                      floors_shown=bound is not None, tokens=(len(a.kernel_tokens), len(b.kernel_tokens)),
                      notes=notes, exclusive=exclusive)
